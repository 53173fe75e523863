//! An S3 backend's own ground: how it is reached (the builder's answers, shared with [`S3Wire`]), listings
//! and single-request writes through [`S3Wire`], and incomplete multipart uploads found and aborted.

use super::*;

/// The headers of a write through [`S3Wire`]: the attributes, the extras' entry, the mode as conditions.
pub(super) fn wire_headers(
    attrs: &ObjectAttrs,
    mode: Option<&PutMode>,
    what: &str,
) -> Result<http::HeaderMap> {
    let mut h = http::HeaderMap::new();
    let mut set = |name: &str, v: &str| -> Result<()> {
        let name = http::HeaderName::from_bytes(name.as_bytes())
            .map_err(|e| Error::invalid_input(format!("{what}: header {name:?}: {e}")))?;
        let v = http::HeaderValue::from_str(v)
            .map_err(|e| Error::invalid_input(format!("{what}: header value {v:?}: {e}")))?;
        h.insert(name, v);
        Ok(())
    };
    for (name, v) in [
        ("content-type", &attrs.content_type),
        ("content-encoding", &attrs.content_encoding),
        ("content-disposition", &attrs.content_disposition),
        ("content-language", &attrs.content_language),
        ("cache-control", &attrs.cache_control),
    ] {
        if let Some(v) = v {
            set(name, v)?;
        }
    }
    for (k, v) in &attrs.user {
        set(&format!("x-amz-meta-{k}"), v)?;
    }
    if let Some((k, v)) = extras_entry(attrs) {
        set(&format!("x-amz-meta-{k}"), &v)?;
    }
    match mode {
        None | Some(PutMode::Overwrite) => {}
        Some(PutMode::Create) => set("if-none-match", "*")?,
        Some(PutMode::IfMatch(e)) => set("if-match", e)?,
    }
    Ok(h)
}

impl Backend {
    /// On S3: whether `key` must be written through [`S3Wire`] because `object_store` cannot name it (an
    /// empty, `.` or `..` segment, a trailing `/`, ...) or Strata's paths refuse it (a backslash).
    pub(super) fn wire_key(&self, key: &str) -> Option<&S3Wire> {
        let named = Path::parse(key).is_ok_and(|p| p.as_ref() == key)
            && !key.ends_with('/')
            && validate_key(key).is_ok();
        self.inner.wire.as_ref().filter(|_| !named)
    }

    /// A PUT through [`S3Wire`] of a key `object_store` cannot name: the attributes as headers, the mode as
    /// conditions.
    pub(super) async fn wire_put(
        &self,
        ctx: &IoContext,
        w: &S3Wire,
        key: &str,
        bytes: Bytes,
        mode: PutMode,
        attrs: &ObjectAttrs,
    ) -> Result<PutOutcome> {
        let what = format!("PUT {}/{key}", self.inner.id);
        let h = wire_headers(attrs, Some(&mode), &what)?;
        let len = bytes.len() as u64;
        self.observe(ctx, Op::Put, key, |_| len, async {
            self.inner
                .retry
                .run(&self.inner.telemetry, Op::Put, || {
                    w.put(key, bytes.clone(), h.clone(), &what)
                })
                .await
                .map(|(etag, version)| PutOutcome { etag, version })
        })
        .await
    }

    /// The incomplete multipart uploads of keys under `prefix`: on S3, what ListMultipartUploads says; other
    /// backends keep no upload beyond the process that wrote it, so none.
    pub async fn incomplete_uploads(
        &self,
        ctx: &IoContext,
        prefix: &str,
    ) -> Result<Vec<crate::IncompleteUpload>> {
        let Some(w) = &self.inner.wire else {
            return Ok(Vec::new());
        };
        let what = format!("LIST uploads {}/{prefix}", self.inner.id);
        self.observe(ctx, Op::List, prefix, |_| 0, async {
            self.inner
                .retry
                .run(&self.inner.telemetry, Op::List, || w.uploads(prefix, &what))
                .await
        })
        .await
    }

    /// Abort the incomplete multipart uploads under `prefix` that `which` selects (a killed writer's, or ones
    /// older than a threshold), freeing their parts; how many were aborted. Every one is tried; the first
    /// failure is returned after.
    pub async fn abort_uploads(
        &self,
        ctx: &IoContext,
        prefix: &str,
        which: impl Fn(&crate::IncompleteUpload) -> bool,
    ) -> Result<usize> {
        if self.inner.wire.is_none() {
            return Ok(0);
        }
        let mut aborted = 0;
        let mut first_err = None;
        for u in self.incomplete_uploads(ctx, prefix).await? {
            if !which(&u) {
                continue;
            }
            match self.abort_upload(ctx, &u).await {
                Ok(()) => aborted += 1,
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(aborted),
        }
    }

    /// Abort one incomplete multipart upload (one already gone counts as aborted).
    pub async fn abort_upload(&self, ctx: &IoContext, u: &crate::IncompleteUpload) -> Result<()> {
        let Some(w) = &self.inner.wire else {
            return Ok(());
        };
        let what = format!(
            "abort multipart {}/{} (upload {})",
            self.inner.id, u.key, u.upload_id
        );
        self.observe(ctx, Op::Delete, &u.key, |_| 0, async {
            self.inner
                .retry
                .run(&self.inner.telemetry, Op::Delete, || {
                    w.abort(&u.key, &u.upload_id, &what)
                })
                .await
        })
        .await
    }
}

pub(super) fn host_of(url: &url::Url, raw: &str) -> Result<String> {
    match url.host_str() {
        Some(h) if !h.is_empty() => Ok(h.to_string()),
        _ => Err(Error::invalid_input(format!(
            "backend URL {raw:?} has no bucket name"
        ))),
    }
}

/// The S3 endpoint: the options', else the standard AWS environment's (`AWS_ENDPOINT_URL`, `AWS_ENDPOINT`).
/// The rest of the AWS environment (credentials chain, web identity, container credentials, region) is read
/// by object_store's builder ([`object_store::aws::AmazonS3Builder::from_env`]), as every AWS client does; these
/// and the region below are the only variables Strata's own code reads here.
pub(crate) fn s3_endpoint(o: &BackendOptions) -> Option<String> {
    o.endpoint
        .clone()
        .or_else(|| std::env::var("AWS_ENDPOINT_URL").ok())
        .or_else(|| std::env::var("AWS_ENDPOINT").ok())
}

/// How an S3 backend is reached, for [`S3Wire`] (the same answers `object_store`'s builder was given).
pub(super) struct S3Target {
    pub(super) endpoint: Option<String>,
    pub(super) region: String,
    pub(super) virtual_hosted: bool,
    pub(super) timeout: Duration,
}

pub(super) fn build_s3(
    bucket: &str,
    o: &BackendOptions,
    url: &str,
) -> Result<(object_store::aws::AmazonS3, S3Target)> {
    use object_store::aws::AmazonS3Builder;
    let mut b = AmazonS3Builder::from_env().with_bucket_name(bucket);
    let endpoint = s3_endpoint(o);
    if let Some(ep) = &endpoint {
        b = b
            .with_endpoint(ep)
            .with_allow_http(ep.starts_with("http://"));
    }
    let region = o
        .region
        .clone()
        .or_else(|| std::env::var("AWS_REGION").ok())
        .or_else(|| std::env::var("AWS_DEFAULT_REGION").ok())
        .unwrap_or_else(|| "us-east-1".into());
    b = b.with_region(&region);
    if let Some(k) = &o.access_key_id {
        b = b.with_access_key_id(k);
    }
    if let Some(s) = &o.secret_access_key {
        b = b.with_secret_access_key(s);
    }
    if let Some(t) = &o.session_token {
        b = b.with_token(t);
    }
    let virtual_hosted = o.virtual_hosted_style.unwrap_or(endpoint.is_none());
    b = b.with_virtual_hosted_style_request(virtual_hosted);
    if o.skip_signature.unwrap_or(false) {
        b = b.with_skip_signature(true);
    }
    let timeout = Duration::from_secs(o.request_timeout_secs.unwrap_or(60).max(1));
    let client = object_store::ClientOptions::new()
        .with_timeout(timeout)
        .with_connect_timeout(Duration::from_secs(5))
        .with_pool_max_idle_per_host(64)
        .with_allow_http(
            endpoint
                .as_deref()
                .is_some_and(|e| e.starts_with("http://")),
        );
    let store = b
        .with_client_options(client)
        // Strata retries in one place (RetryPolicy), so object_store's own loop is off.
        .with_retry(object_store::RetryConfig {
            max_retries: 0,
            ..Default::default()
        })
        .build()
        .map_err(|e| classify(e, &format!("configuring {url}")).with_retryable(false))?;
    let target = S3Target {
        endpoint,
        region,
        virtual_hosted,
        timeout,
    };
    Ok((store, target))
}

/// A listing through [`S3Wire`], page after page: objects (in key order, after `start_after`) until `limit` of
/// them or the first for which `past_end` holds, and the common prefixes. `complete`: the listing reached its
/// end (or `past_end`) rather than the limit.
pub(super) async fn wire_list(
    w: &S3Wire,
    prefix: &str,
    delimiter: Option<&str>,
    start_after: Option<&str>,
    past_end: impl Fn(&ObjectMeta) -> bool,
    limit: usize,
    what: &str,
) -> Result<(Vec<ObjectMeta>, Vec<String>, bool)> {
    let mut objects = Vec::new();
    let mut prefixes = Vec::new();
    let mut token: Option<String> = None;
    loop {
        let want = limit.saturating_sub(objects.len()).max(1);
        let page = w
            .list(prefix, delimiter, start_after, token.as_deref(), want, what)
            .await?;
        prefixes.extend(page.common_prefixes);
        for m in page.objects {
            if past_end(&m) {
                return Ok((objects, prefixes, true));
            }
            if objects.len() == limit {
                return Ok((objects, prefixes, false));
            }
            objects.push(m);
        }
        match page.next_token {
            Some(t) if objects.len() < limit => token = Some(t),
            // Full: complete only if nothing follows.
            Some(_) => return Ok((objects, prefixes, false)),
            None => return Ok((objects, prefixes, true)),
        }
    }
}
