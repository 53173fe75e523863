//! Admission of a claim: validate, resolve and authorize every location, pin the exact object versions found,
//! admit quota (scratch, pinned bytes) before anything is staged, protect the datasets from clean-up, and
//! record it. A step that fails releases what the steps before it took, and the caller gets that step's error.

use std::sync::Arc;

use strata_catalog::Role;
use strata_catalog::claims::{ClaimObject, ClaimRecord};
use strata_catalog::lifecycle::Protection;
use strata_claim::{ClaimSpec, ClaimState, DatasetStatus, JobUsage, Mode, Progress};
use strata_types::{Error, ErrorKind, IoContext, ObjectMeta, Result};

use crate::Agent;
use crate::access::Caller;
use crate::api::CACHE_SCOPE;

/// Objects one claim may pin (its snapshot is a row each in the catalog).
pub const MAX_OBJECTS: usize = 1_000_000;

/// A dataset as resolved at admission.
pub(super) struct Resolved {
    pub name: String,
    pub catalog_name: String,
    pub backend: strata_object::Backend,
    pub prefix: String,
    pub objects: Vec<ObjectMeta>,
}

/// The inventory key (on the `cache` scope) charging a claim's pinned dataset to its team.
pub(super) fn pin_charge_key(claim: &str, dataset: &str) -> String {
    format!("claims/{claim}/{dataset}")
}

/// Resolve, authorize and list one location: a prefix (ends with `/`) or one object.
pub(super) async fn snapshot(
    a: &Agent,
    caller: &Caller,
    field: &str,
    location: &str,
    need: Role,
) -> Result<(String, strata_object::Backend, String, Vec<ObjectMeta>)> {
    let named = |e: Error| Error::new(e.kind(), format!("{field}: {e}"));
    let (name, backend, key, _) = a
        .authorize_named(caller, location, need, true)
        .await
        .map_err(named)?;
    let ctx = IoContext::default();
    if !key.is_empty() && !key.ends_with('/') {
        let meta = backend.head(&ctx, &key).await.map_err(|e| {
            if e.kind() == ErrorKind::NotFound {
                Error::new(
                    ErrorKind::NotFound,
                    format!("{field}: no object {location:?} (a prefix ends with '/')"),
                )
            } else {
                named(e)
            }
        })?;
        return Ok((name, backend, key, vec![meta]));
    }
    let mut objects = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let page = backend
            .list_page(&ctx, &key, after.as_deref(), 1000)
            .await
            .map_err(named)?;
        objects.extend(page.objects);
        if objects.len() > MAX_OBJECTS {
            return Err(Error::invalid_input(format!(
                "{field}: more than {MAX_OBJECTS} objects under {location:?}; claim smaller prefixes"
            )));
        }
        match page.next_start_after {
            Some(s) => after = Some(s),
            None => break,
        }
    }
    Ok((name, backend, key, objects))
}

/// The principal a claim's locations are authorized as: its submitter held to the claim's team (the role
/// it has there; an admin's is team_admin), so a claim never reaches what its team may not, whoever submits
/// it: a member of several teams, or the Kubernetes operator, which submits every namespace's claims with
/// one admin token.
pub(super) fn as_team(p: &strata_catalog::Principal, team: &str) -> strata_catalog::Principal {
    let role = p.role_in(team).unwrap_or(Role::Member);
    strata_catalog::Principal {
        is_admin: false,
        team: Some(team.to_string()),
        memberships: vec![strata_catalog::access::Membership {
            team: team.to_string(),
            role,
        }],
        ..p.clone()
    }
}

/// Admit `spec` for `caller`: everything but the staging, which [`super::stage`] does. Returns the claim's id.
pub(super) async fn admit(
    a: &Arc<Agent>,
    principal: &strata_catalog::Principal,
    spec: ClaimSpec,
) -> Result<String> {
    principal.require(&spec.team, Role::Member)?;
    a.catalog().team(&spec.team).await?;
    let caller = Caller::Principal(as_team(principal, &spec.team));
    for (i, d) in spec.datasets.iter().enumerate() {
        if let Some(m) = &d.mount {
            super::mounts::check(&spec, &d.location, m, &format!("datasets[{i}].mount"))?;
        }
    }
    // Every location resolved, readable by the caller, and listed: the versions the claim pins.
    let mut resolved = Vec::new();
    for (i, d) in spec.datasets.iter().enumerate() {
        let field = format!("datasets[{i}].location");
        let (catalog_name, backend, prefix, objects) =
            snapshot(a, &caller, &field, &d.location, Role::Reader).await?;
        if objects.is_empty() {
            return Err(Error::new(
                ErrorKind::NotFound,
                format!(
                    "{field}: no objects under {:?}; a job must not start on an empty dataset",
                    d.location
                ),
            ));
        }
        resolved.push(Resolved {
            name: d.name.clone(),
            catalog_name,
            backend,
            prefix,
            objects,
        });
    }
    if let Some(c) = &spec.checkpoint {
        a.authorize_named(&caller, &c.location, Role::Member, true)
            .await
            .map_err(|e| Error::new(e.kind(), format!("checkpoint.location: {e}")))?;
    }

    let cat = a.catalog();
    let now = cat.now();
    let id = format!("claim_{now}_{:08x}", rand::random::<u32>());
    let datasets: Vec<DatasetStatus> = spec
        .datasets
        .iter()
        .zip(&resolved)
        .map(|(d, r)| DatasetStatus {
            name: d.name.clone(),
            location: d.location.clone(),
            mode: d.mode.as_str().into(),
            objects: r.objects.len() as u64,
            bytes: r.objects.iter().map(|o| o.size).sum(),
            mount: d.mount.clone(),
        })
        .collect();
    let objects: Vec<ClaimObject> = resolved
        .iter()
        .flat_map(|r| {
            r.objects.iter().map(|o| ClaimObject {
                dataset: r.name.clone(),
                backend: r.catalog_name.clone(),
                key: o.key.clone(),
                size: o.size as i64,
                etag: o.etag.clone(),
                version: o.version.clone(),
                modified_at: o.last_modified_unix,
            })
        })
        .collect();
    let rec = ClaimRecord {
        id: id.clone(),
        team: spec.team.clone(),
        job: spec.job.clone(),
        principal: principal.id.clone(),
        agent: super::agent_id(a),
        spec: json(&spec)?,
        state: ClaimState::Pending,
        reason: String::new(),
        progress: json(&Progress::default())?,
        usage: json(&JobUsage::default())?,
        datasets: json(&datasets)?,
        scratch_id: None,
        created_at: now,
        deadline_at: now + spec.stage_deadline() as i64,
        ready_at: None,
        heartbeat_at: now,
        released_at: None,
    };
    cat.insert_claim(&rec, &objects).await?;
    // From here on, a failure releases what was taken.
    if let Err(e) = take(a, &rec, &spec, &resolved, &principal.id).await {
        let reason = format!("not admitted: {e}");
        if let Err(re) = super::release::release(a, &id, &reason, &principal.id).await {
            tracing::warn!(claim = %id, error = %re, "releasing a claim that was not admitted");
        }
        return Err(e);
    }
    cat.audit(
        &principal.id,
        Some(&spec.team),
        "claim.submit",
        &id,
        serde_json::json!({"job": spec.job, "objects": objects.len()}),
    )
    .await?;
    Ok(id)
}

/// Quota, scratch, protections and pins of an admitted claim.
async fn take(
    a: &Agent,
    rec: &ClaimRecord,
    spec: &ClaimSpec,
    resolved: &[Resolved],
    actor: &str,
) -> Result<()> {
    let cat = a.catalog();
    // Quota before bytes: pinned datasets on the team's `cache` scope, scratch on `scratch`.
    for (i, (d, r)) in spec.datasets.iter().zip(resolved).enumerate() {
        if d.mode != Mode::Pin {
            continue;
        }
        let bytes: i64 = r.objects.iter().map(|o| o.size as i64).sum();
        let res = cat
            .reserve(&spec.team, CACHE_SCOPE, bytes, 1, 600)
            .await
            .map_err(|e| Error::new(e.kind(), format!("datasets[{i}] (pin): {e}")))?;
        let charge = strata_catalog::inventory::ObjectRecord {
            backend: CACHE_SCOPE.into(),
            key: pin_charge_key(&rec.id, &d.name),
            size: bytes,
            etag: String::new(),
            modified_at: cat.now(),
            team: Some(spec.team.clone()),
            principal: Some(actor.to_string()),
            job: Some(spec.job.clone()),
            dataset: Some(d.name.clone()),
            accessed_at: None,
        };
        cat.commit_write(vec![res], &charge).await?;
    }
    if let Some(s) = &spec.scratch {
        let scratch = crate::control::allocate_scratch(
            a,
            &spec.team,
            s.size.bytes() as i64,
            s.ttl_secs as i64,
        )
        .await
        .map_err(|e| Error::new(e.kind(), format!("scratch.size: {e}")))?;
        cat.set_claim_scratch(&rec.id, &scratch.id).await?;
    }
    // The datasets are not cleaned up under the job (renewed with each heartbeat).
    // A whole backend cannot be protected by prefix; clean-up policies name prefixes of one anyway.
    for r in resolved.iter().filter(|r| !r.prefix.is_empty()) {
        cat.add_protection(
            actor,
            Protection {
                id: String::new(),
                kind: "claim".into(),
                team: spec.team.clone(),
                backend: r.catalog_name.clone(),
                prefix: r.prefix.clone(),
                job: Some(rec.id.clone()),
                expires_at: Some(rec.heartbeat_at + spec.ttl() as i64),
                created_at: 0,
            },
        )
        .await?;
    }
    for (d, r) in spec.datasets.iter().zip(resolved) {
        if d.mode == Mode::Pin {
            a.cache().pin(r.backend.id(), &r.prefix)?;
            a.pins_changed();
        }
    }
    Ok(())
}

pub(super) fn json<T: serde::Serialize>(v: &T) -> Result<String> {
    serde_json::to_string(v).map_err(|e| Error::internal(format!("encoding a claim document: {e}")))
}

/// `train-set` -> `TRAIN_SET`: a dataset's name in environment variables.
pub fn env_name(name: &str) -> String {
    name.to_ascii_uppercase().replace('-', "_")
}
