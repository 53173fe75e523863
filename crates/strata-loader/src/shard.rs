//! The plain data of a dataset: its shard format, its shards (key, expected size and ETag, sample count,
//! sample offsets once known) and decoded samples. No I/O: reading a shard's offsets is the source's
//! ([`crate::Source::offsets`]), building the list is the index's ([`crate::dataset`]).

use std::sync::Arc;

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use crate::format::mds;

/// How shards are laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ShardFormat {
    /// WebDataset tar shards.
    Tar,
    /// MosaicML MDS shards.
    Mds,
}

/// One shard of an open dataset.
#[derive(Debug)]
pub struct Shard {
    /// Key relative to the dataset root.
    pub key: String,
    /// Expected size (from the manifest or index), if known.
    pub size: Option<u64>,
    /// Expected ETag, if the manifest recorded one.
    pub etag: Option<String>,
    /// Samples in the shard.
    pub samples: u64,
    pub(crate) offsets: Mutex<Option<Arc<Vec<u64>>>>,
    pub(crate) columns: Option<mds::Columns>,
}

impl Shard {
    /// Whether the sample offsets are known without reading the shard (a manifest, a scan, or read before).
    pub fn offsets_known(&self) -> bool {
        self.offsets.lock().is_some()
    }

    /// The sample offsets, when known.
    pub(crate) fn known_offsets(&self) -> Option<Arc<Vec<u64>>> {
        self.offsets.lock().clone()
    }

    /// Remember the sample offsets once read.
    pub(crate) fn set_offsets(&self, offsets: Arc<Vec<u64>>) {
        *self.offsets.lock() = Some(offsets);
    }
}

/// A decoded sample: its key (tar) or index, and its fields in order.
#[derive(Debug, Clone)]
pub struct Sample {
    /// WebDataset key, or `"<shard>:<index>"` for MDS.
    pub key: String,
    /// Fields in shard order.
    pub fields: Vec<(String, mds::Value)>,
    /// Raw bytes read for this sample.
    pub bytes: u64,
}
