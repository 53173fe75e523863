//! Listing-based reconciliation: list a backend completely (in parallel: one listing per top-level prefix, or
//! contiguous key ranges past [`PER_PREFIX_MAX`] prefixes; the trash is never listed), then make the
//! catalog's inventory and usage counters match it.
//!
//! A listing that fails anywhere fails as a whole: reconciling a partial listing would "remove" every object
//! that the failed part did not return, and a clean-up planned from it could miss protected data.
//!
//! The whole sorted listing is held in memory while the catalog is compared with it (about 0.6 KiB per
//! object with the catalog's rows): streaming it is the next step for buckets of a hundred million objects.

use std::time::Instant;

use futures::StreamExt;
use serde::Serialize;
use strata_catalog::Catalog;
use strata_catalog::inventory::{Listed, ReconcileReport};
use strata_object::Backend;
use strata_types::{IoContext, Result};

/// Most top-level prefixes listed one listing each; with more, key ranges are listed instead.
pub const PER_PREFIX_MAX: usize = 4096;

/// Keys under this prefix are the clean-up trash: never listed as data, never reconciled, never planned.
pub const TRASH_PREFIX: &str = ".strata-trash/";

/// List every object of `backend` (except the trash), with up to `concurrency` listings in flight.
///
/// One delimited listing finds the top-level prefixes. Up to [`PER_PREFIX_MAX`] of them are listed one
/// listing each (a listing scoped to a prefix is what S3-compatible servers that index by path, MinIO and
/// moto among them, serve fastest: measured 1.9x `s5cmd du` of the whole bucket on moto at 100k objects).
/// More are split into `concurrency` contiguous key ranges, each one paged listing from the range's first key
/// to the next range, so a bucket of millions of tiny prefixes costs about as many requests as one listing
/// of everything, spread over parallel streams.
pub async fn list_all(backend: &Backend, concurrency: usize) -> Result<Vec<Listed>> {
    list_all_with(backend, concurrency, PER_PREFIX_MAX).await
}

/// [`list_all`] with another threshold between per-prefix and key-range listings.
pub async fn list_all_with(
    backend: &Backend,
    concurrency: usize,
    per_prefix_max: usize,
) -> Result<Vec<Listed>> {
    let ctx = IoContext::anonymous();
    let root = backend.list_delimited(&ctx, "").await?;
    let mut out: Vec<Listed> = root.objects.iter().map(listed).collect();
    let prefixes: Vec<String> = root
        .common_prefixes
        .into_iter()
        .filter(|p| p != TRASH_PREFIX)
        .collect();
    if prefixes.is_empty() {
        return Ok(out);
    }
    if prefixes.len() <= per_prefix_max {
        let mut pages = futures::stream::iter(prefixes.into_iter().map(|p| {
            let backend = backend.clone();
            let ctx = ctx.clone();
            async move { backend.list_page(&ctx, &p, None, usize::MAX).await }
        }))
        .buffer_unordered(concurrency.max(1));
        while let Some(page) = pages.next().await {
            out.extend(page?.objects.iter().map(listed));
        }
        out.sort_by(|a, b| a.key.cmp(&b.key));
        return Ok(out);
    }
    let groups = concurrency.clamp(1, prefixes.len());
    let per = prefixes.len().div_ceil(groups);
    let chunks: Vec<Vec<String>> = prefixes.chunks(per).map(<[String]>::to_vec).collect();
    let ranges: Vec<(Vec<String>, Option<String>)> = chunks
        .iter()
        .enumerate()
        .map(|(i, c)| (c.clone(), chunks.get(i + 1).map(|n| n[0].clone())))
        .collect();
    let mut pages = futures::stream::iter(ranges.into_iter().map(|(group, end)| {
        let backend = backend.clone();
        let ctx = ctx.clone();
        async move {
            // Keys of this group sort after "<first prefix without its '/'>" and before the next group's
            // first prefix; keep only those under one of the group's prefixes (a root object can sort in
            // between and is already listed).
            let first = group[0].trim_end_matches('/').to_string();
            let objects = backend.list_range(&ctx, &first, end.as_deref()).await?;
            let set: std::collections::HashSet<&str> = group.iter().map(String::as_str).collect();
            Ok::<_, strata_types::Error>(
                objects
                    .iter()
                    .filter(|o| o.key.find('/').is_some_and(|i| set.contains(&o.key[..=i])))
                    .map(listed)
                    .collect::<Vec<_>>(),
            )
        }
    }))
    .buffer_unordered(concurrency.max(1));
    while let Some(page) = pages.next().await {
        out.extend(page?);
    }
    out.sort_by(|a, b| a.key.cmp(&b.key));
    Ok(out)
}

/// A backend's object as a listing entry of the catalog.
pub(crate) fn listed(m: &strata_types::ObjectMeta) -> Listed {
    Listed {
        key: m.key.clone(),
        size: m.size as i64,
        etag: m.etag.clone().unwrap_or_default(),
        modified_at: m.last_modified_unix,
    }
}

/// What one reconciliation did and how long its parts took.
#[derive(Debug, Clone, Serialize)]
pub struct ReconcileRun {
    /// Changes and per-team usage.
    #[serde(flatten)]
    pub report: ReconcileReport,
    /// Seconds spent listing.
    pub list_secs: f64,
    /// Seconds spent updating the catalog.
    pub apply_secs: f64,
}

/// Reservations older than this are released by a reconciliation: the listing counted whatever their writes
/// stored, and a writer still holding one after an hour died (a late commit is charged anyway).
pub const STALE_RESERVATION_SECS: i64 = 3600;

/// Reconcile the backend named `name` (as the catalog and quotas know it): the inventory and usage from a
/// complete listing, and stale reservations on its scope released.
pub async fn reconcile(
    catalog: &Catalog,
    name: &str,
    backend: &Backend,
    concurrency: usize,
) -> Result<ReconcileRun> {
    let t = Instant::now();
    let listing = list_all(backend, concurrency).await?;
    let list_secs = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let mut report = catalog.reconcile(name, &listing).await?;
    report.released_reservations = catalog.release_stale(name, STALE_RESERVATION_SECS).await?;
    Ok(ReconcileRun {
        report,
        list_secs,
        apply_secs: t.elapsed().as_secs_f64(),
    })
}
