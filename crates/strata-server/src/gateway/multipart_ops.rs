//! Multipart uploads as S3 operations: Create, UploadPart, ListParts, Complete, Abort (the staging of parts
//! is [`super::multipart`]), and the assembly of a completed upload.

use super::attributes::*;
use super::checksums::*;
use super::*;
use crate::cluster::coherence::Change;

impl Gateway {
    pub(super) async fn s3_create_multipart_upload(
        &self,
        req: S3Request<CreateMultipartUploadInput>,
    ) -> S3Result<S3Response<CreateMultipartUploadOutput>> {
        let who = self.who(&req).await?;
        let owner = who.access_key.clone();
        let input = req.input;
        refuse_unimplemented!(input)?;
        let backend = self.backend(&input.bucket).await?;
        check_write_key(&backend, &input.key)?;
        self.tenancy
            .attribute(&input.bucket, &input.key, &who.caller, Role::Member)
            .await?;
        let checksum = algorithm_of(input.checksum_algorithm.as_ref())?;
        let full_object = upload_checksum_type(checksum, input.checksum_type.as_ref())?;
        let id = self
            .staging
            .create(&UploadInfo {
                bucket: input.bucket.clone(),
                key: input.key.clone(),
                owner,
                attrs: attrs_of_input!(input)?,
                checksum,
                full_object,
            })
            .map_err(s3err)?;
        Ok(S3Response::new(CreateMultipartUploadOutput {
            bucket: Some(input.bucket),
            key: Some(input.key),
            upload_id: Some(id),
            checksum_algorithm: input.checksum_algorithm,
            checksum_type: checksum.map(|_| checksum_type_of(full_object)),
            ..Default::default()
        }))
    }

    pub(super) async fn s3_upload_part(
        &self,
        req: S3Request<UploadPartInput>,
    ) -> S3Result<S3Response<UploadPartOutput>> {
        let who = self.who(&req).await?;
        let owner = who.access_key.clone();
        let decoded_len = decoded_length(&req.headers)?;
        let trailers = req.trailing_headers;
        let req_headers = req.headers;
        let input = req.input;
        if !(1..=10_000).contains(&input.part_number) {
            return Err(s3_error!(InvalidArgument, "part numbers are 1..=10000"));
        }
        let info = self.owner_check(&input.upload_id, &input.bucket, &input.key, &owner)?;
        let team = self
            .tenancy
            .attribute(&input.bucket, &input.key, &who.caller, Role::Member)
            .await?;
        if team.is_some() {
            let Some(len) = decoded_len.map(|n| n as i64).or(input.content_length) else {
                return Err(s3_error!(
                    MissingContentLength,
                    "a part charged to a quota needs its Content-Length"
                ));
            };
            // Quota before bytes: each part is admitted before it is read.
            self.tenancy
                .admit_part(
                    team.as_deref(),
                    &input.bucket,
                    &input.upload_id,
                    input.part_number,
                    len,
                )
                .await?;
        }
        let check = BodyCheck::new(
            input.content_md5,
            input.checksum_algorithm.as_ref(),
            input.checksum_crc32,
            input.checksum_crc32c,
            input.checksum_sha1,
            input.checksum_sha256,
            input.checksum_crc64nvme,
        )?
        .keeping(info.checksum)
        .keeping_trailer(&req_headers)
        .with_trailers(trailers)
        .with_declared_length(decoded_len);
        let body = input.body.map(|b| {
            b.map_err(|e| s3_error!(IncompleteBody, "reading the part: {e}"))
                .boxed()
        });
        let (md5, sum) = self
            .stage_part(&input.upload_id, input.part_number, &info, body, check)
            .await?;
        let mut out = UploadPartOutput {
            e_tag: Some(ETag::Strong(md5)),
            ..Default::default()
        };
        if let Some((alg, v)) = sum {
            checksum_fields!(out, checksum_dto(alg, v, None));
        }
        Ok(S3Response::new(out))
    }

    /// Stage part `n` of an upload from `body`, verified by `check`: written to a temporary file, published
    /// under its MD5 (and the upload's checksum) once whole. A failed part gives its quota admission back, and
    /// so does one whose upload was aborted meanwhile. Returns the part's MD5 and kept checksum.
    pub(super) async fn stage_part(
        &self,
        upload_id: &str,
        n: i32,
        info: &UploadInfo,
        body: Option<futures::stream::BoxStream<'_, S3Result<Bytes>>>,
        mut check: BodyCheck,
    ) -> S3Result<(String, Option<(StrataAlgorithm, String)>)> {
        let tmp = self.staging.temp_part_path(upload_id, n).map_err(s3err)?;
        let result = async {
            let mut f = tokio::fs::File::create(&tmp)
                .await
                .map_err(|e| s3err(Error::from_io(e, "staging a part")))?;
            if let Some(mut body) = body {
                while let Some(chunk) = body.next().await {
                    let chunk = chunk?;
                    check.update(&chunk)?;
                    f.write_all(&chunk)
                        .await
                        .map_err(|e| s3err(Error::from_io(e, "staging a part")))?;
                }
            }
            f.flush()
                .await
                .map_err(|e| s3err(Error::from_io(e, "staging a part")))?;
            let v = check.finish()?;
            // The upload's algorithm is the part's (another one the client sent was verified, not kept).
            let sum = v
                .checksum
                .clone()
                .filter(|(a, _)| Some(*a) == info.checksum);
            self.staging
                .commit_part(upload_id, n, &tmp, &v.md5, sum.as_ref())
                .map_err(s3err)?;
            Ok::<_, S3Error>((v.md5, sum))
        }
        .await;
        if result.is_err() || self.staging.info(upload_id).is_err() {
            self.tenancy.release_part(upload_id, n).await;
        }
        if result.is_err() {
            let _ = tokio::fs::remove_file(&tmp).await;
        }
        result
    }

    /// The caller's uploads in progress in the bucket (an upload belongs to the access key that created it:
    /// others' are neither usable nor shown), by key then creation, paged by key and upload-id markers,
    /// grouped by a delimiter, names URL-encoded when asked.
    pub(super) async fn s3_list_multipart_uploads(
        &self,
        req: S3Request<ListMultipartUploadsInput>,
    ) -> S3Result<S3Response<ListMultipartUploadsOutput>> {
        let (_, owner) = self.caller(&req)?;
        let who = self.who(&req).await?;
        let input = req.input;
        self.listable(&who, &input.bucket).await?;
        let url = super::list::url_encoded(input.encoding_type.as_ref())?;
        let prefix = input.prefix.clone().unwrap_or_default();
        let delimiter = input.delimiter.clone().filter(|d| !d.is_empty());
        let max = input.max_uploads.unwrap_or(1000).clamp(1, 1000) as usize;
        let (key_marker, id_marker) = (input.key_marker.clone(), input.upload_id_marker.clone());
        let mut uploads = Vec::new();
        let mut prefixes: Vec<String> = Vec::new();
        let mut next: Option<(String, String)> = None;
        // Uploads of one key are in creation order, as S3 lists them: the upload-id marker says where in
        // its key's uploads the page starts (after the marked upload).
        let mut passed_marker = false;
        for (id, info, created) in self.staging.list() {
            if info.bucket != input.bucket || info.owner != owner || !info.key.starts_with(&prefix)
            {
                continue;
            }
            // After the markers: keys after the key marker, or that key's uploads after the id marker.
            if let Some(k) = &key_marker {
                // A marker that is a common prefix skips its whole group.
                if delimiter.as_deref().is_some_and(|d| k.ends_with(d))
                    && info.key.starts_with(k.as_str())
                {
                    continue;
                }
                let after = match &id_marker {
                    Some(u) if info.key == *k => {
                        let after = passed_marker;
                        passed_marker |= id == *u;
                        after
                    }
                    _ => info.key > *k,
                };
                if !after {
                    continue;
                }
            }
            let group = delimiter.as_deref().and_then(|d| {
                info.key[prefix.len()..]
                    .find(d)
                    .map(|i| info.key[..prefix.len() + i + d.len()].to_string())
            });
            if let Some(g) = &group
                && prefixes.last() == Some(g)
            {
                continue;
            }
            if uploads.len() + prefixes.len() == max {
                next = Some((info.key.clone(), id.clone()));
                break;
            }
            match group {
                Some(g) => prefixes.push(g),
                None => uploads.push(MultipartUpload {
                    key: Some(super::list::encode(url, info.key.clone())),
                    upload_id: Some(id.clone()),
                    initiated: Some(Timestamp::from(created)),
                    storage_class: Some(StorageClass::from_static(StorageClass::STANDARD)),
                    ..Default::default()
                }),
            }
        }
        // The markers of the last entry shown (a key and upload), as S3 pages.
        let (next_key, next_id) = match &next {
            Some(_) => match (uploads.last(), prefixes.last()) {
                (Some(u), _) => (u.key.clone(), u.upload_id.clone()),
                (None, Some(p)) => (Some(super::list::encode(url, p.clone())), None),
                (None, None) => (None, None),
            },
            None => (None, None),
        };
        Ok(S3Response::new(ListMultipartUploadsOutput {
            bucket: Some(input.bucket),
            prefix: Some(super::list::encode(url, prefix)),
            delimiter: delimiter.map(|d| super::list::encode(url, d)),
            key_marker: Some(
                key_marker
                    .map(|k| super::list::encode(url, k))
                    .unwrap_or_default(),
            ),
            upload_id_marker: Some(id_marker.unwrap_or_default()),
            next_key_marker: next_key,
            next_upload_id_marker: next_id,
            max_uploads: Some(max as i32),
            is_truncated: Some(next.is_some()),
            uploads: Some(uploads),
            common_prefixes: Some(
                prefixes
                    .into_iter()
                    .map(|p| CommonPrefix {
                        prefix: Some(super::list::encode(url, p)),
                    })
                    .collect(),
            ),
            encoding_type: input.encoding_type,
            ..Default::default()
        }))
    }

    pub(super) async fn s3_list_parts(
        &self,
        req: S3Request<ListPartsInput>,
    ) -> S3Result<S3Response<ListPartsOutput>> {
        let (_, owner) = self.caller(&req)?;
        let input = req.input;
        let info = self.owner_check(&input.upload_id, &input.bucket, &input.key, &owner)?;
        let marker = input.part_number_marker.unwrap_or(0);
        let max = input.max_parts.unwrap_or(1000).clamp(1, 1000) as usize;
        let mut parts: Vec<_> = self
            .staging
            .parts(&input.upload_id)
            .map_err(s3err)?
            .into_iter()
            .filter(|p| p.number > marker)
            .collect();
        let truncated = parts.len() > max;
        parts.truncate(max);
        let next = if truncated {
            parts.last().map(|p| p.number)
        } else {
            None
        };
        Ok(S3Response::new(ListPartsOutput {
            bucket: Some(input.bucket),
            key: Some(input.key),
            upload_id: Some(input.upload_id),
            is_truncated: Some(truncated),
            next_part_number_marker: next,
            max_parts: Some(max as i32),
            part_number_marker: input.part_number_marker,
            parts: Some(
                parts
                    .into_iter()
                    .map(|p| {
                        let mut part = Part {
                            part_number: Some(p.number),
                            e_tag: Some(ETag::Strong(p.md5)),
                            size: Some(p.size as i64),
                            last_modified: Some(Timestamp::from(p.modified)),
                            ..Default::default()
                        };
                        if let Some((alg, v)) = p.checksum {
                            checksum_fields!(part, checksum_dto(alg, v, None));
                        }
                        part
                    })
                    .collect(),
            ),
            checksum_algorithm: info
                .checksum
                .map(|a| ChecksumAlgorithm::from(a.as_str().to_string())),
            checksum_type: info.checksum.map(|_| checksum_type_of(info.full_object)),
            storage_class: Some(StorageClass::from_static(StorageClass::STANDARD)),
            ..Default::default()
        }))
    }

    pub(super) async fn s3_complete_multipart_upload(
        &self,
        req: S3Request<CompleteMultipartUploadInput>,
    ) -> S3Result<S3Response<CompleteMultipartUploadOutput>> {
        let who = self.who(&req).await?;
        let (ctx, owner) = (who.ctx.clone(), who.access_key.clone());
        let input = req.input;
        let _writing = self.created.begin_write(&input.bucket)?;
        let backend = self.backend(&input.bucket).await?;
        let listed = |m: &Option<CompletedMultipartUpload>| -> Vec<(i32, String)> {
            m.as_ref()
                .and_then(|m| m.parts.as_ref())
                .map(|ps| {
                    ps.iter()
                        .map(|p| {
                            let etag = p.e_tag.as_ref().map(|e| match e {
                                ETag::Strong(v) | ETag::Weak(v) => v.clone(),
                            });
                            (p.part_number.unwrap_or(0), etag.unwrap_or_default())
                        })
                        .collect()
                })
                .unwrap_or_default()
        };
        // A repeated complete of an upload already completed with these very parts, by its owner: S3's answer
        // again (clients retry a complete whose answer they lost), nothing written.
        if matches!(self.staging.info(&input.upload_id), Err(ref e) if e.kind() == ErrorKind::NotFound)
            && let Some(c) = self.staging.completed(&input.upload_id)
            && c.bucket == input.bucket
            && c.key == input.key
            && c.owner == owner
            && c.parts == listed(&input.multipart_upload)
        {
            return Ok(S3Response::new(completed_output(
                input.bucket,
                input.key,
                ETag::Strong(c.etag),
                c.checksum,
            )));
        }
        let info = self.owner_check(&input.upload_id, &input.bucket, &input.key, &owner)?;
        if input.if_match.is_some() || input.if_none_match.is_some() {
            // The assembled object goes to the backend as a multipart upload, which has no condition: refused
            // before anything is written (the upload stays, to complete without the condition or abort).
            return Err(s3_error!(
                NotImplemented,
                "conditional CompleteMultipartUpload (If-Match, If-None-Match) is not implemented; nothing was written"
            ));
        }
        let team = self
            .tenancy
            .attribute(&input.bucket, &input.key, &who.caller, Role::Member)
            .await?;
        let requested_parts = listed(&input.multipart_upload);
        let asked_checksum = s3s::dto::Checksum {
            checksum_crc32: input.checksum_crc32.clone(),
            checksum_crc32c: input.checksum_crc32c.clone(),
            checksum_crc64nvme: input.checksum_crc64nvme.clone(),
            checksum_sha1: input.checksum_sha1.clone(),
            checksum_sha256: input.checksum_sha256.clone(),
            checksum_type: None,
        };
        let requested = input
            .multipart_upload
            .and_then(|m| m.parts)
            .unwrap_or_default();
        if requested.is_empty() {
            return Err(s3_error!(
                InvalidRequest,
                "you must specify at least one part"
            ));
        }
        let staged: HashMap<i32, multipart::StagedPart> = self
            .staging
            .parts(&input.upload_id)
            .map_err(s3err)?
            .into_iter()
            .map(|p| (p.number, p))
            .collect();
        let mut chosen = Vec::with_capacity(requested.len());
        let mut last = 0;
        for (i, p) in requested.iter().enumerate() {
            let n = p
                .part_number
                .ok_or_else(|| s3_error!(InvalidPart, "a part has no number"))?;
            if n <= last {
                return Err(s3_error!(
                    InvalidPartOrder,
                    "parts must be listed in ascending order"
                ));
            }
            last = n;
            let staged = staged
                .get(&n)
                .ok_or_else(|| s3_error!(InvalidPart, "part {n} was not uploaded"))?;
            if let Some(e) = &p.e_tag
                && !e.strong_cmp(&ETag::Strong(staged.md5.clone()))
            {
                return Err(s3_error!(
                    InvalidPart,
                    "part {n}: the ETag does not match the uploaded part"
                ));
            }
            if let (Some((alg, sum)), Some(listed)) = (
                &staged.checksum,
                staged.checksum.as_ref().and_then(|(alg, _)| {
                    let c = s3s::dto::Checksum {
                        checksum_crc32: p.checksum_crc32.clone(),
                        checksum_crc32c: p.checksum_crc32c.clone(),
                        checksum_crc64nvme: p.checksum_crc64nvme.clone(),
                        checksum_sha1: p.checksum_sha1.clone(),
                        checksum_sha256: p.checksum_sha256.clone(),
                        checksum_type: None,
                    };
                    pick(&c, *alg).cloned()
                }),
            ) && listed != *sum
            {
                return Err(s3_error!(
                    InvalidPart,
                    "part {n}: the {} checksum does not match the uploaded part",
                    alg.as_str()
                ));
            }
            if i + 1 < requested.len() && staged.size < MIN_PART {
                return Err(s3_error!(
                    EntityTooSmall,
                    "part {n} is smaller than 5 MiB and is not the last part"
                ));
            }
            chosen.push(staged.clone());
        }
        // md5 of the part md5s, as S3 computes multipart ETags (returned when the backend gives none).
        let mut md5 = s3s::crypto::Md5::new();
        for p in &chosen {
            let raw: Vec<u8> = (0..p.md5.len())
                .step_by(2)
                .filter_map(|i| {
                    p.md5
                        .get(i..i + 2)
                        .and_then(|h| u8::from_str_radix(h, 16).ok())
                })
                .collect();
            md5.update(&raw);
        }
        let s3_etag = format!("{}-{}", hex(&md5.finalize()), chosen.len());
        let total: u64 = chosen.iter().map(|p| p.size).sum();
        if let Some(n) = input.mpu_object_size
            && n != total as i64
        {
            return Err(s3_error!(
                InvalidRequest,
                "x-amz-mp-object-size is {n}; the parts listed are {total} bytes"
            ));
        }
        let checksum = upload_checksum(&info, &chosen).await?;
        if let Some(c) = &checksum
            && let Some(want) = pick(&asked_checksum, c.algorithm)
            && *want != c.value
            && want.split('-').next() != c.value.split('-').next()
        {
            return Err(s3_error!(
                BadDigest,
                "x-amz-checksum-{} did not match the object's",
                c.algorithm.header_suffix()
            ));
        }
        let mut attrs = info.attrs.clone();
        attrs.checksum = checksum.clone();
        attrs.parts = chosen.iter().map(|p| p.size).collect();
        // The parts' bytes were admitted as they arrived; the object itself (and any bytes not admitted, after
        // a restart) is admitted now, before anything is written to the backend.
        let mut reservations = self.tenancy.take_parts(&input.upload_id);
        let admitted: i64 = reservations.iter().map(|r| r.bytes).sum();
        match self
            .tenancy
            .admit(
                team.as_deref(),
                &input.bucket,
                (total as i64 - admitted).max(0),
                1,
            )
            .await
        {
            Ok(r) => reservations.extend(r),
            Err(e) => {
                for r in reservations {
                    self.tenancy.release(Some(r)).await;
                }
                return Err(e);
            }
        }
        let written = self
            .assemble(&ctx, &backend, &input.key, &chosen, total, &attrs, &s3_etag)
            .await;
        let etag = match written {
            Ok(e) => e,
            Err(e) => {
                for r in reservations {
                    self.tenancy.release(Some(r)).await;
                }
                return Err(e);
            }
        };
        self.agent
            .announce(vec![Change::key(backend.id(), &input.key)])
            .await;
        let final_etag = etag
            .as_deref()
            .map(|e| e.trim_start_matches("W/").trim_matches('"').to_string())
            .unwrap_or_else(|| s3_etag.clone());
        let record = multipart::Completed {
            bucket: input.bucket.clone(),
            key: input.key.clone(),
            owner: owner.clone(),
            parts: requested_parts,
            etag: final_etag,
            checksum: checksum.clone(),
        };
        if let Err(e) = self.staging.record_completed(&input.upload_id, &record) {
            tracing::warn!(error = %e, "recording a completed upload (a repeated complete will be NoSuchUpload)");
        }
        let _ = self.staging.remove(&input.upload_id);
        self.tenancy
            .written(
                reservations,
                &input.bucket,
                &input.key,
                total as i64,
                etag.clone(),
                team,
                &who.caller,
                ctx.job.as_deref().map(str::to_string),
                who.dataset.clone(),
            )
            .await;
        Ok(S3Response::new(completed_output(
            input.bucket,
            input.key,
            etag.as_deref()
                .map(plain_etag)
                .unwrap_or(ETag::Strong(s3_etag)),
            checksum,
        )))
    }

    pub(super) async fn s3_abort_multipart_upload(
        &self,
        req: S3Request<AbortMultipartUploadInput>,
    ) -> S3Result<S3Response<AbortMultipartUploadOutput>> {
        let who = self.who(&req).await?;
        let owner = who.access_key;
        let input = req.input;
        self.owner_check(&input.upload_id, &input.bucket, &input.key, &owner)?;
        self.staging
            .remove(&input.upload_id)
            .map_err(|_| s3_error!(NoSuchUpload))?;
        self.tenancy.release_parts(&input.upload_id).await;
        Ok(S3Response::new(AbortMultipartUploadOutput::default()))
    }
}

/// CompleteMultipartUpload's answer (the same for a repeated complete).
fn completed_output(
    bucket: String,
    key: String,
    etag: ETag,
    checksum: Option<strata_types::StoredChecksum>,
) -> CompleteMultipartUploadOutput {
    let mut out = CompleteMultipartUploadOutput {
        bucket: Some(bucket),
        key: Some(key),
        e_tag: Some(etag),
        ..Default::default()
    };
    if let Some(c) = checksum {
        let kind = c.kind();
        out.checksum_type = checksum_fields!(out, checksum_dto(c.algorithm, c.value, Some(kind)));
    }
    out
}

/// The checksum of an upload made with one: composite, from the parts' checksums; full-object, a CRC of
/// every byte, read back from the staged parts.
async fn upload_checksum(
    info: &UploadInfo,
    chosen: &[multipart::StagedPart],
) -> S3Result<Option<strata_types::StoredChecksum>> {
    let Some(alg) = info.checksum else {
        return Ok(None);
    };
    let mut sums = Vec::with_capacity(chosen.len());
    for p in chosen {
        match &p.checksum {
            Some((a, v)) if *a == alg => sums.push(v.clone()),
            _ => {
                return Err(s3_error!(
                    InvalidRequest,
                    "The upload was created using a {} checksum. The complete request must include the checksum for each part. It was missing for part {} in the request.",
                    alg.as_str(),
                    p.number
                ));
            }
        }
    }
    let value = if info.full_object {
        use tokio::io::AsyncReadExt;
        let mut h = hasher_for(alg);
        let mut buf = vec![0u8; 1 << 20];
        for p in chosen {
            let mut f = tokio::fs::File::open(&p.path)
                .await
                .map_err(|e| s3err(Error::from_io(e, "reading a staged part")))?;
            loop {
                let n = f
                    .read(&mut buf)
                    .await
                    .map_err(|e| s3err(Error::from_io(e, "reading a staged part")))?;
                if n == 0 {
                    break;
                }
                h.update(&buf[..n]);
            }
        }
        pick(&h.finalize(), alg).cloned().unwrap_or_default()
    } else {
        composite(alg, &sums)?
    };
    Ok(Some(strata_types::StoredChecksum {
        algorithm: alg,
        value,
        full_object: info.full_object,
        parts: sums,
    }))
}

impl Gateway {
    /// Write an upload's chosen parts to the backend as one object.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn assemble(
        &self,
        ctx: &IoContext,
        backend: &Backend,
        key: &str,
        chosen: &[multipart::StagedPart],
        total: u64,
        attrs: &ObjectAttrs,
        s3_etag: &str,
    ) -> S3Result<Option<String>> {
        let input_key = key;
        let ctx = ctx.clone();
        // Where the backend makes its own ETag (object stores), the object is sent in the client's parts, so
        // the ETag is the one S3 computes from them (md5 of the parts' md5s, `-<parts>`): parts of one size (all
        // but the last) up to 64 MiB are sent as they are; others in 8 MiB parts.
        let uniform = chosen.split_last().is_some_and(|(last, rest)| {
            let size = rest.first().map_or(last.size, |p| p.size);
            rest.iter().all(|p| p.size == size) && last.size <= size
        });
        let part_size = match chosen.first() {
            Some(p) if uniform && p.size <= CLIENT_PART_MAX => p.size as usize,
            _ => BACKEND_PART,
        };
        let etag = if backend.takes_etags() && total as usize <= SINGLE_PUT_MAX {
            let mut all = Vec::with_capacity(total as usize);
            for p in chosen {
                all.extend_from_slice(
                    &tokio::fs::read(&p.path)
                        .await
                        .map_err(|e| s3err(Error::from_io(e, "reading a staged part")))?,
                );
            }
            backend
                .put_with_etag(
                    &ctx,
                    input_key,
                    Bytes::from(all),
                    PutMode::Overwrite,
                    attrs,
                    Some(s3_etag.to_string()),
                )
                .await
                .map_err(s3err)?
                .etag
        } else {
            let mut up = backend
                .put_multipart_with(&ctx, input_key, part_size, attrs)
                .await
                .map_err(s3err)?;
            up.set_etag(s3_etag);
            for p in chosen {
                let mut f = tokio::fs::File::open(&p.path)
                    .await
                    .map_err(|e| s3err(Error::from_io(e, "reading a staged part")))?;
                loop {
                    use tokio::io::AsyncReadExt;
                    let mut buf = vec![0u8; BACKEND_PART.min(part_size)];
                    let mut filled = 0;
                    while filled < buf.len() {
                        let n = f
                            .read(&mut buf[filled..])
                            .await
                            .map_err(|e| s3err(Error::from_io(e, "reading a staged part")))?;
                        if n == 0 {
                            break;
                        }
                        filled += n;
                    }
                    if filled == 0 {
                        break;
                    }
                    buf.truncate(filled);
                    up.write(Bytes::from(buf)).await.map_err(s3err)?;
                }
            }
            up.complete().await.map_err(s3err)?.etag
        };
        Ok(etag)
    }
}
