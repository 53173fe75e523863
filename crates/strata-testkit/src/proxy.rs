use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::Response;
use bytes::Bytes;
use futures::StreamExt;
use parking_lot::Mutex;

/// One request seen by the proxy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recorded {
    /// HTTP method.
    pub method: String,
    /// Path and query.
    pub path: String,
    /// The `Range` header, if any.
    pub range: Option<String>,
}

#[derive(Debug, Default)]
struct Faults {
    fail_next: u32,
    fail_status: u16,
    delay: Duration,
    reset_next_bodies: u32,
    hold_after: Option<u64>,
}

#[derive(Debug)]
struct Shared {
    upstream: String,
    client: reqwest::Client,
    faults: Mutex<Faults>,
    log: Mutex<Vec<Recorded>>,
    /// Open (true) lets held bodies go on.
    gate: tokio::sync::watch::Sender<bool>,
}

/// A request-counting, fault-injecting HTTP proxy on loopback. Stops when dropped.
#[derive(Debug)]
pub struct FaultProxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
}

impl FaultProxy {
    /// Start a proxy forwarding to `upstream` (`http://host:port`). Must be called inside a Tokio runtime.
    pub async fn start(upstream: &str) -> Self {
        let shared = Arc::new(Shared {
            upstream: upstream.trim_end_matches('/').to_string(),
            client: reqwest::Client::new(),
            faults: Mutex::new(Faults::default()),
            log: Mutex::new(Vec::new()),
            gate: tokio::sync::watch::Sender::new(true),
        });
        let app = axum::Router::new()
            .fallback(forward)
            .with_state(shared.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("binding the fault proxy");
        let addr = listener.local_addr().expect("proxy address");
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(async move {
            let _ = axum::serve(listener, app)
                .with_graceful_shutdown(async {
                    let _ = rx.await;
                })
                .await;
        });
        Self {
            addr,
            shared,
            shutdown: Some(tx),
        }
    }

    /// `http://127.0.0.1:PORT` of the proxy.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Answer the next `n` requests with `status` without forwarding them.
    pub fn fail_next(&self, n: u32, status: u16) {
        let mut f = self.shared.faults.lock();
        f.fail_next = n;
        f.fail_status = status;
    }

    /// Delay every request by `d` before forwarding.
    pub fn set_delay(&self, d: Duration) {
        self.shared.faults.lock().delay = d;
    }

    /// Forward the next `n` responses with bodies but cut each connection after half the body (the half
    /// delivered before the cut).
    pub fn reset_next_bodies(&self, n: u32) {
        self.shared.faults.lock().reset_next_bodies = n;
    }

    /// Hold every response body started from now on after its first `bytes` bytes, until
    /// [`Self::release_bodies`]: an origin that stalls mid-body, for as long as a test needs.
    pub fn hold_bodies_after(&self, bytes: u64) {
        self.shared.faults.lock().hold_after = Some(bytes);
        self.shared.gate.send_replace(false);
    }

    /// Let held bodies go on; bodies started from now on are not held.
    pub fn release_bodies(&self) {
        self.shared.faults.lock().hold_after = None;
        self.shared.gate.send_replace(true);
    }

    /// Every request seen so far (including failed ones).
    pub fn requests(&self) -> Vec<Recorded> {
        self.shared.log.lock().clone()
    }

    /// GET requests seen so far whose path contains `needle`.
    pub fn gets_of(&self, needle: &str) -> Vec<Recorded> {
        self.requests()
            .into_iter()
            .filter(|r| r.method == "GET" && r.path.contains(needle))
            .collect()
    }

    /// Forget the request log.
    pub fn clear(&self) {
        self.shared.log.lock().clear();
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
    }
}

async fn forward(State(s): State<Arc<Shared>>, req: Request) -> Response {
    let method = req.method().clone();
    let path = req
        .uri()
        .path_and_query()
        .map(|p| p.to_string())
        .unwrap_or_else(|| "/".into());
    let range = req
        .headers()
        .get(http::header::RANGE)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    s.log.lock().push(Recorded {
        method: method.to_string(),
        path: path.clone(),
        range,
    });
    let (fail, delay, reset, hold) = {
        let mut f = s.faults.lock();
        let fail = if f.fail_next > 0 {
            f.fail_next -= 1;
            Some(f.fail_status)
        } else {
            None
        };
        (fail, f.delay, f.reset_next_bodies, f.hold_after)
    };
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    if let Some(status) = fail {
        return Response::builder()
            .status(status)
            .header("content-type", "application/xml")
            .body(Body::from(
                "<?xml version=\"1.0\"?><Error><Code>SlowDown</Code><Message>injected</Message></Error>",
            ))
            .unwrap_or_default();
    }
    let mut headers = req.headers().clone();
    headers.remove(http::header::HOST);
    let body = match axum::body::to_bytes(req.into_body(), usize::MAX).await {
        Ok(b) => b,
        Err(_) => return status_response(400),
    };
    let upstream = s
        .client
        .request(method, format!("{}{}", s.upstream, path))
        .headers(headers)
        .body(body)
        .send()
        .await;
    let resp = match upstream {
        Ok(r) => r,
        Err(_) => return status_response(502),
    };
    let mut builder = Response::builder().status(resp.status());
    for (k, v) in resp.headers() {
        if k != http::header::TRANSFER_ENCODING && k != http::header::CONNECTION {
            builder = builder.header(k, v);
        }
    }
    let len = resp.content_length().unwrap_or(0);
    let cut = if len > 1 && reset > 0 {
        let mut f = s.faults.lock();
        if f.reset_next_bodies > 0 {
            f.reset_next_bodies -= 1;
            Some(len / 2)
        } else {
            None
        }
    } else {
        None
    };
    let stream = resp.bytes_stream();
    let body = match cut {
        None if hold.is_some() => held_body(stream.boxed(), hold.unwrap_or(0), s.gate.subscribe()),
        None => Body::from_stream(stream),
        Some(limit) => {
            let mut sent = 0u64;
            let s = stream.flat_map(move |chunk| {
                let out: Vec<Result<Bytes, std::io::Error>> = match chunk {
                    Ok(_) if sent >= limit => vec![Err(reset_err())],
                    Ok(c) if sent + c.len() as u64 > limit => {
                        let take = (limit - sent) as usize;
                        sent = limit;
                        vec![Ok(c.slice(..take)), Err(reset_err())]
                    }
                    Ok(c) => {
                        sent += c.len() as u64;
                        vec![Ok(c)]
                    }
                    Err(e) => vec![Err(std::io::Error::other(e))],
                };
                futures::stream::iter(out)
            });
            // The bytes before the cut reach the client before it: the server drops what it has not yet
            // written when a body fails, which would make the cut fall anywhere before half-way.
            let s = s.then(|item| async move {
                if item.is_err() {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                item
            });
            Body::from_stream(s)
        }
    };
    builder.body(body).unwrap_or_default()
}

/// `stream` up to `limit` bytes, then the rest once `gate` is open.
fn held_body(
    stream: futures::stream::BoxStream<'static, reqwest::Result<Bytes>>,
    limit: u64,
    gate: tokio::sync::watch::Receiver<bool>,
) -> Body {
    let s = futures::stream::unfold(
        (stream, 0u64, gate, None::<Bytes>),
        move |(mut st, sent, mut gate, rest)| async move {
            if sent >= limit {
                let _ = gate.wait_for(|open| *open).await;
            }
            let chunk = match rest {
                Some(c) => c,
                None => match st.next().await? {
                    Ok(c) => c,
                    Err(e) => {
                        return Some((Err(std::io::Error::other(e)), (st, sent, gate, None)));
                    }
                },
            };
            if sent < limit && sent + chunk.len() as u64 > limit {
                let mut chunk = chunk;
                let head = chunk.split_to((limit - sent) as usize);
                return Some((Ok(head), (st, limit, gate, Some(chunk))));
            }
            let n = chunk.len() as u64;
            Some((Ok(chunk), (st, sent + n, gate, None)))
        },
    );
    Body::from_stream(s)
}

fn reset_err() -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::ConnectionReset,
        "injected reset mid-body",
    )
}

fn status_response(status: u16) -> Response {
    Response::builder()
        .status(status)
        .body(Body::empty())
        .unwrap_or_default()
}
