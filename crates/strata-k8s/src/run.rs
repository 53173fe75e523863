//! The controller loops: every DataClaim of the cluster (all namespaces), reconciled by [`crate::reconcile`]
//! whenever it or one of the pods naming it changes and when a reconcile asked to be looked at again; and
//! every Dataset, reconciled by [`crate::reconcile_dataset`]. Both stop when `shutdown` resolves.

use std::future::Future;
use std::sync::Arc;

use futures::{FutureExt, StreamExt};
use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::controller::Controller;
use kube::runtime::events::Recorder;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;

use crate::agent::Claims;
use crate::crd::{DataClaim, Dataset};
use crate::dataset::{dataset_error_policy, reconcile_dataset};
use crate::metrics::Metrics;
use crate::reconcile::{Context, MANAGER, Settings, error_policy, reconcile};
use crate::webhook::{CLAIM_LABEL, claim_name};

/// How the operator watches DataClaims: every one of the cluster, as kube-runtime lists and watches by default
/// (a watch answered 410 Gone lists again).
pub(crate) fn watch_config() -> watcher::Config {
    watcher::Config::default()
}

/// Reconcile DataClaims through `claims` until `shutdown` resolves (reconciles in flight finish first);
/// `agent_nodes` says where a Ready claim's data is (`status.nodes`).
pub async fn run<C: Claims>(
    client: Client,
    claims: C,
    settings: Settings,
    metrics: Metrics,
    agent_nodes: Option<Arc<crate::EndpointMembers>>,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    let recorder = Recorder::new(client.clone(), MANAGER.into());
    let ctx = Arc::new(Context {
        client: client.clone(),
        claims,
        recorder,
        settings,
        metrics,
        agent_nodes,
    });
    let shutdown = shutdown.shared();
    let api: Api<DataClaim> = Api::all(client.clone());
    // A pod naming a claim that is bound to a node (or changes) is a reason to look at its DataClaim: the
    // claim's datasets are mounted on that node for it.
    let pods: Api<Pod> = Api::all(client.clone());
    let claims = Controller::new(api, watch_config())
        .watches(
            pods,
            watcher::Config::default().labels(CLAIM_LABEL),
            |pod: Pod| {
                let name = claim_name(&pod)?.to_string();
                let ns = pod.namespace()?;
                Some(ObjectRef::<DataClaim>::new(&name).within(&ns))
            },
        )
        .graceful_shutdown_on(shutdown.clone())
        .run(reconcile, error_policy, ctx.clone())
        .for_each(|r| async move {
            match r {
                Ok((obj, _)) => tracing::debug!(claim = %obj.name, "reconciled"),
                Err(e) => tracing::debug!(error = %e, "a reconcile did not complete"),
            }
        });
    let datasets: Api<Dataset> = Api::all(client);
    let datasets = Controller::new(datasets, watch_config())
        .graceful_shutdown_on(shutdown)
        .run(reconcile_dataset, dataset_error_policy, ctx)
        .for_each(|r| async move {
            match r {
                Ok((obj, _)) => tracing::debug!(dataset = %obj.name, "reconciled"),
                Err(e) => tracing::debug!(error = %e, "a Dataset reconcile did not complete"),
            }
        });
    futures::join!(claims, datasets);
}
