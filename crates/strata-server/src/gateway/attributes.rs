//! Object attributes on the wire: ETags, Content-Type and the other stored headers, user metadata, times.

use super::*;

pub(super) fn etag_of(meta: &ObjectMeta) -> Option<ETag> {
    meta.etag.as_deref().map(plain_etag)
}

/// Backends report ETags with or without quotes; S3 clients get one strong ETag.
pub(super) fn plain_etag(raw: &str) -> ETag {
    let v = raw.trim_start_matches("W/").trim_matches('"');
    ETag::Strong(v.to_string())
}

/// S3's limit on user metadata: names and values together, in bytes.
pub(super) const USER_METADATA_MAX: usize = 2048;

/// The attributes a write asks to keep (PutObject, CreateMultipartUpload, CopyObject with `REPLACE`). The
/// `aws-chunked` content coding of a streaming upload describes the request, not the object, and is dropped, as
/// S3 does; user metadata names are kept in lower case.
pub(super) fn attrs_in(
    content_type: Option<String>,
    content_encoding: Option<String>,
    content_disposition: Option<String>,
    content_language: Option<String>,
    cache_control: Option<String>,
    metadata: Option<Metadata>,
    expires: Option<Timestamp>,
) -> S3Result<ObjectAttrs> {
    let content_encoding = content_encoding.and_then(|e| {
        let kept: Vec<&str> = e
            .split(',')
            .map(str::trim)
            .filter(|c| !c.is_empty() && !c.eq_ignore_ascii_case("aws-chunked"))
            .collect();
        (!kept.is_empty()).then(|| kept.join(", "))
    });
    // `x-amz-meta-strataobject` is where a Strata gateway keeps its own record of an object (checksums,
    // parts): what a client sends there is never stored as such. Another Strata agent whose origin this is
    // sends its own record there; it is dropped and this gateway keeps the one it makes from this request.
    let user: std::collections::BTreeMap<String, String> = metadata
        .unwrap_or_default()
        .into_iter()
        .map(|(k, v)| (k.to_ascii_lowercase(), v))
        .filter(|(k, _)| k != strata_types::extras::RESERVED_META)
        .collect();
    let size: usize = user.iter().map(|(k, v)| k.len() + v.len()).sum();
    if size > USER_METADATA_MAX {
        return Err(s3_error!(
            MetadataTooLarge,
            "user metadata is {size} bytes; at most {USER_METADATA_MAX} are allowed"
        ));
    }
    Ok(ObjectAttrs {
        content_type,
        content_encoding,
        content_disposition,
        content_language,
        cache_control,
        user,
        expires: expires.map(|t| http_date(unix_of(&t))),
        ..Default::default()
    })
}

/// An HTTP date (`Expires`, as S3 returns it).
pub(super) fn http_date(unix: i64) -> String {
    httpdate::fmt_http_date(
        SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(unix.max(0) as u64),
    )
}

/// A stored `Expires` for the response (none when it is not an HTTP date: S3 itself sends such a value
/// as it was given, which s3s cannot).
pub(super) fn expires_out(a: &ObjectAttrs) -> Option<Timestamp> {
    a.expires
        .as_deref()
        .and_then(|e| httpdate::parse_http_date(e).ok())
        .map(Timestamp::from)
}

/// An object's attributes (none when it has none), for the response fields.
pub(super) fn attrs_out(attrs: &Option<Arc<ObjectAttrs>>) -> ObjectAttrs {
    attrs.as_deref().cloned().unwrap_or_default()
}

/// User metadata as the `x-amz-meta-*` response headers (none when empty).
pub(super) fn metadata_out(user: std::collections::BTreeMap<String, String>) -> Option<Metadata> {
    (!user.is_empty()).then(|| user.into_iter().collect())
}

/// [`attrs_in`] from a request input with the usual fields (PutObject, CreateMultipartUpload, CopyObject).
macro_rules! attrs_of_input {
    ($input:expr) => {
        attrs_in(
            $input.content_type,
            $input.content_encoding,
            $input.content_disposition,
            $input.content_language,
            $input.cache_control,
            $input.metadata,
            $input.expires,
        )
    };
}
pub(super) use attrs_of_input;

/// `501 NotImplemented` naming the first header of a write that asks for something Strata does not do
/// (server-side encryption, customer keys, ACL grants other than `private`, tagging, object lock, a storage
/// class other than `STANDARD`, website redirects): accepting and ignoring it would leave, say, an object
/// "encrypted with a customer key" readable without the key.
macro_rules! refuse_unimplemented {
    ($input:expr) => {{
        let i = &$input;
        let asked: [(&str, bool); 13] = [
            (
                "x-amz-server-side-encryption",
                i.server_side_encryption.is_some(),
            ),
            (
                "x-amz-server-side-encryption-customer-algorithm",
                i.sse_customer_algorithm.is_some(),
            ),
            (
                "x-amz-server-side-encryption-customer-key",
                i.sse_customer_key.is_some(),
            ),
            (
                "x-amz-server-side-encryption-aws-kms-key-id",
                i.ssekms_key_id.is_some(),
            ),
            (
                "x-amz-server-side-encryption-bucket-key-enabled",
                i.bucket_key_enabled == Some(true),
            ),
            (
                "x-amz-acl",
                i.acl.as_ref().is_some_and(|a| a.as_str() != "private"),
            ),
            (
                "x-amz-grant-*",
                i.grant_full_control.is_some()
                    || i.grant_read.is_some()
                    || i.grant_read_acp.is_some()
                    || i.grant_write_acp.is_some(),
            ),
            ("x-amz-tagging", i.tagging.is_some()),
            ("x-amz-object-lock-mode", i.object_lock_mode.is_some()),
            (
                "x-amz-object-lock-retain-until-date",
                i.object_lock_retain_until_date.is_some(),
            ),
            (
                "x-amz-object-lock-legal-hold",
                i.object_lock_legal_hold_status.is_some(),
            ),
            (
                "x-amz-storage-class",
                i.storage_class
                    .as_ref()
                    .is_some_and(|c| c.as_str() != "STANDARD"),
            ),
            (
                "x-amz-website-redirect-location",
                i.website_redirect_location.is_some(),
            ),
        ];
        match asked.iter().find(|(_, on)| *on) {
            Some((name, _)) => Err(s3s::s3_error!(
                NotImplemented,
                "{name} is not implemented by this gateway; the request was not carried out"
            )),
            None => Ok(()),
        }
    }};
}
pub(super) use refuse_unimplemented;

pub(super) fn timestamp(unix: i64) -> Timestamp {
    let t = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(unix.max(0) as u64);
    Timestamp::from(t)
}

pub(super) fn unix_of(t: &Timestamp) -> i64 {
    let odt: time::OffsetDateTime = t.clone().into();
    odt.unix_timestamp()
}
