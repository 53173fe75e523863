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
    const MAX_PARTS_IN_FLIGHT: usize = 8;

    /// Append bytes; waits while too many parts are in flight (bounded memory).
    pub async fn write(&mut self, bytes: Bytes) -> Result<()> {
        let what = format!("multipart PUT {}/{}", self.backend.inner.id, self.key);
        let w = self
            .writer
            .as_mut()
            .ok_or_else(|| Error::internal(format!("{what}: upload already finished")))?;
        w.wait_for_capacity(Self::MAX_PARTS_IN_FLIGHT)
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
    }

    /// Upload the last part and make the object visible.
    pub async fn complete(mut self) -> Result<PutOutcome> {
        let what = format!("multipart PUT {}/{}", self.backend.inner.id, self.key);
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
        let outcome = match &r {
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
        match self.writer.take() {
            Some(w) => w.abort().await.map_err(|e| classify(e, &what)),
            None => Ok(()),
        }
    }
}
