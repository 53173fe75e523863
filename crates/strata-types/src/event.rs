use std::sync::Arc;
use std::time::{Duration, SystemTime};

/// The operation an [`IoEvent`] records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    /// A (ranged) object read from a backend.
    Get,
    /// A metadata read.
    Head,
    /// An object write (single or multipart).
    Put,
    /// A listing page.
    List,
    /// A delete.
    Delete,
    /// A copy inside one backend.
    Copy,
    /// A cache lookup of one block; [`IoEvent::tier`] says which tier served it, or [`Tier::Miss`].
    CacheLookup,
}

impl Op {
    /// Stable label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Op::Get => "get",
            Op::Head => "head",
            Op::Put => "put",
            Op::List => "list",
            Op::Delete => "delete",
            Op::Copy => "copy",
            Op::CacheLookup => "cache_lookup",
        }
    }
}

/// Where bytes came from (or went to).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Tier {
    /// The RAM cache tier.
    Ram,
    /// The local disk (NVMe) cache tier.
    Disk,
    /// A peer node's cache (reserved for the distributed cache).
    Peer,
    /// The backend (object store, file system) itself.
    Backend,
    /// A cache lookup that no tier could serve.
    Miss,
}

impl Tier {
    /// Stable label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Tier::Ram => "ram",
            Tier::Disk => "disk",
            Tier::Peer => "peer",
            Tier::Backend => "backend",
            Tier::Miss => "miss",
        }
    }
}

/// How an operation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// It succeeded.
    Ok,
    /// It failed with an error of this kind.
    Err(crate::ErrorKind),
}

/// Who and what an I/O is for: the principal (token or access key), its team, the job and the dataset, when
/// known.
/// Cheap to clone; pass it down with each request.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IoContext {
    /// The authenticated principal.
    pub principal: Option<Arc<str>>,
    /// The team the principal acts for (the unit of quota and attribution).
    pub team: Option<Arc<str>>,
    /// The job the I/O belongs to (Slurm job id, Kubernetes pod, ...).
    pub job: Option<Arc<str>>,
    /// The dataset the I/O reads or writes (`x-strata-dataset`), when the client says.
    pub dataset: Option<Arc<str>>,
}

impl IoContext {
    /// A context with nothing known: background work such as readahead inherits its trigger's context instead.
    pub fn anonymous() -> Self {
        Self::default()
    }
}

/// One I/O operation, as recorded for telemetry. Events are emitted on the hot path into a bounded, lossy
/// channel, so they are small and cheap to clone.
#[derive(Debug, Clone)]
pub struct IoEvent {
    /// Wall-clock time the operation ended.
    pub at: SystemTime,
    /// What was done.
    pub op: Op,
    /// Canonical backend id.
    pub backend: Arc<str>,
    /// Object key (or listing prefix).
    pub key: Arc<str>,
    /// Bytes moved.
    pub bytes: u64,
    /// How long it took.
    pub latency: Duration,
    /// Which tier served it.
    pub tier: Tier,
    /// Whether it worked.
    pub outcome: Outcome,
    /// Principal, team and job.
    pub ctx: IoContext,
}
