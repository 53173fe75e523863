//! A DataLoader worker's side of the share: reads shard bytes from the rank's server (see the
//! [parent](super)).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use parking_lot::Mutex;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

use strata_types::{Error, Result};

use super::*;
use crate::shm::{SharedRegion, SlotMut};

/// Where a read's bytes land: private memory, or a slot of the shared sample region.
enum Buf {
    Vec(Vec<u8>),
    Slot(SlotMut),
}

/// A read's receive buffer, which the server may be writing into (op 3) until its reply arrives. Dropped
/// before that (the read was cancelled), it is leaked rather than freed under the server's write.
struct Landing(Option<Buf>);

impl Landing {
    fn new(len: usize, region: Option<&Arc<SharedRegion>>) -> Self {
        match region.and_then(|r| r.alloc(len)) {
            Some(slot) => Self(Some(Buf::Slot(slot))),
            None => Self(Some(Buf::Vec(Vec::with_capacity(len)))),
        }
    }

    fn address(&mut self) -> u64 {
        match self.0.as_mut() {
            Some(Buf::Vec(v)) => v.as_mut_ptr() as usize as u64,
            Some(Buf::Slot(s)) => s.address(),
            None => 0,
        }
    }

    /// The reply has arrived: the buffer is no longer written from outside.
    fn replied(mut self) -> Option<Buf> {
        self.0.take()
    }
}

impl Drop for Landing {
    fn drop(&mut self) {
        match self.0.take() {
            Some(Buf::Vec(v)) => std::mem::forget(v),
            Some(Buf::Slot(s)) => s.leak(),
            None => {}
        }
    }
}

/// A worker's side: reads shard bytes from the rank's [`ShareServer`].
#[derive(Debug, Clone)]
pub struct ShareClient {
    path: PathBuf,
    idle: Arc<Mutex<Vec<UnixStream>>>,
    /// Reads land in slots of this region when it has room (samples that cross DataLoader workers).
    region: Option<Arc<SharedRegion>>,
}

impl ShareClient {
    /// A client of the server listening at `path`.
    pub fn new(path: &Path) -> Self {
        Self {
            path: path.to_path_buf(),
            idle: Arc::new(Mutex::new(Vec::new())),
            region: None,
        }
    }

    /// This client (sharing its connections) with reads landing in slots of `region` while it has room, in
    /// private memory otherwise.
    pub fn with_region(&self, region: Option<Arc<SharedRegion>>) -> Self {
        Self {
            region,
            ..self.clone()
        }
    }

    /// One request; a read lands in a slot of `region` when given and it has room.
    async fn call(
        &self,
        op: u8,
        key: &str,
        start: u64,
        end: u64,
        region: Option<&Arc<SharedRegion>>,
    ) -> Result<Bytes> {
        let pooled = self.idle.lock().pop();
        let mut s = match pooled {
            Some(s) => s,
            None => UnixStream::connect(&self.path)
                .await
                .map_err(|e| io_err(e, &format!("connecting to {}", self.path.display())))?,
        };
        // A read lands in a buffer the server may write straight into (op 3).
        let mut landing = if op == OP_READ && end > start {
            let len = usize::try_from(end - start)
                .map_err(|_| Error::invalid_input(format!("range {start}..{end} too large")))?;
            Some(Landing::new(len, region))
        } else {
            None
        };
        let mut req = Vec::with_capacity(5 + key.len() + 24);
        req.push(if landing.is_some() { OP_READ_INTO } else { op });
        req.extend_from_slice(&(key.len() as u32).to_le_bytes());
        req.extend_from_slice(key.as_bytes());
        req.extend_from_slice(&start.to_le_bytes());
        req.extend_from_slice(&end.to_le_bytes());
        if let Some(l) = &mut landing {
            req.extend_from_slice(&l.address().to_le_bytes());
        }
        s.write_all(&req).await.map_err(|e| io_err(e, "request"))?;
        let mut head = [0u8; 13];
        s.read_exact(&mut head)
            .await
            .map_err(|e| io_err(e, "reply"))?;
        // The server writes into the landing buffer only before it replies: from here on it is ours again.
        let buf = landing.and_then(Landing::replied);
        let len = u64::from_le_bytes(head[5..13].try_into().expect("8 bytes"));
        if head[0] == STATUS_WRITTEN {
            self.idle.lock().push(s);
            if len != end - start {
                return Err(Error::internal(format!(
                    "shared loader cache: {len} bytes written for {start}..{end}"
                )));
            }
            return match buf {
                Some(Buf::Slot(slot)) => Ok(slot.freeze(len as usize)),
                Some(Buf::Vec(mut v)) => {
                    // SAFETY: the server wrote all `len` bytes of the buffer's spare capacity (it replies
                    // with STATUS_WRITTEN only after process_vm_writev returned that many), and `len` is its
                    // capacity.
                    #[allow(unsafe_code)]
                    unsafe {
                        v.set_len(len as usize);
                    }
                    Ok(Bytes::from(v))
                }
                None => Err(Error::internal("shared loader cache: unexpected reply")),
            };
        }
        let len = usize::try_from(len).map_err(|_| Error::internal("reply too large"))?;
        let buf = match buf {
            Some(Buf::Slot(mut slot)) if head[0] == STATUS_OK && slot.capacity() >= len => {
                s.read_exact(&mut slot.as_mut_slice()[..len])
                    .await
                    .map_err(|e| io_err(e, "reply body"))?;
                self.idle.lock().push(s);
                return Ok(slot.freeze(len));
            }
            other => other,
        };
        let mut body = match buf {
            Some(Buf::Vec(mut b)) if b.capacity() >= len => {
                b.clear();
                b
            }
            _ => Vec::with_capacity(len),
        };
        // Into spare capacity: no zeroing of a buffer about to be overwritten.
        let got = (&mut s)
            .take(len as u64)
            .read_to_end(&mut body)
            .await
            .map_err(|e| io_err(e, "reply body"))?;
        if got != len {
            return Err(io_err(
                std::io::ErrorKind::UnexpectedEof.into(),
                "reply body",
            ));
        }
        self.idle.lock().push(s);
        if head[0] == STATUS_OK {
            return Ok(Bytes::from(body));
        }
        let code = u32::from_le_bytes(head[1..5].try_into().expect("4 bytes"));
        Err(error_of(code, String::from_utf8_lossy(&body).into_owned()))
    }

    /// Bytes `range` of the shard `key`, verified by the serving process, in private memory.
    pub async fn read(&self, key: &str, range: std::ops::Range<u64>) -> Result<Bytes> {
        self.call(OP_READ, key, range.start, range.end, None).await
    }

    /// As [`read`](Self::read), landing in the client's shared region when it has one with room: for sample
    /// bytes handed to the training process (metadata kept by the worker stays in private memory).
    pub async fn read_sample(&self, key: &str, range: std::ops::Range<u64>) -> Result<Bytes> {
        self.call(OP_READ, key, range.start, range.end, self.region.as_ref())
            .await
    }

    /// Ask the serving process to start fetching `range` of shard `key` into its cache.
    pub async fn prefetch(&self, key: &str, range: std::ops::Range<u64>) -> Result<()> {
        self.call(OP_PREFETCH, key, range.start, range.end, None)
            .await
            .map(|_| ())
    }

    /// Size of the shard `key`.
    pub async fn size(&self, key: &str) -> Result<u64> {
        let b = self.call(OP_SIZE, key, 0, 0, None).await?;
        let a: [u8; 8] = b
            .as_ref()
            .try_into()
            .map_err(|_| Error::internal("bad size reply"))?;
        Ok(u64::from_le_bytes(a))
    }
}
