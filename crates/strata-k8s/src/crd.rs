//! The custom resources: `Dataset` and `DataClaim` in `strata.dev/v1alpha1`, namespaced.
//!
//! Field names are camelCase, as Kubernetes users expect; [`DataClaimSpec`] maps onto
//! `strata_claim::ClaimSpec` field for field (`mountPath` is `mount`, `ttlSeconds` is `ttl_secs`). Statuses
//! are written only by the operator, through the status subresource.

use std::collections::BTreeMap;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResource;
use kube::CustomResourceExt;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The API group of Strata's resources.
pub const GROUP: &str = "strata.dev";
/// Their version.
pub const VERSION: &str = "v1alpha1";
/// The namespace label that names the team a namespace's resources are charged to. Set by cluster
/// administrators; a namespace without it cannot claim data.
pub const TEAM_LABEL: &str = "strata.dev/team";

/// A dataset the cluster's agents should know about: where it is and how to keep it cached.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "strata.dev",
    version = "v1alpha1",
    kind = "Dataset",
    namespaced,
    status = "DatasetStatus",
    shortname = "sds",
    category = "strata",
    printcolumn = r#"{"name":"Source","type":"string","jsonPath":".spec.source"}"#,
    printcolumn = r#"{"name":"Cached","type":"string","jsonPath":".status.cachedFraction"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct DatasetSpec {
    /// Where the data is: a location the agents resolve (`backend/prefix/`, `s3://bucket/prefix/`), a prefix
    /// ending with `/` or one object.
    pub source: String,
    /// How the agents keep it cached (default: read through the cache as used, nothing ahead).
    #[serde(default)]
    pub cache: CachePolicy,
}

/// How a dataset is kept in the cache.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CachePolicy {
    /// `none` (read through), `prefetch` (staged once into the cache, evictable) or `pin` (staged and never
    /// evicted; charged to the team's `cache` quota).
    #[serde(default)]
    pub mode: PrefetchMode,
    /// Copies of each block across the cluster's nodes (1 to 8, default 1; at most one per node): with 2 or
    /// more, `prefetch` and `pin` stage each block on its first owners, so a node that leaves takes no block
    /// with it and readers are served by the next owner. Ignored by `none` (nothing is staged).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<u32>,
    /// Seconds a `prefetch` or `pin` staging may take before it is given up (default one hour; 10 s to 7
    /// days). A staging given up is tried again when the source's version or the Dataset's spec changes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stage_deadline_seconds: Option<u64>,
}

/// A dataset's cache mode.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum PrefetchMode {
    /// Read through the cache as jobs read it.
    #[default]
    None,
    /// Staged into the cache once; evictable.
    Prefetch,
    /// Staged and pinned.
    Pin,
}

/// What the operator last saw of a dataset.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DatasetStatus {
    /// The generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Per version (the listing's digest of names, sizes and ETags): bytes cached of the total.
    #[serde(default)]
    pub versions: Vec<DatasetVersionStatus>,
    /// The cached share of the newest version, as text for `kubectl get` (`"57%"`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cached_fraction: Option<String>,
    /// Nodes whose agents hold blocks of the newest version.
    #[serde(default)]
    pub nodes: Vec<String>,
    /// Conditions: `Ready` (the source is listed for the namespace's team and the cache policy is met: for
    /// `prefetch` and `pin`, the newest version staged) and `Cached` (every block of the newest version is in
    /// the cluster's caches).
    #[serde(default)]
    pub conditions: Vec<Condition>,
    /// The team charged (the namespace's `strata.dev/team`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub team: Option<String>,
    /// Why the Dataset is not Ready: what a person can act on.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
    /// The agents' claim that stages (`prefetch`) or pins (`pin`) the source, while there is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claim_id: Option<String>,
    /// The version that claim staged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claim_version: Option<String>,
    /// Staging progress of that claim.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<ClaimProgress>,
    /// A version whose staging failed (`reason` says why): not staged again until the source or the spec
    /// changes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed_version: Option<String>,
}

/// One version of a dataset and how much of it is cached.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DatasetVersionStatus {
    /// The version: a digest of the listing's keys, sizes and ETags (equal digests, equal data).
    pub version: String,
    /// Objects in it.
    pub objects: u64,
    /// Its bytes.
    pub total_bytes: u64,
    /// Its bytes held in the cluster's caches.
    pub cached_bytes: u64,
}

/// A job's declaration of its data, reconciled by the operator into a claim on the agents.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "strata.dev",
    version = "v1alpha1",
    kind = "DataClaim",
    namespaced,
    status = "DataClaimStatus",
    shortname = "dclaim",
    category = "strata",
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Progress","type":"string","jsonPath":".status.progress.summary"}"#,
    printcolumn = r#"{"name":"Reason","type":"string","jsonPath":".status.reason","priority":1}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct DataClaimSpec {
    /// The team charged. Optional: it must equal the namespace's `strata.dev/team` label, which is what is
    /// charged either way.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub team: Option<String>,
    /// The datasets the job reads (1 to 64).
    #[serde(default)]
    pub datasets: Vec<ClaimDataset>,
    /// Where the job writes checkpoints.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint: Option<ClaimCheckpoint>,
    /// Scratch space for the job's life.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scratch: Option<ClaimScratch>,
    /// Seconds by which staging must be done, else the claim fails (default one hour).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stage_deadline_seconds: Option<u64>,
    /// Pods using the claim must run where the data is cached (default: preferred, not required).
    #[serde(default)]
    pub require_cache_affinity: bool,
}

/// One dataset of a DataClaim: a location, or a Dataset of the same namespace.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClaimDataset {
    /// The dataset's name in the claim (`STRATA_DATASET_<NAME>`): 1 to 63 of `a-z 0-9 _ -`.
    pub name: String,
    /// Where it is (`backend/prefix/`, `s3://bucket/prefix/`); or give `datasetRef`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub location: Option<String>,
    /// A Dataset in the claim's namespace whose `source` is the location.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dataset_ref: Option<String>,
    /// `stage` (default), `pin` or `stream`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
    /// Where pods find it as files (an absolute path).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mount_path: Option<String>,
    /// Copies of each block the cache keeps across nodes (1 to 8, default 1; at most one per node): a node
    /// that leaves takes no block with it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<u32>,
}

/// A DataClaim's checkpoint declaration.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClaimCheckpoint {
    /// Where checkpoints go (a prefix location).
    pub location: String,
    /// Steps kept (1 to 1000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keep_last: Option<u32>,
}

/// A DataClaim's scratch declaration.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClaimScratch {
    /// Bytes (`10GiB` or a number), admitted against the team's `scratch` quota.
    pub size: String,
    /// Seconds the scratch may outlive a claim that was never released.
    pub ttl_seconds: u64,
}

/// A DataClaim's phase, as on the agent.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum ClaimPhase {
    /// Not yet admitted by an agent.
    #[default]
    Pending,
    /// Admitted; blocks being staged.
    Staging,
    /// Every block of every staged dataset is cached: pods may start.
    Ready,
    /// Cannot be staged; `reason` says why.
    Failed,
    /// Released (being deleted).
    Released,
}

/// What the operator last saw of a DataClaim.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DataClaimStatus {
    /// The generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Where the claim is.
    #[serde(default)]
    pub phase: ClaimPhase,
    /// The agent's claim id (`clm_...`), once admitted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claim_id: Option<String>,
    /// The team charged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub team: Option<String>,
    /// Why it failed: what a person can act on.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
    /// Staging progress.
    #[serde(default)]
    pub progress: ClaimProgress,
    /// Accounting so far (final once released).
    #[serde(default)]
    pub usage: ClaimUsage,
    /// What pods get in their environment (`STRATA_CLAIM`, `STRATA_DATASET_<NAME>`, ...).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Nodes whose agents hold the claim's blocks.
    #[serde(default)]
    pub nodes: Vec<String>,
    /// The datasets pods get as volumes: where in the pod, and the agent's mount on the node behind it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mounts: Vec<ClaimMount>,
    /// The group the mounts are readable by (files `root:<gid>`, mode 0440): admitted pods get it among their
    /// supplemental groups.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mount_group: Option<u32>,
    /// Nodes where the operator had the claim's datasets mounted for a pod bound there (sorted).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mounted_nodes: Vec<String>,
    /// Conditions (`Admitted`, `Ready`).
    #[serde(default)]
    pub conditions: Vec<Condition>,
}

/// A dataset of a DataClaim as a volume of its pods.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClaimMount {
    /// The dataset's name in the claim.
    pub name: String,
    /// Where the pod's containers see it (the DataClaim's `mountPath`).
    pub mount_path: String,
    /// The agent's read-only mount on the node (under the operator's `--mount-root`), which pods get as a
    /// hostPath volume.
    pub node_path: String,
}

/// Staging progress of a DataClaim.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClaimProgress {
    /// Bytes staged (or found cached) of `bytesTotal`.
    pub bytes_done: u64,
    /// Bytes to stage.
    pub bytes_total: u64,
    /// Objects done of `objectsTotal`.
    pub objects_done: u64,
    /// Objects to stage.
    pub objects_total: u64,
    /// Blocks found cached by the last count: Ready needs this to equal `blocksTotal`.
    pub blocks_held: u64,
    /// Blocks of the staged datasets' versions.
    pub blocks_total: u64,
    /// Seconds left at the current rate, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eta_seconds: Option<u64>,
    /// `bytesDone/bytesTotal` as text for `kubectl get` (`"1.2 GiB/2.0 GiB (60%)"`).
    #[serde(default)]
    pub summary: String,
}

/// Accounting of a DataClaim's job.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClaimUsage {
    /// Bytes staged from the origin for the claim.
    pub staged_bytes: u64,
    /// Bytes staging found already cached (shared with other claims and jobs).
    pub staged_cached_bytes: u64,
    /// Bytes the job read from the origin.
    pub origin_bytes: u64,
    /// Bytes the job read from peers' caches.
    pub peer_bytes: u64,
    /// Seconds the job's loaders reported waiting for data (text: a decimal).
    pub stall_seconds: String,
    /// Peak scratch bytes.
    pub scratch_peak_bytes: u64,
    /// Bytes under the checkpoint location.
    pub checkpoint_bytes: u64,
}

/// A condition, as Kubernetes resources report them.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    /// `Ready`, `Admitted`, ...
    #[serde(rename = "type")]
    pub type_: String,
    /// `True`, `False` or `Unknown`.
    pub status: String,
    /// One CamelCase word.
    #[serde(default)]
    pub reason: String,
    /// For people.
    #[serde(default)]
    pub message: String,
    /// When `status` last changed (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<String>,
    /// The generation it was set for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// The CustomResourceDefinitions of Strata's resources.
pub fn crds() -> Vec<CustomResourceDefinition> {
    vec![Dataset::crd(), DataClaim::crd()]
}

/// The CRDs as one YAML stream, as checked in at `deploy/00-crds.yaml`.
pub fn crds_yaml() -> String {
    let mut out = String::from(
        "# Generated by `strata operator crds`; do not edit (a test fails when this file drifts).\n",
    );
    for crd in crds() {
        out.push_str("---\n");
        // A CRD always serializes.
        out.push_str(&serde_norway::to_string(&crd).unwrap_or_default());
    }
    out
}
