//! Shard formats.

pub mod mds;
pub mod tar;
