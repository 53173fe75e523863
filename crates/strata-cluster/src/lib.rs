//! The cache cluster of a job's nodes: who its members are and which of them owns a block.
//!
//! - [`placement`]: weighted rendezvous (highest random weight) hashing. A block's owners are every member
//!   in order of a score computed from the member's id, its weight and the block's key alone, so every
//!   agent holding the same [`View`] computes the same owners, with no coordinator, and a change of members
//!   moves only the blocks whose first owner joined or left.
//! - [`membership`]: where the members come from, behind one small trait ([`Membership`]): a static list
//!   from the configuration, a Slurm job's node list ([`hostlist`]: `SLURM_JOB_NODELIST` expanded as
//!   `scontrol show hostnames` does). Sources that change (the shared catalog's heartbeats, Kubernetes
//!   EndpointSlices) publish a new [`View`]; readers take the current one.
//!
//! This crate knows nothing of HTTP, the cache or the catalog: the agent feeds it and asks it.

pub mod hostlist;
pub mod membership;
pub mod placement;

pub use membership::{Member, Membership, SlurmNodes, StaticMembers, View};
pub use placement::owners;
