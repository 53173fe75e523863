//! Strata's shared vocabulary.
//!
//! This crate has no I/O and knows nothing of HTTP, the cache or any backend. It defines:
//!
//! - [`Error`] and [`ErrorKind`]: every library crate returns these; each error says whether a retry may help.
//! - [`ObjectId`] and [`BlockKey`]: an object is named by backend, key *and version*, so cached bytes of an
//!   older version can never be served for a newer one.
//! - [`IoEvent`] and friends: the raw record of one I/O operation, consumed by telemetry.
//! - [`ByteSize`]: human byte sizes (`8MiB`, `2 GiB`) for configuration.

mod error;
mod event;
mod ids;
mod size;

pub use error::{Error, ErrorKind, Result};
pub use event::{IoContext, IoEvent, Op, Outcome, Tier};
pub use ids::{BlockKey, ObjectId, ObjectMeta, validate_key};
pub use size::ByteSize;
