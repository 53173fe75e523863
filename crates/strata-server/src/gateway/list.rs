//! Listings: ListObjectsV2 and ListObjects (V1), one core for both ([`Gateway::list`]), continuation tokens.
//!
//! A listing shows only what the caller may read ([`Tenancy::visible`]), and nothing else of it leaks: pages
//! are filled from visible entries only, `IsTruncated` says whether more *visible* entries follow,
//! `KeyCount` counts what is shown, V1's `NextMarker` is the last key shown, and V2 continuation tokens are
//! sealed (ChaCha20-Poly1305 under a key derived from the catalog key, bound to the bucket and prefix): a
//! client can neither read the position in one nor forge one.

use super::attributes::*;
use super::*;

/// Entries a ListObjectsV2 request looks at, at most, to fill one page with visible ones: past that it answers
/// truncated, continuing from where it stopped (a sealed position). V1, whose marker is a key in clear, scans
/// on until the page is full.
const SCAN_LIMIT: usize = 50_000;

impl Gateway {
    fn token_encode(&self, bucket: &str, prefix: &str, after: &str) -> S3Result<String> {
        let sealed = self
            .tokens
            .seal(&format!("{bucket}\0{prefix}"), after)
            .map_err(s3err)?;
        Ok(sealed.trim_start_matches("enc1:").to_string())
    }

    fn token_decode(&self, bucket: &str, prefix: &str, t: &str) -> S3Result<String> {
        self.tokens
            .open(&format!("{bucket}\0{prefix}"), &format!("enc1:{t}"))
            .map_err(|_| s3_error!(InvalidArgument, "the continuation token is not valid"))
    }

    /// Up to `max` entries after `after` that `caller` may see, and the position to continue from when more
    /// visible entries follow; with `sealed` (the position goes out in a sealed token) the scan stops after
    /// [`SCAN_LIMIT`] entries.
    #[allow(clippy::too_many_arguments)]
    async fn visible_list(
        &self,
        ctx: &IoContext,
        backend: &Backend,
        bucket: &str,
        caller: &Caller,
        prefix: &str,
        delimiter: Option<&str>,
        after: Option<&str>,
        max: usize,
        sealed: bool,
    ) -> S3Result<(Vec<Object>, Vec<CommonPrefix>, Option<String>)> {
        let (mut objects, mut prefixes) = (Vec::new(), Vec::new());
        let mut pos = after.map(str::to_string);
        let mut scanned = 0usize;
        if max == 0 {
            // Validates the request as a listing would.
            self.list(ctx, backend, prefix, delimiter, pos.as_deref(), 0)
                .await?;
            return Ok((objects, prefixes, None));
        }
        loop {
            // One more than the page: whether a visible entry follows decides IsTruncated. A delimited listing
            // reads the whole level at once anyway: take all of it, so it is read once, not once per page of
            // hidden entries.
            let want = if delimiter.is_some_and(|d| !d.is_empty()) {
                usize::MAX
            } else {
                // (1,001 at most: a full page and the one entry that says whether another follows, in one
                // backend listing)
                (max + 1 - objects.len() - prefixes.len()).clamp(1, 1001)
            };
            let (o, p, next) = self
                .list(ctx, backend, prefix, delimiter, pos.as_deref(), want)
                .await?;
            scanned += o.len() + p.len();
            let last_seen = o
                .iter()
                .filter_map(|o| o.key.clone())
                .chain(p.iter().filter_map(|p| p.prefix.clone()))
                .max();
            let (o, p) = self.tenancy.visible(bucket, caller, o, p).await?;
            let mut entries: Vec<(String, Option<Object>)> = o
                .into_iter()
                .map(|o| (o.key.clone().unwrap_or_default(), Some(o)))
                .chain(
                    p.into_iter()
                        .map(|p| (p.prefix.clone().unwrap_or_default(), None)),
                )
                .collect();
            entries.sort_by(|a, b| a.0.cmp(&b.0));
            for (key, o) in entries {
                if objects.len() + prefixes.len() == max {
                    // A visible entry follows the page: continue after the page's last one.
                    let last = objects
                        .iter()
                        .filter_map(|o: &Object| o.key.clone())
                        .chain(
                            prefixes
                                .iter()
                                .filter_map(|p: &CommonPrefix| p.prefix.clone()),
                        )
                        .max();
                    return Ok((objects, prefixes, last));
                }
                match o {
                    Some(o) => objects.push(o),
                    None => prefixes.push(CommonPrefix { prefix: Some(key) }),
                }
            }
            match next {
                None => return Ok((objects, prefixes, None)),
                Some(n) => pos = Some(n.max(last_seen.unwrap_or_default())),
            }
            if sealed && scanned >= SCAN_LIMIT {
                return Ok((objects, prefixes, pos));
            }
        }
    }

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
        // A prefix is a key prefix on every backend (`a/../` is a prefix of the key `a/../b`): a local
        // directory walks only prefixes that are plain paths, the rest are in its escaped keys.
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
            Some(d) => {
                let page = backend.list_grouped(ctx, prefix, d).await.map_err(s3err)?;
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
        }
    }

    pub(super) async fn s3_list_objects_v2(
        &self,
        req: S3Request<ListObjectsV2Input>,
    ) -> S3Result<S3Response<ListObjectsV2Output>> {
        let who = self.who(&req).await?;
        let ctx = who.ctx.clone();
        let input = req.input;
        let backend = self.listable(&who, &input.bucket).await?;
        let url = url_encoded(input.encoding_type.as_ref())?;
        let prefix = input.prefix.clone().unwrap_or_default();
        let max = input.max_keys.unwrap_or(1000).clamp(0, 1000) as usize;
        let token = input
            .continuation_token
            .as_deref()
            // An empty token is none (as S3 takes `continuation-token=`), echoed back as it came.
            .filter(|t| !t.is_empty())
            .map(|t| self.token_decode(&input.bucket, &prefix, t))
            .transpose()?;
        let after = match (token, input.start_after.clone()) {
            (Some(t), Some(s)) => Some(t.max(s)),
            (t, s) => t.or(s),
        };
        // Keys under a prefix owned by a team the caller may not read are not shown, nor counted.
        let (objects, prefixes, next) = self
            .visible_list(
                &ctx,
                &backend,
                &input.bucket,
                &who.caller,
                &prefix,
                input.delimiter.as_deref(),
                after.as_deref(),
                max,
                true,
            )
            .await?;
        let key_count = (objects.len() + prefixes.len()) as i32;
        let next_token = next
            .as_deref()
            .map(|n| self.token_encode(&input.bucket, &prefix, n))
            .transpose()?;
        let (mut objects, prefixes) = encode_entries(url, objects, prefixes);
        if input.fetch_owner == Some(true) {
            for o in &mut objects {
                o.owner = Some(super::service::owner());
            }
        }
        Ok(S3Response::new(ListObjectsV2Output {
            name: Some(input.bucket),
            prefix: Some(encode(url, input.prefix.unwrap_or_default())),
            delimiter: delimiter_out(url, input.delimiter),
            max_keys: Some(max as i32),
            key_count: Some(key_count),
            is_truncated: Some(next.is_some()),
            next_continuation_token: next_token,
            continuation_token: input.continuation_token,
            start_after: input.start_after.map(|s| encode(url, s)),
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
        let backend = self.listable(&who, &input.bucket).await?;
        let url = url_encoded(input.encoding_type.as_ref())?;
        let prefix = input.prefix.clone().unwrap_or_default();
        let max = input.max_keys.unwrap_or(1000).clamp(0, 1000) as usize;
        // Keys under a prefix owned by a team the caller may not read are not shown; NextMarker is the last key
        // shown.
        let (objects, prefixes, next) = self
            .visible_list(
                &ctx,
                &backend,
                &input.bucket,
                &who.caller,
                &prefix,
                input.delimiter.as_deref(),
                input.marker.as_deref(),
                max,
                false,
            )
            .await?;
        let (mut objects, prefixes) = encode_entries(url, objects, prefixes);
        // V1 names every object's owner, as S3 does.
        for o in &mut objects {
            o.owner = Some(super::service::owner());
        }
        Ok(S3Response::new(ListObjectsOutput {
            name: Some(input.bucket),
            // S3 leaves V1's own Prefix as it was sent (botocore decodes it only for V2).
            prefix: Some(input.prefix.unwrap_or_default()),
            delimiter: delimiter_out(url, input.delimiter),
            // S3 always sends Marker, empty on a first page (s3fs looks for it).
            marker: Some(encode(url, input.marker.unwrap_or_default())),
            max_keys: Some(max as i32),
            is_truncated: Some(next.is_some()),
            next_marker: next.map(|n| encode(url, n)),
            contents: Some(objects),
            common_prefixes: Some(prefixes),
            encoding_type: input.encoding_type,
            ..Default::default()
        }))
    }
}

impl Gateway {
    /// ListObjectVersions. No bucket here ever had versioning (PutBucketVersioning is `501`), so each object
    /// is its one version, `null` and the latest, as S3 lists an unversioned bucket: what cleanup tools (ceph
    /// s3-tests' own fixtures among them) call before deleting. Pages by key (`key-marker`; a
    /// `version-id-marker` can only be `null` here, which ends that key's versions), the same visibility as
    /// the other listings.
    pub(super) async fn s3_list_object_versions(
        &self,
        req: S3Request<ListObjectVersionsInput>,
    ) -> S3Result<S3Response<ListObjectVersionsOutput>> {
        let who = self.who(&req).await?;
        let ctx = who.ctx.clone();
        let input = req.input;
        let backend = self.listable(&who, &input.bucket).await?;
        let url = url_encoded(input.encoding_type.as_ref())?;
        if let Some(v) = input.version_id_marker.as_deref().filter(|v| !v.is_empty()) {
            if input.key_marker.as_deref().unwrap_or_default().is_empty() {
                return Err(s3_error!(
                    InvalidArgument,
                    "A version-id marker cannot be specified without a key marker."
                ));
            }
            if v != "null" {
                return Err(s3_error!(InvalidArgument, "Invalid version id specified"));
            }
        }
        let prefix = input.prefix.clone().unwrap_or_default();
        let max = input.max_keys.unwrap_or(1000).clamp(0, 1000) as usize;
        let (objects, prefixes, next) = self
            .visible_list(
                &ctx,
                &backend,
                &input.bucket,
                &who.caller,
                &prefix,
                input.delimiter.as_deref(),
                input.key_marker.as_deref().filter(|k| !k.is_empty()),
                max,
                false,
            )
            .await?;
        let (objects, prefixes) = encode_entries(url, objects, prefixes);
        let versions = objects
            .into_iter()
            .map(|o| ObjectVersion {
                key: o.key,
                size: o.size,
                e_tag: o.e_tag,
                last_modified: o.last_modified,
                is_latest: Some(true),
                version_id: Some("null".into()),
                owner: Some(super::service::owner()),
                storage_class: Some(ObjectVersionStorageClass::from_static(
                    ObjectVersionStorageClass::STANDARD,
                )),
                ..Default::default()
            })
            .collect();
        Ok(S3Response::new(ListObjectVersionsOutput {
            name: Some(input.bucket),
            prefix: Some(encode(url, input.prefix.unwrap_or_default())),
            delimiter: delimiter_out(url, input.delimiter),
            key_marker: Some(encode(url, input.key_marker.unwrap_or_default())),
            version_id_marker: Some(input.version_id_marker.unwrap_or_default()),
            max_keys: Some(max as i32),
            is_truncated: Some(next.is_some()),
            next_version_id_marker: next.as_ref().map(|_| "null".to_string()),
            next_key_marker: next.map(|n| encode(url, n)),
            versions: Some(versions),
            common_prefixes: Some(prefixes),
            encoding_type: input.encoding_type,
            ..Default::default()
        }))
    }

    /// GetBucketVersioning: never enabled here, which S3 answers with an empty configuration.
    pub(super) async fn s3_get_bucket_versioning(
        &self,
        req: S3Request<GetBucketVersioningInput>,
    ) -> S3Result<S3Response<GetBucketVersioningOutput>> {
        let who = self.who(&req).await?;
        self.listable(&who, &req.input.bucket).await?;
        Ok(S3Response::new(GetBucketVersioningOutput::default()))
    }
}

/// Characters a listing with `EncodingType=url` leaves as they are: the unreserved ones and `/`, as S3 does
/// (`test_file(3).png` is `test_file%283%29.png`).
const LISTING_KEEP: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'~')
    .remove(b'/');

/// A listing's `Delimiter` as it goes out: none when empty, URL-encoded when asked.
fn delimiter_out(url: bool, d: Option<String>) -> Option<String> {
    d.filter(|d| !d.is_empty()).map(|d| encode(url, d))
}

/// Whether the listing's names go out URL-encoded; an encoding S3 does not know is its `InvalidArgument`.
pub(super) fn url_encoded(e: Option<&EncodingType>) -> S3Result<bool> {
    match e.map(EncodingType::as_str) {
        None => Ok(false),
        Some(EncodingType::URL) => Ok(true),
        Some(other) => Err(s3_error!(
            InvalidArgument,
            "Invalid Encoding Method specified in Request: {other:?}"
        )),
    }
}

/// A name as the listing sends it (`EncodingType=url`: percent-encoded; clients decode it).
pub(super) fn encode(url: bool, s: String) -> String {
    match url {
        true => percent_encoding::utf8_percent_encode(&s, LISTING_KEEP).to_string(),
        false => s,
    }
}

fn encode_entries(
    url: bool,
    mut objects: Vec<Object>,
    mut prefixes: Vec<CommonPrefix>,
) -> (Vec<Object>, Vec<CommonPrefix>) {
    if url {
        for o in &mut objects {
            o.key = o.key.take().map(|k| encode(true, k));
        }
        for p in &mut prefixes {
            p.prefix = p.prefix.take().map(|k| encode(true, k));
        }
    }
    (objects, prefixes)
}
