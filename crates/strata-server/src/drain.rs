//! Stopping a server without dropping what the kernel already accepted.
//!
//! A client's connection is complete once the kernel finished its handshake, before the server calls
//! `accept`: closing the listener then resets it, and a request sent on it in the moments before a SIGTERM
//! got no answer at all. On shutdown both servers (the API's and the gateway's) first take every connection
//! already queued (until none comes within [`POLL`], for at most [`MAX`] while clients keep connecting), serve
//! it, and only then close the listener: a client connecting later is refused (a clear, retryable error).

use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

/// How long a stopping server waits for the next queued connection before it takes the queue for empty.
pub(crate) const POLL: Duration = Duration::from_millis(20);
/// The longest a stopping server keeps taking queued connections.
pub(crate) const MAX: Duration = Duration::from_millis(500);

/// The next connection already queued on `listener`, if one comes within [`POLL`] and the drain that began
/// at `since` has not run for [`MAX`].
pub(crate) async fn queued(
    listener: &TcpListener,
    since: tokio::time::Instant,
) -> Option<(TcpStream, std::net::SocketAddr)> {
    if since.elapsed() >= MAX {
        return None;
    }
    match tokio::time::timeout(POLL, listener.accept()).await {
        Ok(Ok(c)) => Some(c),
        _ => None,
    }
}

/// The API's listener for `axum::serve`: accepts until `stop`, then the queued connections, then cancels
/// `drained` (the server's graceful-shutdown signal) and accepts nothing more.
pub(crate) struct Draining {
    pub(crate) inner: TcpListener,
    pub(crate) stop: CancellationToken,
    pub(crate) drained: CancellationToken,
    /// When the drain began.
    pub(crate) since: Option<tokio::time::Instant>,
}

impl axum::serve::Listener for Draining {
    type Io = TcpStream;
    type Addr = std::net::SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        while !self.stop.is_cancelled() {
            tokio::select! {
                r = self.inner.accept() => match r {
                    Ok(c) => return c,
                    Err(e) => {
                        tracing::warn!(error = %e, "API: accepting a connection failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                },
                _ = self.stop.cancelled() => {}
            }
        }
        let since = *self.since.get_or_insert_with(tokio::time::Instant::now);
        if let Some(c) = queued(&self.inner, since).await {
            return c;
        }
        self.drained.cancel();
        std::future::pending().await
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        self.inner.local_addr()
    }
}
