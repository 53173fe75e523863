//! Operations on the checkpoints of a run across tiers, for the CLI (`strata ckpt ...`).

use std::collections::BTreeMap;

use strata_types::{Error, ErrorKind, IoContext, Result};

use crate::manifest::Manifest;
use crate::tier::Tier;

/// One checkpoint as seen across tiers.
#[derive(Debug, Clone)]
pub struct Listed {
    /// The step.
    pub step: u64,
    /// The manifest (from the first tier that has one).
    pub manifest: Manifest,
    /// Tiers (by description) where the checkpoint is committed.
    pub committed_in: Vec<String>,
}

/// Every committed checkpoint of `run` in any of `tiers`, newest first.
pub async fn list(ctx: &IoContext, tiers: &[Tier], run: &str) -> Result<Vec<Listed>> {
    crate::manifest::validate_run_id(run)?;
    let mut by_step: BTreeMap<u64, Listed> = BTreeMap::new();
    for t in tiers {
        for step in t.committed(ctx, run).await? {
            if let Some(l) = by_step.get_mut(&step) {
                l.committed_in.push(t.describe());
                continue;
            }
            if let Some(m) = t.manifest(ctx, run, step).await? {
                by_step.insert(
                    step,
                    Listed {
                        step,
                        manifest: m,
                        committed_in: vec![t.describe()],
                    },
                );
            }
        }
    }
    Ok(by_step.into_values().rev().collect())
}

/// The verdict on one copy of one shard.
#[derive(Debug, Clone)]
pub struct CopyCheck {
    /// The rank.
    pub rank: u32,
    /// The tier.
    pub tier: String,
    /// `ok`, `missing`, `mismatch` or an error message.
    pub status: String,
}

/// Check every copy of every shard of `step` in every tier against the manifest. Returns the checks and
/// whether every rank has at least one verified copy.
pub async fn verify(
    ctx: &IoContext,
    tiers: &[Tier],
    run: &str,
    step: u64,
) -> Result<(Vec<CopyCheck>, bool)> {
    let listed = list(ctx, tiers, run).await?;
    let l = listed.into_iter().find(|l| l.step == step).ok_or_else(|| {
        Error::new(
            ErrorKind::NotFound,
            format!("run {run} has no complete checkpoint at step {step}"),
        )
    })?;
    let mut checks = Vec::new();
    let mut all = true;
    for rec in &l.manifest.shards {
        let mut any = false;
        for t in tiers {
            let status = match t.read_file(ctx, run, step, &rec.file).await {
                Ok(b) if rec.matches(&b) => {
                    any = true;
                    "ok".to_string()
                }
                Ok(_) => "mismatch".to_string(),
                Err(e) if e.kind() == ErrorKind::NotFound => "missing".to_string(),
                Err(e) => e.message().to_string(),
            };
            checks.push(CopyCheck {
                rank: rec.rank,
                tier: t.describe(),
                status,
            });
        }
        all &= any;
    }
    Ok((checks, all))
}

/// Bring checkpoint `step` into the `to` tier from the others: every shard copied from a verified copy, then
/// the manifest, last. Shards already there and verified are kept.
pub async fn restore_into(
    ctx: &IoContext,
    to: &Tier,
    from: &[Tier],
    run: &str,
    step: u64,
) -> Result<Manifest> {
    let mut all = vec![to.clone()];
    all.extend(from.iter().cloned());
    let listed = list(ctx, &all, run).await?;
    let m = listed
        .into_iter()
        .find(|l| l.step == step)
        .map(|l| l.manifest)
        .ok_or_else(|| {
            Error::new(
                ErrorKind::NotFound,
                format!("run {run} has no complete checkpoint at step {step}"),
            )
        })?;
    for rec in &m.shards {
        let good = |b: &bytes::Bytes| rec.matches(b);
        if let Ok(b) = to.read_file(ctx, run, step, &rec.file).await
            && good(&b)
        {
            continue;
        }
        let mut copied = false;
        for t in from {
            let Ok(b) = t.read_file(ctx, run, step, &rec.file).await else {
                continue;
            };
            if !good(&b) {
                continue;
            }
            // The verified file as it is (passed as the "header" with no tensors after it).
            let mut written = to.write_shard(ctx, run, step, rec.rank, &b, &[]).await?;
            written.tensors = rec.tensors;
            to.write_record(ctx, run, step, &written).await?;
            copied = true;
            break;
        }
        if !copied {
            return Err(Error::new(
                ErrorKind::Corrupt,
                format!(
                    "step {step} rank {}: no tier has a verified copy of {}",
                    rec.rank, rec.file
                ),
            ));
        }
    }
    if to.manifest(ctx, run, step).await?.is_none() {
        to.commit(ctx, &m).await?;
    }
    Ok(m)
}
