//! `strata operator`: the Kubernetes operator (reconciles DataClaims into claims on the agents) and its CRDs.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use strata_client::{AgentClient, ClientOptions};
use strata_k8s::{Metrics, Settings};

#[derive(Subcommand, Debug)]
pub enum OperatorCommand {
    /// Print the CustomResourceDefinitions of Dataset and DataClaim as YAML (what deploy/00-crds.yaml
    /// holds; `kubectl apply -f -` takes it).
    Crds,
    /// Run the operator until SIGTERM or SIGINT: every DataClaim of the cluster becomes a claim on the agents
    /// (charged to its namespace's strata.dev/team label), its status follows the claim, and its deletion
    /// releases it. Talks to the Kubernetes API in-cluster, or through $KUBECONFIG.
    Run(RunArgs),
}

#[derive(Args, Debug)]
pub struct RunArgs {
    /// The agents' control API: one agent, or the agents' Service (http://strata-agent.strata-system:7070).
    /// The token is $STRATA_TOKEN: an admin's, since claims of every team go through it (the agents authorize
    /// each claim's locations as its team only).
    #[arg(long, env = "STRATA_AGENT")]
    agent: String,
    /// Where /metrics (Prometheus) and /healthz are served.
    #[arg(long, default_value = "0.0.0.0:9464")]
    metrics_addr: SocketAddr,
    /// Milliseconds between looks at a claim being staged.
    #[arg(long, default_value_t = 2000)]
    staging_poll_ms: u64,
    /// Seconds a deleted DataClaim's release is retried before its finalizer is removed anyway (with a
    /// Warning event; the agents then release the claim when its TTL passes without a heartbeat).
    #[arg(long, default_value_t = 300)]
    force_release_after_secs: u64,
}

pub async fn run(cmd: OperatorCommand) -> Result<()> {
    match cmd {
        OperatorCommand::Crds => {
            print!("{}", strata_k8s::crds_yaml());
            Ok(())
        }
        OperatorCommand::Run(a) => serve(a).await,
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
    tracing::info!(agent = %a.agent, metrics = %a.metrics_addr, "operator running");
    let mut rx = stop_rx;
    let shutdown = async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    let signals = async move {
        crate::shutdown_signal().await;
        let _ = stop_tx.send(true);
    };
    tokio::spawn(signals);
    strata_k8s::run(client, agent, settings, metrics, shutdown).await;
    let _ = http.await;
    Ok(())
}
