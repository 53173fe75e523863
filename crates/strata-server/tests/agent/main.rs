//! The agent in process, one test binary: the S3 gateway's operations ([`gateway`]) and the API's wire as
//! clients see it ([`wire`]). (`control.rs` beside it is the control plane on both catalogs.)

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

mod common;
mod gateway;
mod wire;
