//! Checkpoint operations at this agent, recorded for the analytics ([`strata_analytics`]): a layer of the
//! agent's router ([`crate::routes::router`]) that passes every other route through, so each checkpoint
//! route's handler stays what it was.
//!
//! Each request is one operation on the pseudo-backend `ckpt` under `run/step/file`: listing a run's steps and
//! reading a manifest or a rank's record are metadata reads, reading a shard a data read, storing a shard a
//! data write, storing a manifest or record, deleting a step and handing a save over metadata writes. It is
//! counted to the caller's team (an agent's call: the team its cluster credential names) and to the job
//! the request names (`x-strata-job`, which a checkpointer sends from `STRATA_JOB`/`SLURM_JOB_ID`).

use std::sync::Arc;
use std::time::Instant;

use axum::extract::{Request, State};
use axum::http::{Method, header};
use axum::middleware::Next;
use axum::response::Response;
use strata_analytics::{Access, OpClass};
use strata_catalog::Principal;

use crate::Agent;
use crate::access::ClusterCall;

/// The class of a checkpoint route's request, and the key it is on (`run/step/file`).
fn classify(method: &Method, path: &str) -> Option<(OpClass, String)> {
    if path == "/v1/ckpt/handoff" {
        return (method == Method::POST).then(|| (OpClass::MetaWrite, String::new()));
    }
    let rest = path.strip_prefix("/v1/peer/ckpt/")?;
    let parts: Vec<&str> = rest.split('/').collect();
    let shard = parts.get(2).is_some_and(|f| f.ends_with(".safetensors"));
    let class = match (method, parts.len()) {
        (&Method::GET, 1) => OpClass::MetaRead,
        (&Method::GET, 3) if shard => OpClass::DataRead,
        (&Method::GET, 3) => OpClass::MetaRead,
        (&Method::PUT, 3) if shard => OpClass::DataWrite,
        (&Method::PUT, 3) => OpClass::MetaWrite,
        (&Method::DELETE, 2) => OpClass::MetaWrite,
        _ => return None,
    };
    Some((class, rest.to_string()))
}

fn length(h: &axum::http::HeaderMap) -> u64 {
    h.get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// The layer: run the route, then record what it did.
pub(crate) async fn record(State(agent): State<Arc<Agent>>, req: Request, next: Next) -> Response {
    if !agent.analytics().enabled() {
        return next.run(req).await;
    }
    let Some((class, key)) = classify(req.method(), req.uri().path()) else {
        return next.run(req).await;
    };
    let mut ctx = crate::http::io_context(req.headers());
    if let Some(p) = req.extensions().get::<Principal>() {
        ctx = crate::http::principal_context(req.headers(), p);
    } else if let Some(c) = req.extensions().get::<ClusterCall>() {
        ctx.team = c.team.as_deref().map(Arc::from);
    }
    let sent = length(req.headers());
    let start = Instant::now();
    let resp = next.run(req).await;
    let ok = resp.status().is_success();
    let bytes = match class {
        OpClass::DataWrite if ok => sent,
        // A replica is answered whole from memory: its body knows its length.
        OpClass::DataRead if ok => {
            use axum::body::HttpBody;
            resp.body()
                .size_hint()
                .exact()
                .unwrap_or_else(|| length(resp.headers()))
        }
        _ => 0,
    };
    agent.analytics().record(Access::one(
        class,
        ctx,
        Arc::from("ckpt"),
        Arc::from(key),
        bytes,
        start.elapsed(),
        ok,
    ));
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_checkpoint_route_has_its_class() {
        let c = |m: Method, p: &str| classify(&m, p).map(|(c, _)| c);
        assert_eq!(
            c(Method::GET, "/v1/peer/ckpt/run-1"),
            Some(OpClass::MetaRead)
        );
        assert_eq!(
            c(Method::GET, "/v1/peer/ckpt/run-1/7/manifest.json"),
            Some(OpClass::MetaRead)
        );
        assert_eq!(
            c(Method::GET, "/v1/peer/ckpt/run-1/7/rank-00001.safetensors"),
            Some(OpClass::DataRead)
        );
        assert_eq!(
            c(Method::PUT, "/v1/peer/ckpt/run-1/7/rank-00001.safetensors"),
            Some(OpClass::DataWrite)
        );
        assert_eq!(
            c(Method::PUT, "/v1/peer/ckpt/run-1/7/rank-00001.json"),
            Some(OpClass::MetaWrite)
        );
        assert_eq!(
            c(Method::DELETE, "/v1/peer/ckpt/run-1/7"),
            Some(OpClass::MetaWrite)
        );
        assert_eq!(
            c(Method::POST, "/v1/ckpt/handoff"),
            Some(OpClass::MetaWrite)
        );
        assert_eq!(
            c(Method::GET, "/v1/ckpt/handoff"),
            None,
            "a status poll is not I/O"
        );
    }
}
