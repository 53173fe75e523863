//! Staging a claim: every block of every staged dataset version into the cache, with progress in the catalog
//! once a second, then the verdict. `ready` is a count, not the end of a loop: every block of the snapshot
//! must be held complete by the cache's last tier, or the claim fails with what is missing and why. A claim
//! still staging at its deadline fails; a release cancels its staging; a claim this agent was staging when it
//! stopped is staged again when it starts ([`resume`]).

use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use strata_cache::Held;
use strata_claim::{ClaimState, Mode, Progress};
use strata_types::{ErrorKind, IoContext, ObjectMeta, Result};

use crate::Agent;

/// Blocks fetched at once by one claim's staging.
const CONCURRENCY: usize = 16;
/// How often progress is written to the catalog.
const PROGRESS_EVERY: Duration = Duration::from_secs(1);

/// Start staging claim `id` in the background (no-op if it is already staging here).
pub(crate) fn spawn(a: &Arc<Agent>, id: &str) {
    let token = a.claim_stop.child_token();
    {
        let mut tasks = a.claim_tasks.lock();
        if tasks.contains_key(id) {
            return;
        }
        tasks.insert(id.to_string(), token.clone());
    }
    let (a, id) = (a.clone(), id.to_string());
    a.clone().spawn(async move {
        tokio::select! {
            r = run(&a, &id) => {
                if let Err(e) = r {
                    tracing::warn!(claim = %id, error = %e, "staging stopped");
                    let reason = format!("staging stopped: {e}");
                    let _ = a.catalog().set_claim_state(&id, ClaimState::Failed, &reason, "{}").await;
                }
            }
            _ = token.cancelled() => {}
        }
        a.claim_tasks.lock().remove(&id);
    });
}

/// Stage again the claims this agent was staging when it stopped.
pub(crate) async fn resume(a: &Arc<Agent>) -> Result<usize> {
    let me = super::agent_id(a);
    let mut n = 0;
    for c in a.catalog().list_claims(None, false).await? {
        if c.agent == me && matches!(c.state, ClaimState::Pending | ClaimState::Staging) {
            spawn(a, &c.id);
            n += 1;
        }
    }
    Ok(n)
}

/// One staged dataset: its backend and the versions to stage.
struct Part {
    name: String,
    backend: strata_object::Backend,
    objects: Vec<ObjectMeta>,
    /// Copies of each block kept: the dataset's `replicas`, at most one per member of the cluster (1 outside
    /// one, and once this agent stages the dataset alone after a member failed).
    copies: std::sync::atomic::AtomicUsize,
    /// The dataset's `replicas`.
    copies_asked: u32,
    /// Once the members of the cluster staged their shares: what they hold of them (this agent's share is
    /// counted here), each copy of a block counted. `None`: this agent holds (or stages) every block itself.
    members_held: Mutex<Option<Held>>,
}

async fn run(a: &Arc<Agent>, id: &str) -> Result<()> {
    let cat = a.catalog();
    let rec = cat.claim(id).await?;
    let spec = super::stored_spec(&rec)?;
    let objects = cat.claim_objects(id).await?;
    let members = a.cluster().map(|c| c.others()).unwrap_or_default();
    let mut parts = Vec::new();
    for d in spec.datasets.iter().filter(|d| d.mode != Mode::Stream) {
        let (backend, _) = a.resolve(&d.location)?;
        let objects = objects
            .iter()
            .filter(|o| o.dataset == d.name)
            .map(|o| ObjectMeta {
                key: o.key.clone(),
                size: o.size as u64,
                etag: o.etag.clone(),
                version: o.version.clone(),
                last_modified_unix: o.modified_at,
                attrs: None,
            })
            .collect();
        parts.push(Part {
            name: d.name.clone(),
            backend,
            objects,
            copies_asked: d.replicas(),
            copies: (d.replicas() as usize).min(members.len() + 1).max(1).into(),
            members_held: Mutex::new(None),
        });
    }
    let mut start = count(a, &parts);
    start.cached_bytes = start.bytes_done;
    let start_bytes = start.bytes_done;
    let doc = super::admit::json(&start)?;
    let progress = Arc::new(Mutex::new(start));
    if !cat
        .set_claim_state(id, ClaimState::Staging, "", &doc)
        .await?
    {
        return Ok(()); // released (or failed) meanwhile
    }
    let deadline = tokio::time::Instant::now()
        + Duration::from_secs(rec.deadline_at.saturating_sub(cat.now()).max(0) as u64);
    let errors: Mutex<Vec<String>> = Mutex::new(Vec::new());
    // What a Ready claim has less of than it asked for: its reason, so the job's owner sees it.
    let degraded: Mutex<Vec<String>> = Mutex::new(Vec::new());
    let note = |e: String| {
        let mut errs = errors.lock();
        if errs.len() < 10 {
            errs.push(e);
        }
    };
    let cached = Mutex::new(start_bytes);
    let done_before = Mutex::new(0u64);
    let work = async {
        for p in &parts {
            let ctx = IoContext {
                team: Some(rec.team.as_str().into()),
                job: Some(rec.job.as_str().into()),
                dataset: Some(p.name.as_str().into()),
                principal: Some(rec.principal.as_str().into()),
            };
            let before = *done_before.lock();
            if !members.is_empty() {
                let spread = spread(a, &ctx, p, &members, |done| {
                    progress.lock().bytes_done = before + done;
                })
                .await?;
                for e in spread.errors {
                    note(format!("{}: {e}", p.name));
                }
                if let Some(held) = spread.held {
                    *done_before.lock() += held.bytes_held;
                    *cached.lock() += spread.peers_cached;
                    *p.members_held.lock() = Some(held);
                    continue;
                }
                // A member failed, or the shares do not add up (the view changed meanwhile): this agent
                // stages what is missing itself, the members' blocks from them and the rest from the origin.
                tracing::warn!(claim = %id, dataset = %p.name, "staging the rest of a dataset here");
                if p.copies.swap(1, std::sync::atomic::Ordering::Relaxed) > 1 {
                    degraded.lock().push(format!(
                        "{}: one copy of each block kept, not {} (a member did not stage its share)",
                        p.name, p.copies_asked
                    ));
                }
            }
            let r = a
                .cache()
                .warm_objects(&ctx, &p.backend, p.objects.clone(), CONCURRENCY, |w| {
                    progress.lock().bytes_done = before + w.done_bytes;
                })
                .await?;
            *done_before.lock() += r.done_bytes;
            for e in r.errors {
                note(format!("{}: {e}", p.name));
            }
        }
        Ok::<(), strata_types::Error>(())
    };
    tokio::pin!(work);
    let mut tick = tokio::time::interval(PROGRESS_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let (mut last_bytes, mut last_at) = (progress.lock().bytes_done, std::time::Instant::now());
    let outcome = loop {
        tokio::select! {
            r = &mut work => break Some(r),
            _ = tokio::time::sleep_until(deadline) => break None,
            _ = tick.tick() => {
                let doc = {
                    let mut p = progress.lock();
                    let dt = last_at.elapsed().as_secs_f64();
                    if dt > 0.0 {
                        p.rate_bytes_per_sec = (p.bytes_done.saturating_sub(last_bytes)) as f64 / dt;
                    }
                    (last_bytes, last_at) = (p.bytes_done, std::time::Instant::now());
                    p.eta_secs = (p.rate_bytes_per_sec > 0.0).then(|| {
                        (p.bytes_total.saturating_sub(p.bytes_done) as f64 / p.rate_bytes_per_sec).ceil() as u64
                    });
                    super::admit::json(&*p)?
                };
                if !cat.set_claim_state(id, ClaimState::Staging, "", &doc).await? {
                    return Ok(()); // released meanwhile
                }
            }
        }
    };
    // The verdict: a count of what is held now.
    let mut p = count(a, &parts);
    let errors = std::mem::take(&mut *errors.lock());
    let (state, reason) = match outcome {
        Some(Err(e)) if e.kind() == ErrorKind::Cancelled => return Ok(()),
        Some(Err(e)) => (ClaimState::Failed, format!("staging failed: {e}")),
        None => (
            ClaimState::Failed,
            format!(
                "not staged by the deadline ({} s after submission): {}",
                spec.stage_deadline(),
                p.summary()
            ),
        ),
        Some(Ok(())) if p.blocks_held == p.blocks_total => {
            (ClaimState::Ready, degraded.lock().join("; "))
        }
        Some(Ok(())) => {
            let why = if errors.is_empty() {
                "blocks did not stay in the cache (is it smaller than the claim, or full of pins?)"
                    .to_string()
            } else {
                errors.join("; ")
            };
            (
                ClaimState::Failed,
                format!(
                    "{} of {} blocks not in the cache after staging: {why}",
                    p.blocks_total - p.blocks_held,
                    p.blocks_total
                ),
            )
        }
    };
    // Ready only once the mounts the claim asks for answer.
    let (state, reason) = match state {
        ClaimState::Ready => match super::mounts::mount_all(a, id, &spec).await {
            Ok(()) => (state, reason),
            Err(e) => {
                super::mounts::unmount_all(id, &spec);
                (ClaimState::Failed, e.to_string())
            }
        },
        _ => (state, reason),
    };
    p.rate_bytes_per_sec = 0.0;
    p.eta_secs = None;
    p.cached_bytes = (*cached.lock()).min(p.bytes_done);
    if !cat
        .set_claim_state(id, state, &reason, &super::admit::json(&p)?)
        .await?
    {
        // Released while it was being mounted: nothing may stay mounted.
        super::mounts::unmount_all(id, &spec);
        return Ok(());
    }
    tracing::info!(claim = %id, state = state.as_str(), %reason, "staging done");
    Ok(())
}

/// What a dataset's staging spread over the cluster came to.
struct Spread {
    /// What the cluster holds (this agent's share and the members'), when every member answered and the
    /// shares add up to every block; `None` otherwise.
    held: Option<Held>,
    /// Bytes the members held before they staged.
    peers_cached: u64,
    /// The members' and this agent's errors.
    errors: Vec<String>,
}

/// Stage `p` over the cluster: this agent warms the blocks it owns while each of `members` is asked to warm
/// its own ([`crate::cluster::stage`]), so each block is read from the origin once, by its owner, and none
/// travels here. `progress` gets the bytes held of the whole dataset so far.
async fn spread(
    a: &Agent,
    ctx: &IoContext,
    p: &Part,
    members: &[String],
    progress: impl Fn(u64),
) -> Result<Spread> {
    let Some(cluster) = a.cluster() else {
        return Ok(Spread {
            held: None,
            peers_cached: 0,
            errors: Vec::new(),
        });
    };
    let req = crate::cluster::stage::stage_request(
        p.backend.id().to_string(),
        a.cache().config().block_size.bytes(),
        &p.objects,
        p.copies_asked,
    );
    let copies = p.copies.load(std::sync::atomic::Ordering::Relaxed);
    // Bytes done: this agent's share first, then each member's.
    let done = Mutex::new(vec![0u64; members.len() + 1]);
    let report = |i: usize, n: u64| {
        let sum = {
            let mut d = done.lock();
            d[i] = n;
            d.iter().sum()
        };
        progress(sum);
    };
    let own = a.cache().warm_owned(
        ctx,
        &p.backend,
        p.objects.clone(),
        CONCURRENCY,
        copies,
        |w| report(0, w.done_bytes),
    );
    let asks = members.iter().enumerate().map(|(i, m)| {
        let report = &report;
        let req = &req;
        async move {
            let r = cluster
                .client()
                .stage(m, ctx, req, |pr| report(i + 1, pr.done_bytes))
                .await;
            (m, r)
        }
    });
    let (own, answers) = futures::join!(own, futures::future::join_all(asks));
    let own = own?;
    let mut errors: Vec<String> = own.errors;
    let mut held = a.cache().held_owned(&p.backend, &p.objects, copies);
    let mut peers_cached = 0;
    let mut complete = true;
    for (m, r) in answers {
        match r {
            Ok(d) => {
                peers_cached += d.progress.cached_bytes;
                held.blocks_held += d.held.blocks_held;
                held.blocks_total += d.held.blocks_total;
                held.bytes_held += d.held.bytes_held;
                held.bytes_total += d.held.bytes_total;
                errors.extend(d.errors.into_iter().map(|e| format!("{m}: {e}")));
            }
            Err(e) => {
                tracing::warn!(member = %m, error = %e, "a member did not stage its share");
                complete = false;
            }
        }
    }
    // Objects are counted whole here, from the blocks: every share adds up to every copy of every block, or
    // the rest is staged on this agent.
    let whole = a.cache().held(&p.backend, &p.objects);
    let n = copies as u64;
    let adds_up =
        held.blocks_total == n * whole.blocks_total && held.bytes_total == n * whole.bytes_total;
    let all_held = held.blocks_held == held.blocks_total;
    let held = (complete && adds_up).then_some(Held {
        objects_total: whole.objects_total,
        objects_held: if all_held { whole.objects_total } else { 0 },
        ..held
    });
    Ok(Spread {
        held,
        peers_cached,
        errors,
    })
}

/// Progress as a count of what the cache (or, for a dataset staged over the cluster, the cluster) holds.
fn count(a: &Agent, parts: &[Part]) -> Progress {
    let mut p = Progress::default();
    for part in parts {
        let h = match &*part.members_held.lock() {
            // As counted once every member had staged its share.
            Some(m) => m.clone(),
            // Before the members answered: this agent's copy, of every copy to be kept.
            None => {
                let n = part.copies.load(std::sync::atomic::Ordering::Relaxed) as u64;
                let h = a.cache().held(&part.backend, &part.objects);
                Held {
                    blocks_total: n * h.blocks_total,
                    bytes_total: n * h.bytes_total,
                    ..h
                }
            }
        };
        p.objects_total += h.objects_total;
        p.objects_done += h.objects_held;
        p.blocks_total += h.blocks_total;
        p.blocks_held += h.blocks_held;
        p.bytes_total += h.bytes_total;
        p.bytes_done += h.bytes_held;
    }
    p
}
