//! Writes: PutObject, DeleteObject, DeleteObjects, CopyObject, and the store every write goes through
//! (quota admission, checksum checks, inventory).

use super::attributes::*;
use super::checksums::*;
use super::*;
use crate::cluster::coherence::Change;

impl Gateway {
    /// Store a body at `bucket/key`: buffered for small bodies, streamed as a backend multipart upload for
    /// large ones; checksums are verified before anything becomes visible. The checksum the request named
    /// or sent is kept with the object (for a streamed body, when its value came up front or the backend is
    /// a local directory, which takes attributes on completion). Returns the ETag, the bytes received and
    /// the body's verified checksums.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn store(
        &self,
        ctx: &IoContext,
        backend: &Backend,
        key: &str,
        body: StreamingBlob,
        mut check: BodyCheck,
        mode: PutMode,
        attrs: &ObjectAttrs,
        len: Option<u64>,
    ) -> S3Result<(Option<String>, u64, Verified)> {
        let mut body = body;
        let mut attrs = attrs.clone();
        let mut buf: Vec<Bytes> = Vec::new();
        let mut buffered = 0usize;
        let mut received = 0u64;
        let mut upload: Option<Upload> = None;
        while let Some(chunk) = body.next().await {
            let chunk = match chunk {
                Ok(c) => c,
                Err(e) => {
                    if let Some(up) = upload.take() {
                        up.abort().await;
                    }
                    return Err(s3_error!(IncompleteBody, "reading the request body: {e}"));
                }
            };
            if let Err(e) = check.update(&chunk) {
                if let Some(up) = upload.take() {
                    up.abort().await;
                }
                return Err(e);
            }
            received += chunk.len() as u64;
            match upload.as_mut() {
                None if buffered + chunk.len() <= SINGLE_PUT_MAX => {
                    buffered += chunk.len();
                    buf.push(chunk);
                }
                None => {
                    if mode != PutMode::Overwrite {
                        return Err(s3_error!(
                            NotImplemented,
                            "conditional writes are limited to 8 MiB bodies"
                        ));
                    }
                    attrs.checksum = check.declared_checksum();
                    let mut up = self.upload(ctx, backend, key, &attrs, len).await?;
                    for b in buf.drain(..) {
                        up.write(b).await?;
                    }
                    up.write(chunk).await?;
                    upload = Some(up);
                }
                Some(up) => up.write(chunk).await?,
            }
        }
        let verified = check.finish();
        match upload {
            Some(Upload::Single(mut up)) => {
                if let Err(e) = verified {
                    up.abort().await;
                    return Err(e);
                }
                let verified = verified?;
                Ok((up.finish().await.map_err(s3err)?.etag, received, verified))
            }
            Some(Upload::Parts(mut up)) => {
                let verified = match verified {
                    Ok(v) => v,
                    Err(e) => {
                        let _ = up.abort().await;
                        return Err(e);
                    }
                };
                if let Some((alg, v)) = &verified.checksum {
                    attrs.checksum = Some(stored_full(*alg, v.clone()));
                    up.set_local_attrs(&attrs);
                }
                up.set_etag(verified.md5.clone());
                Ok((up.complete().await.map_err(s3err)?.etag, received, verified))
            }
            None => {
                let verified = verified?;
                attrs.checksum = verified
                    .checksum
                    .as_ref()
                    .map(|(alg, v)| stored_full(*alg, v.clone()));
                let mut all = Vec::with_capacity(buffered);
                for b in &buf {
                    all.extend_from_slice(b);
                }
                Ok((
                    backend
                        .put_with_etag(
                            ctx,
                            key,
                            Bytes::from(all),
                            mode,
                            &attrs,
                            Some(verified.md5.clone()),
                        )
                        .await
                        .map_err(s3err)?
                        .etag,
                    received,
                    verified,
                ))
            }
        }
    }

    /// Where a body too large to buffer goes: one PUT streamed to the origin when its length is known and
    /// the backend has such a request (S3: the object keeps the ETag of a single PUT, its MD5), else a
    /// multipart upload.
    async fn upload(
        &self,
        ctx: &IoContext,
        backend: &Backend,
        key: &str,
        attrs: &ObjectAttrs,
        len: Option<u64>,
    ) -> S3Result<Upload> {
        if let Some(n) = len
            && let Some(up) = backend.put_stream(ctx, key, n, attrs).map_err(s3err)?
        {
            return Ok(Upload::Single(up));
        }
        let mut up = backend
            .put_multipart_with(ctx, key, BACKEND_PART, attrs)
            .await
            .map_err(s3err)?;
        // The body's MD5 is the check's (the ETag where the backend takes one).
        up.defer_etag();
        Ok(Upload::Parts(Box::new(up)))
    }

    pub(super) async fn s3_put_object(
        &self,
        req: S3Request<PutObjectInput>,
    ) -> S3Result<S3Response<PutObjectOutput>> {
        let who = self.who(&req).await?;
        let ctx = who.ctx.clone();
        let decoded_len = decoded_length(&req.headers)?;
        let trailers = req.trailing_headers;
        let req_headers = req.headers;
        let input = req.input;
        refuse_unimplemented!(input)?;
        let _writing = self.created.begin_write(&input.bucket)?;
        let backend = self.backend(&input.bucket).await?;
        check_write_key(&backend, &input.key)?;
        let team = self
            .tenancy
            .attribute(&input.bucket, &input.key, &who.caller, Role::Member)
            .await?;
        // The body's exact length, when the request says it (a streamed single PUT to the origin needs it).
        let exact_len = decoded_len.or(input.content_length.and_then(|n| u64::try_from(n).ok()));
        let size = match decoded_len.map(|n| n as i64).or(input.content_length) {
            Some(n) => n,
            None if team.is_some() => {
                return Err(s3_error!(
                    MissingContentLength,
                    "a write charged to a quota needs its Content-Length"
                ));
            }
            None => 0,
        };
        // Quota before bytes: admitted (reserved) before the body is read.
        let res = self
            .tenancy
            .admit(team.as_deref(), &input.bucket, size, 1)
            .await?;
        let mode = match (&input.if_none_match, &input.if_match) {
            (Some(c), _) if c.is_any() => PutMode::Create,
            (_, Some(ETagCondition::ETag(e))) => PutMode::IfMatch(format!("\"{}\"", e.value())),
            (None, None) => PutMode::Overwrite,
            _ => return Err(s3_error!(NotImplemented, "unsupported conditional write")),
        };
        let check = BodyCheck::new(
            input.content_md5,
            input.checksum_algorithm.as_ref(),
            input.checksum_crc32,
            input.checksum_crc32c,
            input.checksum_sha1,
            input.checksum_sha256,
            input.checksum_crc64nvme,
        )?
        .keeping_trailer(&req_headers)
        .with_trailers(trailers)
        .with_declared_length(decoded_len);
        let attrs = attrs_of_input!(input);
        let attrs = match attrs {
            Ok(a) => a,
            Err(e) => {
                self.tenancy.release(res).await;
                return Err(e);
            }
        };
        let body = input.body.unwrap_or_else(|| {
            StreamingBlob::wrap(futures::stream::empty::<Result<Bytes, std::io::Error>>())
        });
        let etag = self
            .store(
                &ctx, &backend, &input.key, body, check, mode, &attrs, exact_len,
            )
            .await;
        // Whatever happened at the backend, the next read asks it again, here and at every member.
        self.agent
            .announce(vec![Change::key(backend.id(), &input.key)])
            .await;
        let (etag, received, verified) = match etag {
            Ok(e) => e,
            Err(e) => {
                self.tenancy.release(res).await;
                return Err(e);
            }
        };
        if let Err(e) = self
            .still_there(&ctx, &input.bucket, &backend, &input.key)
            .await
        {
            self.tenancy.release(res).await;
            return Err(e);
        }
        // Charged what was stored (a streaming upload's Content-Length counts its chunk framing too).
        self.tenancy
            .written(
                res.into_iter().collect(),
                &input.bucket,
                &input.key,
                received as i64,
                etag.clone(),
                team,
                &who.caller,
                ctx.job.as_deref().map(str::to_string),
                who.dataset.clone(),
            )
            .await;
        let mut out = PutObjectOutput {
            e_tag: etag.as_deref().map(plain_etag),
            ..Default::default()
        };
        if let Some((alg, v)) = verified.checksum {
            out.checksum_type =
                checksum_fields!(out, checksum_dto(alg, v, Some(ChecksumType::FULL_OBJECT)));
        }
        Ok(S3Response::new(out))
    }

    pub(super) async fn s3_delete_object(
        &self,
        req: S3Request<DeleteObjectInput>,
    ) -> S3Result<S3Response<DeleteObjectOutput>> {
        let who = self.who(&req).await?;
        let ctx = who.ctx;
        let backend = self.backend(&req.input.bucket).await?;
        check_write_key(&backend, &req.input.key)?;
        self.tenancy
            .attribute(&req.input.bucket, &req.input.key, &who.caller, Role::Member)
            .await?;
        let i = &req.input;
        if i.if_match.is_some()
            || i.if_match_last_modified_time.is_some()
            || i.if_match_size.is_some()
        {
            // The backends have no conditional delete: refused, never a delete that ignores the condition.
            return Err(s3_error!(
                NotImplemented,
                "conditional DeleteObject (If-Match, x-amz-if-match-*) is not implemented; nothing was deleted"
            ));
        }
        let r = backend.delete(&ctx, &req.input.key).await;
        self.agent
            .announce(vec![Change::key(backend.id(), &req.input.key)])
            .await;
        r.map_err(s3err)?;
        self.tenancy
            .deleted(&req.input.bucket, &req.input.key)
            .await;
        Ok(S3Response::new(DeleteObjectOutput::default()))
    }

    pub(super) async fn s3_delete_objects(
        &self,
        req: S3Request<DeleteObjectsInput>,
    ) -> S3Result<S3Response<DeleteObjectsOutput>> {
        let who = self.who(&req).await?;
        let ctx = who.ctx;
        let input = req.input;
        let backend = self.backend(&input.bucket).await?;
        if input.delete.objects.len() > 1000 {
            return Err(s3_error!(
                MalformedXML,
                "at most 1000 keys per DeleteObjects request"
            ));
        }
        let quiet = input.delete.quiet.unwrap_or(false);
        let (mut deleted, mut errors) = (Vec::new(), Vec::new());
        let mut changed = Vec::new();
        for o in input.delete.objects {
            let conditional =
                o.e_tag.is_some() || o.last_modified_time.is_some() || o.size.is_some();
            let r = match backend.check_write_key(&o.key) {
                Ok(_) if conditional => Err(Error::new(
                    ErrorKind::Unsupported,
                    "a conditional delete (ETag, LastModifiedTime, Size) is not implemented; not deleted",
                )),
                Ok(_) => {
                    match self
                        .tenancy
                        .attribute(&input.bucket, &o.key, &who.caller, Role::Member)
                        .await
                    {
                        Ok(_) => {
                            let r = backend.delete(&ctx, &o.key).await;
                            changed.push(Change::key(backend.id(), &o.key));
                            if r.is_ok() {
                                self.tenancy.deleted(&input.bucket, &o.key).await;
                            }
                            r
                        }
                        Err(e) => Err(Error::new(
                            ErrorKind::PermissionDenied,
                            e.message().unwrap_or("access denied").to_string(),
                        )),
                    }
                }
                Err(e) => Err(e),
            };
            match r {
                Ok(()) if !quiet => deleted.push(DeletedObject {
                    key: Some(o.key),
                    ..Default::default()
                }),
                Ok(()) => {}
                Err(e) => {
                    let s3 = s3err(e);
                    errors.push(s3s::dto::Error {
                        key: Some(o.key),
                        code: Some(s3.code().as_str().to_string()),
                        message: s3.message().map(str::to_string),
                        ..Default::default()
                    });
                }
            }
        }
        // One announcement for the request's keys, before the answer.
        self.agent.announce(changed).await;
        Ok(S3Response::new(DeleteObjectsOutput {
            deleted: Some(deleted),
            errors: Some(errors),
            ..Default::default()
        }))
    }

    pub(super) async fn s3_copy_object(
        &self,
        req: S3Request<CopyObjectInput>,
    ) -> S3Result<S3Response<CopyObjectOutput>> {
        let who = self.who(&req).await?;
        let ctx = who.ctx.clone();
        let input = req.input;
        refuse_unimplemented!(input)?;
        let (src_bucket, src_key) = copy_source(&input.copy_source)?;
        let _writing = self.created.begin_write(&input.bucket)?;
        let dst = self.backend(&input.bucket).await?;
        check_write_key(&dst, &input.key)?;
        let (src, team) = self
            .copy_access(
                &who.caller,
                (&src_bucket, &src_key),
                (&input.bucket, &input.key),
            )
            .await?;
        let meta = src.head(&ctx, &src_key).await.map_err(s3err)?;
        // `REPLACE` gives the copy the request's attributes; `COPY` (the default) keeps the source's.
        let replace = input
            .metadata_directive
            .as_ref()
            .is_some_and(|d| d.as_str().eq_ignore_ascii_case(MetadataDirective::REPLACE));
        let new_attrs = if replace {
            Some(attrs_of_input!(input)?)
        } else {
            None
        };
        if src_bucket == input.bucket && src_key == input.key && !replace {
            return Err(s3_error!(
                InvalidRequest,
                "This copy request is illegal because it is trying to copy an object to itself without changing \
                 the object's metadata, storage class, website redirect location or encryption attributes."
            ));
        }
        let matches = |c: &ETagCondition| match c {
            ETagCondition::Any => true,
            ETagCondition::ETag(e) => etag_of(&meta).is_some_and(|cur| cur.strong_cmp(e)),
        };
        if input
            .copy_source_if_match
            .as_ref()
            .is_some_and(|c| !matches(c))
            || input
                .copy_source_if_none_match
                .as_ref()
                .is_some_and(matches)
        {
            return Err(s3_error!(PreconditionFailed));
        }
        let wanted = algorithm_of(input.checksum_algorithm.as_ref())?;
        let res = self
            .tenancy
            .admit(team.as_deref(), &input.bucket, meta.size as i64, 1)
            .await?;
        let copied = self
            .copy_bytes(
                &ctx,
                &src,
                &dst,
                (&src_bucket, &src_key),
                (&input.bucket, &input.key),
                &meta,
                new_attrs,
                wanted,
            )
            .await;
        if let Err(e) = copied {
            self.tenancy.release(res).await;
            return Err(e);
        }
        self.agent
            .announce(vec![Change::key(dst.id(), &input.key)])
            .await;
        let new = dst.head(&ctx, &input.key).await.map_err(s3err)?;
        self.tenancy
            .written(
                res.into_iter().collect(),
                &input.bucket,
                &input.key,
                new.size as i64,
                new.etag.clone(),
                team,
                &who.caller,
                ctx.job.as_deref().map(str::to_string),
                who.dataset.clone(),
            )
            .await;
        let mut result = CopyObjectResult {
            e_tag: etag_of(&new),
            last_modified: Some(timestamp(new.last_modified_unix)),
            ..Default::default()
        };
        if let Some(c) = new.attrs.as_deref().and_then(|a| a.checksum.clone()) {
            let kind = c.kind();
            result.checksum_type =
                checksum_fields!(result, checksum_dto(c.algorithm, c.value, Some(kind)));
        }
        Ok(S3Response::new(CopyObjectOutput {
            copy_object_result: Some(result),
            ..Default::default()
        }))
    }
}

/// The bucket and key a copy reads (CopyObject, UploadPartCopy): a version id is refused, as nothing here is
/// versioned (copying the current version instead would copy other bytes than asked for).
pub(super) fn copy_source(c: &CopySource) -> S3Result<(String, String)> {
    match c {
        CopySource::Bucket {
            bucket,
            key,
            version_id: None,
        } => Ok((bucket.to_string(), key.to_string())),
        CopySource::Bucket { .. } => Err(s3_error!(
            NotImplemented,
            "copy sources with a versionId are not implemented: buckets here are not versioned"
        )),
        _ => Err(s3_error!(NotImplemented, "copy sources must be bucket/key")),
    }
}

/// A copy's attributes, as S3 gives them: the request's (`REPLACE`) or the source's, written in one piece
/// (no part layout), with the source's checksum when it is of all the bytes (the copy's bytes are the same)
/// and none when it was composite (it names parts the copy does not have).
fn copy_attrs(source: &ObjectMeta, replace: Option<ObjectAttrs>) -> ObjectAttrs {
    let src = source.attrs.as_deref().cloned().unwrap_or_default();
    let mut a = replace.unwrap_or_else(|| src.clone());
    a.parts.clear();
    a.checksum = src.checksum.filter(|c| c.full_object);
    a
}

impl Gateway {
    /// Whether `caller` may read a copy's source and write its destination: the source's backend, and the
    /// team the destination is charged to.
    pub(super) async fn copy_access(
        &self,
        caller: &Caller,
        (src_bucket, src_key): (&str, &str),
        (dst_bucket, dst_key): (&str, &str),
    ) -> S3Result<(Backend, Option<String>)> {
        let src = self.backend(src_bucket).await?;
        check_read_key(&src, src_key)?;
        self.tenancy
            .attribute(src_bucket, src_key, caller, Role::Reader)
            .await?;
        let team = self
            .tenancy
            .attribute(dst_bucket, dst_key, caller, Role::Member)
            .await?;
        Ok((src, team))
    }

    /// The byte-moving half of CopyObject: server-side on S3 (S3's own copy, with the copy's attributes) and,
    /// keeping the source's attributes, within any other backend; otherwise through the cache, in one write
    /// up to 8 MiB (so the copy's ETag is its content's MD5, as S3's) and as a multipart upload beyond.
    /// `wanted` is a checksum algorithm the copy must have (`x-amz-checksum-algorithm`), computed from the
    /// bytes when the source's is another.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn copy_bytes(
        &self,
        ctx: &IoContext,
        src: &Backend,
        dst: &Backend,
        (src_bucket, src_key): (&str, &str),
        (dst_bucket, dst_key): (&str, &str),
        meta: &ObjectMeta,
        replace: Option<ObjectAttrs>,
        wanted: Option<StrataAlgorithm>,
    ) -> S3Result<()> {
        let ctx = ctx.clone();
        let replaced = replace.is_some();
        let mut attrs = copy_attrs(meta, replace);
        let compute = wanted.filter(|w| attrs.checksum.as_ref().map(|c| c.algorithm) != Some(*w));
        if src_bucket == dst_bucket && compute.is_none() {
            if src
                .copy_with(&ctx, src_key, dst_key, &attrs, meta.etag.as_deref())
                .await
                .map_err(s3err)?
                .is_some()
            {
                return Ok(());
            }
            let same = meta.attrs.as_deref().cloned().unwrap_or_default() == attrs;
            if !replaced && same {
                // Server-side: the backend keeps the source's attributes with the copy, which are the copy's.
                src.copy(&ctx, src_key, dst_key).await.map_err(s3err)?;
                return Ok(());
            }
        }
        // The source's version as the copy saw it: a source changed meanwhile fails the copy.
        let opts = strata_cache::GetOptions::default().version(meta.clone());
        let mut body = self
            .agent
            .cache()
            .get(&ctx, src, src_key, opts)
            .await
            .map_err(s3err)?
            .body;
        let mut sum = compute.map(hasher_for);
        if meta.size as usize <= SINGLE_PUT_MAX {
            let mut all = Vec::with_capacity(meta.size as usize);
            while let Some(chunk) = body.next().await {
                all.extend_from_slice(&chunk.map_err(s3err)?);
            }
            if let (Some(h), Some(alg)) = (sum.as_mut(), compute) {
                h.update(&all);
                let v = pick(&std::mem::take(h).finalize(), alg).cloned();
                attrs.checksum = v.map(|v| stored_full(alg, v));
            }
            dst.put_with(&ctx, dst_key, Bytes::from(all), PutMode::Overwrite, &attrs)
                .await
                .map_err(s3err)?;
            return Ok(());
        }
        if compute.is_some() {
            // Known only once every byte passed: kept where the backend takes attributes on completion.
            attrs.checksum = None;
        }
        let mut up = dst
            .put_multipart_with(&ctx, dst_key, BACKEND_PART, &attrs)
            .await
            .map_err(s3err)?;
        while let Some(chunk) = body.next().await {
            match chunk {
                Ok(b) if b.is_empty() => {}
                Ok(b) => {
                    if let Some(h) = sum.as_mut() {
                        h.update(&b);
                    }
                    up.write(b).await.map_err(s3err)?
                }
                Err(e) => {
                    let _ = up.abort().await;
                    return Err(s3err(e));
                }
            }
        }
        if let (Some(h), Some(alg)) = (sum, compute) {
            attrs.checksum = pick(&h.finalize(), alg)
                .cloned()
                .map(|v| stored_full(alg, v));
            up.set_local_attrs(&attrs);
        }
        up.complete().await.map_err(s3err)?;
        Ok(())
    }
}

/// A body past what is buffered, on its way to the backend ([`Gateway::store`]).
enum Upload {
    /// One PUT, sent as the body arrives.
    Single(strata_object::StreamPut),
    /// A multipart upload.
    Parts(Box<strata_object::MultipartUpload>),
}

impl Upload {
    async fn write(&mut self, chunk: Bytes) -> S3Result<()> {
        let r = match self {
            Self::Single(up) => up.write(chunk).await,
            Self::Parts(up) => up.write(chunk).await,
        };
        r.map_err(s3err)
    }

    async fn abort(self) {
        match self {
            Self::Single(mut up) => up.abort().await,
            Self::Parts(up) => {
                let _ = up.abort().await;
            }
        }
    }
}
