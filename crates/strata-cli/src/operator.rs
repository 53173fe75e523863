//! `strata operator`: the Kubernetes operator (reconciles DataClaims into claims on the agents) and its CRDs;
//! and the agent's side of Kubernetes (`strata serve` with `[cluster] cache = "kubernetes"`).

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use strata_client::{AgentClient, ClientOptions};
use strata_k8s::{Elector, Metrics, Settings};

#[derive(Subcommand, Debug)]
pub enum OperatorCommand {
    /// Print the CustomResourceDefinitions of Dataset and DataClaim as YAML (what deploy/00-crds.yaml
    /// holds; `kubectl apply -f -` takes it).
    Crds,
    /// Run the operator until SIGTERM or SIGINT: every DataClaim of the cluster becomes a claim on the agents
    /// (charged to its namespace's strata.dev/team label), its status follows the claim, and its deletion
    /// releases it. Talks to the Kubernetes API in-cluster, or through $KUBECONFIG.
    Run(Box<RunArgs>),
}

#[derive(Args, Debug)]
pub struct RunArgs {
    /// The agents' control API: one agent, or the agents' Service (http://strata-api.strata-system:7070).
    /// The token is $STRATA_TOKEN: an admin's, since claims of every team go through it (the agents authorize
    /// each claim's locations as its team only).
    #[arg(long, env = "STRATA_AGENT")]
    agent: String,
    /// Where /metrics (Prometheus) and /healthz are served: loopback unless told otherwise (in a pod, pass
    /// 0.0.0.0:9464 so the kubelet and Prometheus reach it, as deploy/10-operator.yaml does).
    #[arg(long, default_value = "127.0.0.1:9464")]
    metrics_addr: SocketAddr,
    /// Milliseconds between looks at a claim being staged.
    #[arg(long, default_value_t = 2000)]
    staging_poll_ms: u64,
    /// Seconds a deleted DataClaim's release is retried before its finalizer is removed anyway (with a
    /// Warning event; the agents then release the claim when its TTL passes without a heartbeat).
    #[arg(long, default_value_t = 300)]
    force_release_after_secs: u64,
    /// Seconds between looks at a DataClaim the operator refused (no team label on its namespace, a missing
    /// Dataset, a bad spec): fixing the cause is enough. The agents' refusals (quota, missing data) are final.
    #[arg(long, default_value_t = 60)]
    refused_retry_secs: u64,
    /// Seconds between counts of a Dataset's cached share on the agents when nothing is being staged (its
    /// status follows jobs' reads and the cache's evictions this often; each count lists the source once).
    #[arg(long, default_value_t = 60)]
    dataset_poll_secs: u64,
    /// Namespace of the Lease `strata-operator` that elects the one replica that reconciles (the pod's own,
    /// from the downward API).
    #[arg(long, env = "POD_NAMESPACE", default_value = "strata-system")]
    lease_namespace: String,
    /// This replica's name in the Lease (default: the pod's name, else host and process id).
    #[arg(long, env = "POD_NAME")]
    lease_holder: Option<String>,
    /// Seconds the Lease lasts past each renewal (renewed every third of it): how long a dead leader keeps
    /// the others waiting.
    #[arg(long, default_value_t = 15)]
    lease_secs: u64,
    /// The agents' headless Service (in the operator's namespace, --lease-namespace): the nodes of its ready
    /// endpoints are where a Ready claim's data is cached (`status.nodes`, which pods get affinity toward).
    #[arg(long, default_value = "strata-agents")]
    agents_service: String,
    /// Serve the pod admission webhook (HTTPS, POST /mutate-pods) here: pods labelled strata.dev/claim are
    /// admitted once their DataClaim is Ready, with its environment and node affinity. Every replica serves
    /// it, leader or not. Off when not given.
    #[arg(long)]
    webhook_listen: Option<SocketAddr>,
    /// The webhook's certificate chain (PEM), e.g. a cert-manager Certificate's Secret, mounted.
    #[arg(long, default_value = "/etc/strata/webhook/tls.crt")]
    webhook_cert: std::path::PathBuf,
    /// The webhook's private key (PEM).
    #[arg(long, default_value = "/etc/strata/webhook/tls.key")]
    webhook_key: std::path::PathBuf,
    /// Seconds between looks at the certificate and key for a change (a renewal is served without a
    /// restart; a pair that does not load keeps the last good one).
    #[arg(long, default_value_t = strata_k8s::webhook_server::RELOAD_EVERY.as_secs())]
    webhook_reload_secs: u64,
    /// The agent admitted pods talk to (their STRATA_AGENT): the node-local Service of deploy/20-agents.yaml.
    #[arg(long, default_value = strata_k8s::NODE_AGENT)]
    node_agent: String,
    /// Where the agents mount a DataClaim's datasets on the nodes (<root>/<namespace>/<name>-<uid8>/<dataset>):
    /// a directory of the agents' hostPath whose mounts propagate to the node. Admitted pods get each as a
    /// hostPath volume at the dataset's mountPath.
    #[arg(long, default_value = strata_k8s::MOUNT_ROOT)]
    mount_root: String,
    /// The image of the init container (strata-mounts) that holds an admitted pod until its datasets are
    /// mounted on its node (`strata wait-mounts`): the operator's own image, with `strata` as its entrypoint.
    #[arg(long, default_value = strata_k8s::MOUNTS_IMAGE)]
    mounts_image: String,
}

pub async fn run(cmd: OperatorCommand) -> Result<()> {
    match cmd {
        OperatorCommand::Crds => {
            print!("{}", strata_k8s::crds_yaml());
            Ok(())
        }
        OperatorCommand::Run(a) => serve(*a).await,
    }
}

async fn serve(a: RunArgs) -> Result<()> {
    // rustls cannot choose between the two providers the build links (aws-lc-rs for the object stores,
    // ring through kube); without this, building the Kubernetes client panics.
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let client = kube::Client::try_default()
        .await
        .context("connecting to the Kubernetes API (in-cluster, or $KUBECONFIG)")?;
    let agent = AgentClient::new(&a.agent, &ClientOptions::from_env())?;
    let metrics = Metrics::new();
    let settings = Settings {
        staging_poll: Duration::from_millis(a.staging_poll_ms.max(100)),
        force_release_after: Duration::from_secs(a.force_release_after_secs),
        refused_retry: Duration::from_secs(a.refused_retry_secs.max(1)),
        dataset_poll: Duration::from_secs(a.dataset_poll_secs.max(1)),
        mount_root: a.mount_root.clone(),
    };
    let listener = tokio::net::TcpListener::bind(a.metrics_addr)
        .await
        .with_context(|| format!("binding {}", a.metrics_addr))?;
    let m = metrics.clone();
    let app = axum::Router::new()
        .route(
            "/metrics",
            axum::routing::get(move || async move { m.render() }),
        )
        .route("/healthz", axum::routing::get(|| async { "ok" }));
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut rx = stop_rx.clone();
    let http = tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(async move {
                let _ = rx.wait_for(|s| *s).await;
            })
            .await
    });
    let webhook = match a.webhook_listen {
        None => None,
        Some(addr) => {
            let tls = strata_k8s::webhook_server::Tls::load(
                &a.webhook_cert,
                &a.webhook_key,
                Duration::from_secs(a.webhook_reload_secs),
            )?;
            let listener = tokio::net::TcpListener::bind(addr)
                .await
                .with_context(|| format!("binding the webhook to {addr}"))?;
            tracing::info!(webhook = %addr, "serving the pod admission webhook");
            let mut rx = stop_rx.clone();
            Some(tokio::spawn(strata_k8s::webhook_server::serve(
                listener,
                tls,
                client.clone(),
                strata_k8s::NodeSide {
                    agent: a.node_agent.clone(),
                    mounts_image: a.mounts_image.clone(),
                },
                async move {
                    let _ = rx.wait_for(|s| *s).await;
                },
            )))
        }
    };
    let stop_tx = std::sync::Arc::new(stop_tx);
    let on_signal = stop_tx.clone();
    tokio::spawn(async move {
        crate::shutdown_signal().await;
        let _ = on_signal.send(true);
    });
    let holder = a.lease_holder.clone().unwrap_or_else(|| {
        let host = std::fs::read_to_string("/etc/hostname").unwrap_or_default();
        format!("{}-{}", host.trim(), std::process::id())
    });
    let elector = Elector::new(
        kube::Api::namespaced(client.clone(), &a.lease_namespace),
        "strata-operator",
        &holder,
        Duration::from_secs(a.lease_secs),
    );
    tracing::info!(agent = %a.agent, metrics = %a.metrics_addr, holder = %holder, "operator waiting for the lease");
    let mut rx = stop_rx.clone();
    if !elector.acquire(&mut rx).await {
        let _ = http.await;
        if let Some(w) = webhook {
            let _ = w.await;
        }
        return Ok(());
    }
    let agent_nodes = std::sync::Arc::new(
        strata_k8s::EndpointMembers::start(
            client.clone(),
            &a.lease_namespace,
            &a.agents_service,
            Duration::from_secs(10),
        )
        .await,
    );
    tracing::info!(holder = %holder, "operator leading: reconciling DataClaims and Datasets");
    // Leadership lost: stop reconciling now, and exit non-zero so that Kubernetes starts a new candidate.
    let lost = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (lost_flag, on_loss, mut rx) = (lost.clone(), stop_tx.clone(), stop_rx.clone());
    tokio::spawn(async move {
        if !elector.lead(&mut rx).await {
            tracing::error!("leader election: the lease was lost; stopping");
            lost_flag.store(true, std::sync::atomic::Ordering::SeqCst);
            let _ = on_loss.send(true);
        }
    });
    let mut rx = stop_rx;
    let shutdown = async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    strata_k8s::run(
        client,
        agent,
        settings,
        metrics,
        Some(agent_nodes),
        shutdown,
    )
    .await;
    let _ = http.await;
    if let Some(w) = webhook {
        let _ = w.await;
    }
    if lost.load(std::sync::atomic::Ordering::SeqCst) {
        anyhow::bail!("the operator lost its lease (another replica leads now)");
    }
    Ok(())
}

/// The cache cluster's members for `strata serve` when `[cluster] cache = "kubernetes"`: the ready endpoints
/// of the agents' headless Service (see deploy/20-agents.yaml), watched; `None` for every other source.
pub async fn kube_membership(
    sharing: Option<&strata_server::cluster::Sharing>,
) -> Result<Option<std::sync::Arc<strata_k8s::EndpointMembers>>> {
    let Some(s) = sharing.filter(|s| s.kind == strata_server::config::CacheSharing::Kubernetes)
    else {
        return Ok(None);
    };
    // As for the operator: the kube client needs the one rustls provider named.
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let client = kube::Client::try_default().await.context(
        "[cluster] cache = \"kubernetes\": connecting to the Kubernetes API (in-cluster, or $KUBECONFIG)",
    )?;
    let members = strata_k8s::EndpointMembers::start(
        client,
        &s.kube_namespace,
        &s.kube_service,
        Duration::from_secs(30),
    )
    .await;
    Ok(Some(std::sync::Arc::new(members)))
}
