//! What every front door records for one operation: an [`Access`], attributed to a team, principal, job,
//! dataset and prefix, with its class, bytes, latency, the tier that served it and its outcome.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use strata_types::{IoContext, Tier};

/// The class of an operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum OpClass {
    /// Object bytes read (GET, a ranged read, a mount's read, a checkpoint shard).
    DataRead,
    /// Object bytes written (PUT, a part, a checkpoint shard).
    DataWrite,
    /// Metadata read: HEAD, LIST, a mount's stat/lookup/readdir/open, a checkpoint manifest.
    MetaRead,
    /// Metadata write: DELETE, copy, rename, multipart create/complete/abort, creates and unlinks.
    MetaWrite,
}

impl OpClass {
    /// Every class, in order.
    pub const ALL: [OpClass; 4] = [
        OpClass::DataRead,
        OpClass::DataWrite,
        OpClass::MetaRead,
        OpClass::MetaWrite,
    ];

    /// The stable name (metrics labels, files, the API).
    pub fn as_str(self) -> &'static str {
        match self {
            OpClass::DataRead => "data_read",
            OpClass::DataWrite => "data_write",
            OpClass::MetaRead => "meta_read",
            OpClass::MetaWrite => "meta_write",
        }
    }

    /// Whether the class is a metadata operation.
    pub fn is_meta(self) -> bool {
        matches!(self, OpClass::MetaRead | OpClass::MetaWrite)
    }

    pub(crate) fn index(self) -> usize {
        self as usize
    }
}

/// Where the bytes of an operation came from, for the tier mix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Served {
    Ram,
    Disk,
    Peer,
    Origin,
    /// Not a read, or not known.
    None,
}

impl Served {
    pub const ALL: [Served; 4] = [Served::Ram, Served::Disk, Served::Peer, Served::Origin];

    pub fn as_str(self) -> &'static str {
        match self {
            Served::Ram => "ram",
            Served::Disk => "disk",
            Served::Peer => "peer",
            Served::Origin => "origin",
            Served::None => "none",
        }
    }

    pub(crate) fn index(self) -> Option<usize> {
        match self {
            Served::Ram => Some(0),
            Served::Disk => Some(1),
            Served::Peer => Some(2),
            Served::Origin => Some(3),
            Served::None => None,
        }
    }
}

impl From<Tier> for Served {
    fn from(t: Tier) -> Self {
        match t {
            Tier::Ram => Served::Ram,
            Tier::Disk => Served::Disk,
            Tier::Peer => Served::Peer,
            Tier::Backend | Tier::Miss => Served::Origin,
        }
    }
}

/// One operation at a front door, or `count` alike (a mount reports the metadata operations its kernel
/// asked for in batches).
#[derive(Debug, Clone)]
pub struct Access {
    /// When it ended.
    pub at: SystemTime,
    pub class: OpClass,
    /// Who, for which team, job and dataset.
    pub ctx: IoContext,
    /// The backend's name as the caller named it (a bucket, a configured backend).
    pub backend: Arc<str>,
    /// The object key, or a listing's prefix.
    pub key: Arc<str>,
    /// Operations this stands for (1 for one request; at least 1).
    pub count: u64,
    /// Bytes moved, by all `count` operations together.
    pub bytes: u64,
    /// How long each operation took at the front door (a batch: their mean).
    pub latency: Duration,
    /// Where most of its bytes came from (reads).
    pub served: Served,
    /// Whether it worked.
    pub ok: bool,
}

impl Access {
    /// One operation that just ended at a front door (no tier known): what the gateway, the data plane and the
    /// checkpoint routes record.
    pub fn one(
        class: OpClass,
        ctx: IoContext,
        backend: Arc<str>,
        key: Arc<str>,
        bytes: u64,
        latency: Duration,
        ok: bool,
    ) -> Self {
        Self {
            at: SystemTime::now(),
            class,
            ctx,
            backend,
            key,
            count: 1,
            bytes,
            latency,
            served: Served::None,
            ok,
        }
    }

    /// The operations this stands for, at least one.
    pub fn ops(&self) -> u64 {
        self.count.max(1)
    }

    /// Latency of all its operations together, microseconds.
    pub(crate) fn latency_total_us(&self) -> u64 {
        (self.latency.as_micros().min(u128::from(u64::MAX)) as u64).saturating_mul(self.ops())
    }
}
