//! Every S3 operation recorded for the analytics ([`strata_analytics`]): its class, bytes, latency and
//! outcome, attributed to the caller's team, principal, job and dataset, and to the bucket and key it names.
//!
//! Recorded at the trait's door ([`super::Gateway`]'s `impl S3`), one place for every operation: latency is
//! the time to the response's headers (a GET's body streams after it), a GET's bytes are the ones its
//! response promises (`Content-Length`), a PUT's or a part's the ones it sent. An unauthenticated request is not
//! recorded (it is refused before any I/O). The caller is
//! resolved as the operation resolves it (`Gateway::who`: configured keys, then the catalog's, cached). Recording never waits ([`strata_analytics::Analytics::record`]).

use std::sync::Arc;
use std::time::Instant;

use s3s::{S3Request, S3Response, S3Result};
use strata_analytics::{Access, OpClass};

use super::Gateway;

impl Gateway {
    /// Run `op` on `req` and record it as `class` on `backend` (the bucket) and `key`, its bytes `bytes` of
    /// the answer (reads) or `sent` (writes).
    pub(super) async fn recorded<I, O, F>(
        &self,
        class: OpClass,
        req: S3Request<I>,
        (backend, key): (Arc<str>, Arc<str>),
        sent: u64,
        bytes: impl FnOnce(&O) -> u64,
        op: impl FnOnce(S3Request<I>) -> F,
    ) -> S3Result<S3Response<O>>
    where
        F: std::future::Future<Output = S3Result<S3Response<O>>>,
    {
        if !self.agent.analytics().enabled() {
            return op(req).await;
        }
        // The caller as the operation itself will see it (a catalog key's team comes from its principal).
        let Ok(who) = self.who(&req).await else {
            return op(req).await;
        };
        let ctx = who.ctx;
        let start = Instant::now();
        let r = op(req).await;
        let (ok, moved) = match &r {
            Ok(resp) => (true, sent + bytes(&resp.output)),
            Err(_) => (false, 0),
        };
        self.agent.analytics().record(Access::one(
            class,
            ctx,
            backend,
            key,
            moved,
            start.elapsed(),
            ok,
        ));
        r
    }
}
