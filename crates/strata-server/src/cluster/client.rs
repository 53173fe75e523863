//! Asking another agent for a block: `GET /v1/peer/blocks` with the cluster credential, the object version
//! and the block, and the principal, team and job the read is for. The answer is checked before it is used:
//! its length must be the block's and its BLAKE3 the one the owner sent in `x-strata-blake3`; a mismatch is
//! [`ErrorKind::Corrupt`] and the bytes are dropped. An object's metadata is asked of the agent that owns
//! it the same way (`GET /v1/peer/meta`, [`PeerMeta`]).

use std::time::Duration;
pub use strata_api::cluster::{PeerMeta, PeerObject};

use bytes::Bytes;
use strata_api::Endpoint;
use strata_api::cluster as api;
use strata_cache::PeerBlock;
use strata_client::reqwest;
use strata_types::{Error, ErrorKind, IoContext, ObjectMeta, Result};

/// The header carrying the BLAKE3 (hex) of a served block.
pub const BLOCK_HASH_HEADER: &str = "x-strata-blake3";
/// The header naming the principal a peer read is for.
pub const PRINCIPAL_HEADER: &str = "x-strata-principal";
/// The header naming the job a peer read is for (as any client's request names it).
pub use strata_client::JOB_HEADER;
/// The header naming the dataset a peer read is for.
pub const DATASET_HEADER: &str = "x-strata-dataset";
/// The header saying how long the owner may take before it answers "still reading" (milliseconds).
pub const WAIT_HEADER: &str = "x-strata-wait-ms";
/// The header an owner's "still reading" answer carries.
pub const BUSY_HEADER: &str = "x-strata-busy";

/// What an owner answered.
#[derive(Debug)]
pub enum Answer {
    /// The block, checked.
    Block(Bytes),
    /// Not held (only asked when it need not be read from the origin).
    NotHeld,
    /// Still being read from the origin after the wait asked for: ask again (the owner's fill goes on).
    Busy,
}

/// How long a block request waits for its answer before the peer's liveness is probed on the side.
pub const FIRST_ANSWER: Duration = Duration::from_millis(200);
/// How long a liveness probe waits: a peer that answers nothing within it is stopped or hung.
pub const PROBE: Duration = Duration::from_millis(500);

/// The header carrying the asking agent's catalog identity ([`strata_catalog::Catalog::identity`]).
pub const CATALOG_HEADER: &str = "x-strata-catalog";

/// Whether an error kind is the peer declining the request (it is well, and would refuse it again), not the
/// peer failing: such answers do not make it suspect.
pub fn is_refusal(kind: ErrorKind) -> bool {
    matches!(
        kind,
        ErrorKind::PermissionDenied
            | ErrorKind::Unauthenticated
            | ErrorKind::InvalidInput
            | ErrorKind::NotFound
            | ErrorKind::PreconditionFailed
            | ErrorKind::Unsupported
    )
}

/// The HTTP client of the peer path (one connection pool for every peer).
#[derive(Debug)]
pub struct PeerClient {
    http: reqwest::Client,
    secret: String,
    catalog: String,
    wait: Duration,
}

impl PeerClient {
    /// A client presenting `secret` and the identity of its agent's catalog, giving each request at most
    /// `timeout` (connecting: at most 1 s).
    pub fn new(secret: String, catalog: String, timeout: Duration) -> Result<Self> {
        let http = reqwest::Client::builder()
            .connect_timeout(timeout.min(Duration::from_secs(1)))
            .timeout(timeout)
            .pool_max_idle_per_host(32)
            .tcp_nodelay(true)
            .build()
            .map_err(|e| Error::internal(format!("building the peer HTTP client: {e}")))?;
        Ok(Self {
            http,
            secret,
            catalog,
            // Half the timeout: an owner still reading from a slow origin says so well before the request
            // times out, so a busy owner is never taken for a dead one.
            wait: timeout / 2,
        })
    }

    /// `req` with the cluster credential, this agent's catalog and the read context `ctx` in its headers.
    fn for_ctx(
        &self,
        mut req: reqwest::RequestBuilder,
        ctx: &IoContext,
    ) -> reqwest::RequestBuilder {
        req = req
            .header(strata_client::CLUSTER_KEY_HEADER, &self.secret)
            .header(CATALOG_HEADER, &self.catalog);
        if let Some(t) = &ctx.team {
            req = req.header(strata_client::CLUSTER_TEAM_HEADER, t.as_ref());
        }
        if let Some(p) = &ctx.principal {
            req = req.header(PRINCIPAL_HEADER, p.as_ref());
        }
        if let Some(j) = &ctx.job {
            req = req.header(JOB_HEADER, j.as_ref());
        }
        if let Some(d) = &ctx.dataset {
            req = req.header(DATASET_HEADER, d.as_ref());
        }
        req
    }

    /// Ask `peer` to stage its share of `job` (`POST /v1/peer/stage`), calling `progress` with each progress
    /// line it sends; the last line's verdict, or the error it (or the connection) ended with. A peer silent
    /// for [`super::stage::SILENCE`] is taken for gone.
    pub async fn stage(
        &self,
        peer: &str,
        ctx: &IoContext,
        job: &super::stage::StageRequest,
        mut progress: impl FnMut(&super::stage::StageProgress),
    ) -> Result<super::stage::StageDone> {
        use super::stage::{SILENCE, StageLine};
        let what = "stage request";
        let resp = self
            .for_ctx(self.http.post(format!("{peer}/v1/peer/stage")), ctx)
            .json(job)
            // The request lasts as long as the staging; silence, not length, says the peer is gone.
            .timeout(Duration::from_secs(7 * 24 * 3600))
            .send()
            .await
            .map_err(|e| strata_client::transport(peer, what, e))?;
        let status = resp.status().as_u16();
        if status != 200 {
            let body = resp.bytes().await.unwrap_or_default();
            return Err(strata_client::wire::error_from_response(status, &body)
                .context(format!("{peer}: staging")));
        }
        let mut resp = resp;
        let mut buf: Vec<u8> = Vec::new();
        loop {
            let chunk = tokio::time::timeout(SILENCE, resp.chunk())
                .await
                .map_err(|_| {
                    Error::new(
                        ErrorKind::Timeout,
                        format!("{peer}: staging: no word for {} s", SILENCE.as_secs()),
                    )
                })?
                .map_err(|e| strata_client::transport(peer, what, e))?;
            let Some(chunk) = chunk else {
                return Err(Error::new(
                    ErrorKind::Unavailable,
                    format!("{peer}: staging: the answer ended before its verdict"),
                ));
            };
            buf.extend_from_slice(&chunk);
            if buf.len() > super::stage::MAX_LINE {
                return Err(Error::new(
                    ErrorKind::Corrupt,
                    format!(
                        "{peer}: staging: a line of over {} bytes",
                        super::stage::MAX_LINE
                    ),
                ));
            }
            while let Some(n) = buf.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = buf.drain(..=n).collect();
                let line: StageLine = serde_json::from_slice(&line).map_err(|e| {
                    Error::new(
                        ErrorKind::Corrupt,
                        format!("{peer}: staging: a bad line: {e}"),
                    )
                })?;
                match line {
                    StageLine::Progress(p) => progress(&p),
                    StageLine::Done(d) => return Ok(d),
                    StageLine::Failed(e) => {
                        let kind = ErrorKind::parse(&e.error).unwrap_or(ErrorKind::Internal);
                        return Err(Error::new(kind, format!("{peer}: staging: {}", e.message))
                            .with_retryable(e.retryable));
                    }
                }
            }
        }
    }

    /// What `peer` holds of its share of `job`'s object versions (`POST /v1/peer/held`), waiting at most
    /// `timeout`.
    pub async fn held(
        &self,
        peer: &str,
        ctx: &IoContext,
        job: &super::stage::StageRequest,
        timeout: Duration,
    ) -> Result<super::stage::HeldShare> {
        let what = "held count";
        let resp = self
            .for_ctx(self.http.post(format!("{peer}/v1/peer/held")), ctx)
            .json(job)
            .timeout(timeout)
            .send()
            .await
            .map_err(|e| strata_client::transport(peer, what, e))?;
        let status = resp.status().as_u16();
        let body = resp
            .bytes()
            .await
            .map_err(|e| strata_client::transport(peer, what, e))?;
        if status != 200 {
            return Err(strata_client::wire::error_from_response(status, &body)
                .context(format!("{peer}: counting held blocks")));
        }
        serde_json::from_slice(&body).map_err(|e| {
            Error::new(
                ErrorKind::Corrupt,
                format!("{peer}: counting held blocks: a bad answer: {e}"),
            )
        })
    }

    /// Announce changes to `peer` (`POST /v1/peer/invalidate`, [`super::coherence`]), waiting at most
    /// `timeout`; `Ok` once it has applied them.
    pub async fn invalidate(
        &self,
        peer: &str,
        body: &super::coherence::Announcement,
        timeout: Duration,
    ) -> Result<()> {
        self.post_for_no_one(
            peer,
            api::PeerInvalidate::PATH,
            "invalidation",
            body,
            timeout,
        )
        .await
    }

    /// Send every pin of this agent to `peer` (`POST /v1/peer/pins`, [`super::pins`]), waiting at most
    /// `timeout`.
    pub async fn pins(
        &self,
        peer: &str,
        body: &super::pins::PinList,
        timeout: Duration,
    ) -> Result<()> {
        self.post_for_no_one(peer, api::PeerPins::PATH, "pins", body, timeout)
            .await
    }

    /// POST `body` to `path` on `peer` with the cluster credential and no read context (the message is for
    /// no principal); `Ok` on 204, else the peer's error, named `what`.
    async fn post_for_no_one(
        &self,
        peer: &str,
        path: &str,
        what: &str,
        body: &impl serde::Serialize,
        timeout: Duration,
    ) -> Result<()> {
        let resp = self
            .for_ctx(
                self.http.post(format!("{peer}{path}")),
                &IoContext::default(),
            )
            .json(body)
            .timeout(timeout)
            .send()
            .await
            .map_err(|e| strata_client::transport(peer, what, e))?;
        let status = resp.status().as_u16();
        if status == 204 {
            return Ok(());
        }
        let body = resp.bytes().await.unwrap_or_default();
        Err(strata_client::wire::error_from_response(status, &body)
            .context(format!("{peer}: {what}")))
    }

    /// `send`'s answer; but when it has not come within [`FIRST_ANSWER`], `peer` is asked for `/healthz` on
    /// the side (at most [`PROBE`]): a peer that does not answer that either accepts connections and serves
    /// nothing (a stopped or hung process: the kernel still completes the handshake), and is given up at
    /// once (`Err` inside: unavailable, retryable) instead of after the request's timeout. A peer that answers
    /// the probe is busy (filling from a slow origin): the request goes on.
    async fn answered<T>(
        &self,
        peer: &str,
        send: impl std::future::Future<Output = std::result::Result<T, reqwest::Error>>,
    ) -> std::result::Result<Result<T>, reqwest::Error> {
        tokio::pin!(send);
        tokio::select! {
            r = &mut send => return r.map(Ok),
            _ = tokio::time::sleep(FIRST_ANSWER) => {}
        }
        let probe = self
            .http
            .get(format!("{peer}/healthz"))
            .timeout(PROBE)
            .send();
        tokio::select! {
            r = &mut send => r.map(Ok),
            alive = probe => match alive {
                Ok(resp) if resp.status().is_success() => send.await.map(Ok),
                _ => Ok(Err(Error::new(
                    ErrorKind::Unavailable,
                    format!(
                        "{peer} accepted the request but answered neither it within {FIRST_ANSWER:?} nor a health probe within {PROBE:?} (stopped or hung)"
                    ),
                ))),
            },
        }
    }

    /// The current version of `key` in the backend `backend_id` from `peer`, which owns the key's metadata,
    /// and how long ago it confirmed it; `Ok(None)`: the backend has no such object.
    pub async fn meta(
        &self,
        peer: &str,
        ctx: &IoContext,
        backend_id: &str,
        key: &str,
    ) -> Result<Option<(ObjectMeta, Duration)>> {
        let what = "metadata request";
        let url = reqwest::Url::parse_with_params(
            &format!("{peer}/v1/peer/meta"),
            &[("backend", backend_id), ("key", key)],
        )
        .map_err(|e| Error::invalid_input(format!("peer URL {peer}: {e}")))?;
        let resp = self
            .answered(peer, self.for_ctx(self.http.get(url), ctx).send())
            .await
            .map_err(|e| strata_client::transport(peer, what, e))?
            .map_err(|e| e.context(format!("{peer}: metadata of {key}")))?;
        let status = resp.status().as_u16();
        let body = resp
            .bytes()
            .await
            .map_err(|e| strata_client::transport(peer, what, e))?;
        if status != 200 {
            return Err(strata_client::wire::error_from_response(status, &body)
                .context(format!("{peer}: metadata of {key}")));
        }
        let m: PeerMeta = serde_json::from_slice(&body).map_err(|e| {
            Error::new(
                ErrorKind::Corrupt,
                format!("{peer}: metadata of {key}: a bad answer: {e}"),
            )
        })?;
        match m.object {
            Some(o) if o.key == key => Ok(Some((o.into_meta(), Duration::from_millis(m.age_ms)))),
            Some(o) => Err(Error::new(
                ErrorKind::Corrupt,
                format!("{peer}: metadata of {key}: the answer is about {}", o.key),
            )),
            None => Ok(None),
        }
    }

    /// The block from `peer` (see [`Answer`]).
    pub async fn block(&self, peer: &str, b: &PeerBlock<'_>, fill: bool) -> Result<Answer> {
        let meta = b.meta;
        let mut q: Vec<(&str, String)> = vec![
            ("backend", b.key.object.backend.to_string()),
            ("key", meta.key.clone()),
            ("size", meta.size.to_string()),
            ("mtime", meta.last_modified_unix.to_string()),
            ("index", b.key.index.to_string()),
            ("block_size", b.block_size.to_string()),
            ("fill", if fill { "1" } else { "0" }.to_string()),
        ];
        if let Some(e) = &meta.etag {
            q.push(("etag", e.clone()));
        }
        if let Some(v) = &meta.version {
            q.push(("version", v.clone()));
        }
        let url = reqwest::Url::parse_with_params(&format!("{peer}/v1/peer/blocks"), &q)
            .map_err(|e| Error::invalid_input(format!("peer URL {peer}: {e}")))?;
        let req = self
            .for_ctx(self.http.get(url), b.ctx)
            .header(WAIT_HEADER, self.wait.as_millis().to_string());
        let what = "block request";
        let resp = self
            .answered(peer, req.send())
            .await
            .map_err(|e| strata_client::transport(peer, what, e))?
            .map_err(|e| e.context(format!("{peer}: block {} of {}", b.key.index, meta.key)))?;
        let status = resp.status().as_u16();
        if status != 200 {
            if resp.headers().contains_key(BUSY_HEADER) {
                return Ok(Answer::Busy);
            }
            let body = resp.bytes().await.unwrap_or_default();
            let e = strata_client::wire::error_from_response(status, &body);
            if !fill && e.kind() == ErrorKind::NotFound {
                return Ok(Answer::NotHeld);
            }
            return Err(e.context(format!("{peer}: block {} of {}", b.key.index, meta.key)));
        }
        let want = resp
            .headers()
            .get(BLOCK_HASH_HEADER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| blake3::Hash::from_hex(v).ok());
        let body = resp
            .bytes()
            .await
            .map_err(|e| strata_client::transport(peer, what, e))?;
        let bad = |why: String| {
            Error::new(
                ErrorKind::Corrupt,
                format!("{peer}: block {} of {}: {why}", b.key.index, meta.key),
            )
        };
        if body.len() as u64 != b.len {
            return Err(bad(format!("{} bytes, expected {}", body.len(), b.len)));
        }
        match want {
            Some(h) if blake3::hash(&body) == h => Ok(Answer::Block(body)),
            Some(_) => Err(bad("the bytes do not match their BLAKE3".into())),
            None => Err(bad(format!("no {BLOCK_HASH_HEADER} header"))),
        }
    }
}
