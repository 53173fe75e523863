//! The cache cluster's members on Kubernetes (`[cluster] cache = "kubernetes"`): the ready endpoints of the
//! agents' headless Service, read from its EndpointSlices (`kubernetes.io/service-name=<service>`) and kept
//! current by a watch.
//!
//! The Service selects the agent DaemonSet's pods; the endpoints controller puts each pod's IP in a slice
//! and marks it ready while the pod's readiness probe passes, so a node whose agent is down or draining
//! (terminating endpoints are never ready) leaves the view within a probe period and its blocks move to
//! the next owners. Every member weighs 1 (the slices carry no capacity). A watch that breaks is retried
//! with backoff while the last view stays current: a partitioned API server freezes the membership, it
//! does not empty it.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::Client;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, reflector, watcher};
use strata_cluster::{Member, Membership, View};

/// The label an EndpointSlice names its Service with.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";
/// The name of the agents' control API port in the Service (and so in its slices).
pub const API_PORT_NAME: &str = "api";

/// The members of the cache cluster: the ready endpoints of one Service, watched.
#[derive(Debug)]
pub struct EndpointMembers {
    view: Arc<RwLock<Arc<View>>>,
    nodes: Arc<RwLock<Vec<String>>>,
    agents: Arc<RwLock<BTreeMap<String, String>>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl EndpointMembers {
    /// Watch the EndpointSlices of Service `service` in `namespace`; waits up to `wait` for the first
    /// listing (an API server that does not answer by then is retried in the background, with an empty view
    /// meanwhile: this agent reads the origin itself until it knows its peers).
    pub async fn start(client: Client, namespace: &str, service: &str, wait: Duration) -> Self {
        let api: Api<EndpointSlice> = Api::namespaced(client, namespace);
        let config = watcher::Config::default().labels(&format!("{SERVICE_NAME_LABEL}={service}"));
        let (reader, writer) = reflector::store();
        let view = Arc::new(RwLock::new(Arc::new(View::default())));
        let nodes = Arc::new(RwLock::new(Vec::new()));
        let agents = Arc::new(RwLock::new(BTreeMap::new()));
        let shared = view.clone();
        let shared_nodes = nodes.clone();
        let shared_agents = agents.clone();
        let store = reader.clone();
        let what = format!("{namespace}/{service}");
        let task = tokio::spawn(async move {
            let mut events = reflector(writer, watcher(api, config).default_backoff()).boxed();
            while let Some(event) = events.next().await {
                match event {
                    Ok(
                        watcher::Event::InitDone
                        | watcher::Event::Apply(_)
                        | watcher::Event::Delete(_),
                    ) => {
                        let slices = store.state();
                        *shared_nodes.write().unwrap_or_else(|p| p.into_inner()) =
                            nodes_of(&slices);
                        *shared_agents.write().unwrap_or_else(|p| p.into_inner()) =
                            agents_by_node_of(&slices);
                        let next = Arc::new(members_of(&slices));
                        let mut v = shared.write().unwrap_or_else(|p| p.into_inner());
                        if **v != *next {
                            tracing::info!(
                                service = %what,
                                members = next.members().len(),
                                "the agents' endpoints changed"
                            );
                            *v = next;
                        }
                    }
                    Ok(_) => {}
                    Err(e) => {
                        tracing::warn!(service = %what, error = %e, "watching the agents' EndpointSlices (retrying)");
                    }
                }
            }
        });
        if tokio::time::timeout(wait, reader.wait_until_ready())
            .await
            .is_err()
        {
            tracing::warn!(
                namespace,
                service,
                "no EndpointSlice listing yet; the cache cluster starts empty and fills when the API server answers"
            );
        } else {
            // The first listing is in the store; publish it before the agent reads its first view.
            let slices = reader.state();
            *nodes.write().unwrap_or_else(|p| p.into_inner()) = nodes_of(&slices);
            *agents.write().unwrap_or_else(|p| p.into_inner()) = agents_by_node_of(&slices);
            *view.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(members_of(&slices));
        }
        Self {
            view,
            nodes,
            agents,
            task: Some(task),
        }
    }

    /// Members as `slices` name them, not watched (for tests and tools).
    pub fn fixed(slices: &[Arc<EndpointSlice>]) -> Self {
        Self {
            view: Arc::new(RwLock::new(Arc::new(members_of(slices)))),
            nodes: Arc::new(RwLock::new(nodes_of(slices))),
            agents: Arc::new(RwLock::new(agents_by_node_of(slices))),
            task: None,
        }
    }

    /// The agent (`http://address:port`) of each node with a ready one.
    pub fn agents_by_node(&self) -> BTreeMap<String, String> {
        self.agents
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The nodes (`nodeName`) of the ready agents, sorted: where a claim staged over the cluster is cached.
    pub fn nodes(&self) -> Vec<String> {
        self.nodes.read().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

impl Drop for EndpointMembers {
    fn drop(&mut self) {
        if let Some(t) = &self.task {
            t.abort();
        }
    }
}

impl Membership for EndpointMembers {
    fn view(&self) -> Arc<View> {
        self.view.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn kind(&self) -> &'static str {
        "kubernetes"
    }
}

/// The nodes of the slices' ready endpoints (those that name one), sorted, once each.
pub fn nodes_of(slices: &[Arc<EndpointSlice>]) -> Vec<String> {
    let mut nodes: Vec<String> = slices
        .iter()
        .flat_map(|s| s.endpoints.iter().flatten())
        .filter(|e| e.conditions.as_ref().and_then(|c| c.ready) != Some(false))
        .filter_map(|e| e.node_name.clone())
        .collect();
    nodes.sort();
    nodes.dedup();
    nodes
}

/// The members the slices name: every address of every ready endpoint (a missing `ready` condition is ready,
/// as the API defines it), at the slice's port named [`API_PORT_NAME`] (or its only port), as
/// `http://address:port` (`[address]` for IPv6). Slices of FQDN addresses and slices without a usable port
/// name nobody.
pub fn members_of(slices: &[Arc<EndpointSlice>]) -> View {
    View::new(
        endpoints_of(slices)
            .into_iter()
            .map(|(_, id)| Member::new(id, 1.0))
            .collect(),
    )
}

/// The agent of each node, as [`members_of`] names it (the first address, in order, of a node with several).
pub fn agents_by_node_of(slices: &[Arc<EndpointSlice>]) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut all = endpoints_of(slices);
    all.sort();
    for (node, id) in all {
        if let Some(node) = node {
            out.entry(node).or_insert(id);
        }
    }
    out
}

/// Every ready endpoint's address at the API port, with the node it is on.
fn endpoints_of(slices: &[Arc<EndpointSlice>]) -> Vec<(Option<String>, String)> {
    let mut out = Vec::new();
    for s in slices {
        let ports = s.ports.as_deref().unwrap_or_default();
        let port = ports
            .iter()
            .find(|p| p.name.as_deref() == Some(API_PORT_NAME))
            .or_else(|| (ports.len() == 1).then(|| &ports[0]))
            .and_then(|p| p.port)
            .and_then(|p| u16::try_from(p).ok())
            .filter(|p| *p > 0);
        let Some(port) = port else { continue };
        let v6 = match s.address_type.as_str() {
            "IPv4" => false,
            "IPv6" => true,
            _ => continue,
        };
        for e in s.endpoints.iter().flatten() {
            if e.conditions.as_ref().and_then(|c| c.ready) == Some(false) {
                continue;
            }
            for a in &e.addresses {
                let id = if v6 {
                    format!("http://[{a}]:{port}")
                } else {
                    format!("http://{a}:{port}")
                };
                out.push((e.node_name.clone(), id));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort};

    fn slice(
        kind: &str,
        ports: &[(Option<&str>, i32)],
        eps: &[(&[&str], Option<bool>)],
    ) -> Arc<EndpointSlice> {
        Arc::new(EndpointSlice {
            address_type: kind.into(),
            ports: Some(
                ports
                    .iter()
                    .map(|(n, p)| EndpointPort {
                        name: n.map(Into::into),
                        port: Some(*p),
                        ..Default::default()
                    })
                    .collect(),
            ),
            endpoints: Some(
                eps.iter()
                    .map(|(addrs, ready)| Endpoint {
                        addresses: addrs.iter().map(|a| a.to_string()).collect(),
                        conditions: Some(EndpointConditions {
                            ready: *ready,
                            ..Default::default()
                        }),
                        node_name: addrs.first().map(|a| format!("node-{a}")),
                        ..Default::default()
                    })
                    .collect(),
            ),
            ..Default::default()
        })
    }

    fn ids(v: &View) -> Vec<&str> {
        v.members().iter().map(|m| m.id.as_str()).collect()
    }

    #[test]
    fn ready_endpoints_of_every_slice_are_members_at_the_api_port() {
        let v = members_of(&[
            slice(
                "IPv4",
                &[(Some("s3"), 9000), (Some("api"), 7070)],
                &[
                    (&["10.0.0.2"], Some(true)),
                    (&["10.0.0.1"], None),
                    (&["10.0.0.3"], Some(false)),
                ],
            ),
            slice(
                "IPv6",
                &[(Some("api"), 7070)],
                &[(&["fd00::5"], Some(true))],
            ),
            // The same pod in two slices (a slice being split) counts once.
            slice("IPv4", &[(None, 7070)], &[(&["10.0.0.2"], Some(true))]),
        ]);
        assert_eq!(
            ids(&v),
            [
                "http://10.0.0.1:7070",
                "http://10.0.0.2:7070",
                "http://[fd00::5]:7070"
            ]
        );
        assert!(v.members().iter().all(|m| m.weight == 1.0));
        let slices = [slice(
            "IPv4",
            &[(Some("api"), 7070)],
            &[
                (&["b"], None),
                (&["a"], Some(true)),
                (&["c"], Some(false)),
                (&["a"], None),
            ],
        )];
        assert_eq!(nodes_of(&slices), ["node-a", "node-b"]);
        let agents = agents_by_node_of(&slices);
        assert_eq!(
            agents.into_iter().collect::<Vec<_>>(),
            [
                ("node-a".to_string(), "http://a:7070".to_string()),
                ("node-b".to_string(), "http://b:7070".to_string())
            ]
        );
    }

    #[test]
    fn slices_without_a_usable_port_or_of_fqdns_name_nobody() {
        let v = members_of(&[
            slice(
                "IPv4",
                &[(Some("s3"), 9000), (Some("metrics"), 9100)],
                &[(&["10.0.0.1"], None)],
            ),
            slice("IPv4", &[(Some("api"), 0)], &[(&["10.0.0.2"], None)]),
            slice(
                "FQDN",
                &[(Some("api"), 7070)],
                &[(&["agent.example"], None)],
            ),
            slice("IPv4", &[], &[(&["10.0.0.4"], None)]),
        ]);
        assert!(v.members().is_empty(), "{:?}", ids(&v));
    }
}
