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
) -> S3Result<ObjectAttrs> {
    let content_encoding = content_encoding.and_then(|e| {
        let kept: Vec<&str> = e
            .split(',')
            .map(str::trim)
            .filter(|c| !c.is_empty() && !c.eq_ignore_ascii_case("aws-chunked"))
            .collect();
        (!kept.is_empty()).then(|| kept.join(", "))
    });
    let user: std::collections::BTreeMap<String, String> = metadata
        .unwrap_or_default()
        .into_iter()
        .map(|(k, v)| (k.to_ascii_lowercase(), v))
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
    })
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
        )
    };
}
pub(super) use attrs_of_input;

pub(super) fn timestamp(unix: i64) -> Timestamp {
    let t = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(unix.max(0) as u64);
    Timestamp::from(t)
}

pub(super) fn unix_of(t: &Timestamp) -> i64 {
    let odt: time::OffsetDateTime = t.clone().into();
    odt.unix_timestamp()
}
