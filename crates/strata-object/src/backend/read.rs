//! Reads: one request shape for every GET and HEAD ([`Fetched`]), pinned to an ETag when asked, through
//! [`S3Wire`] on S3 and `object_store` elsewhere; ranges, streams and the one-request open.

use super::*;

impl Backend {
    /// One GET (or HEAD) of `key`, `range` of it when given, pinned to `if_match`: the server checks
    /// `If-Match`, and so do we, on the response's ETag (some S3-compatible servers ignore the header). S3
    /// backends ask through [`S3Wire`]; the others through `object_store`.
    pub(super) async fn fetch(
        &self,
        key: &str,
        range: Option<&Range<u64>>,
        if_match: Option<&str>,
        head: bool,
        what: &str,
    ) -> Result<Fetched> {
        self.check_read_key(key)?;
        if let Some(w) = &self.inner.wire {
            let (meta, body) = w.get(key, range, if_match, head, what).await?;
            return Ok(Fetched { meta, body });
        }
        let path = match &self.inner.local_root {
            Some(root) => self.local_read_path(root, key)?,
            None => read_path(key)?,
        };
        if head && self.inner.local.is_some() {
            let m = self
                .inner
                .store
                .head(&path)
                .await
                .map_err(|e| classify(e, what))?;
            let mut meta = self.meta_of(&path, m, &object_store::Attributes::new());
            meta.key = key.to_string();
            self.show_local_etag(&path, &mut meta);
            return Ok(Fetched::empty(meta));
        }
        // A local file pinned to the public ETag it was shown is pinned to the file store's ETag recorded with
        // it, which the file store checks against the file it opens (`localetag`).
        let file = self.local_file(&path);
        let pinned = match (&file, if_match) {
            (Some(f), Some(want)) => Some(crate::localetag::pin(f, want)),
            (None, Some(want)) => Some(want.to_string()),
            (_, None) => None,
        };
        let if_match = pinned.as_deref();
        // With `head`, a HEAD that keeps the object's attributes (`ObjectStore::head` drops them).
        let opts = object_store::GetOptions {
            head,
            range: range.map(|r| r.clone().into()),
            if_match: if_match.map(str::to_string),
            ..Default::default()
        };
        let r = self
            .inner
            .store
            .get_opts(&path, opts)
            .await
            .map_err(|e| classify(e, what))?;
        if let (Some(expect), Some(got)) = (if_match, r.meta.e_tag.as_deref())
            && expect != got
        {
            return Err(crate::classify::changed(what, got, expect));
        }
        let mut meta = self.meta_of(&path, r.meta.clone(), &r.attributes);
        meta.key = key.to_string();
        self.show_local_etag(&path, &mut meta);
        if head {
            return Ok(Fetched::empty(meta));
        }
        let what = what.to_string();
        let body = r
            .into_stream()
            .map(move |c| c.map_err(|e| classify(e, &what)))
            .boxed();
        Ok(Fetched { meta, body })
    }

    /// Metadata of `key`.
    pub async fn head(&self, ctx: &IoContext, key: &str) -> Result<ObjectMeta> {
        self.check_read_key(key)?;
        let what = format!("HEAD {}/{key}", self.inner.id);
        self.observe(ctx, Op::Head, key, |_| 0, async {
            self.inner
                .retry
                .run(&self.inner.telemetry, Op::Head, || async {
                    Ok(self.fetch(key, None, None, true, &what).await?.meta)
                })
                .await
        })
        .await
    }

    /// The whole object.
    pub async fn get(&self, ctx: &IoContext, key: &str) -> Result<(ObjectMeta, Bytes)> {
        self.check_read_key(key)?;
        let what = format!("GET {}/{key}", self.inner.id);
        self.observe(
            ctx,
            Op::Get,
            key,
            |(_, b): &(ObjectMeta, Bytes)| b.len() as u64,
            async {
                self.inner
                    .retry
                    .run(&self.inner.telemetry, Op::Get, || async {
                        let f = self.fetch(key, None, None, false, &what).await?;
                        let want = f.meta.size;
                        let meta = f.meta.clone();
                        let bytes = f.collect(want, &what).await?;
                        Ok((meta, bytes))
                    })
                    .await
            },
        )
        .await
    }

    /// Bytes `range` of `key`. With `if_match`, the read fails with [`ErrorKind::PreconditionFailed`] unless the
    /// object's ETag is still that one, so the bytes of two versions are never mixed. Short reads (a
    /// truncated body) are errors, never silently returned.
    pub async fn get_range(
        &self,
        ctx: &IoContext,
        key: &str,
        range: Range<u64>,
        if_match: Option<&str>,
    ) -> Result<Bytes> {
        self.check_read_key(key)?;
        if range.end <= range.start {
            return Ok(Bytes::new());
        }
        let what = format!(
            "GET {}/{key} bytes {}-{}",
            self.inner.id,
            range.start,
            range.end - 1
        );
        let want = range.end - range.start;
        self.observe(ctx, Op::Get, key, |b: &Bytes| b.len() as u64, async {
            self.inner
                .retry
                .run(&self.inner.telemetry, Op::Get, || async {
                    let f = self
                        .fetch(key, Some(&range), if_match, false, &what)
                        .await?;
                    f.collect(want, &what).await
                })
                .await
        })
        .await
    }

    /// Bytes `range` of `key` as chunks, as they arrive from the backend, for callers that process data while
    /// it streams (the cache writes blocks to disk while the rest of a run is still arriving). The request
    /// itself is retried like [`Self::get_range`]; a failure mid-stream ends the stream with a classified error
    /// item and the caller decides whether to retry. The caller must check that it received `range.len()`
    /// bytes. One I/O event is emitted when the stream ends.
    pub async fn get_range_stream(
        &self,
        ctx: &IoContext,
        key: &str,
        range: Range<u64>,
        if_match: Option<&str>,
    ) -> Result<futures::stream::BoxStream<'static, Result<Bytes>>> {
        self.check_read_key(key)?;
        let what = format!(
            "GET {}/{key} bytes {}-{}",
            self.inner.id,
            range.start,
            range.end.saturating_sub(1)
        );
        let start = Instant::now();
        let f = self
            .request_retried(ctx, key, &range, if_match, &what, start)
            .await?;
        Ok(self.body_stream(ctx, key, start, f.body))
    }

    /// [`Self::fetch`] of a range under the retry policy; a final failure is an I/O event.
    pub(super) async fn request_retried(
        &self,
        ctx: &IoContext,
        key: &str,
        range: &Range<u64>,
        if_match: Option<&str>,
        what: &str,
        start: Instant,
    ) -> Result<Fetched> {
        let r = self
            .inner
            .retry
            .run(&self.inner.telemetry, Op::Get, || {
                self.fetch(key, Some(range), if_match, false, what)
            })
            .await;
        if let Err(e) = &r {
            self.emit(ctx, Op::Get, key, 0, start, Outcome::Err(e.kind()));
        }
        r
    }

    /// Metadata of `key` and a stream of its first `len` bytes (the whole object when it is shorter), from one
    /// request: the metadata as soon as the response headers are in, the bytes as they arrive. How a cache
    /// opens an object it has not seen, without a separate HEAD. Fails with [`ErrorKind::InvalidInput`] for an
    /// empty object (no range of it is satisfiable); callers fall back to [`Self::head`]. The request is
    /// retried; a stream that fails midway is the caller's to retry ([`Self::get_range_stream`], pinned to
    /// the ETag it learned here).
    pub async fn get_head_stream(
        &self,
        ctx: &IoContext,
        key: &str,
        len: u64,
    ) -> Result<(
        ObjectMeta,
        futures::stream::BoxStream<'static, Result<Bytes>>,
    )> {
        self.check_read_key(key)?;
        let what = format!("GET {}/{key} bytes 0-{}", self.inner.id, len.max(1) - 1);
        let start = Instant::now();
        let f = self
            .request_retried(ctx, key, &(0..len.max(1)), None, &what, start)
            .await?;
        Ok((f.meta, self.body_stream(ctx, key, start, f.body)))
    }

    /// A response body as a stream of `Bytes`, with an I/O event when it ends (bytes, duration, outcome).
    pub(super) fn body_stream(
        &self,
        ctx: &IoContext,
        key: &str,
        start: Instant,
        body: futures::stream::BoxStream<'static, Result<Bytes>>,
    ) -> futures::stream::BoxStream<'static, Result<Bytes>> {
        struct State {
            inner: futures::stream::BoxStream<'static, Result<Bytes>>,
            backend: Backend,
            ctx: IoContext,
            key: String,
            start: Instant,
            bytes: u64,
            done: bool,
        }
        let state = State {
            inner: body,
            backend: self.clone(),
            ctx: ctx.clone(),
            key: key.to_string(),
            start,
            bytes: 0,
            done: false,
        };
        futures::stream::unfold(state, |mut st| async move {
            if st.done {
                return None;
            }
            match st.inner.next().await {
                Some(Ok(b)) => {
                    st.bytes += b.len() as u64;
                    Some((Ok(b), st))
                }
                Some(Err(e)) => {
                    st.backend.emit(
                        &st.ctx,
                        Op::Get,
                        &st.key,
                        st.bytes,
                        st.start,
                        Outcome::Err(e.kind()),
                    );
                    st.done = true;
                    Some((Err(e), st))
                }
                None => {
                    st.backend
                        .emit(&st.ctx, Op::Get, &st.key, st.bytes, st.start, Outcome::Ok);
                    None
                }
            }
        })
        .boxed()
    }

    /// Metadata and the first `len` bytes of `key` in one request (the whole object when it is shorter), the
    /// bytes collected: [`Self::get_head_stream`] for callers that want them in one piece. Fails with
    /// [`ErrorKind::InvalidInput`] for an empty object; a short or long body is an error.
    pub async fn get_head(
        &self,
        ctx: &IoContext,
        key: &str,
        len: u64,
    ) -> Result<(ObjectMeta, Bytes)> {
        let (meta, mut chunks) = self.get_head_stream(ctx, key, len).await?;
        let want = len.min(meta.size);
        // Into a buffer mapped in one call, not faulted in page by page.
        let mut buf = strata_types::mem::prefaulted(want as usize);
        while let Some(c) = chunks.next().await {
            let c = c?;
            if (buf.len() + c.len()) as u64 > want {
                return Err(Error::new(
                    ErrorKind::Unavailable,
                    format!(
                        "GET {}/{key}: more than the {want} bytes asked",
                        self.inner.id
                    ),
                ));
            }
            buf.extend_from_slice(&c);
        }
        if buf.len() as u64 != want {
            return Err(Error::new(
                ErrorKind::Unavailable,
                format!(
                    "GET {}/{key}: short read, got {} of {want} bytes",
                    self.inner.id,
                    buf.len()
                ),
            ));
        }
        Ok((meta, buf.freeze()))
    }
}

/// What a GET or HEAD brought: the object's metadata and its bytes as they arrive (failures classified).
pub(super) struct Fetched {
    meta: ObjectMeta,
    body: futures::stream::BoxStream<'static, Result<Bytes>>,
}

impl Fetched {
    fn empty(meta: ObjectMeta) -> Self {
        Self {
            meta,
            body: futures::stream::empty().boxed(),
        }
    }

    /// The body in one piece, which must be exactly `want` bytes.
    async fn collect(mut self, want: u64, what: &str) -> Result<Bytes> {
        let mut buf = Vec::with_capacity(want.min(1 << 30) as usize);
        while let Some(c) = self.body.next().await {
            let c = c?;
            if (buf.len() + c.len()) as u64 > want {
                return Err(Error::new(
                    ErrorKind::Unavailable,
                    format!("{what}: more than the {want} bytes asked"),
                ));
            }
            buf.extend_from_slice(&c);
        }
        if buf.len() as u64 != want {
            return Err(Error::new(
                ErrorKind::Unavailable,
                format!("{what}: short read, got {} of {want} bytes", buf.len()),
            ));
        }
        Ok(Bytes::from(buf))
    }
}
