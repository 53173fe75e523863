//! Test support for Strata's integration tests and benchmarks. Not part of the product.
//!
//! - [`S3Server`]: a real S3-protocol server (moto, from PyPI) started on a free loopback port for the life of
//!   the value. The README's test command installs it into `.venv`; tests fail with a clear message if it is
//!   missing rather than silently skipping.
//! - [`FakeGcs`] and [`Azurite`]: Google Cloud Storage (fake-gcs-server) and Azure Blob Storage (Azurite)
//!   emulators, started the same way, found through `STRATA_FAKE_GCS` and `STRATA_AZURITE`. Without those the
//!   tests that need them skip with a notice, unless `STRATA_REQUIRE_EMULATORS=1` (the test command sets all
//!   three).
//! - [`FaultProxy`]: an HTTP proxy in front of any origin that counts requests (so tests can assert "one origin
//!   read per block") and injects faults: error statuses, latency, and connections reset mid-body.

mod emulators;
mod proxy;
mod s3;

pub use emulators::{AZURITE_ENV, Azurite, FAKE_GCS_ENV, FakeGcs, REQUIRE_EMULATORS_ENV};
pub use proxy::{FaultProxy, Recorded};
pub use s3::{ACCESS_KEY, S3Server, SECRET_KEY, create_bucket_at};

/// The workspace root (two levels above this crate).
pub fn workspace_root() -> std::path::PathBuf {
    let here = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    here.ancestors().nth(2).unwrap_or(here).to_path_buf()
}

/// A free TCP port on loopback (bound then released; a race with other processes is possible but rare).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("binding an ephemeral loopback port")
}
