//! The webhook's HTTPS server: `POST /mutate-pods` takes an `AdmissionReview` of a Pod from the API server,
//! reads the DataClaim the pod names and answers with [`crate::webhook::admit`]'s verdict as a JSON patch.
//!
//! The API server calls webhooks over TLS only; the certificate and key are PEM files (a cert-manager
//! Certificate's Secret, mounted). They are read again when either file changes (looked at when a connection
//! comes, at most every `--webhook-reload-secs`, [`RELOAD_EVERY`] by default): cert-manager renews the Secret and the kubelet updates the
//! mounted files in place, and a webhook that kept serving the expired certificate would stop every labelled
//! pod (the webhook fails closed). A pair that does not load keeps the last good one, with a warning. At most
//! [`MAX_CONNECTIONS`] connections are served at once;
//! a handshake gets [`HANDSHAKE`]; shutdown stops accepting and drops what is in flight (the API server
//! retries or fails the pod closed).

use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use axum::extract::State;
use axum::routing::post;
use axum::{Json, Router};
use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::api::Api;
use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use strata_types::{Error, ErrorKind, Result};

use crate::crd::DataClaim;
use crate::webhook::{NodeSide, Verdict, admit, claim_name};

/// Connections served at once.
pub const MAX_CONNECTIONS: usize = 256;
/// Longest a TLS handshake may take.
pub const HANDSHAKE: Duration = Duration::from_secs(10);

/// How often, at most, the certificate files are looked at for a change, by default.
pub const RELOAD_EVERY: Duration = Duration::from_secs(10);

/// The TLS configuration of PEM files, read again when they change.
#[derive(Debug)]
pub struct Tls {
    cert: PathBuf,
    key: PathBuf,
    every: Duration,
    state: parking_lot::Mutex<TlsState>,
}

#[derive(Debug)]
struct TlsState {
    config: Arc<rustls::ServerConfig>,
    stamp: Stamp,
    looked: Instant,
}

/// What identifies a version of the two files: their modification times and sizes (the kubelet swaps a
/// Secret volume's files by renaming a directory, which changes both for a new certificate).
type Stamp = [(Option<SystemTime>, u64); 2];

fn stamp(cert: &Path, key: &Path) -> Stamp {
    let one = |p: &Path| std::fs::metadata(p).map_or((None, 0), |m| (m.modified().ok(), m.len()));
    [one(cert), one(key)]
}

impl Tls {
    /// Load `cert` (the chain) and `key`, to be looked at again at most every `every`; an error when they do
    /// not make a configuration.
    pub fn load(cert: &Path, key: &Path, every: Duration) -> Result<Self> {
        let stamp = stamp(cert, key);
        let config = tls_config(cert, key)?;
        Ok(Self {
            cert: cert.to_path_buf(),
            key: key.to_path_buf(),
            every,
            state: parking_lot::Mutex::new(TlsState {
                config,
                stamp,
                looked: Instant::now(),
            }),
        })
    }

    /// The configuration to serve the next connection with: the files read again if they changed.
    pub fn current(&self) -> Arc<rustls::ServerConfig> {
        let mut st = self.state.lock();
        if st.looked.elapsed() >= self.every {
            st.looked = Instant::now();
            let now = stamp(&self.cert, &self.key);
            if now != st.stamp {
                match tls_config(&self.cert, &self.key) {
                    Ok(c) => {
                        tracing::info!(cert = %self.cert.display(), "the webhook's certificate changed; serving the new one");
                        st.config = c;
                        st.stamp = now;
                    }
                    // Half-written (the key renewed before the chain, say): the next look tries again.
                    Err(e) => {
                        tracing::warn!(error = %e, "the webhook's new certificate does not load; keeping the last one")
                    }
                }
            }
        }
        st.config.clone()
    }
}

/// The TLS configuration from PEM files `cert` (the chain) and `key`.
pub fn tls_config(cert: &Path, key: &Path) -> Result<Arc<rustls::ServerConfig>> {
    let bad = |what: &Path, e: &dyn std::fmt::Display| {
        Error::config(format!("the webhook's TLS file {}: {e}", what.display()))
    };
    let chain = CertificateDer::pem_file_iter(cert)
        .map_err(|e| bad(cert, &e))?
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| bad(cert, &e))?;
    if chain.is_empty() {
        return Err(bad(cert, &"no certificate in it"));
    }
    let key = PrivateKeyDer::from_pem_file(key).map_err(|e| bad(key, &e))?;
    let mut config = rustls::ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(|e| Error::config(format!("the webhook's certificate and key: {e}")))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

#[derive(Clone)]
struct Ctx {
    client: Client,
    side: Arc<NodeSide>,
}

/// Serve the webhook on `listener` with `tls` until `shutdown` resolves; DataClaims are read with `client`,
/// and admitted pods get `side` (their node's agent, the image waiting for their mounts).
pub async fn serve(
    listener: tokio::net::TcpListener,
    tls: Tls,
    client: Client,
    side: NodeSide,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<()> {
    let app = Router::new()
        .route("/mutate-pods", post(mutate))
        .with_state(Ctx {
            client,
            side: Arc::new(side),
        });
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    let mut conns = tokio::task::JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        let permit = tokio::select! {
            _ = &mut shutdown => break,
            p = slots.clone().acquire_owned() => p.map_err(|_| Error::new(ErrorKind::Internal, "closed"))?,
        };
        let (tcp, peer) = tokio::select! {
            _ = &mut shutdown => break,
            r = listener.accept() => match r {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!(error = %e, "accepting a webhook connection");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        while conns.try_join_next().is_some() {}
        let acceptor = tokio_rustls::TlsAcceptor::from(tls.current());
        let app = app.clone();
        conns.spawn(async move {
            let _permit = permit;
            connection(acceptor, app, tcp, peer).await;
        });
    }
    conns.shutdown().await;
    Ok(())
}

async fn connection(
    acceptor: tokio_rustls::TlsAcceptor,
    app: Router,
    tcp: tokio::net::TcpStream,
    peer: SocketAddr,
) {
    let tls = match tokio::time::timeout(HANDSHAKE, acceptor.accept(tcp)).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => return tracing::debug!(%peer, error = %e, "webhook TLS handshake failed"),
        Err(_) => return tracing::debug!(%peer, "webhook TLS handshake timed out"),
    };
    let service = hyper_util::service::TowerToHyperService::new(app);
    if let Err(e) = hyper::server::conn::http1::Builder::new()
        .serve_connection(hyper_util::rt::TokioIo::new(tls), service)
        .await
    {
        tracing::debug!(%peer, error = %e, "webhook connection ended");
    }
}

async fn mutate(
    State(ctx): State<Ctx>,
    Json(review): Json<AdmissionReview<Pod>>,
) -> Json<serde_json::Value> {
    let req: AdmissionRequest<Pod> = match review.try_into() {
        Ok(r) => r,
        Err(e) => {
            return Json(wire(
                AdmissionResponse::invalid(e.to_string()).into_review(),
            ));
        }
    };
    Json(wire(respond(&ctx, &req).await.into_review()))
}

/// The review as the API server reads it: `response.patch` is a `[]byte`, which Go's JSON wants as base64
/// text (kube-core serializes the bytes as an array of numbers).
fn wire(review: AdmissionReview<DynamicObject>) -> serde_json::Value {
    use base64::Engine as _;
    let mut v = serde_json::to_value(&review).unwrap_or_default();
    if let Some(patch) = v.pointer_mut("/response/patch") {
        let bytes: Option<Vec<u8>> = patch.as_array().map(|a| {
            a.iter()
                .filter_map(|b| b.as_u64().and_then(|b| u8::try_from(b).ok()))
                .collect()
        });
        if let Some(bytes) = bytes {
            *patch =
                serde_json::Value::String(base64::engine::general_purpose::STANDARD.encode(bytes));
        }
    }
    v
}

async fn respond(ctx: &Ctx, req: &AdmissionRequest<Pod>) -> AdmissionResponse {
    let res = AdmissionResponse::from(req);
    let Some(pod) = req.object.as_ref() else {
        return res;
    };
    let namespace = req
        .namespace
        .clone()
        .or_else(|| pod.metadata.namespace.clone())
        .unwrap_or_else(|| "default".into());
    let claim = match claim_name(pod) {
        None => return res,
        Some(name) => {
            let api: Api<DataClaim> = Api::namespaced(ctx.client.clone(), &namespace);
            match crate::reconcile::get_opt(&api, name, "a pod's DataClaim").await {
                Ok(c) => c,
                Err(e) => {
                    // Fail closed: a pod that declares its data never starts without it.
                    tracing::warn!(namespace, claim = name, error = %e, "reading a pod's DataClaim");
                    return res.deny(format!(
                        "could not read DataClaim {name} in namespace {namespace}: {e}"
                    ));
                }
            }
        }
    };
    match admit(pod, &namespace, claim.as_ref(), &ctx.side) {
        Verdict::Untouched => res,
        Verdict::Deny(why) => {
            tracing::info!(namespace, pod = ?pod.metadata.name.as_ref().or(pod.metadata.generate_name.as_ref()), reason = %why, "pod denied");
            res.deny(why)
        }
        Verdict::Admit(out) => {
            let (Ok(before), Ok(after)) = (serde_json::to_value(pod), serde_json::to_value(&*out))
            else {
                return res.deny("could not write the pod's patch");
            };
            match res.clone().with_patch(json_patch::diff(&before, &after)) {
                Ok(r) => r,
                Err(e) => res.deny(format!("could not write the pod's patch: {e}")),
            }
        }
    }
}
