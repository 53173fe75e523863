//! Between `/dev/fuse` and `fuser`: how a mount outlives the process serving it.
//!
//! The kernel's FUSE connection lives as long as one descriptor of `/dev/fuse` is open, so the mount's holder
//! ([`crate::holder`]) keeps one and hands it to each server it starts. A new server cannot simply run
//! `fuser` on it: the kernel negotiated the connection (`INIT`) with the first server and never sends `INIT`
//! again, and `fuser` answers nothing before its handshake. So the server runs `fuser` on one end of a
//! `SOCK_SEQPACKET` socket pair (message boundaries kept, as on `/dev/fuse`) and relays messages both ways:
//!
//! - first start: the kernel's `INIT` is saved in the state directory on its way to `fuser`;
//! - later starts: the saved `INIT` is given to `fuser` (whose answer is dropped: the kernel has its answer),
//!   then `FUSE_NOTIFY_RESEND` (Linux 6.9) asks the kernel to send again every request the dead server had
//!   read but not answered. Readers see a slower read, never `ENOTCONN` or a lost request.
//!
//! The relay costs one copy each way per message. **A message must never need a large contiguous kernel
//! allocation.** The kernel builds a `SOCK_SEQPACKET` message as one buffer plus at most `MAX_SKB_FRAGS` (17)
//! pages; the rest of a 1 MiB read's answer took one ~950 KiB buffer (an order-8 allocation), which fails
//! under fragmentation (`ENOBUFS`) where allocations of order 3 or less never do. `fuser` cannot retry a
//! failed answer: it logs `Failed to send FUSE reply: No buffer space available`, the request is never
//! answered, and the page it was reading stays locked, hanging every later reader of that file until the
//! unmount. So reads and writes go in pieces of at most [`RELIABLE_IO`] (see [`linear_bytes`]), which
//! [`Relay::max_io`] reports; and the relay's own sends retry the transient `ENOBUFS`/`ENOMEM` instead of
//! dropping a message.

use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustix::io::Errno;
use rustix::net::{AddressFamily, RecvFlags, SendFlags, SocketFlags, SocketType};
use strata_types::{Error, Result};

/// `FUSE_INIT`'s opcode.
const FUSE_INIT: u32 = 26;
/// `FUSE_NOTIFY_RESEND`'s code (Linux 6.9).
const FUSE_NOTIFY_RESEND: i32 = 7;
/// Bytes of a `fuse_in_header`.
const IN_HEADER: usize = 40;
/// The largest read or write the kernel is asked to send in one message: its answer (and its header) fits
/// 17 pages plus a buffer of an order-3 allocation (see [`linear_bytes`]).
pub const RELIABLE_IO: usize = 64 << 10;
/// The largest message either side could send (room for a larger `max_io` negotiated by an older server).
const MAX_IO: usize = 1 << 20;
/// How long a send that failed for want of kernel memory is retried before the message is given up.
const RETRY_FOR: std::time::Duration = std::time::Duration::from_secs(30);
/// Room for headers beside the payload of a message.
const HEADROOM: usize = 4096;

/// The relay of one server.
#[derive(Debug)]
pub struct Relay {
    dev: Arc<OwnedFd>,
    near: Arc<OwnedFd>,
    max_io: u32,
    init_file: PathBuf,
}

/// Why the relay stopped.
#[derive(Debug, PartialEq, Eq)]
pub enum Stopped {
    /// The file system was unmounted (the kernel closed the connection).
    Unmounted,
    /// `fuser` stopped (its end of the socket closed).
    ServerGone,
}

/// A seqpacket pair whose messages may be as large as `want` (or the largest the system allows), and that size.
fn socket_pair(want: usize) -> Result<(OwnedFd, OwnedFd, usize)> {
    let (a, b) = rustix::net::socketpair(
        AddressFamily::UNIX,
        SocketType::SEQPACKET,
        SocketFlags::CLOEXEC,
        None,
    )
    .map_err(|e| Error::from_io(e.into(), "a socket pair for the FUSE relay"))?;
    for s in [&a, &b] {
        // Forcing needs CAP_NET_ADMIN; without it the size is capped at net.core.wmem_max.
        if rustix::net::sockopt::set_socket_send_buffer_size_force(s, want).is_err() {
            let _ = rustix::net::sockopt::set_socket_send_buffer_size(s, want);
        }
    }
    let got = rustix::net::sockopt::socket_send_buffer_size(&a)
        .and_then(|x| rustix::net::sockopt::socket_send_buffer_size(&b).map(|y| x.min(y)))
        .map_err(|e| Error::from_io(e.into(), "the FUSE relay's socket buffer"))?;
    Ok((a, b, got))
}

impl Relay {
    /// A relay for `dev` (the mount's `/dev/fuse` descriptor); the end for `fuser` is returned beside it. With
    /// `state` holding a saved `INIT` ([`Relay::resuming`]), [`Relay::handshake_again`] must run before
    /// [`Relay::run`].
    pub fn new(dev: OwnedFd, state: &Path) -> Result<(Self, OwnedFd)> {
        let (near, far, buf) = socket_pair(2 * (MAX_IO + HEADROOM))?;
        // The kernel doubles what is set and a datagram also pays for its bookkeeping: keep a margin.
        let room = (buf / 2).saturating_sub(HEADROOM);
        let max_io = (room.min(RELIABLE_IO) / 4096 * 4096).max(4096) as u32;
        Ok((
            Self {
                dev: Arc::new(dev),
                near: Arc::new(near),
                max_io,
                init_file: state.join("init.bin"),
            },
            far,
        ))
    }

    /// The largest read or write the kernel may send through this relay.
    pub fn max_io(&self) -> u32 {
        self.max_io
    }

    /// Whether an earlier server of this mount answered the kernel's `INIT` already.
    pub fn resuming(state: &Path) -> bool {
        state.join("init.bin").exists()
    }

    /// Give `fuser` the saved `INIT` (call before `fuser::Session::from_fd`, which reads it; then
    /// [`Relay::drop_init_answer`]).
    pub fn replay_init(&self) -> Result<()> {
        let init = std::fs::read(&self.init_file)
            .map_err(|e| Error::from_io(e, self.init_file.display()))?;
        rustix::net::send(&*self.near, &init, SendFlags::empty())
            .map_err(|e| Error::from_io(e.into(), "replaying INIT to the FUSE server"))?;
        Ok(())
    }

    /// Read and drop `fuser`'s answer to the replayed `INIT`, then ask the kernel to send again what the
    /// previous server left unanswered.
    pub fn drop_init_answer(&self) -> Result<()> {
        let mut buf = vec![0u8; HEADROOM];
        rustix::net::recv(&*self.near, &mut buf[..], RecvFlags::empty())
            .map_err(|e| Error::from_io(e.into(), "the FUSE server's INIT answer"))?;
        let mut notify = [0u8; 16];
        notify[0..4].copy_from_slice(&16u32.to_ne_bytes());
        notify[4..8].copy_from_slice(&FUSE_NOTIFY_RESEND.to_ne_bytes());
        match rustix::io::write(&*self.dev, &notify) {
            Ok(_) => Ok(()),
            Err(e) => Err(Error::from_io(
                e.into(),
                "FUSE_NOTIFY_RESEND (Linux 6.9 or later is needed to survive a restart)",
            )),
        }
    }

    /// Relay until the file system is unmounted or `fuser` stops; two threads, one each way. The caller exits
    /// the process afterwards (the thread relaying answers may still be blocked).
    pub fn run(&self) -> Stopped {
        let (dev, near) = (self.dev.clone(), self.near.clone());
        let from_server = std::thread::Builder::new()
            .name("fuse-relay-out".into())
            .spawn(move || {
                let mut buf = vec![0u8; MAX_IO + HEADROOM];
                loop {
                    let n = match rustix::net::recv(&*near, &mut buf[..], RecvFlags::empty()) {
                        Ok((_, 0)) => return,
                        Ok((_, n)) => n,
                        Err(Errno::INTR) => continue,
                        Err(_) => return,
                    };
                    match retrying(|| rustix::io::write(&*dev, &buf[..n])) {
                        // ENOENT: the request was interrupted and is answered no more.
                        Ok(_) | Err(Errno::NOENT) => {}
                        Err(Errno::NODEV) => return,
                        Err(e) => tracing::warn!(error = %e, "writing an answer to /dev/fuse"),
                    }
                }
            });
        let mut buf = vec![0u8; MAX_IO + HEADROOM];
        let mut first = true;
        let stopped = loop {
            let n = match rustix::io::read(&*self.dev, &mut buf[..]) {
                Ok(0) => break Stopped::Unmounted,
                Ok(n) => n,
                Err(Errno::INTR | Errno::AGAIN | Errno::NOENT) => continue,
                Err(Errno::NODEV) => break Stopped::Unmounted,
                Err(e) => {
                    tracing::error!(error = %e, "reading /dev/fuse");
                    break Stopped::Unmounted;
                }
            };
            if first {
                first = false;
                if n >= IN_HEADER
                    && u32::from_ne_bytes([buf[4], buf[5], buf[6], buf[7]]) == FUSE_INIT
                    && let Err(e) = save(&self.init_file, &buf[..n])
                {
                    tracing::error!(error = %e, "saving INIT: a restarted server could not take over");
                }
            }
            match retrying(|| rustix::net::send(&*self.near, &buf[..n], SendFlags::empty())) {
                Ok(_) => {}
                Err(e) => {
                    tracing::error!(error = %e, "passing a request to the FUSE server");
                    break Stopped::ServerGone;
                }
            }
        };
        // The other thread is left blocked on its socket: the process exits next (see `holder::serve`).
        drop(from_server);
        stopped
    }

    /// The descriptor of `/dev/fuse`, for notifications.
    pub fn dev(&self) -> std::os::fd::BorrowedFd<'_> {
        self.dev.as_fd()
    }

    /// The descriptor of `/dev/fuse`, shared (backing-file ioctls, [`crate::passthrough`]).
    pub fn dev_shared(&self) -> Arc<OwnedFd> {
        self.dev.clone()
    }
}

/// `send` again while it fails for want of kernel memory (`ENOBUFS`, `ENOMEM`: transient) or a signal, for
/// up to [`RETRY_FOR`]: a message dropped here is a request never answered (or never served).
fn retrying<T>(mut send: impl FnMut() -> rustix::io::Result<T>) -> rustix::io::Result<T> {
    let start = std::time::Instant::now();
    let mut pause = std::time::Duration::from_millis(1);
    loop {
        match send() {
            Err(Errno::INTR) => continue,
            Err(e @ (Errno::NOBUFS | Errno::NOMEM)) if start.elapsed() < RETRY_FOR => {
                tracing::debug!(error = %e, "no kernel memory for a FUSE message; retrying");
                std::thread::sleep(pause);
                pause = (pause * 2).min(std::time::Duration::from_millis(100));
            }
            r => return r,
        }
    }
}

/// The bytes of a `SOCK_SEQPACKET` message of `len` bytes that the kernel puts in one contiguous buffer, the
/// rest going into at most 17 separate pages (`unix_dgram_sendmsg`: what exceeds `SKB_MAX_ALLOC`, page
/// aligned, up to `MAX_SKB_FRAGS` pages); with `skb_max_alloc` what an order-3 allocation holds past the
/// kernel's bookkeeping.
pub fn linear_bytes(len: usize, page: usize, skb_max_alloc: usize) -> usize {
    if len <= skb_max_alloc {
        return len;
    }
    let paged = (len - skb_max_alloc).min(17 * page).next_multiple_of(page);
    len.saturating_sub(paged)
}

fn save(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    /// Bytes of a `fuse_out_header`.
    const OUT_HEADER: usize = 16;

    /// What an order-3 allocation holds past `struct skb_shared_info` (320 bytes on x86-64; 512 leaves room
    /// for other builds).
    fn skb_max_alloc(page: usize) -> usize {
        (page << 3) - 512
    }

    #[test]
    fn no_message_the_relay_passes_needs_more_than_an_order_3_allocation() {
        let dir = tempfile::tempdir().unwrap();
        let dev: OwnedFd = std::fs::File::open("/dev/null").unwrap().into();
        let (relay, _far) = Relay::new(dev, dir.path()).unwrap();
        let page = 4096;
        let largest = relay.max_io() as usize + OUT_HEADER;
        assert!(
            linear_bytes(largest, page, skb_max_alloc(page)) <= skb_max_alloc(page),
            "a read of {} bytes needs a {}-byte contiguous buffer",
            relay.max_io(),
            linear_bytes(largest, page, skb_max_alloc(page))
        );
        // The model, on what the kernel did to a 1 MiB read (an ~950 KiB buffer: order 8).
        assert!(linear_bytes((1 << 20) + OUT_HEADER, 4096, skb_max_alloc(4096)) > 900 << 10);
    }

    #[test]
    fn a_send_short_of_kernel_memory_is_retried_and_other_errors_are_not() {
        let mut n = 0;
        let r = retrying(|| {
            n += 1;
            if n < 4 { Err(Errno::NOBUFS) } else { Ok(n) }
        });
        assert_eq!(r, Ok(4));
        let mut m = 0;
        let r: rustix::io::Result<()> = retrying(|| {
            m += 1;
            Err(Errno::PIPE)
        });
        assert_eq!((r, m), (Err(Errno::PIPE), 1));
    }
}
