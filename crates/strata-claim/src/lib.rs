//! A claim: what a job declares about its data, and what the platform promises back.
//!
//! A job names its datasets (a location, how to have it: `stage`d into the cache before it starts, `pin`ned
//! there for its whole life, or just `stream`ed; where to mount it), its checkpoint location and retention,
//! and its scratch (size, TTL). The agent admits the claim against the team's quotas, pins the exact object
//! versions it found, stages them and says when the claim is `Ready`; at the job's end it releases what the
//! claim held. [`ClaimSpec`] is the document (YAML or JSON, versioned: `version: 1`); [`ClaimSpec::parse`]
//! and [`ClaimSpec::validate`] refuse bad input with errors that name the field (`datasets[1].mode: ...`);
//! [`schema`] is its JSON Schema, which the agent publishes at `GET /v1/claims/schema`. [`ClaimStatus`] is
//! what the agent answers about a claim, on the API and to the Slurm and Kubernetes integrations alike.
//!
//! The life of a claim: `pending` (admitted, versions pinned) -> `staging` (bytes and objects done of the
//! total, rate, ETA) -> `ready` (every block of every staged dataset version is held: counts equal the
//! snapshot, not "the loop finished"), or `failed` (a reason a person can act on: a missing object, a changed
//! one, the deadline); then `released` (pins and scratch freed, accounting final). Release is idempotent
//! and never deletes a dataset.

mod schema;
mod spec;
mod status;

pub use schema::schema;
pub use spec::{
    CheckpointClaim, ClaimSpec, DatasetClaim, FieldError, MAX_REPLICAS, Mode, SPEC_VERSION,
    ScratchClaim,
};
pub use status::{
    ClaimState, ClaimStatus, Coverage, DatasetStatus, JobUsage, MemberCoverage, Progress,
};
