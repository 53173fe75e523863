//! The agent's wire, written once.
//!
//! Every client of a Strata agent (the CLI, the loader's agent source, the checkpoint peer tier, the
//! checkpoint quota gate) talks to it through [`AgentClient`]:
//!
//! - [`wire`]: the error body every agent route answers a failure with (`{"error": kind, "message",
//!   "retryable"}`), the status each [`ErrorKind`] is answered with, and [`wire::error_from_response`], which
//!   reads an [`Error`] back with its kind and retryable flag. The server serialises the same [`wire::ErrorBody`],
//!   so the two ends cannot drift; a body that is not Strata's (a proxy's 502) falls back to the status.
//! - [`token`]: where a client's bearer token comes from (`STRATA_TOKEN`, else the local agent's
//!   `<data-dir>/admin-token`); the only place a client reads the environment.
//! - [`AgentClient`]: base URL, the token as a default header, timeouts, and retries of idempotent requests
//!   through [`strata_object::RetryPolicy`] (only errors whose retryable flag is set are tried again, so a
//!   corrupt replica or a refused quota fails at once).
//! - [`AgentClient::call`]: one typed call for every endpoint of the contract ([`strata_api`]): path
//!   arguments, query and body of the endpoint's types in, its answer's type out. Raw requests
//!   ([`AgentClient::request`]) remain for streamed bodies (reads, replica files, warm-up progress).
//!
//! Transport failures (connection refused, reset, a body cut short) are [`ErrorKind::Unavailable`] and
//! retryable; everything the agent answered keeps the kind it sent.

pub mod token;
pub mod wire;

use std::time::Duration;

use serde::de::DeserializeOwned;
use strata_api::{Endpoint, EndpointDoc, Payload};
use strata_object::RetryPolicy;
use strata_types::{Error, ErrorKind, Result};

pub use reqwest::{self, Body, Method, RequestBuilder, Response};

/// How an [`AgentClient`] connects.
#[derive(Debug, Clone)]
pub struct ClientOptions {
    /// Bearer token presented on every request (see [`token`]). `None` sends none (only `/healthz` and
    /// `/openapi.json` answer then).
    pub token: Option<String>,
    /// Longest wait for a TCP connection. Default 5 s.
    pub connect_timeout: Duration,
    /// Longest a whole request may take, body included; `None` (the default) for none, as streamed reads and
    /// warm-ups of large prefixes may run for long.
    pub timeout: Option<Duration>,
    /// Idle connections kept per agent. Default 64 (a loader keeps many reads in flight).
    pub pool_max_idle_per_host: usize,
    /// Retries of idempotent requests ([`AgentClient::send_retried`]).
    pub retry: RetryPolicy,
    /// Speak as an agent of the cluster (peer routes only) instead of with a token.
    pub cluster: Option<ClusterCredential>,
    /// The job every request is attributed to (`x-strata-job`; see [`token::job_from_env`]).
    pub job: Option<String>,
}

/// How one agent authenticates to another: the cluster's shared secret, and the team whose replicas the call
/// acts on. Only the peer routes accept it, and no user's token can stand in for it.
#[derive(Clone, PartialEq, Eq)]
pub struct ClusterCredential {
    /// The cluster secret (`STRATA_CLUSTER_SECRET`).
    pub secret: String,
    /// The team the call acts for (`None`: replicas of callers without a team).
    pub team: Option<String>,
}

impl std::fmt::Debug for ClusterCredential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterCredential")
            .field("team", &self.team)
            .finish_non_exhaustive()
    }
}

/// The header carrying [`ClusterCredential::secret`].
pub const CLUSTER_KEY_HEADER: &str = "x-strata-cluster-key";
/// The header naming the job a request is for.
pub const JOB_HEADER: &str = "x-strata-job";
/// The header carrying [`ClusterCredential::team`].
pub const CLUSTER_TEAM_HEADER: &str = "x-strata-team";

impl Default for ClientOptions {
    fn default() -> Self {
        Self {
            token: None,
            connect_timeout: Duration::from_secs(5),
            timeout: None,
            pool_max_idle_per_host: 64,
            retry: RetryPolicy::default(),
            cluster: None,
            job: None,
        }
    }
}

impl ClientOptions {
    /// Defaults with the token and the job from the environment ([`token::from_env`],
    /// [`token::job_from_env`]).
    pub fn from_env() -> Self {
        Self {
            token: token::from_env(),
            job: token::job_from_env(),
            ..Self::default()
        }
    }
}

/// An agent's address as a base URL: `http://` when it names no scheme, no trailing slash.
fn base_of(api: &str) -> Result<String> {
    let base = if api.contains("://") {
        api.to_string()
    } else {
        format!("http://{api}")
    };
    url::Url::parse(&base)
        .map_err(|e| Error::invalid_input(format!("agent address {api:?}: {e}")))?;
    Ok(base.trim_end_matches('/').to_string())
}

/// A client of one agent's API.
#[derive(Debug, Clone)]
pub struct AgentClient {
    base: String,
    http: reqwest::Client,
    retry: RetryPolicy,
}

impl AgentClient {
    /// A client of the agent whose API is at `api` (`http://node7:7070`, or `node7:7070`).
    pub fn new(api: &str, opts: &ClientOptions) -> Result<Self> {
        let base = base_of(api)?;
        let mut headers = reqwest::header::HeaderMap::new();
        if let Some(t) = &opts.token {
            let v =
                reqwest::header::HeaderValue::from_str(&format!("Bearer {t}")).map_err(|_| {
                    Error::invalid_input(
                        "the API token contains characters that cannot be sent in a header",
                    )
                })?;
            headers.insert(reqwest::header::AUTHORIZATION, v);
        }
        if let Some(c) = &opts.cluster {
            let bad =
                || Error::invalid_input("the cluster secret or team cannot be sent in a header");
            headers.insert(
                CLUSTER_KEY_HEADER,
                reqwest::header::HeaderValue::from_str(&c.secret).map_err(|_| bad())?,
            );
            if let Some(t) = &c.team {
                headers.insert(
                    CLUSTER_TEAM_HEADER,
                    reqwest::header::HeaderValue::from_str(t).map_err(|_| bad())?,
                );
            }
        }
        if let Some(j) = &opts.job {
            headers.insert(
                JOB_HEADER,
                reqwest::header::HeaderValue::from_str(j).map_err(|_| {
                    Error::invalid_input(format!("job {j:?}: cannot be sent in a header"))
                })?,
            );
        }
        let mut b = reqwest::Client::builder()
            .connect_timeout(opts.connect_timeout)
            .pool_max_idle_per_host(opts.pool_max_idle_per_host)
            .default_headers(headers);
        if let Some(t) = opts.timeout {
            b = b.timeout(t);
        }
        let http = b
            .build()
            .map_err(|e| Error::internal(format!("HTTP client: {e}")))?;
        Ok(Self {
            base,
            http,
            retry: opts.retry,
        })
    }

    /// A client of another agent of the same cluster (`api`, as in [`AgentClient::new`]) that sends what this
    /// one sends (its token, its cluster credential) with the same retries and connections pool. Only for
    /// addresses the deployment names (a Service's endpoints), never one a caller chose: the credentials go
    /// along.
    pub fn at(&self, api: &str) -> Result<Self> {
        Ok(Self {
            base: base_of(api)?,
            http: self.http.clone(),
            retry: self.retry,
        })
    }

    /// The agent's address (`http://host:port`, no trailing slash).
    pub fn base(&self) -> &str {
        &self.base
    }

    /// The URL of `path` (which starts with `/`) on this agent.
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// The URL of `path` with query parameters, percent-encoded.
    pub fn url_with(&self, path: &str, query: &[(&str, &str)]) -> Result<url::Url> {
        url::Url::parse_with_params(&self.url(path), query)
            .map_err(|e| Error::invalid_input(format!("agent URL {}{path}: {e}", self.base)))
    }

    /// A request to `url` (from [`AgentClient::url`] or [`AgentClient::url_with`]) carrying the token.
    pub fn request(&self, method: Method, url: impl reqwest::IntoUrl) -> RequestBuilder {
        self.http.request(method, url)
    }

    /// Send `req`: a transport failure is [`ErrorKind::Unavailable`], an answer outside 2xx the agent's own
    /// error read back by [`wire::error_from_response`]; `what` names the operation in messages.
    pub async fn send(&self, req: RequestBuilder, what: &str) -> Result<Response> {
        let resp = req
            .send()
            .await
            .map_err(|e| transport(&self.base, what, e))?;
        let status = resp.status();
        if status.is_success() {
            return Ok(resp);
        }
        let body = resp.bytes().await.unwrap_or_default();
        Err(wire::error_from_response(status.as_u16(), &body)
            .context(format!("{what} at {}", self.base)))
    }

    /// [`AgentClient::send`] of the request `build` makes, retried through the policy while the error is
    /// retryable. Only for idempotent requests whose body can be made again.
    pub async fn send_retried(
        &self,
        what: &str,
        build: impl Fn() -> RequestBuilder,
    ) -> Result<Response> {
        self.retry
            .run_observed(
                |e, attempt| tracing::debug!(attempt, error = %e, "retrying a request to the agent"),
                || self.send(build(), what),
            )
            .await
    }

    /// Call endpoint `E` of the contract ([`strata_api`]): `path` fills its `{param}` segments in order,
    /// `query` and `body` are its query and body types, and the answer is its response type. `GET`s are
    /// retried through the policy; nothing else is.
    pub async fn call<E: Endpoint>(
        &self,
        path: &[&str],
        query: &E::Query,
        body: &<E::Request as Payload>::Value,
    ) -> Result<<E::Response as Payload>::Value> {
        let doc = EndpointDoc::of::<E>();
        let path = doc.fill(path)?;
        let method = Method::from_bytes(E::METHOD.as_str().as_bytes())
            .map_err(|e| Error::internal(format!("method {}: {e}", E::METHOD.as_str())))?;
        let what = format!("{} {path}", E::METHOD.as_str());
        let body = E::Request::encode(body)?;
        let media = <E::Request as Payload>::MEDIA;
        let make = || {
            let mut r = self.request(method.clone(), self.url(&path)).query(query);
            if let (Some(b), Some(m)) = (&body, media) {
                r = r
                    .header(reqwest::header::CONTENT_TYPE, m.content_type())
                    .body(b.clone());
            }
            r
        };
        let resp = if E::METHOD == strata_api::Method::GET {
            self.send_retried(&what, make).await?
        } else {
            self.send(make(), &what).await?
        };
        let bytes = resp.bytes().await.map_err(|e| {
            Error::new(
                ErrorKind::Unavailable,
                format!("{what}: reading the answer: {e}"),
            )
        })?;
        E::Response::decode(&bytes).map_err(|e| e.context(format!("{what} at {}", self.base)))
    }
}

/// The JSON body of `resp` (`null` when it is empty).
pub async fn read_json<T: DeserializeOwned>(resp: Response, what: &str) -> Result<T> {
    let bytes = resp.bytes().await.map_err(|e| {
        Error::new(
            ErrorKind::Unavailable,
            format!("{what}: reading the answer: {e}"),
        )
    })?;
    let bytes: &[u8] = if bytes.iter().all(u8::is_ascii_whitespace) {
        b"null"
    } else {
        &bytes
    };
    serde_json::from_slice(bytes).map_err(|e| {
        Error::internal(format!(
            "{what}: the agent's answer is not the JSON expected: {e}"
        ))
    })
}

/// A request that never got an answer.
pub fn transport(base: &str, what: &str, e: reqwest::Error) -> Error {
    let kind = if e.is_timeout() {
        ErrorKind::Timeout
    } else {
        ErrorKind::Unavailable
    };
    Error::new(kind, format!("{what} at {base}: {e}")).with_source(e)
}
