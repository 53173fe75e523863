//! Reads: GetObject and HeadObject, through the cache's one read call ([`strata_cache::BlockCache::get`]);
//! the request's range and conditions become its [`GetOptions`].

use super::attributes::*;
use super::checksums::*;
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
    fn part_number(&self) -> Option<i32>;
    fn has_range(&self) -> bool;
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
            fn part_number(&self) -> Option<i32> {
                self.part_number
            }
            fn has_range(&self) -> bool {
                self.range.is_some()
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
        let backend = self.backend(input.bucket()).await?;
        check_read_key(&backend, input.key())?;
        self.tenancy
            .attribute(input.bucket(), input.key(), &who.caller, Role::Reader)
            .await?;
        let mut opts = if head {
            input.options().head()
        } else {
            input.options()
        };
        if let Some(n) = input.part_number() {
            opts = self
                .part_options(&who.ctx, &backend, input.key(), n, input.has_range(), opts)
                .await?;
        }
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

    /// `partNumber=n`: the range of part `n` of the object's current version (pinned: a version that
    /// changes after the part is found fails the read), from the part layout kept with it. An object written
    /// in one piece is its own part 1.
    async fn part_options(
        &self,
        ctx: &IoContext,
        backend: &Backend,
        key: &str,
        n: i32,
        ranged: bool,
        opts: GetOptions,
    ) -> S3Result<GetOptions> {
        if ranged {
            return Err(s3_error!(
                InvalidRequest,
                "Cannot specify both Range header and partNumber query parameter"
            ));
        }
        if !(1..=10_000).contains(&n) {
            return Err(s3_error!(
                InvalidArgument,
                "Part number must be an integer between 1 and 10000, inclusive"
            ));
        }
        let head = opts.clone().head();
        let found = self
            .agent
            .cache()
            .get(ctx, backend, key, head)
            .await
            .map_err(s3err)?;
        if found.not_modified {
            return Ok(opts);
        }
        let meta = found.meta;
        let parts = meta
            .attrs
            .as_deref()
            .map(|a| a.parts.clone())
            .unwrap_or_default();
        let unsatisfiable = || {
            let mut e = S3Error::with_message(
                S3ErrorCode::Custom("InvalidPartNumber".into()),
                "The requested partnumber is not satisfiable",
            );
            e.set_status_code(http::StatusCode::RANGE_NOT_SATISFIABLE);
            e
        };
        if parts.is_empty() {
            if meta
                .etag
                .as_deref()
                .is_some_and(|e| multipart_etag(e).is_some())
            {
                // Written as a multipart upload by another client of the origin: the part sizes were not
                // kept where Strata can read them.
                return Err(s3_error!(
                    NotImplemented,
                    "the part layout of this object is not known to the gateway (it was uploaded in parts by another client); read it by range"
                ));
            }
            return if n == 1 {
                Ok(opts.version(meta))
            } else {
                Err(unsatisfiable())
            };
        }
        let i = (n - 1) as usize;
        let Some(&size) = parts.get(i) else {
            return Err(unsatisfiable());
        };
        let first: u64 = parts[..i].iter().sum();
        let mut o = opts.version(meta);
        o.range = Some(if size == 0 {
            ByteRange::From { first }
        } else {
            ByteRange::Bounded {
                first,
                last: first + size - 1,
            }
        });
        Ok(o)
    }

    pub(super) async fn s3_get_object(
        &self,
        req: S3Request<GetObjectInput>,
    ) -> S3Result<S3Response<GetObjectOutput>> {
        let checksum_on = checksum_mode(&req.input.checksum_mode);
        let (input, res) = self.read_through_cache(req, false).await?;
        let now = self.agent.catalog().now();
        // One access-time record per object version and second: a hot object read thousands of times a
        // second takes the access log's lock once.
        if res.mark_read(now, crate::control::ACCESS_RESOLUTION_SECS) {
            self.agent
                .access_log()
                .record(&input.bucket, &input.key, now);
        }
        let (e_tag, last_modified) = (etag_of(&res.meta), timestamp(res.meta.last_modified_unix));
        let content_range = res.content_range();
        let len = res.range.end - res.range.start;
        let meta_attrs = res.meta.attrs.clone();
        // A body cut mid-stream (the object changed at the origin, the origin failed after its retries) reaches
        // the client only as a closed connection: said in the log, with the object and the cause.
        let (bucket, key) = (input.bucket.clone(), input.key.clone());
        let body = StreamingBlob::wrap(res.body.map_err(move |e| {
            tracing::warn!(%bucket, %key, kind = e.kind().as_str(), error = %e, "a GET was cut mid-body");
            std::io::Error::other(e.to_string())
        }));
        let a = attrs_out(&meta_attrs);
        let (parts_count, checksum) = part_answer(&a, input.part_number, checksum_on, res.partial);
        let mut out = GetObjectOutput {
            parts_count,
            expires: expires_out(&a),
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
        };
        if let Some(c) = checksum {
            out.checksum_type = checksum_fields!(out, c);
        }
        Ok(S3Response::new(out))
    }

    pub(super) async fn s3_head_object(
        &self,
        req: S3Request<HeadObjectInput>,
    ) -> S3Result<S3Response<HeadObjectOutput>> {
        let checksum_on = checksum_mode(&req.input.checksum_mode);
        let (input, res) = self.read_through_cache(req, true).await?;
        let content_range = res.content_range();
        let len = res.range.end - res.range.start;
        let meta = res.meta;
        let a = attrs_out(&meta.attrs);
        let (parts_count, checksum) = part_answer(&a, input.part_number, checksum_on, res.partial);
        let mut out = HeadObjectOutput {
            parts_count,
            expires: expires_out(&a),
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
        };
        if let Some(c) = checksum {
            out.checksum_type = checksum_fields!(out, c);
        }
        Ok(S3Response::new(out))
    }
}

/// `x-amz-checksum-mode: ENABLED`.
fn checksum_mode(m: &Option<ChecksumMode>) -> bool {
    m.as_ref()
        .is_some_and(|m| m.as_str().eq_ignore_ascii_case(ChecksumMode::ENABLED))
}

/// The number of parts of a multipart object's ETag (`<md5s' md5>-<n>`).
pub(super) fn multipart_etag(etag: &str) -> Option<usize> {
    let (_, n) = etag.trim_matches('"').rsplit_once('-')?;
    n.parse().ok()
}

/// What a GET or HEAD says of parts and checksums: `PartsCount` of a multipart object read by part
/// number; with checksum mode, the object's checksum for a whole read, a part's for a part read (none for
/// another range, as S3).
fn part_answer(
    a: &ObjectAttrs,
    part_number: Option<i32>,
    checksum_on: bool,
    partial: bool,
) -> (Option<i32>, Option<s3s::dto::Checksum>) {
    let multipart = !a.parts.is_empty();
    let count = (part_number.is_some() && multipart).then_some(a.parts.len() as i32);
    let checksum = a
        .checksum
        .as_ref()
        .filter(|_| checksum_on)
        .and_then(|c| match part_number {
            Some(n) if multipart => c
                .parts
                .get((n - 1) as usize)
                .map(|v| checksum_dto(c.algorithm, v.clone(), Some(c.kind()))),
            _ if partial && part_number.is_none() => None,
            _ => Some(checksum_dto(c.algorithm, c.value.clone(), Some(c.kind()))),
        });
    (count, checksum)
}

impl Gateway {
    /// GetObjectAttributes: what the request names of `ETag`, `Checksum`, `ObjectParts` (a multipart
    /// object's parts, paged by part number, with their checksums where kept), `StorageClass` and
    /// `ObjectSize`, from the object's metadata (through the cache, as HEAD).
    pub(super) async fn s3_get_object_attributes(
        &self,
        req: S3Request<GetObjectAttributesInput>,
    ) -> S3Result<S3Response<GetObjectAttributesOutput>> {
        let who = self.who(&req).await?;
        let input = req.input;
        if input.version_id.is_some() {
            return Err(s3_error!(
                NotImplemented,
                "versionId is not implemented: buckets here are not versioned"
            ));
        }
        let backend = self.backend(&input.bucket).await?;
        check_read_key(&backend, &input.key)?;
        self.tenancy
            .attribute(&input.bucket, &input.key, &who.caller, Role::Reader)
            .await?;
        let res = self
            .agent
            .cache()
            .get(&who.ctx, &backend, &input.key, GetOptions::default().head())
            .await
            .map_err(s3err)?;
        let meta = res.meta;
        let a = attrs_out(&meta.attrs);
        // `x-amz-object-attributes` is one comma-separated header, or several.
        let wants = |name: &str| {
            input
                .object_attributes
                .iter()
                .flat_map(|w| w.as_str().split(','))
                .any(|w| w.trim().eq_ignore_ascii_case(name))
        };
        let mut out = GetObjectAttributesOutput {
            last_modified: Some(timestamp(meta.last_modified_unix)),
            ..Default::default()
        };
        if wants(ObjectAttributes::ETAG) {
            out.e_tag = etag_of(&meta);
        }
        if wants(ObjectAttributes::OBJECT_SIZE) {
            out.object_size = Some(meta.size as i64);
        }
        if wants(ObjectAttributes::STORAGE_CLASS) {
            out.storage_class = Some(StorageClass::from_static(StorageClass::STANDARD));
        }
        if wants(ObjectAttributes::CHECKSUM)
            && let Some(c) = &a.checksum
        {
            out.checksum = Some(checksum_dto(c.algorithm, c.value.clone(), Some(c.kind())));
        }
        if wants(ObjectAttributes::OBJECT_PARTS) && !a.parts.is_empty() {
            let marker = input.part_number_marker.unwrap_or(0).max(0) as usize;
            let max = input.max_parts.unwrap_or(1000).clamp(1, 1000) as usize;
            let sums = a
                .checksum
                .as_ref()
                .filter(|c| c.parts.len() == a.parts.len());
            let parts: Vec<ObjectPart> = a
                .parts
                .iter()
                .enumerate()
                .skip(marker)
                .take(max)
                .map(|(i, &size)| {
                    let mut p = ObjectPart {
                        part_number: Some(i as i32 + 1),
                        size: Some(size as i64),
                        ..Default::default()
                    };
                    if let Some(c) = sums {
                        checksum_fields!(p, checksum_dto(c.algorithm, c.parts[i].clone(), None));
                    }
                    p
                })
                .collect();
            let last = parts.last().and_then(|p| p.part_number);
            let truncated = marker + parts.len() < a.parts.len();
            out.object_parts = Some(GetObjectAttributesParts {
                total_parts_count: Some(a.parts.len() as i32),
                part_number_marker: input.part_number_marker,
                next_part_number_marker: if truncated { last } else { None },
                max_parts: Some(max as i32),
                is_truncated: Some(truncated),
                parts: Some(parts),
            });
        }
        Ok(S3Response::new(out))
    }
}
