//! Sharing one process's cache with its DataLoader workers.
//!
//! PyTorch's DataLoader forks worker processes, and starts new ones every epoch. A cache inside each worker
//! would fetch every block once per worker and be lost at the end of each epoch. Instead the process that
//! opened the dataset (the rank) serves its [`LocalSource`](crate::LocalSource) on a Unix socket and the
//! workers read through it: one cache per rank, warm across epochs, each block fetched from the origin once.
//!
//! The protocol is deliberately tiny (no HTTP): a request is `u8 op | u32 key_len | key | u64 start | u64 end`
//! (op 0 reads `start..end`, 1 asks for the object's size, 2 starts a prefetch of `start..end` and answers once
//! it is started, 3 reads `start..end` into the worker's memory: the request ends with `u64 address`); the
//! reply is
//! `u8 status | u32 error kind | u64 len | payload`, the payload being the bytes (status 0; the size as a u64;
//! nothing for a prefetch) or the error message (status 1). Status 2 answers op 3 when the bytes were written
//! straight into the worker's buffer at `address` with `process_vm_writev(2)` (no payload follows).
//!
//! Op 3 is the fast path: one copy from the rank's cache into the worker's buffer, where a socket costs two
//! copies through the kernel, a zeroed receive buffer and a wake-up per chunk (a profile of two DataLoader
//! workers put most of the serving CPU there). The server writes only into the process on the other end of
//! the connection (its pid from `SO_PEERCRED`, never one named in the request), and the worker keeps the
//! buffer alive until the reply has arrived (a cancelled read leaks it rather than free memory the server may
//! still write). Where the kernel refuses the call (Yama `ptrace_scope` 2 or 3, a seccomp profile without it,
//! a worker that is not a descendant under scope 1) the server answers with the bytes on the socket (status 0)
//! and stops trying.

//!
//! - [`server`]: the rank's side, [`ShareServer`] (it reads through a [`crate::Source`]).
//! - [`client`]: a worker's side, [`ShareClient`] (a source of its own: [`crate::Source::Shared`]).

use strata_types::{Error, ErrorKind};

pub mod client;
pub mod server;

pub use client::ShareClient;
pub use server::ShareServer;

pub(super) const OP_READ: u8 = 0;
pub(super) const OP_SIZE: u8 = 1;
pub(super) const OP_PREFETCH: u8 = 2;
pub(super) const OP_READ_INTO: u8 = 3;
pub(super) const STATUS_OK: u8 = 0;
pub(super) const STATUS_ERR: u8 = 1;
pub(super) const STATUS_WRITTEN: u8 = 2;
pub(super) const MAX_KEY: u32 = 64 * 1024;
/// Most worker connections served at once.
pub(super) const MAX_CONNECTIONS: usize = 1024;

/// An error's kind and retryable flag on the wire: the kind's index in [`ErrorKind::ALL`], the flag in the top
/// bit. Both ends are the same build (a rank and its DataLoader workers), so every kind crosses intact.
pub(super) fn error_code(e: &Error) -> u32 {
    let index = ErrorKind::ALL
        .iter()
        .position(|&k| k == e.kind())
        .or_else(|| {
            ErrorKind::ALL
                .iter()
                .position(|&k| k == ErrorKind::Internal)
        })
        .unwrap_or(0) as u32;
    index | if e.is_retryable() { RETRYABLE_BIT } else { 0 }
}

pub(super) const RETRYABLE_BIT: u32 = 1 << 31;

/// The error [`error_code`] encoded, with its message.
pub(super) fn error_of(code: u32, message: String) -> Error {
    let kind = ErrorKind::ALL
        .get((code & !RETRYABLE_BIT) as usize)
        .copied()
        .unwrap_or(ErrorKind::Internal);
    Error::new(kind, message).with_retryable(code & RETRYABLE_BIT != 0)
}

pub(super) fn io_err(e: std::io::Error, what: &str) -> Error {
    Error::new(
        ErrorKind::Unavailable,
        format!("shared loader cache: {what}: {e}"),
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn sockets_of_dead_processes_are_swept_and_live_ones_kept() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir().unwrap();
        let dir = super::server::socket_dir(tmp.path()).unwrap();
        assert_eq!(
            std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777,
            0o700
        );
        let dead = dir.join("999999999-0.sock"); // above any pid_max
        let live = dir.join(format!("{}-3.sock", std::process::id()));
        let other = dir.join("notes.txt");
        for f in [&dead, &live, &other] {
            std::fs::write(f, b"").unwrap();
        }
        super::server::sweep_dead(&dir);
        assert!(!dead.exists() && live.exists() && other.exists());
    }

    #[test]
    fn every_error_kind_and_its_retryable_flag_cross_to_the_worker() {
        for kind in ErrorKind::ALL {
            for retryable in [false, true] {
                let e = Error::new(kind, "m").with_retryable(retryable);
                let back = super::error_of(super::error_code(&e), "m".into());
                assert_eq!((back.kind(), back.is_retryable()), (kind, retryable));
            }
        }
    }

    use std::path::Path;
    use std::sync::Arc;

    use super::*;
    use strata_types::IoContext;

    use crate::dataset::DatasetIndex;
    use crate::shm::SharedRegion;
    use crate::source::{LocalCacheOptions, LocalSource, Source};

    /// A dataset of one tar shard, opened through an in-process cache, and the shard's bytes.
    async fn dataset(dir: &Path) -> (Arc<DatasetIndex>, Source, Vec<u8>) {
        let big: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
        let shard = crate::format::tar::tests::tar(&[
            ("s/000.bin", b"tiny".as_slice()),
            ("s/001.bin", &big),
            ("s/002.bin", &big[..70_000]),
        ]);
        std::fs::write(dir.join("shard-0.tar"), &shard).unwrap();
        let url = format!("file://{}", dir.display());
        let src = Source::Local(
            LocalSource::open(
                &url,
                &LocalCacheOptions::default(),
                strata_telemetry::Telemetry::new(),
            )
            .unwrap(),
        );
        let index = DatasetIndex::open(&src, &IoContext::anonymous(), 2)
            .await
            .unwrap();
        (Arc::new(index), src, shard)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn reads_are_byte_exact_written_directly_or_over_the_socket() {
        let dir = tempfile::tempdir().unwrap();
        let (index, src, shard) = dataset(dir.path()).await;
        let rt = tokio::runtime::Handle::current();
        let region = SharedRegion::create(4 << 20).unwrap();
        for (direct, shared) in [(true, false), (false, false), (true, true), (false, true)] {
            let server = ShareServer::start_with(
                &rt,
                index.clone(),
                src.clone(),
                IoContext::anonymous(),
                direct,
            )
            .unwrap();
            let client =
                ShareClient::new(server.path()).with_region(shared.then(|| region.clone()));
            let n = shard.len() as u64;
            assert_eq!(client.size("shard-0.tar").await.unwrap(), n);
            // Whole shard, a range across cache blocks' worth of data, a small one, one byte, an empty one.
            for (a, b) in [(0, n), (512, 300_512), (1000, 1004), (n - 1, n), (7, 7)] {
                let got = client.read_sample("shard-0.tar", a..b).await.unwrap();
                assert_eq!(
                    got.as_ref(),
                    &shard[a as usize..b as usize],
                    "{a}..{b} direct={direct}"
                );
                // Metadata reads stay in private memory.
                let meta = client.read("shard-0.tar", a..b).await.unwrap();
                assert_eq!(meta, got);
                assert!(SharedRegion::share(&meta).is_none());
                // With a region, every non-empty read lands in one of its slots.
                assert_eq!(
                    SharedRegion::share(&got).map(|h| SharedRegion::adopt(h).unwrap().len()),
                    (shared && b > a).then_some((b - a) as usize)
                );
            }
            // Many at once on pooled connections.
            let reads = (0..32u64).map(|i| {
                let c = client.clone();
                async move {
                    (
                        i,
                        c.read_sample("shard-0.tar", i * 1000..i * 1000 + 70_000)
                            .await,
                    )
                }
            });
            for (i, r) in futures::future::join_all(reads).await {
                let (a, b) = (i as usize * 1000, i as usize * 1000 + 70_000);
                assert_eq!(r.unwrap().as_ref(), &shard[a..b]);
            }
            // Errors keep their kind; the connection stays usable.
            let e = client.read("nope.tar", 0..10).await.unwrap_err();
            assert_eq!(e.kind(), ErrorKind::NotFound, "{e}");
            let e = client.read("shard-0.tar", n..n + 10).await.unwrap_err();
            assert_eq!(e.kind(), ErrorKind::Corrupt, "{e}");
            assert_eq!(
                client.read("shard-0.tar", 0..4).await.unwrap().as_ref(),
                &shard[..4]
            );
            let mode = std::os::unix::fs::PermissionsExt::mode(
                &std::fs::metadata(server.path()).unwrap().permissions(),
            );
            assert_eq!(mode & 0o777, 0o600, "only this user may connect");
            // In this process the kernel allows writing into our own memory: the direct path stayed on and
            // answered every non-empty read.
            assert_eq!(server.writes_direct(), direct);
            assert_eq!(
                server.direct_writes() > 35,
                direct,
                "{}",
                server.direct_writes()
            );
        }
        assert_eq!(region.in_use(), 0, "every slot freed with its bytes");
        // A region without room: reads land in private memory, as before.
        let full = SharedRegion::create(crate::shm::GRANULE as u64).unwrap();
        let hog = full.alloc(1).unwrap();
        let server = ShareServer::start(&rt, index, src, IoContext::anonymous()).unwrap();
        let client = ShareClient::new(server.path()).with_region(Some(full.clone()));
        let got = client.read_sample("shard-0.tar", 10..5000).await.unwrap();
        assert_eq!(got.as_ref(), &shard[10..5000]);
        assert!(SharedRegion::share(&got).is_none());
        drop(hog);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_cancelled_read_leaves_the_client_and_server_working() {
        let dir = tempfile::tempdir().unwrap();
        let (index, src, shard) = dataset(dir.path()).await;
        let rt = tokio::runtime::Handle::current();
        let server = ShareServer::start(&rt, index, src, IoContext::anonymous()).unwrap();
        let client = ShareClient::new(server.path());
        let n = shard.len() as u64;
        for i in 0..50u64 {
            // Dropped at whatever point it reached (its buffer is leaked, never freed under a write).
            let c = client.clone();
            let _ = tokio::time::timeout(std::time::Duration::from_micros(i * 20), async move {
                c.read("shard-0.tar", 0..n).await
            })
            .await;
        }
        let got = client.read("shard-0.tar", 100..200_100).await.unwrap();
        assert_eq!(got.as_ref(), &shard[100..200_100]);
    }
}
