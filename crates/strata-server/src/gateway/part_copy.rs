//! UploadPartCopy: a part of a multipart upload copied from an object (all of it or a range), read
//! through the cache at the version its conditions saw and staged like any uploaded part.

use super::checksums::*;
use super::write::copy_source;
use super::*;

impl Gateway {
    pub(super) async fn s3_upload_part_copy(
        &self,
        req: S3Request<UploadPartCopyInput>,
    ) -> S3Result<S3Response<UploadPartCopyOutput>> {
        let who = self.who(&req).await?;
        let input = req.input;
        if !(1..=10_000).contains(&input.part_number) {
            return Err(s3_error!(InvalidArgument, "part numbers are 1..=10000"));
        }
        if input.copy_source_sse_customer_key.is_some() || input.sse_customer_key.is_some() {
            return Err(s3_error!(
                NotImplemented,
                "server-side encryption with customer keys is not implemented by this gateway; the request was not carried out"
            ));
        }
        let (src_bucket, src_key) = copy_source(&input.copy_source)?;
        let info =
            self.owner_check(&input.upload_id, &input.bucket, &input.key, &who.access_key)?;
        let (src, team) = self
            .copy_access(
                &who.caller,
                (&src_bucket, &src_key),
                (&input.bucket, &input.key),
            )
            .await?;
        // The source's conditions, as S3 weighs them: if-match over if-unmodified-since, if-none-match over
        // if-modified-since.
        let mut opts = read::get_options(
            None,
            input.copy_source_if_match.as_ref(),
            input.copy_source_if_none_match.as_ref(),
            input.copy_source_if_modified_since.as_ref(),
            input.copy_source_if_unmodified_since.as_ref(),
        );
        let found = self
            .agent
            .cache()
            .get(&who.ctx, &src, &src_key, opts.clone().head())
            .await
            .map_err(s3err)?;
        if found.not_modified {
            // A copy source's if-none-match / if-modified-since that holds is a failed precondition.
            return Err(s3_error!(PreconditionFailed));
        }
        let meta = found.meta;
        let (first, last) = match &input.copy_source_range {
            None => (0, meta.size.saturating_sub(1)),
            Some(r) => copy_range(r, meta.size)?,
        };
        let len = if meta.size == 0 { 0 } else { last - first + 1 };
        if input.copy_source_range.is_some() && len > 5 * 1024 * 1024 * 1024 {
            return Err(s3_error!(
                InvalidArgument,
                "a part copied from a range is at most 5 GiB"
            ));
        }
        if team.is_some() {
            self.tenancy
                .admit_part(
                    team.as_deref(),
                    &input.bucket,
                    &input.upload_id,
                    input.part_number,
                    len as i64,
                )
                .await?;
        }
        opts.if_none_match = None;
        opts.if_modified_since = None;
        let mut opts = opts.version(meta.clone());
        if meta.size > 0 {
            opts.range = Some(ByteRange::Bounded { first, last });
        }
        let body = match self.agent.cache().get(&who.ctx, &src, &src_key, opts).await {
            Ok(r) => r.body.map_err(s3err).boxed(),
            Err(e) => {
                self.tenancy
                    .release_part(&input.upload_id, input.part_number)
                    .await;
                return Err(s3err(e));
            }
        };
        let check = BodyCheck::new(None, None, None, None, None, None, None)?
            .keeping(info.checksum)
            .with_declared_length(Some(len));
        let (md5, sum) = self
            .stage_part(
                &input.upload_id,
                input.part_number,
                &info,
                Some(body),
                check,
            )
            .await?;
        let mut result = CopyPartResult {
            e_tag: Some(ETag::Strong(md5)),
            last_modified: Some(Timestamp::from(SystemTime::now())),
            ..Default::default()
        };
        if let Some((alg, v)) = sum {
            checksum_fields!(result, checksum_dto(alg, v, None));
        }
        Ok(S3Response::new(UploadPartCopyOutput {
            copy_part_result: Some(result),
            copy_source_version_id: None,
            ..Default::default()
        }))
    }
}

/// `x-amz-copy-source-range: bytes=first-last`, inclusive and within the source, as S3 requires.
fn copy_range(r: &str, size: u64) -> S3Result<(u64, u64)> {
    let bad = || {
        s3_error!(
            InvalidArgument,
            "The x-amz-copy-source-range value must be of the form bytes=first-last where first and last are the zero-based offsets of the first and last bytes to copy"
        )
    };
    let (a, b) = r
        .trim()
        .strip_prefix("bytes=")
        .and_then(|v| v.split_once('-'))
        .ok_or_else(bad)?;
    let (first, last): (u64, u64) = (
        a.trim().parse().map_err(|_| bad())?,
        b.trim().parse().map_err(|_| bad())?,
    );
    if first > last {
        return Err(bad());
    }
    if last >= size {
        let mut e = S3Error::with_message(
            S3ErrorCode::InvalidRange,
            format!("Range specified is not valid for source object of size: {size}"),
        );
        e.set_status_code(http::StatusCode::BAD_REQUEST);
        return Err(e);
    }
    Ok((first, last))
}
