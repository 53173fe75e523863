//! [`StreamPut`]: one PUT of a body that is sent as it arrives, on S3 backends. A single PutObject larger
//! than the gateway buffers keeps the ETag S3 gives one PUT (its content's MD5) instead of a multipart
//! upload's `-N` form, which clients that check MD5s (rclone) cannot verify.
//!
//! Nothing is visible before the writer says the body is good: the last chunk written is held back until
//! [`StreamPut::finish`], and [`StreamPut::abort`] (or a drop) ends the request short of its
//! `Content-Length`, of which S3 stores nothing. A writer checks what it received (MD5, checksums) before it
//! finishes.

use super::*;

/// Chunks queued between the writer and the request (each as large as the writer's; a slow origin slows
/// the writer down).
const QUEUE: usize = 4;

/// A single PUT in progress ([`Backend::put_stream`]).
pub struct StreamPut {
    tx: Option<tokio::sync::mpsc::Sender<std::result::Result<Bytes, std::io::Error>>>,
    /// The last chunk written, sent by [`StreamPut::finish`] only.
    held: Option<Bytes>,
    task: Option<tokio::task::JoinHandle<Result<PutOutcome>>>,
    len: u64,
    sent: u64,
    what: String,
}

impl fmt::Debug for StreamPut {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StreamPut")
            .field("what", &self.what)
            .field("len", &self.len)
            .field("sent", &self.sent)
            .finish()
    }
}

impl Backend {
    /// Start one PUT of exactly `len` bytes to `key` whose body is sent as it is written, with `attrs`
    /// (unconditional); `None` where the backend has no such request (not S3) or S3 would refuse a single
    /// PUT of this size (over 5 GiB): use [`Self::put_multipart_with`] there. The request is not retried
    /// (its body is not kept): a failure is the caller's, as for any single PUT.
    pub fn put_stream(
        &self,
        ctx: &IoContext,
        key: &str,
        len: u64,
        attrs: &ObjectAttrs,
    ) -> Result<Option<StreamPut>> {
        const SINGLE_PUT_LIMIT: u64 = 5 * 1024 * 1024 * 1024;
        if self.inner.wire.is_none() || len > SINGLE_PUT_LIMIT {
            return Ok(None);
        }
        s3_key(key)?;
        let what = format!("PUT {}/{key}", self.inner.id);
        let headers = wire_headers(attrs, None, &what)?;
        let (tx, rx) = tokio::sync::mpsc::channel(QUEUE);
        let (backend, ctx, key, w) = (self.clone(), ctx.clone(), key.to_string(), what.clone());
        let task = tokio::spawn(async move {
            let Some(wire) = backend.inner.wire.as_ref() else {
                return Err(Error::internal(format!("{w}: not an S3 backend")));
            };
            backend
                .observe(&ctx, Op::Put, &key, |_| len, async {
                    wire.put_stream(&key, len, headers, rx, &w)
                        .await
                        .map(|(etag, version)| PutOutcome { etag, version })
                })
                .await
        });
        Ok(Some(StreamPut {
            tx: Some(tx),
            held: None,
            task: Some(task),
            len,
            sent: 0,
            what,
        }))
    }
}

impl StreamPut {
    /// Write `chunk`: the one written before it goes on to the origin, this one is held until the next write
    /// or [`Self::finish`]. Past the declared length, or once the request failed, an error (the request's
    /// own, when it failed), and the PUT is abandoned.
    pub async fn write(&mut self, chunk: Bytes) -> Result<()> {
        let n = chunk.len() as u64;
        if self.sent + n > self.len {
            self.abort().await;
            return Err(Error::invalid_input(format!(
                "{}: the body is longer than the {} bytes declared",
                self.what, self.len
            )));
        }
        self.sent += n;
        match self.held.replace(chunk) {
            Some(prev) => self.send(prev).await,
            None => Ok(()),
        }
    }

    async fn send(&mut self, chunk: Bytes) -> Result<()> {
        let sent = match &self.tx {
            Some(tx) => tx.send(Ok(chunk)).await.is_ok(),
            None => false,
        };
        if sent {
            return Ok(());
        }
        // The request ended before its body did: its answer says why.
        Err(match self.outcome().await {
            Err(e) => e,
            Ok(_) => Error::new(
                ErrorKind::Unavailable,
                format!(
                    "{}: the origin answered before the body was sent",
                    self.what
                ),
            ),
        })
    }

    /// Send the held chunk, end the body (it must be the declared length) and wait for the origin's answer.
    pub async fn finish(mut self) -> Result<PutOutcome> {
        if self.sent != self.len {
            self.abort().await;
            return Err(Error::invalid_input(format!(
                "{}: {} of the {} bytes declared were written",
                self.what, self.sent, self.len
            )));
        }
        if let Some(last) = self.held.take() {
            self.send(last).await?;
        }
        self.tx = None;
        self.outcome().await
    }

    /// Abandon the PUT: the held chunk is dropped and the request cut, so the origin never receives the
    /// body whole and stores nothing.
    pub async fn abort(&mut self) {
        self.held = None;
        if let Some(tx) = self.tx.take() {
            let _ = tx.try_send(Err(std::io::Error::other("the write was abandoned")));
        }
        if let Some(task) = self.task.take() {
            task.abort();
            let _ = task.await;
        }
    }

    async fn outcome(&mut self) -> Result<PutOutcome> {
        self.tx = None;
        let Some(task) = self.task.take() else {
            return Err(Error::new(
                ErrorKind::Unavailable,
                format!("{}: the request already ended", self.what),
            ));
        };
        match task.await {
            Ok(r) => r,
            Err(e) => Err(Error::internal(format!("{}: {e}", self.what))),
        }
    }
}

impl Drop for StreamPut {
    fn drop(&mut self) {
        // Dropped mid-body (the client went away): the body errors and the request ends with it.
        self.held = None;
        if let Some(tx) = self.tx.take() {
            let _ = tx.try_send(Err(std::io::Error::other("the write was abandoned")));
        }
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}
