//! `GET /v1/coverage?location=&team=`: how much of a location's current version the cache cluster holds.
//!
//! The location is resolved, authorized and listed as a claim's admission lists it ([`super::admit::snapshot`]:
//! as the caller held to `team` when given, a reader of every key), so coverage shows nothing a claim could
//! not read. The version is a digest of the listing ([`version_of`]); the blocks are counted where they live:
//! this agent's share here, each other member's by `POST /v1/peer/held`, all at once, each within
//! [`MEMBER_TIMEOUT`]. Nothing is fetched: a dataset's coverage costs one listing, not a read. A member that
//! does not answer is named with its error and its share counted as not held (`complete: false`).

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Extension, State};
use strata_catalog::{Principal, Role};
use strata_claim::{Coverage, MemberCoverage};
use strata_types::{IoContext, ObjectMeta};

use crate::Agent;
use crate::access::Caller;
use crate::http::ApiResult;
use crate::http::Query;

/// The longest one member may take to count its share.
const MEMBER_TIMEOUT: Duration = Duration::from_secs(30);

/// The version of a listing: the first 16 hex digits of the BLAKE3 of each object's key, size, ETag and
/// version id (in key order, each field ended by a NUL, so no two listings run together).
pub fn version_of(objects: &[ObjectMeta]) -> String {
    let mut sorted: Vec<&ObjectMeta> = objects.iter().collect();
    sorted.sort_by(|a, b| a.key.cmp(&b.key));
    let mut h = blake3::Hasher::new();
    for o in sorted {
        h.update(o.key.as_bytes());
        h.update(&[0]);
        h.update(o.size.to_string().as_bytes());
        h.update(&[0]);
        h.update(o.etag.as_deref().unwrap_or_default().as_bytes());
        h.update(&[0]);
        h.update(o.version.as_deref().unwrap_or_default().as_bytes());
        h.update(&[0]);
    }
    h.finalize().to_hex()[..16].to_string()
}

pub(super) async fn coverage(
    State(a): State<Arc<Agent>>,
    Extension(p): Extension<Principal>,
    Query(q): Query<strata_api::claims::CoverageQuery>,
) -> ApiResult<crate::http::Reply<strata_api::claims::GetCoverage>> {
    let caller = match &q.team {
        Some(team) => {
            p.require(team, Role::Reader)?;
            a.catalog().team(team).await?;
            Caller::Principal(super::admit::as_team(&p, team))
        }
        None => Caller::Principal(p.clone()),
    };
    let (_, backend, _, objects) =
        super::admit::snapshot(&a, &caller, "location", &q.location, Role::Reader).await?;
    let mut out = Coverage {
        location: q.location.clone(),
        version: version_of(&objects),
        objects: objects.len() as u64,
        complete: true,
        ..Coverage::default()
    };
    let cache = a.cache();
    let whole = cache.held(&backend, &objects);
    out.bytes_total = whole.bytes_total;
    out.blocks_total = whole.blocks_total;
    let Some(cluster) = a.cluster() else {
        out.objects_held = whole.objects_held;
        out.bytes_held = whole.bytes_held;
        out.blocks_held = whole.blocks_held;
        out.members = vec![MemberCoverage {
            member: a.api_url.get().cloned().unwrap_or_default(),
            blocks_total: whole.blocks_total,
            blocks_held: whole.blocks_held,
            bytes_total: whole.bytes_total,
            bytes_held: whole.bytes_held,
            error: None,
        }];
        return Ok(crate::http::Reply(out));
    };
    // Objects of which some member lacks a block: those not held whole by the cluster.
    let mut lacking = vec![false; objects.len()];
    let mut i = 0;
    let own = cache.held_owned_each(&backend, &objects, 1, |all| {
        lacking[i] |= !all;
        i += 1;
    });
    let mut members = vec![MemberCoverage {
        member: cluster.me().to_string(),
        blocks_total: own.blocks_total,
        blocks_held: own.blocks_held,
        bytes_total: own.bytes_total,
        bytes_held: own.bytes_held,
        error: None,
    }];
    let req = crate::cluster::stage::stage_request(
        backend.id().to_string(),
        cache.config().block_size.bytes(),
        &objects,
        1,
    );
    let ctx = IoContext {
        principal: Some(p.id.as_str().into()),
        team: q.team.as_deref().map(Into::into),
        ..IoContext::default()
    };
    let others = cluster.others();
    let answers = futures::future::join_all(
        others
            .iter()
            .map(|m| cluster.client().held(m, &ctx, &req, MEMBER_TIMEOUT)),
    )
    .await;
    for (m, r) in others.into_iter().zip(answers) {
        members.push(match r {
            Ok(share) => {
                for (i, l) in lacking.iter_mut().enumerate() {
                    *l |= share.lacks(i);
                }
                let h = share.held;
                MemberCoverage {
                    member: m,
                    blocks_total: h.blocks_total,
                    blocks_held: h.blocks_held,
                    bytes_total: h.bytes_total,
                    bytes_held: h.bytes_held,
                    error: None,
                }
            }
            Err(e) => {
                out.complete = false;
                MemberCoverage {
                    member: m,
                    error: Some(e.to_string()),
                    ..MemberCoverage::default()
                }
            }
        });
    }
    let shares = members
        .iter()
        .fold((0, 0), |(b, n), m| (b + m.blocks_total, n + m.bytes_total));
    // Shares that do not add up to every block: the view changed while they were counted.
    if shares != (whole.blocks_total, whole.bytes_total) {
        out.complete = false;
    }
    out.blocks_held = members.iter().map(|m| m.blocks_held).sum();
    out.bytes_held = members.iter().map(|m| m.bytes_held).sum();
    // Whole objects are known only when every member answered for shares that add up: a silent member (or a
    // block nobody counted) may be a block of any.
    out.objects_held = if !out.complete {
        0
    } else {
        lacking.iter().filter(|l| !**l).count() as u64
    };
    out.members = members;
    Ok(crate::http::Reply(out))
}
