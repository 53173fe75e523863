//! Object backends addressed by URL.
//!
//! A [`Backend`] wraps an [`object_store::ObjectStore`] and adds what Strata needs around it:
//!
//! - **Addressing by URL**: `s3://bucket/prefix`, `file:///path`, `memory://name`, and `gs://` / `az://` when
//!   built with the `gcp` / `azure` features. See [`Backend::open`].
//! - **Typed errors**: every failure is a [`strata_types::Error`] with a kind and a retryable flag
//!   ([`classify`] maps `object_store` errors, HTTP statuses and transport failures).
//! - **Bounded retries**: `object_store`'s own request retries are switched off and replaced by one
//!   [`RetryPolicy`] (exponential backoff with full jitter, a bounded attempt count) that retries only retryable
//!   errors and counts each retry in telemetry. Multipart part uploads use the same policy.
//! - **I/O events**: every operation emits an [`strata_types::IoEvent`] with the serving tier `backend`.
//! - **Reads pinned to a version**: ranged reads can carry `If-Match`, and the response's ETag is checked as
//!   well (some S3-compatible servers ignore the header); short bodies are errors, never returned.
//!   [`Backend::get_head_stream`] opens an object with the GET of its start, metadata at the headers.
//! - **Listings that stop early**: on backends that list in key order ([`Backend::lists_in_order`]),
//!   [`Backend::list_page`] and [`Backend::list_span`] read only as far as they need.
//! - **Object attributes** ([`strata_types::ObjectAttrs`]: Content-Type and the other stored headers, user
//!   metadata) written with the object and returned by HEAD and GET; a local directory keeps them in an
//!   extended attribute.
//!
//! Every backend, in-memory included, passes one conformance suite (`tests/conformance.rs`).

mod backend;
mod classify;
mod localetag;
mod localkeys;
mod retry;
mod s3wire;
mod store_id;

pub use backend::{
    Backend, BackendOptions, ListPage, ListSpan, MultipartUpload, PutMode, PutOutcome, StreamPut,
};
pub use classify::classify;
pub use retry::RetryPolicy;
pub use s3wire::IncompleteUpload;
pub use store_id::{Relation, StoreLocation};
