//! AWS Signature Version 4 for the requests [`super::S3Wire`] sends, and the URI encoding S3 expects.
//!
//! Written here rather than taken from `object_store` because S3's canonical URI is the path exactly as
//! sent: `object_store`'s signer re-parses the request through `url::Url`, which removes `.` and `..`
//! segments (and `%2E` spellings of them), so keys like `./z` or `a/../b` would be signed, and sent, as other
//! keys. The primitives are `ring`'s; the test below is AWS's published example.

use std::fmt::Write;

use chrono::{DateTime, Utc};
use http::HeaderMap;
use ring::{digest, hmac};

/// SHA-256 of the empty body.
pub(crate) const EMPTY_SHA256: &str =
    "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

/// Credentials a request is signed with.
pub(crate) struct Credential<'a> {
    pub key_id: &'a str,
    pub secret: &'a str,
    pub token: Option<&'a str>,
}

/// S3's URI encoding: every byte but `A-Z a-z 0-9 - _ . ~` as `%XX`, and `/` too unless `keep_slash`.
pub(crate) fn uri_encode(s: &str, keep_slash: bool) -> String {
    let mut out = String::with_capacity(s.len() * 3 / 2);
    for &b in s.as_bytes() {
        if b.is_ascii_alphanumeric()
            || matches!(b, b'-' | b'_' | b'.' | b'~')
            || (keep_slash && b == b'/')
        {
            out.push(b as char);
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

/// A query string from raw pairs, encoded and sorted as SigV4's canonical query string (so the string sent
/// and the string signed are the same one).
pub(crate) fn query_string(pairs: &[(&str, String)]) -> String {
    let mut enc: Vec<(String, String)> = pairs
        .iter()
        .map(|(k, v)| (uri_encode(k, false), uri_encode(v, false)))
        .collect();
    enc.sort();
    let mut out = String::new();
    for (i, (k, v)) in enc.iter().enumerate() {
        if i > 0 {
            out.push('&');
        }
        let _ = write!(out, "{k}={v}");
    }
    out
}

/// Hex SHA-256 of a request body.
pub(crate) fn sha256_hex(body: &[u8]) -> String {
    hex(digest::digest(&digest::SHA256, body).as_ref())
}

fn hex(bytes: &[u8]) -> String {
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}

fn mac(key: &[u8], data: &[u8]) -> hmac::Tag {
    hmac::sign(&hmac::Key::new(hmac::HMAC_SHA256, key), data)
}

/// Sign a request: adds `x-amz-date`, `x-amz-content-sha256`, `x-amz-security-token` (with a session token)
/// and `authorization` to `headers`. `host` must already be in `headers`; it and every `x-amz-*` header are
/// signed. `path` and `query` are exactly what is sent (already encoded, see [`uri_encode`] and
/// [`query_string`]).
#[allow(clippy::too_many_arguments)]
pub(crate) fn sign(
    method: &str,
    path: &str,
    query: &str,
    headers: &mut HeaderMap,
    payload_sha256: &str,
    cred: &Credential<'_>,
    region: &str,
    now: DateTime<Utc>,
) {
    let amz_date = now.format("%Y%m%dT%H%M%SZ").to_string();
    let day = now.format("%Y%m%d").to_string();
    let set = |h: &mut HeaderMap, name: &'static str, v: &str| {
        if let Ok(v) = http::HeaderValue::from_str(v) {
            h.insert(name, v);
        }
    };
    set(headers, "x-amz-date", &amz_date);
    set(headers, "x-amz-content-sha256", payload_sha256);
    if let Some(t) = cred.token {
        set(headers, "x-amz-security-token", t);
    }
    let mut signed: Vec<(String, String)> = headers
        .iter()
        .filter(|(n, _)| n.as_str() != "authorization")
        .map(|(n, v)| {
            let v = String::from_utf8_lossy(v.as_bytes());
            (
                n.as_str().to_string(),
                v.split_whitespace().collect::<Vec<_>>().join(" "),
            )
        })
        .collect();
    signed.sort();
    let mut canonical = format!("{method}\n{path}\n{query}\n");
    for (n, v) in &signed {
        let _ = writeln!(canonical, "{n}:{v}");
    }
    let names: Vec<&str> = signed.iter().map(|(n, _)| n.as_str()).collect();
    let names = names.join(";");
    let _ = write!(canonical, "\n{names}\n{payload_sha256}");
    let scope = format!("{day}/{region}/s3/aws4_request");
    let to_sign = format!(
        "AWS4-HMAC-SHA256\n{amz_date}\n{scope}\n{}",
        hex(digest::digest(&digest::SHA256, canonical.as_bytes()).as_ref())
    );
    let k = mac(format!("AWS4{}", cred.secret).as_bytes(), day.as_bytes());
    let k = mac(k.as_ref(), region.as_bytes());
    let k = mac(k.as_ref(), b"s3");
    let k = mac(k.as_ref(), b"aws4_request");
    let signature = hex(mac(k.as_ref(), to_sign.as_bytes()).as_ref());
    set(
        headers,
        "authorization",
        &format!(
            "AWS4-HMAC-SHA256 Credential={}/{scope}, SignedHeaders={names}, Signature={signature}",
            cred.key_id
        ),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    /// AWS's example "GET Object" request (Signature Version 4 documentation for S3, "Examples of how to
    /// calculate a signature"), with its published signature.
    #[test]
    fn signs_aws_published_example() {
        let mut h = HeaderMap::new();
        h.insert("host", "examplebucket.s3.amazonaws.com".parse().unwrap());
        h.insert("range", "bytes=0-9".parse().unwrap());
        let now = DateTime::parse_from_rfc3339("2013-05-24T00:00:00Z")
            .unwrap()
            .with_timezone(&Utc);
        let cred = Credential {
            key_id: "AKIAIOSFODNN7EXAMPLE",
            secret: "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
            token: None,
        };
        sign(
            "GET",
            "/test.txt",
            "",
            &mut h,
            EMPTY_SHA256,
            &cred,
            "us-east-1",
            now,
        );
        assert_eq!(
            h["authorization"].to_str().unwrap(),
            "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request, \
             SignedHeaders=host;range;x-amz-content-sha256;x-amz-date, \
             Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41"
        );
    }

    #[test]
    fn encodes_as_s3_does() {
        assert_eq!(
            uri_encode("a b+c%d/é~._-", true),
            "a%20b%2Bc%25d/%C3%A9~._-"
        );
        assert_eq!(uri_encode("x/y", false), "x%2Fy");
        assert_eq!(
            query_string(&[("prefix", "a b".into()), ("list-type", "2".into())]),
            "list-type=2&prefix=a%20b"
        );
    }
}
