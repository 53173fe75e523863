//! S3 requests of our own, for what `object_store` cannot say: keys it cannot represent, headers it cannot
//! read, and the multipart bookkeeping it hides.
//!
//! - **Keys as they are.** `object_store`'s `Path` refuses empty and `.`/`..` segments, so a single key like
//!   `x//y` or `./z` at an origin failed every listing that covered it, and such objects could not be read.
//!   Here a key is a string: listed with `encoding-type=url` (so any character survives the XML), read by its
//!   exact bytes (the request path is built and signed by hand, [`sign`], and sent through `hyper`, which does
//!   not normalize paths as `url::Url` does).
//! - **Headers as they are.** A user-metadata value that is not UTF-8 made `object_store` fail the whole GET
//!   (a 500 at the gateway). Here it is passed on RFC 2047-encoded with its bytes kept
//!   (`=?ISO-8859-1?B?...?=`: HTTP's historical header charset, in which every byte is a character).
//! - **Multipart uploads by key.** `object_store` never shows an upload id; [`S3Wire::uploads`] lists the
//!   incomplete uploads under a prefix (ListMultipartUploads) and [`S3Wire::abort`] aborts one, so uploads
//!   of a killed save can be found by key and freed ([`crate::Backend::abort_uploads`]).
//!
//! Every request is one attempt; the backend's `RetryPolicy` decides on the kind of the error, which comes
//! from the status ([`crate::classify::status_kind`]) with S3's error code and message in the text.
//!
//! One room of about 1,000 lines (signing apart, in `sign.rs`): every request here shares the one signed
//! request builder, the error mapping and the XML answers, and split by operation each file would be half
//! plumbing.

mod sign;

use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use futures::stream::BoxStream;
use http::{HeaderMap, HeaderValue, Method, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use serde::Deserialize;
use strata_types::{Error, ErrorKind, ObjectAttrs, ObjectMeta, Result};

use crate::classify::status_kind;

type Https = hyper_rustls::HttpsConnector<Connect>;
/// A request body: whole (`Full`) or streamed ([`S3Wire::put_stream`]).
type WireBody = http_body_util::combinators::BoxBody<Bytes, std::io::Error>;

/// The most of an error response's body read for its code and message.
const ERROR_BODY_LIMIT: usize = 64 * 1024;
/// The most of a listing response's body read (S3 pages are at most 1,000 keys, well under this).
const LIST_BODY_LIMIT: usize = 64 * 1024 * 1024;

/// One S3 bucket (and the backend's prefix in it), spoken to directly.
pub(crate) struct S3Wire {
    client: Client<Https, WireBody>,
    /// `None`: requests are sent unsigned (`skip_signature`).
    credentials: Option<object_store::aws::AwsCredentialProvider>,
    region: String,
    scheme: &'static str,
    /// `host[:port]`, as sent in `Host` and signed.
    authority: String,
    /// `""` for virtual-hosted buckets, `/bucket` for path-style ones.
    base_path: String,
    /// The backend's prefix with its trailing `/`, or `""`.
    prefix: String,
    /// The bucket's name (copy sources name it).
    bucket: String,
    timeout: Duration,
}

/// Where and how to reach a bucket.
pub(crate) struct Target<'a> {
    pub bucket: &'a str,
    pub prefix: &'a str,
    pub endpoint: Option<&'a str>,
    pub region: &'a str,
    pub virtual_hosted: bool,
    pub timeout: Duration,
}

/// One page of a listing (keys relative to the backend's prefix).
pub(crate) struct WirePage {
    pub objects: Vec<ObjectMeta>,
    pub common_prefixes: Vec<String>,
    pub next_token: Option<String>,
}

/// An incomplete multipart upload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IncompleteUpload {
    /// The key it writes, relative to the backend.
    pub key: String,
    /// S3's upload id.
    pub upload_id: String,
    /// When it was initiated, seconds since the Unix epoch (0 when the server did not say).
    pub initiated_unix: i64,
}

impl S3Wire {
    pub(crate) fn new(
        t: Target<'_>,
        credentials: Option<object_store::aws::AwsCredentialProvider>,
    ) -> Result<Self> {
        let (scheme, authority, base_path) = match t.endpoint {
            Some(ep) => {
                let uri: http::Uri = ep.trim_end_matches('/').parse().map_err(|e| {
                    Error::new(
                        ErrorKind::Config,
                        format!("invalid S3 endpoint {ep:?}: {e}"),
                    )
                })?;
                let scheme = match uri.scheme_str() {
                    Some("http") => "http",
                    Some("https") | None => "https",
                    Some(other) => {
                        return Err(Error::new(
                            ErrorKind::Config,
                            format!("invalid S3 endpoint {ep:?}: scheme {other:?}"),
                        ));
                    }
                };
                let authority = uri.authority().map(|a| a.to_string()).ok_or_else(|| {
                    Error::new(ErrorKind::Config, format!("S3 endpoint {ep:?} has no host"))
                })?;
                let path = uri.path().trim_end_matches('/').to_string();
                match t.virtual_hosted {
                    // As object_store: a virtual-hosted endpoint already names the bucket.
                    true => (scheme, authority, path),
                    false => (scheme, authority, format!("{path}/{}", t.bucket)),
                }
            }
            None => match t.virtual_hosted {
                true => (
                    "https",
                    format!("{}.s3.{}.amazonaws.com", t.bucket, t.region),
                    String::new(),
                ),
                false => (
                    "https",
                    format!("s3.{}.amazonaws.com", t.region),
                    format!("/{}", t.bucket),
                ),
            },
        };
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        http.set_nodelay(true);
        http.set_connect_timeout(Some(Duration::from_secs(5)));
        // Through a proxy when the environment names one for this endpoint, as every other HTTP client of
        // Strata (object_store's, for writes) does: `HTTPS_PROXY`/`HTTP_PROXY`/`ALL_PROXY`, `NO_PROXY`.
        let target: http::Uri = format!("{scheme}://{authority}/").parse().map_err(|e| {
            Error::new(
                ErrorKind::Config,
                format!("invalid S3 endpoint {authority:?}: {e}"),
            )
        })?;
        let connect =
            match hyper_util::client::proxy::matcher::Matcher::from_env().intercept(&target) {
                None => Connect::Direct(http),
                Some(proxy) => {
                    let mut tunnel = hyper_util::client::legacy::connect::proxy::Tunnel::new(
                        proxy.uri().clone(),
                        http,
                    );
                    if let Some(auth) = proxy.basic_auth() {
                        tunnel = tunnel.with_auth(auth.clone());
                    }
                    Connect::Proxied(tunnel)
                }
            };
        let tls = tls_config()?;
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_http1()
            .wrap_connector(connect);
        let client = Client::builder(hyper_util::rt::TokioExecutor::new())
            .pool_max_idle_per_host(64)
            .build(https);
        let prefix = t.prefix.trim_matches('/');
        Ok(Self {
            client,
            credentials,
            region: t.region.to_string(),
            scheme,
            authority,
            base_path,
            prefix: if prefix.is_empty() {
                String::new()
            } else {
                format!("{prefix}/")
            },
            bucket: t.bucket.to_string(),
            timeout: t.timeout,
        })
    }

    /// One request without a body; a status other than 2xx is an error with S3's code and message.
    async fn send(
        &self,
        method: Method,
        key: Option<&str>,
        query: &[(&str, String)],
        headers: HeaderMap,
        what: &str,
    ) -> Result<http::Response<hyper::body::Incoming>> {
        self.send_body(method, key, query, headers, Bytes::new(), what)
            .await
    }

    /// One request with `body` (signed with its SHA-256).
    async fn send_body(
        &self,
        method: Method,
        key: Option<&str>,
        query: &[(&str, String)],
        headers: HeaderMap,
        body: Bytes,
        what: &str,
    ) -> Result<http::Response<hyper::body::Incoming>> {
        let payload = match body.is_empty() {
            true => sign::EMPTY_SHA256.to_string(),
            false => sign::sha256_hex(&body),
        };
        let req = self
            .request(method, key, query, headers, &payload, what)
            .await?
            .body(Full::new(body).map_err(|never| match never {}).boxed())
            .map_err(|e| Error::invalid_input(format!("{what}: {e}")))?;
        let resp = match tokio::time::timeout(self.timeout, self.client.request(req)).await {
            Err(_) => {
                return Err(Error::new(
                    ErrorKind::Timeout,
                    format!("{what}: no response within {:?}", self.timeout),
                ));
            }
            Ok(r) => r,
        };
        self.answered(resp, what).await
    }

    /// A request to `key` (the bucket: `None`) with `headers`, signed for a payload of SHA-256
    /// `payload_sha256` (or `UNSIGNED-PAYLOAD`), ready for its body.
    async fn request(
        &self,
        method: Method,
        key: Option<&str>,
        query: &[(&str, String)],
        mut headers: HeaderMap,
        payload_sha256: &str,
        what: &str,
    ) -> Result<http::request::Builder> {
        let path = match key {
            Some(k) => format!(
                "{}/{}",
                self.base_path,
                sign::uri_encode(&format!("{}{k}", self.prefix), true)
            ),
            None => format!("{}/", self.base_path),
        };
        let query = sign::query_string(query);
        let host = HeaderValue::from_str(&self.authority)
            .map_err(|e| Error::new(ErrorKind::Config, format!("{what}: invalid host: {e}")))?;
        headers.insert(http::header::HOST, host);
        if let Some(provider) = &self.credentials {
            let c = provider.get_credential().await.map_err(|e| {
                Error::new(
                    ErrorKind::Unauthenticated,
                    format!("{what}: no S3 credentials: {e}"),
                )
            })?;
            let cred = sign::Credential {
                key_id: &c.key_id,
                secret: &c.secret_key,
                token: c.token.as_deref(),
            };
            sign::sign(
                method.as_str(),
                &path,
                &query,
                &mut headers,
                payload_sha256,
                &cred,
                &self.region,
                chrono::Utc::now(),
            );
        }
        let uri = match query.is_empty() {
            true => format!("{}://{}{path}", self.scheme, self.authority),
            false => format!("{}://{}{path}?{query}", self.scheme, self.authority),
        };
        let mut req = http::Request::builder().method(method).uri(&uri);
        if let Some(h) = req.headers_mut() {
            *h = headers;
        }
        Ok(req)
    }

    /// The response to a request sent: 2xx, else an error with S3's code and message.
    async fn answered(
        &self,
        resp: std::result::Result<
            http::Response<hyper::body::Incoming>,
            impl std::error::Error + Send + Sync + 'static,
        >,
        what: &str,
    ) -> Result<http::Response<hyper::body::Incoming>> {
        let resp = match resp {
            Err(e) => {
                return Err(
                    Error::new(ErrorKind::Unavailable, format!("{what}: {e}")).with_source(e)
                );
            }
            Ok(r) => r,
        };
        if resp.status().is_success() {
            return Ok(resp);
        }
        Err(self.failure(resp, what).await)
    }

    /// A non-2xx response as an error: its kind from the status, S3's code and message in the text.
    async fn failure(&self, resp: http::Response<hyper::body::Incoming>, what: &str) -> Error {
        let status = resp.status();
        let body = read_limited(resp.into_body(), ERROR_BODY_LIMIT, self.timeout)
            .await
            .unwrap_or_default();
        #[derive(Deserialize, Default)]
        #[serde(rename_all = "PascalCase", default)]
        struct S3ErrorBody {
            code: Option<String>,
            message: Option<String>,
        }
        let parsed: S3ErrorBody = quick_xml::de::from_reader(&body[..]).unwrap_or_default();
        let detail = match (parsed.code, parsed.message) {
            (Some(c), Some(m)) => format!("{c}: {m}"),
            (Some(c), None) => c,
            (None, Some(m)) => m,
            (None, None) => status.canonical_reason().unwrap_or("").to_string(),
        };
        let kind = status_kind(status.as_u16());
        Error::new(kind, format!("{what}: {} {detail}", status.as_u16()))
            .with_retryable(kind.default_retryable())
    }

    /// A bucket-level GET whose answer is an XML document (a listing).
    async fn get_xml<T: serde::de::DeserializeOwned>(
        &self,
        q: &[(&str, String)],
        what: &str,
    ) -> Result<T> {
        let resp = self
            .send(Method::GET, None, q, HeaderMap::new(), what)
            .await?;
        let body = read_limited(resp.into_body(), LIST_BODY_LIMIT, self.timeout)
            .await
            .map_err(|e| e.context(what))?;
        quick_xml::de::from_reader(&body[..]).map_err(|e| {
            Error::new(
                ErrorKind::Unavailable,
                format!("{what}: unreadable answer: {e}"),
            )
        })
    }

    /// A listing page (ListObjectsV2) under `prefix` (relative to the backend), keys as they are.
    pub(crate) async fn list(
        &self,
        prefix: &str,
        delimiter: Option<&str>,
        start_after: Option<&str>,
        token: Option<&str>,
        max_keys: usize,
        what: &str,
    ) -> Result<WirePage> {
        let mut q: Vec<(&str, String)> = vec![
            ("list-type", "2".into()),
            ("encoding-type", "url".into()),
            ("max-keys", max_keys.clamp(1, 1000).to_string()),
        ];
        let full = format!("{}{prefix}", self.prefix);
        if !full.is_empty() {
            q.push(("prefix", full));
        }
        if let Some(d) = delimiter {
            q.push(("delimiter", d.into()));
        }
        if let Some(t) = token {
            q.push(("continuation-token", t.into()));
        }
        if let Some(s) = start_after.filter(|s| !s.is_empty()) {
            q.push(("start-after", format!("{}{s}", self.prefix)));
        }
        #[derive(Deserialize, Default)]
        #[serde(rename_all = "PascalCase", default)]
        struct ListBucketResult {
            contents: Vec<Contents>,
            common_prefixes: Vec<CommonPrefix>,
            next_continuation_token: Option<String>,
            is_truncated: bool,
            encoding_type: Option<String>,
        }
        #[derive(Deserialize)]
        #[serde(rename_all = "PascalCase")]
        struct Contents {
            key: String,
            #[serde(default)]
            size: u64,
            #[serde(rename = "ETag", default)]
            e_tag: Option<String>,
            #[serde(default)]
            last_modified: Option<String>,
        }
        #[derive(Deserialize)]
        #[serde(rename_all = "PascalCase")]
        struct CommonPrefix {
            prefix: String,
        }
        let r: ListBucketResult = self.get_xml(&q, what).await?;
        let encoded = r.encoding_type.as_deref() == Some("url");
        let name = |raw: String| -> Result<Option<String>> {
            let k = if encoded {
                url_decode(&raw, what)?
            } else {
                raw
            };
            Ok(k.strip_prefix(&self.prefix).map(str::to_string))
        };
        let mut objects = Vec::with_capacity(r.contents.len());
        for c in r.contents {
            let Some(key) = name(c.key)? else { continue };
            objects.push(ObjectMeta {
                key,
                size: c.size,
                etag: c.e_tag,
                version: None,
                last_modified_unix: c
                    .last_modified
                    .as_deref()
                    .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
                    .map(|t| t.timestamp())
                    .unwrap_or(0),
                attrs: None,
            });
        }
        let mut common_prefixes = Vec::with_capacity(r.common_prefixes.len());
        for p in r.common_prefixes {
            if let Some(p) = name(p.prefix)? {
                common_prefixes.push(p);
            }
        }
        Ok(WirePage {
            objects,
            common_prefixes,
            next_token: r.next_continuation_token.filter(|_| r.is_truncated),
        })
    }

    /// GET (or HEAD) of `key`: its metadata from the response headers and its bytes as they arrive. With
    /// `range`, a 206 for exactly that range (clipped to the object) is expected; with `if_match`, the object
    /// must still have that ETag (checked by the server and again here).
    pub(crate) async fn get(
        &self,
        key: &str,
        range: Option<&Range<u64>>,
        if_match: Option<&str>,
        head: bool,
        what: &str,
    ) -> Result<(ObjectMeta, BoxStream<'static, Result<Bytes>>)> {
        let mut h = HeaderMap::new();
        if let Some(r) = range {
            let v = format!("bytes={}-{}", r.start, r.end.saturating_sub(1));
            h.insert(http::header::RANGE, header_value(&v, what)?);
        }
        if let Some(e) = if_match {
            h.insert(http::header::IF_MATCH, header_value(e, what)?);
        }
        if head {
            // The object's checksum, where S3 keeps one (written by another client).
            h.insert(
                "x-amz-checksum-mode",
                http::HeaderValue::from_static("ENABLED"),
            );
        }
        let method = if head { Method::HEAD } else { Method::GET };
        let resp = self.send(method, Some(key), &[], h, what).await?;
        let status = resp.status();
        let headers = resp.headers();
        let text = |name: &str| headers.get(name).map(|v| header_text(v.as_bytes()));
        let size = match (status, text("content-range")) {
            (StatusCode::PARTIAL_CONTENT, Some(cr)) => {
                let (start, total) = parse_content_range(&cr).ok_or_else(|| {
                    Error::new(
                        ErrorKind::Unavailable,
                        format!("{what}: unreadable Content-Range {cr:?}"),
                    )
                })?;
                if range.is_some_and(|r| r.start != start) {
                    return Err(Error::new(
                        ErrorKind::Unavailable,
                        format!("{what}: the server answered another range ({cr})"),
                    ));
                }
                total
            }
            _ => {
                if range.is_some_and(|r| r.start != 0) && !head {
                    return Err(Error::new(
                        ErrorKind::Unavailable,
                        format!("{what}: the server ignored the range"),
                    ));
                }
                text("content-length")
                    .and_then(|v| v.trim().parse().ok())
                    .ok_or_else(|| {
                        Error::new(
                            ErrorKind::Unavailable,
                            format!("{what}: response without a length"),
                        )
                    })?
            }
        };
        let etag = text("etag");
        if let (Some(expect), Some(got)) = (if_match, etag.as_deref())
            && expect != got
        {
            return Err(crate::classify::changed(what, got, expect));
        }
        let mut attrs = ObjectAttrs {
            content_type: text("content-type"),
            content_encoding: text("content-encoding"),
            content_disposition: text("content-disposition"),
            content_language: text("content-language"),
            cache_control: text("cache-control"),
            ..Default::default()
        };
        for (name, v) in headers {
            if let Some(user) = name.as_str().strip_prefix("x-amz-meta-") {
                attrs
                    .user
                    .insert(user.to_string(), header_text(v.as_bytes()));
            }
        }
        attrs.absorb_extras();
        // What S3 keeps natively (written by another client): `Expires`, and a checksum when the request
        // asked for it (`x-amz-checksum-mode`).
        if attrs.expires.is_none() {
            attrs.expires = text("expires");
        }
        if attrs.checksum.is_none() {
            attrs.checksum = strata_types::ChecksumAlgorithm::ALL
                .into_iter()
                .find_map(|a| {
                    let value = text(&format!("x-amz-checksum-{}", a.header_suffix()))?;
                    Some(strata_types::StoredChecksum {
                        algorithm: a,
                        full_object: text("x-amz-checksum-type").as_deref() != Some("COMPOSITE")
                            && !value.contains('-'),
                        value,
                        parts: Vec::new(),
                    })
                });
        }
        let meta = ObjectMeta {
            key: key.to_string(),
            size,
            etag,
            version: text("x-amz-version-id"),
            last_modified_unix: text("last-modified")
                .and_then(|t| chrono::DateTime::parse_from_rfc2822(&t).ok())
                .map(|t| t.timestamp())
                .unwrap_or(0),
            attrs: attrs.shared(),
        };
        let body = body_stream(resp.into_body(), self.timeout, what.to_string());
        Ok((meta, body))
    }

    /// Every incomplete multipart upload whose key starts with `prefix` (relative to the backend).
    pub(crate) async fn uploads(&self, prefix: &str, what: &str) -> Result<Vec<IncompleteUpload>> {
        #[derive(Deserialize, Default)]
        #[serde(rename_all = "PascalCase", default)]
        struct Result_ {
            upload: Vec<Upload>,
            is_truncated: bool,
            next_key_marker: Option<String>,
            next_upload_id_marker: Option<String>,
            encoding_type: Option<String>,
        }
        #[derive(Deserialize)]
        #[serde(rename_all = "PascalCase")]
        struct Upload {
            key: String,
            upload_id: String,
            #[serde(default)]
            initiated: Option<String>,
        }
        let mut out = Vec::new();
        let mut markers: Option<(String, String)> = None;
        // Bounded: 10,000 pages of 1,000 uploads.
        for _ in 0..10_000 {
            let mut q: Vec<(&str, String)> = vec![
                ("uploads", String::new()),
                ("encoding-type", "url".into()),
                ("prefix", format!("{}{prefix}", self.prefix)),
            ];
            if let Some((k, u)) = &markers {
                q.push(("key-marker", k.clone()));
                q.push(("upload-id-marker", u.clone()));
            }
            let r: Result_ = self.get_xml(&q, what).await?;
            let encoded = r.encoding_type.as_deref() == Some("url");
            for u in r.upload {
                let key = if encoded {
                    url_decode(&u.key, what)?
                } else {
                    u.key
                };
                let Some(key) = key.strip_prefix(&self.prefix) else {
                    continue;
                };
                out.push(IncompleteUpload {
                    key: key.to_string(),
                    upload_id: u.upload_id,
                    initiated_unix: u
                        .initiated
                        .as_deref()
                        .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
                        .map(|t| t.timestamp())
                        .unwrap_or(0),
                });
            }
            match (r.is_truncated, r.next_key_marker, r.next_upload_id_marker) {
                (true, Some(k), Some(u)) => {
                    let k = if encoded { url_decode(&k, what)? } else { k };
                    markers = Some((k, u));
                }
                _ => return Ok(out),
            }
        }
        Ok(out)
    }

    /// PUT `body` at `key` in one request, with `headers` (attributes, conditions); the new version's ETag and
    /// version id.
    pub(crate) async fn put(
        &self,
        key: &str,
        body: Bytes,
        headers: HeaderMap,
        what: &str,
    ) -> Result<(Option<String>, Option<String>)> {
        let resp = self
            .send_body(Method::PUT, Some(key), &[], headers, body, what)
            .await?;
        let text = |n: &str| resp.headers().get(n).map(|v| header_text(v.as_bytes()));
        Ok((text("etag"), text("x-amz-version-id")))
    }

    /// PUT a body of exactly `len` bytes at `key` in one request, streamed from `body` as it comes (its
    /// payload is not known up front, so it is sent `UNSIGNED-PAYLOAD`, which S3 allows); the new version's
    /// ETag and version id. Never retried: the body is gone once sent. A body that yields an error or ends
    /// short of `len` aborts the request, and S3 stores nothing of a PUT whose body did not arrive whole.
    /// The timeout counts from the body's end (a slow writer is not the origin's fault).
    pub(crate) async fn put_stream(
        &self,
        key: &str,
        len: u64,
        mut headers: HeaderMap,
        body: tokio::sync::mpsc::Receiver<std::result::Result<Bytes, std::io::Error>>,
        what: &str,
    ) -> Result<(Option<String>, Option<String>)> {
        headers.insert(http::header::CONTENT_LENGTH, HeaderValue::from(len));
        let (ended, body_ended) = tokio::sync::oneshot::channel::<()>();
        let frames =
            futures::stream::unfold((body, Some(ended)), |(mut rx, mut ended)| async move {
                match rx.recv().await {
                    Some(chunk) => Some((chunk.map(hyper::body::Frame::data), (rx, ended))),
                    None => {
                        if let Some(tx) = ended.take() {
                            let _ = tx.send(());
                        }
                        None
                    }
                }
            });
        let req = self
            .request(
                Method::PUT,
                Some(key),
                &[],
                headers,
                "UNSIGNED-PAYLOAD",
                what,
            )
            .await?
            .body(BodyExt::boxed(http_body_util::StreamBody::new(frames)))
            .map_err(|e| Error::invalid_input(format!("{what}: {e}")))?;
        let sent = self.client.request(req);
        let patience = async {
            // The body's sender gone without its end (an error, or dropped): the request fails by itself.
            let _ = body_ended.await;
            tokio::time::sleep(self.timeout).await;
        };
        let resp = tokio::select! {
            r = sent => r,
            _ = patience => {
                return Err(Error::new(
                    ErrorKind::Timeout,
                    format!("{what}: no response within {:?} of the body's end", self.timeout),
                ));
            }
        };
        let resp = self.answered(resp, what).await?;
        let text = |n: &str| resp.headers().get(n).map(|v| header_text(v.as_bytes()));
        Ok((text("etag"), text("x-amz-version-id")))
    }

    /// CopyObject of `from` to `to` in this bucket, server-side: with `headers` (the copy's attributes, with
    /// `x-amz-metadata-directive: REPLACE`) and conditions on the source. Returns the copy's ETag and
    /// version. S3 may answer 200 with an error in the body; that is an error here.
    pub(crate) async fn copy(
        &self,
        from: &str,
        to: &str,
        mut headers: HeaderMap,
        what: &str,
    ) -> Result<(Option<String>, Option<String>)> {
        let source = format!(
            "/{}/{}",
            self.bucket,
            sign::uri_encode(&format!("{}{from}", self.prefix), true)
        );
        headers.insert("x-amz-copy-source", header_value(&source, what)?);
        let resp = self.send(Method::PUT, Some(to), &[], headers, what).await?;
        self.etag_answer(resp, what).await
    }

    /// The ETag and version of a CopyObject's or CompleteMultipartUpload's answer, which S3 may give as 200
    /// with an error in the body: that is an error here, with its kind.
    async fn etag_answer(
        &self,
        resp: http::Response<hyper::body::Incoming>,
        what: &str,
    ) -> Result<(Option<String>, Option<String>)> {
        let version = resp
            .headers()
            .get("x-amz-version-id")
            .map(|v| header_text(v.as_bytes()));
        let body = read_limited(resp.into_body(), ERROR_BODY_LIMIT, self.timeout)
            .await
            .map_err(|e| e.context(what))?;
        #[derive(Deserialize, Default)]
        #[serde(rename_all = "PascalCase", default)]
        struct Answer {
            e_tag: Option<String>,
            code: Option<String>,
            message: Option<String>,
        }
        let r: Answer = quick_xml::de::from_reader(&body[..]).unwrap_or_default();
        if let Some(code) = r.code {
            let kind = match code.as_str() {
                "NoSuchKey" | "NoSuchUpload" => ErrorKind::NotFound,
                "PreconditionFailed" => ErrorKind::PreconditionFailed,
                "InvalidPart" | "InvalidPartOrder" | "EntityTooSmall" => ErrorKind::InvalidInput,
                _ => ErrorKind::Unavailable,
            };
            return Err(Error::new(
                kind,
                format!("{what}: {code}: {}", r.message.unwrap_or_default()),
            )
            .with_retryable(kind.default_retryable()));
        }
        Ok((r.e_tag, version))
    }

    /// CreateMultipartUpload of `key` with `headers` (its attributes); returns the upload id.
    pub(crate) async fn create_upload(
        &self,
        key: &str,
        headers: HeaderMap,
        what: &str,
    ) -> Result<String> {
        let q = [("uploads", String::new())];
        let resp = self
            .send(Method::POST, Some(key), &q, headers, what)
            .await?;
        let body = read_limited(resp.into_body(), ERROR_BODY_LIMIT, self.timeout)
            .await
            .map_err(|e| e.context(what))?;
        #[derive(Deserialize, Default)]
        #[serde(rename_all = "PascalCase", default)]
        struct Created {
            upload_id: Option<String>,
        }
        let r: Created = quick_xml::de::from_reader(&body[..]).unwrap_or_default();
        r.upload_id.ok_or_else(|| {
            Error::new(
                ErrorKind::Unavailable,
                format!("{what}: the answer has no upload id"),
            )
        })
    }

    /// UploadPart `n` of an upload; returns the part's ETag.
    pub(crate) async fn upload_part(
        &self,
        key: &str,
        upload_id: &str,
        n: usize,
        body: Bytes,
        what: &str,
    ) -> Result<String> {
        let q = [
            ("partNumber", n.to_string()),
            ("uploadId", upload_id.to_string()),
        ];
        let resp = self
            .send_body(Method::PUT, Some(key), &q, HeaderMap::new(), body, what)
            .await?;
        resp.headers()
            .get("etag")
            .map(|v| header_text(v.as_bytes()))
            .ok_or_else(|| {
                Error::new(
                    ErrorKind::Unavailable,
                    format!("{what}: part {n} answered without an ETag"),
                )
            })
    }

    /// CompleteMultipartUpload with these part ETags (parts 1..); returns the object's ETag and version.
    pub(crate) async fn complete_upload(
        &self,
        key: &str,
        upload_id: &str,
        etags: &[String],
        what: &str,
    ) -> Result<(Option<String>, Option<String>)> {
        let mut xml = String::from("<CompleteMultipartUpload>");
        for (i, e) in etags.iter().enumerate() {
            xml.push_str(&format!(
                "<Part><PartNumber>{}</PartNumber><ETag>{}</ETag></Part>",
                i + 1,
                e.replace('&', "&amp;")
                    .replace('<', "&lt;")
                    .replace('"', "&quot;")
            ));
        }
        xml.push_str("</CompleteMultipartUpload>");
        let q = [("uploadId", upload_id.to_string())];
        let resp = self
            .send_body(
                Method::POST,
                Some(key),
                &q,
                HeaderMap::new(),
                Bytes::from(xml),
                what,
            )
            .await?;
        self.etag_answer(resp, what).await
    }

    /// DELETE `key` (a missing key is deleted, as S3 says).
    pub(crate) async fn delete(&self, key: &str, what: &str) -> Result<()> {
        match self
            .send(Method::DELETE, Some(key), &[], HeaderMap::new(), what)
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Abort one multipart upload; one already gone counts as aborted.
    pub(crate) async fn abort(&self, key: &str, upload_id: &str, what: &str) -> Result<()> {
        let q = [("uploadId", upload_id.to_string())];
        match self
            .send(Method::DELETE, Some(key), &q, HeaderMap::new(), what)
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(()),
            Err(e) => Err(e),
        }
    }
}

/// How connections to the endpoint are made: directly, or through an HTTP proxy's `CONNECT` tunnel.
#[derive(Clone)]
enum Connect {
    Direct(HttpConnector),
    Proxied(hyper_util::client::legacy::connect::proxy::Tunnel<HttpConnector>),
}

type Conn = <HttpConnector as tower_service::Service<http::Uri>>::Response;
type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl tower_service::Service<http::Uri> for Connect {
    type Response = Conn;
    type Error = BoxError;
    type Future = std::pin::Pin<
        Box<dyn std::future::Future<Output = std::result::Result<Conn, BoxError>> + Send>,
    >;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::result::Result<(), BoxError>> {
        match self {
            Connect::Direct(c) => c.poll_ready(cx).map_err(Into::into),
            Connect::Proxied(t) => t.poll_ready(cx).map_err(Into::into),
        }
    }

    fn call(&mut self, dst: http::Uri) -> Self::Future {
        match self {
            Connect::Direct(c) => {
                let f = c.call(dst);
                Box::pin(async move { f.await.map_err(Into::into) })
            }
            Connect::Proxied(t) => {
                let f = t.call(dst);
                Box::pin(async move { f.await.map_err(Into::into) })
            }
        }
    }
}

/// TLS with the platform's roots, on the same crypto provider `object_store`'s client uses.
fn tls_config() -> Result<rustls::ClientConfig> {
    use rustls_platform_verifier::BuilderVerifierExt;
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .and_then(|b| b.with_platform_verifier())
        .map(|b| b.with_no_client_auth())
        .map_err(|e| Error::new(ErrorKind::Config, format!("TLS for S3: {e}")))
}

fn header_value(v: &str, what: &str) -> Result<HeaderValue> {
    HeaderValue::from_str(v).map_err(|e| Error::invalid_input(format!("{what}: header {v:?}: {e}")))
}

/// A header value as text: as it is when it is UTF-8, else RFC 2047-encoded with its bytes kept
/// (ISO-8859-1, in which every byte is a character).
fn header_text(v: &[u8]) -> String {
    use base64::Engine as _;
    match std::str::from_utf8(v) {
        Ok(s) => s.to_string(),
        Err(_) => format!(
            "=?ISO-8859-1?B?{}?=",
            base64::engine::general_purpose::STANDARD.encode(v)
        ),
    }
}

/// `bytes START-END/TOTAL` → (START, TOTAL).
fn parse_content_range(v: &str) -> Option<(u64, u64)> {
    let rest = v.trim().strip_prefix("bytes ")?;
    let (span, total) = rest.split_once('/')?;
    let (start, _) = span.split_once('-')?;
    Some((start.trim().parse().ok()?, total.trim().parse().ok()?))
}

/// S3's `encoding-type=url` value back to the key (`+` is a space, as in a form).
fn url_decode(s: &str, what: &str) -> Result<String> {
    let plus = s.replace('+', " ");
    percent_encoding::percent_decode_str(&plus)
        .decode_utf8()
        .map(|c| c.into_owned())
        .map_err(|e| {
            Error::new(
                ErrorKind::Unavailable,
                format!("{what}: listed key {s:?} is not UTF-8: {e}"),
            )
        })
}

/// A whole body of at most `limit` bytes.
async fn read_limited(
    body: hyper::body::Incoming,
    limit: usize,
    timeout: Duration,
) -> Result<Bytes> {
    let limited = http_body_util::Limited::new(body, limit);
    match tokio::time::timeout(timeout, limited.collect()).await {
        Err(_) => Err(Error::new(
            ErrorKind::Timeout,
            format!("response body not complete within {timeout:?}"),
        )),
        Ok(Err(e)) => Err(Error::new(
            ErrorKind::Unavailable,
            format!("response body: {e}"),
        )),
        Ok(Ok(c)) => Ok(c.to_bytes()),
    }
}

/// A response body as a stream of chunks; a stall longer than `timeout` or a cut connection ends it with an
/// `Unavailable` error item.
fn body_stream(
    body: hyper::body::Incoming,
    timeout: Duration,
    what: String,
) -> BoxStream<'static, Result<Bytes>> {
    futures::stream::unfold(Some(body), move |body| {
        let what = what.clone();
        async move {
            let mut body = body?;
            loop {
                match tokio::time::timeout(timeout, body.frame()).await {
                    Err(_) => {
                        let e = Error::new(
                            ErrorKind::Unavailable,
                            format!("{what}: no data for {timeout:?}"),
                        );
                        return Some((Err(e), None));
                    }
                    Ok(None) => return None,
                    Ok(Some(Err(e))) => {
                        let e = Error::new(ErrorKind::Unavailable, format!("{what}: {e}"));
                        return Some((Err(e), None));
                    }
                    Ok(Some(Ok(frame))) => {
                        if let Ok(data) = frame.into_data() {
                            return Some((Ok(data), Some(body)));
                        }
                    }
                }
            }
        }
    })
    .boxed()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_values_that_are_not_utf8_keep_their_bytes() {
        assert_eq!(header_text(b"plain"), "plain");
        assert_eq!(header_text("caf\u{e9}".as_bytes()), "caf\u{e9}");
        assert_eq!(header_text(b"caf\xe9"), "=?ISO-8859-1?B?Y2Fm6Q==?=");
    }

    #[test]
    fn content_ranges_and_listed_keys_are_read() {
        assert_eq!(parse_content_range("bytes 5-9/100"), Some((5, 100)));
        assert_eq!(parse_content_range("bytes */100"), None);
        assert_eq!(url_decode("a+b%2Bc%25d", "t").unwrap(), "a b+c%d");
    }
}
