//! Listing-based reconciliation: list a backend completely (in parallel, one listing per top-level prefix),
//! then make the catalog's inventory and usage counters match it.
//!
//! A listing that fails anywhere fails as a whole: reconciling a partial listing would "remove" every object
//! that the failed part did not return, and a clean-up planned from it could miss protected data.

use std::time::Instant;

use futures::StreamExt;
use serde::Serialize;
use strata_catalog::Catalog;
use strata_catalog::inventory::{Listed, ReconcileReport};
use strata_object::Backend;
use strata_types::{IoContext, Result};

/// Keys under this prefix are the clean-up trash: never listed as data, never reconciled, never planned.
pub const TRASH_PREFIX: &str = ".strata-trash/";

/// List every object of `backend` (except the trash), with up to `concurrency` listings in flight.
pub async fn list_all(backend: &Backend, concurrency: usize) -> Result<Vec<Listed>> {
    let ctx = IoContext::anonymous();
    let root = backend.list_delimited(&ctx, "").await?;
    let mut out: Vec<Listed> = root.objects.iter().map(listed).collect();
    let prefixes: Vec<String> = root
        .common_prefixes
        .into_iter()
        .filter(|p| p != TRASH_PREFIX)
        .collect();
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
    Ok(out)
}

fn listed(m: &strata_types::ObjectMeta) -> Listed {
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

/// Reconcile the backend named `name` (as the catalog and quotas know it).
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
    let report = catalog.reconcile(name, &listing).await?;
    Ok(ReconcileRun {
        report,
        list_secs,
        apply_secs: t.elapsed().as_secs_f64(),
    })
}
