//! The cache's tests against real backends; the helpers are shared with the `disk_faults` test binary, which
//! runs alone because failpoints are process-wide.

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

#[path = "../../tests/common/mod.rs"]
pub(crate) mod common;

mod cache;
mod coherence;
mod peers;
mod pins;
mod warm;
