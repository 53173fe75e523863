//! Reads: GetObject and HeadObject, through the cache's one read call ([`strata_cache::BlockCache::get`]);
//! the request's range and conditions become its [`GetOptions`].

use super::attributes::*;
use super::*;

/// A GET's or HEAD's range and preconditions as the cache's read call takes them (the cache evaluates them,
/// in RFC 9110 order, as S3 does).
pub(super) fn get_options(
    range: Option<&s3s::dto::Range>,
    if_match: Option<&ETagCondition>,
    if_none_match: Option<&ETagCondition>,
    if_modified_since: Option<&Timestamp>,
    if_unmodified_since: Option<&Timestamp>,
) -> GetOptions {
    let tag = |c: &ETagCondition| match c {
        ETagCondition::Any => ETagMatch::Any,
        ETagCondition::ETag(ETag::Strong(v)) => ETagMatch::Strong(v.clone()),
        ETagCondition::ETag(ETag::Weak(v)) => ETagMatch::Weak(v.clone()),
    };
    let mut o = GetOptions::default();
    o.range = range.map(|r| match *r {
        s3s::dto::Range::Int {
            first,
            last: Some(last),
        } => ByteRange::Bounded { first, last },
        s3s::dto::Range::Int { first, last: None } => ByteRange::From { first },
        s3s::dto::Range::Suffix { length } => ByteRange::Suffix { len: length },
    });
    o.if_match = if_match.map(tag);
    o.if_none_match = if_none_match.map(tag);
    o.if_modified_since = if_modified_since.map(unix_of);
    o.if_unmodified_since = if_unmodified_since.map(unix_of);
    o
}

/// The fields of GetObject and HeadObject a read through the cache takes.
pub(super) trait ReadInput {
    fn bucket(&self) -> &str;
    fn key(&self) -> &str;
    fn options(&self) -> GetOptions;
}

macro_rules! read_input {
    ($t:ty) => {
        impl ReadInput for $t {
            fn bucket(&self) -> &str {
                &self.bucket
            }
            fn key(&self) -> &str {
                &self.key
            }
            fn options(&self) -> GetOptions {
                get_options(
                    self.range.as_ref(),
                    self.if_match.as_ref(),
                    self.if_none_match.as_ref(),
                    self.if_modified_since.as_ref(),
                    self.if_unmodified_since.as_ref(),
                )
            }
        }
    };
}
read_input!(GetObjectInput);
read_input!(HeadObjectInput);

impl Gateway {
    /// Who is calling, may they read the key, and the cache's answer (`head`: metadata only); 304 when a
    /// condition says "not modified".
    async fn read_through_cache<I: ReadInput>(
        &self,
        req: S3Request<I>,
        head: bool,
    ) -> S3Result<(I, strata_cache::GetResult)> {
        let who = self.who(&req).await?;
        let input = req.input;
        let backend = self.backend(input.bucket())?;
        check_read_key(&backend, input.key())?;
        self.tenancy
            .attribute(input.bucket(), input.key(), &who.caller, Role::Reader)
            .await?;
        let opts = if head {
            input.options().head()
        } else {
            input.options()
        };
        let res = self
            .agent
            .cache()
            .get(&who.ctx, &backend, input.key(), opts)
            .await
            .map_err(s3err)?;
        if res.not_modified {
            // As S3: a 304 names the version the client already has.
            let mut e = s3_error!(NotModified);
            let mut h = http::HeaderMap::new();
            if let Some(v) = res.meta.etag.as_deref().and_then(|t| {
                http::HeaderValue::from_str(&format!(
                    "\"{}\"",
                    t.trim_start_matches("W/").trim_matches('"')
                ))
                .ok()
            }) {
                h.insert(http::header::ETAG, v);
            }
            let modified = std::time::UNIX_EPOCH
                + std::time::Duration::from_secs(res.meta.last_modified_unix.max(0) as u64);
            if let Ok(v) = http::HeaderValue::from_str(&httpdate::fmt_http_date(modified)) {
                h.insert(http::header::LAST_MODIFIED, v);
            }
            e.set_headers(h);
            return Err(e);
        }
        Ok((input, res))
    }

    pub(super) async fn s3_get_object(
        &self,
        req: S3Request<GetObjectInput>,
    ) -> S3Result<S3Response<GetObjectOutput>> {
        let (input, res) = self.read_through_cache(req, false).await?;
        let now = self.agent.catalog().now();
        // One access-time record per object version and second: a hot object read thousands of times a
        // second takes the access log's lock once.
        if res.mark_read(now, ACCESS_RESOLUTION_SECS) {
            self.agent
                .access_log()
                .record(&input.bucket, &input.key, now);
        }
        let (e_tag, last_modified) = (etag_of(&res.meta), timestamp(res.meta.last_modified_unix));
        let content_range = res.content_range();
        let len = res.range.end - res.range.start;
        let meta_attrs = res.meta.attrs.clone();
        let body = StreamingBlob::wrap(res.body.map_err(|e| std::io::Error::other(e.to_string())));
        let a = attrs_out(&meta_attrs);
        Ok(S3Response::new(GetObjectOutput {
            body: Some(body),
            content_length: Some(len as i64),
            content_range,
            accept_ranges: Some("bytes".into()),
            e_tag,
            last_modified: Some(last_modified),
            // A signed request may override the stored headers (`response-content-type=` and the like).
            content_type: input.response_content_type.or(a.content_type),
            content_encoding: input.response_content_encoding.or(a.content_encoding),
            content_disposition: input.response_content_disposition.or(a.content_disposition),
            content_language: input.response_content_language.or(a.content_language),
            cache_control: input.response_cache_control.or(a.cache_control),
            metadata: metadata_out(a.user),
            ..Default::default()
        }))
    }

    pub(super) async fn s3_head_object(
        &self,
        req: S3Request<HeadObjectInput>,
    ) -> S3Result<S3Response<HeadObjectOutput>> {
        let (_, res) = self.read_through_cache(req, true).await?;
        let content_range = res.content_range();
        let len = res.range.end - res.range.start;
        let meta = res.meta;
        let a = attrs_out(&meta.attrs);
        Ok(S3Response::new(HeadObjectOutput {
            content_length: Some(len as i64),
            content_range,
            accept_ranges: Some("bytes".into()),
            e_tag: etag_of(&meta),
            last_modified: Some(timestamp(meta.last_modified_unix)),
            content_type: a.content_type,
            content_encoding: a.content_encoding,
            content_disposition: a.content_disposition,
            content_language: a.content_language,
            cache_control: a.cache_control,
            metadata: metadata_out(a.user),
            ..Default::default()
        }))
    }
}
