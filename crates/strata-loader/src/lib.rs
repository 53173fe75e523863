//! Strata's streaming dataset loader.
//!
//! - [`format`]: WebDataset tar shards and MosaicML MDS shards, read as they are.
//! - [`shard`]: the plain types: shard format, shards, samples.
//! - [`dataset`]: a dataset's shards and sample offsets, from a Strata manifest, an MDS `index.json`, or a
//!   scan of `.tar` shards; the manifest format written by `strata dataset index`.
//! - [`order`]: the deterministic global order of an epoch (seeded shard shuffle plus a bounded window
//!   shuffle) and its partition over ranks and dataloader workers; resuming at any position costs the same.
//! - [`source`]: bytes through the node agent's shared cache, or an in-process [`strata_cache::BlockCache`].
//! - [`share`]: the rank's cache served to its DataLoader worker processes over a Unix socket
//!   ([`share::server`]; a worker's side in [`share::client`]).
//! - [`shm`]: a shared-memory region samples cross DataLoader workers in instead of being pickled.
//! - [`stream`]: one consumer's prefetching stream with a bounded window in bytes and stall accounting.
//!
//! The Python package (`python/`) wraps this crate; see ARCHITECTURE.md for the resumption contract.

pub mod dataset;
pub mod format;
pub mod order;
pub mod shard;
pub mod share;
pub mod shm;
pub mod source;
pub mod stream;

pub use dataset::{DatasetIndex, MANIFEST_NAME, Manifest};
pub use format::mds::Value;
pub use order::{EpochOrder, Partition, Shuffle, TailPolicy, auto_cache_bytes, auto_window};
pub use shard::{Sample, Shard, ShardFormat};
pub use source::{AgentSource, LocalSource, Source};
pub use stream::{Fetched, Loader, LoaderOptions, SampleStream, StreamStats};
