//! Listings: ListObjectsV2 and ListObjects (V1), one core for both ([`Gateway::list`]), continuation tokens.

use super::attributes::*;
use super::checksums::hex;
use super::*;

pub(super) fn token_encode(key: &str) -> String {
    hex(key.as_bytes())
}

pub(super) fn token_decode(t: &str) -> S3Result<String> {
    let bad = || s3_error!(InvalidArgument, "the continuation token is not valid");
    if !t.len().is_multiple_of(2) {
        return Err(bad());
    }
    let bytes: Option<Vec<u8>> = (0..t.len())
        .step_by(2)
        .map(|i| t.get(i..i + 2).and_then(|h| u8::from_str_radix(h, 16).ok()))
        .collect();
    String::from_utf8(bytes.ok_or_else(bad)?).map_err(|_| bad())
}

impl Gateway {
    pub(super) fn object_entry(meta: &ObjectMeta) -> Object {
        Object {
            key: Some(meta.key.clone()),
            size: Some(meta.size as i64),
            e_tag: etag_of(meta),
            last_modified: Some(timestamp(meta.last_modified_unix)),
            storage_class: Some(ObjectStorageClass::from_static(
                ObjectStorageClass::STANDARD,
            )),
            ..Default::default()
        }
    }

    /// The listing core shared by ListObjects and ListObjectsV2: entries after `after`, at most `max`.
    pub(super) async fn list(
        &self,
        ctx: &IoContext,
        backend: &Backend,
        prefix: &str,
        delimiter: Option<&str>,
        after: Option<&str>,
        max: usize,
    ) -> S3Result<(Vec<Object>, Vec<CommonPrefix>, Option<String>)> {
        if !prefix.is_empty() && (prefix.contains('\0') || prefix.split('/').any(|s| s == "..")) {
            return Err(s3_error!(InvalidArgument, "invalid prefix"));
        }
        match delimiter {
            None | Some("") => {
                let page = backend
                    .list_page(ctx, prefix, after, max.max(1))
                    .await
                    .map_err(s3err)?;
                let objects = if max == 0 {
                    Vec::new()
                } else {
                    page.objects.iter().map(Self::object_entry).collect()
                };
                Ok((
                    objects,
                    Vec::new(),
                    if max == 0 {
                        None
                    } else {
                        page.next_start_after
                    },
                ))
            }
            Some("/") => {
                let page = backend.list_delimited(ctx, prefix).await.map_err(s3err)?;
                // Merge objects and prefixes in key order, then page.
                let mut entries: Vec<(String, Option<ObjectMeta>)> = page
                    .objects
                    .into_iter()
                    .map(|o| (o.key.clone(), Some(o)))
                    .chain(page.common_prefixes.into_iter().map(|p| (p, None)))
                    .filter(|(k, _)| after.is_none_or(|a| k.as_str() > a))
                    .collect();
                entries.sort_by(|a, b| a.0.cmp(&b.0));
                let truncated = entries.len() > max;
                entries.truncate(max);
                let next = if truncated {
                    entries.last().map(|e| e.0.clone())
                } else {
                    None
                };
                let mut objects = Vec::new();
                let mut prefixes = Vec::new();
                for (k, m) in entries {
                    match m {
                        Some(m) => objects.push(Self::object_entry(&m)),
                        None => prefixes.push(CommonPrefix { prefix: Some(k) }),
                    }
                }
                Ok((objects, prefixes, next))
            }
            Some(d) => Err(s3_error!(
                NotImplemented,
                "only '/' is supported as a delimiter, not {d:?}"
            )),
        }
    }

    pub(super) async fn s3_list_objects_v2(
        &self,
        req: S3Request<ListObjectsV2Input>,
    ) -> S3Result<S3Response<ListObjectsV2Output>> {
        let who = self.who(&req).await?;
        let ctx = who.ctx.clone();
        let input = req.input;
        let backend = self.backend(&input.bucket)?;
        let prefix = input.prefix.clone().unwrap_or_default();
        let max = input.max_keys.unwrap_or(1000).clamp(0, 1000) as usize;
        let token = input
            .continuation_token
            .as_deref()
            .map(token_decode)
            .transpose()?;
        let after = match (token, input.start_after.clone()) {
            (Some(t), Some(s)) => Some(t.max(s)),
            (t, s) => t.or(s),
        };
        let (objects, prefixes, next) = self
            .list(
                &ctx,
                &backend,
                &prefix,
                input.delimiter.as_deref(),
                after.as_deref(),
                max,
            )
            .await?;
        // Keys under a prefix owned by a team the caller may not read are not shown.
        let (objects, prefixes) = self
            .tenancy
            .visible(&input.bucket, &who.caller, objects, prefixes)
            .await?;
        let key_count = (objects.len() + prefixes.len()) as i32;
        Ok(S3Response::new(ListObjectsV2Output {
            name: Some(input.bucket),
            prefix: input.prefix,
            delimiter: input.delimiter,
            max_keys: Some(max as i32),
            key_count: Some(key_count),
            is_truncated: Some(next.is_some()),
            next_continuation_token: next.as_deref().map(token_encode),
            continuation_token: input.continuation_token,
            start_after: input.start_after,
            contents: Some(objects),
            common_prefixes: Some(prefixes),
            encoding_type: input.encoding_type,
            ..Default::default()
        }))
    }

    pub(super) async fn s3_list_objects(
        &self,
        req: S3Request<ListObjectsInput>,
    ) -> S3Result<S3Response<ListObjectsOutput>> {
        let who = self.who(&req).await?;
        let ctx = who.ctx.clone();
        let input = req.input;
        let backend = self.backend(&input.bucket)?;
        let prefix = input.prefix.clone().unwrap_or_default();
        let max = input.max_keys.unwrap_or(1000).clamp(0, 1000) as usize;
        let (objects, prefixes, next) = self
            .list(
                &ctx,
                &backend,
                &prefix,
                input.delimiter.as_deref(),
                input.marker.as_deref(),
                max,
            )
            .await?;
        // Keys under a prefix owned by a team the caller may not read are not shown.
        let (objects, prefixes) = self
            .tenancy
            .visible(&input.bucket, &who.caller, objects, prefixes)
            .await?;
        Ok(S3Response::new(ListObjectsOutput {
            name: Some(input.bucket),
            prefix: input.prefix,
            delimiter: input.delimiter,
            marker: input.marker,
            max_keys: Some(max as i32),
            is_truncated: Some(next.is_some()),
            next_marker: next,
            contents: Some(objects),
            common_prefixes: Some(prefixes),
            encoding_type: input.encoding_type,
            ..Default::default()
        }))
    }
}
