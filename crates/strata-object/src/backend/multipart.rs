//! [`MultipartUpload`]: a backend upload in parts (up to 8 in flight), visible only once complete.

use super::*;

/// A multipart upload in progress. Parts are uploaded as data arrives (up to 8 in flight); nothing is visible
/// until [`Self::complete`]. Dropping it without completing leaves no object (call [`Self::abort`] to also free
/// the parts at the backend promptly).
pub struct MultipartUpload {
    pub(super) backend: Backend,
    pub(super) ctx: IoContext,
    pub(super) key: String,
    pub(super) writer: Option<object_store::WriteMultipart>,
    pub(super) bytes: u64,
    pub(super) start: Instant,
    /// For a local directory: where and what to keep as the object's attributes once complete.
    /// On a local directory: the file written, and the attributes to keep with it.
    pub(super) local: Option<(Path, Option<ObjectAttrs>)>,
    /// On a local directory: the MD5 of the bytes written so far (the object's ETag), unless
    /// [`Self::set_etag`] named another.
    pub(super) md5: Option<crate::localetag::Md5>,
    pub(super) etag: Option<String>,
    /// The size of every part but the last.
    pub(super) part_size: usize,
    /// On S3, for a key `object_store` cannot name: the upload made through `s3wire` instead of `writer`.
    pub(super) wire: Option<WireUpload>,
}

/// An upload through `s3wire`: parts sent one at a time as `part_size` bytes gather.
pub(super) struct WireUpload {
    pub(super) id: String,
    pub(super) part_size: usize,
    pub(super) buf: Vec<u8>,
    pub(super) etags: Vec<String>,
}

impl fmt::Debug for MultipartUpload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MultipartUpload")
            .field("backend", &self.backend.inner.id)
            .field("key", &self.key)
            .field("bytes", &self.bytes)
            .finish()
    }
}

impl MultipartUpload {
    /// Parts in flight: 8, fewer for parts over 8 MiB (at most 64 MiB buffered, at least 2 parts).
    fn in_flight(&self) -> usize {
        let part = self.part_size.max(1);
        (64 * 1024 * 1024 / part).clamp(2, 8)
    }

    /// Send the wire upload's gathered bytes as its next part (`last`: even when fewer than a part).
    async fn wire_flush(&mut self, last: bool) -> Result<()> {
        let what = format!("multipart PUT {}/{}", self.backend.inner.id, self.key);
        let Some(up) = &mut self.wire else {
            return Ok(());
        };
        let Some(w) = self.backend.inner.wire.as_ref() else {
            return Err(Error::internal(format!("{what}: not an S3 backend")));
        };
        while up.buf.len() >= up.part_size || (last && (!up.buf.is_empty() || up.etags.is_empty()))
        {
            let n = up.buf.len().min(up.part_size);
            let part = Bytes::from(up.buf.drain(..n).collect::<Vec<u8>>());
            let number = up.etags.len() + 1;
            let etag = self
                .backend
                .inner
                .retry
                .run(&self.backend.inner.telemetry, Op::Put, || {
                    w.upload_part(&self.key, &up.id, number, part.clone(), &what)
                })
                .await?;
            up.etags.push(etag);
            if last && up.buf.is_empty() {
                break;
            }
        }
        Ok(())
    }

    /// Append bytes; waits while too many parts are in flight (bounded memory).
    pub async fn write(&mut self, bytes: Bytes) -> Result<()> {
        let what = format!("multipart PUT {}/{}", self.backend.inner.id, self.key);
        if let Some(up) = &mut self.wire {
            self.bytes += bytes.len() as u64;
            up.buf.extend_from_slice(&bytes);
            return self.wire_flush(false).await;
        }
        let in_flight = self.in_flight();
        let w = self
            .writer
            .as_mut()
            .ok_or_else(|| Error::internal(format!("{what}: upload already finished")))?;
        w.wait_for_capacity(in_flight)
            .await
            .map_err(|e| classify(e, &what))?;
        self.bytes += bytes.len() as u64;
        if let Some(h) = &mut self.md5 {
            h.update(&bytes);
        }
        w.put(bytes);
        Ok(())
    }

    /// The ETag the object gets where the backend takes one from the writer (a local directory, whose own is
    /// no hash): the gateway gives S3's multipart form. Without it, the content's MD5.
    pub fn set_etag(&mut self, etag: impl Into<String>) {
        self.etag = Some(etag.into());
        self.md5 = None;
    }

    /// The caller names the ETag ([`Self::set_etag`]) before [`Self::complete`], having hashed the bytes
    /// itself: the upload does not hash them again.
    pub fn defer_etag(&mut self) {
        self.md5 = None;
    }

    /// The attributes a local directory keeps with the object once complete (it takes them then, so what is
    /// known only at the end of the bytes, a checksum, can still be kept). Object stores took theirs when the
    /// upload started; this changes nothing there.
    pub fn set_local_attrs(&mut self, attrs: &ObjectAttrs) {
        if let Some((_, a)) = &mut self.local {
            *a = (!attrs.is_empty()).then(|| attrs.clone());
        }
    }

    /// The wire upload's last part and its completion.
    async fn wire_complete(&mut self) -> Result<PutOutcome> {
        let what = format!("multipart PUT {}/{}", self.backend.inner.id, self.key);
        self.wire_flush(true).await?;
        let (Some(up), Some(w)) = (&self.wire, self.backend.inner.wire.as_ref()) else {
            return Err(Error::internal(format!("{what}: not an S3 backend")));
        };
        let (etag, version) = self
            .backend
            .inner
            .retry
            .run(&self.backend.inner.telemetry, Op::Put, || {
                w.complete_upload(&self.key, &up.id, &up.etags, &what)
            })
            .await?;
        Ok(PutOutcome { etag, version })
    }

    /// The upload's one I/O event, with how it ended.
    fn emit_outcome<T>(&self, r: &Result<T>) {
        let outcome = match r {
            Ok(_) => Outcome::Ok,
            Err(e) => Outcome::Err(e.kind()),
        };
        self.backend.emit(
            &self.ctx,
            Op::Put,
            &self.key,
            self.bytes,
            self.start,
            outcome,
        );
    }

    /// Upload the last part and make the object visible.
    pub async fn complete(mut self) -> Result<PutOutcome> {
        let what = format!("multipart PUT {}/{}", self.backend.inner.id, self.key);
        if self.wire.is_some() {
            let r = self.wire_complete().await;
            self.emit_outcome(&r);
            if r.is_err()
                && let (Some(up), Some(w)) = (&self.wire, self.backend.inner.wire.as_ref())
                && let Err(a) = w.abort(&self.key, &up.id, &what).await
            {
                tracing::warn!(error = %a, key = %self.key, "aborting a failed multipart upload (the store keeps its parts until it expires them)");
            }
            return r;
        }
        let mut w = self
            .writer
            .take()
            .ok_or_else(|| Error::internal(format!("{what}: upload already finished")))?;
        // The parts first: when one failed, that failure is what the caller reads. (object_store's `finish`
        // aborts the upload then and returns the abort's error instead, a DELETE failure when the store is
        // down.)
        let r = match w.wait_for_capacity(0).await {
            Ok(()) => w.finish().await.map_err(|e| classify(e, &what)),
            Err(e) => {
                let cause = classify(e, &what);
                if let Err(a) = w.abort().await {
                    tracing::warn!(error = %a, key = %self.key, "aborting a failed multipart upload (the store keeps its parts until it expires them)");
                }
                Err(cause)
            }
        };
        self.emit_outcome(&r);
        let r = r?;
        let mut etag = r.e_tag;
        if let Some((path, attrs)) = &self.local {
            if let Some(attrs) = attrs {
                self.backend.keep_local_attrs(path, attrs);
            }
            self.backend.forget_other_place(&self.key, path);
            let public = match (self.etag.take(), self.md5.take()) {
                (Some(e), _) => Some(e),
                (None, Some(h)) => Some(h.hex()),
                (None, None) => None,
            };
            if let Some(public) = public {
                etag = self.backend.record_local_etag(path, public, etag);
            }
        }
        Ok(PutOutcome {
            etag,
            version: r.version,
        })
    }

    /// Abandon the upload and free its parts at the backend.
    pub async fn abort(mut self) -> Result<()> {
        let what = format!("abort multipart {}/{}", self.backend.inner.id, self.key);
        if let (Some(up), Some(w)) = (self.wire.take(), self.backend.inner.wire.as_ref()) {
            return w.abort(&self.key, &up.id, &what).await;
        }
        match self.writer.take() {
            Some(w) => w.abort().await.map_err(|e| classify(e, &what)),
            None => Ok(()),
        }
    }
}
