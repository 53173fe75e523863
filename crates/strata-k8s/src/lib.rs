//! Strata on Kubernetes: the custom resources a cluster's users write, their CRDs, and the operator that
//! reconciles them. The only crate that knows Kubernetes.
//!
//! - [`Dataset`]: a named location (and, optionally, a cache policy: pin or prefetch it on the nodes); its
//!   status says how much of each version is cached and on which nodes. [`reconcile_dataset`] counts it on
//!   the agents and keeps a claim staging (or pinning) its newest version.
//! - [`DataClaim`]: the claim of `strata-claim` as a resource (datasets, checkpoint, scratch, deadline); its
//!   status mirrors the agent's claim (phase, progress, reason, accounting). [`reconcile`] turns one into a
//!   claim on the agents and releases it when the DataClaim is deleted; [`run`] is the controller loop.
//!
//! The team a resource is charged to is its namespace's `strata.dev/team` label ([`TEAM_LABEL`]), which
//! cluster administrators set and namespace users cannot; the agents authorize a claim's locations as that
//! team only, so a DataClaim never reaches another team's data, although the operator submits every claim
//! with one admin token. [`crds`] are the CustomResourceDefinitions, checked in as
//! `deploy/00-crds.yaml` (a test fails when they drift; `strata operator crds` writes them).
//!
//! On the node side, [`EndpointMembers`] is the cache cluster's membership on Kubernetes: the ready
//! endpoints of the agents' headless Service (`[cluster] cache = "kubernetes"`). Pods declare their data
//! with the label [`CLAIM_LABEL`]: the admission webhook ([`admit`], served by [`webhook_server`]) admits
//! them once the claim is Ready, with its environment and node affinity toward the nodes holding its data.

mod admission;
mod agent;
mod convert;
mod crd;
mod dataset;
mod lease;
mod members;
mod metrics;
mod reconcile;
mod run;
mod webhook;

pub use agent::Claims;
pub use convert::{
    CLAIM_TTL_SECS, HEARTBEAT_SECS, MOUNT_ROOT, claim_spec, job_id, node_path, status_of, team_of,
};
pub use crd::{
    CachePolicy, ClaimCheckpoint, ClaimDataset, ClaimMount, ClaimPhase, ClaimProgress,
    ClaimScratch, ClaimUsage, Condition, DataClaim, DataClaimSpec, DataClaimStatus, Dataset,
    DatasetSpec, DatasetStatus, DatasetVersionStatus, GROUP, PrefetchMode, TEAM_LABEL, VERSION,
    crds, crds_yaml,
};
pub use dataset::{dataset_claim_spec, dataset_error_policy, dataset_job, reconcile_dataset};
pub use lease::Elector;
pub use members::{
    API_PORT_NAME, EndpointMembers, SERVICE_NAME_LABEL, agents_by_node_of, members_of, nodes_of,
};
pub use metrics::Metrics;
pub use reconcile::{Context, FINALIZER, MANAGER, Settings, error_policy, kube_error, reconcile};
pub use run::run;
pub use webhook::{
    CLAIM_LABEL, HOSTNAME_LABEL, MOUNTS_IMAGE, MOUNTS_INIT, NODE_AGENT, NodeSide, Verdict, admit,
    claim_name,
};
/// The admission webhook's HTTPS server.
pub mod webhook_server {
    pub use crate::admission::{HANDSHAKE, MAX_CONNECTIONS, RELOAD_EVERY, Tls, serve, tls_config};
}

#[cfg(test)]
mod tests;
