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
pub mod extras;
mod ids;
pub mod mem;
mod size;

pub use error::{Error, ErrorKind, Result};
pub use event::{IoContext, IoEvent, Op, Outcome, Tier};
pub use extras::{ChecksumAlgorithm, StoredChecksum};
pub use ids::{BlockKey, ObjectAttrs, ObjectId, ObjectMeta, validate_key};
pub use size::{ByteSize, FsSpace};

/// Percent-encode `s` for one URL path segment or query value (everything but `A-Za-z0-9-_.~`).
pub fn encode_segment(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}
