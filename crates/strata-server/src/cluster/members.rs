//! Membership sources of the shared cache: the static list and Slurm's node list come from
//! [`strata_cluster::membership`]; the catalog source is here, since it heartbeats through the agent's catalog.
//!
//! **Catalog membership**: every `heartbeat` the agent writes its row (address, cache capacity) and reads the
//! rows seen within the TTL; that list, weighted by capacity, is the view. When the catalog cannot be reached
//! the last view is kept (a catalog outage does not reshuffle the cache), and the agent itself is always a
//! member of its own view. A stopping agent deletes its row, so the others see it leave within a second.

use std::sync::Arc;
use std::time::Duration;

use parking_lot::RwLock;
use strata_cluster::{Member, Membership, SlurmNodes, StaticMembers, View};
use strata_types::Result;

use super::Sharing;
use crate::config::CacheSharing;

/// Members from the shared catalog.
#[derive(Debug)]
pub struct CatalogMembers {
    me: String,
    capacity: u64,
    view: RwLock<Arc<View>>,
}

impl CatalogMembers {
    /// The source for agent `me` with its cache capacity; the view holds only `me` until the first beat.
    pub fn new(me: &str, capacity: u64) -> Self {
        Self {
            me: me.to_string(),
            capacity,
            view: RwLock::new(Arc::new(View::new(vec![Member::new(me, capacity as f64)]))),
        }
    }

    /// One heartbeat: write this agent's row, read the live members.
    pub async fn beat(&self, catalog: &strata_catalog::Catalog, ttl: Duration) -> Result<()> {
        let capacity = i64::try_from(self.capacity).unwrap_or(i64::MAX);
        catalog.heartbeat_member(&self.me, capacity).await?;
        let rows = catalog.live_members(ttl.as_secs() as i64).await?;
        let mut members: Vec<Member> = rows
            .into_iter()
            .map(|r| Member::new(r.id, r.capacity as f64))
            .collect();
        if !members.iter().any(|m| m.id == self.me) {
            members.push(Member::new(self.me.clone(), self.capacity as f64));
        }
        *self.view.write() = Arc::new(View::new(members));
        Ok(())
    }

    /// Heartbeat every `every` until `stop`, then leave the catalog.
    pub async fn run(
        self: Arc<Self>,
        catalog: strata_catalog::Catalog,
        every: Duration,
        ttl: Duration,
        stop: tokio_util::sync::CancellationToken,
    ) {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut failing = false;
        loop {
            tokio::select! {
                _ = stop.cancelled() => break,
                _ = tick.tick() => match self.beat(&catalog, ttl).await {
                    Ok(()) => failing = false,
                    Err(e) if !failing => {
                        failing = true;
                        tracing::warn!(error = %e, "cluster heartbeat failed; keeping the last view");
                    }
                    Err(_) => {}
                },
            }
        }
        if let Err(e) = catalog.leave_member(&self.me).await {
            tracing::warn!(error = %e, "leaving the cluster");
        }
    }
}

impl Membership for CatalogMembers {
    fn view(&self) -> Arc<View> {
        self.view.read().clone()
    }

    fn kind(&self) -> &'static str {
        "catalog"
    }
}

/// A membership source, and the catalog source again when it is one (for its heartbeat loop).
pub type Source = (Arc<dyn Membership>, Option<Arc<CatalogMembers>>);

/// The membership source `sharing` names; `external` is the one built outside the agent
/// ([`crate::config::Resolved::membership`]), which `kubernetes` needs.
pub fn source(
    sharing: &Sharing,
    capacity: u64,
    external: Option<&Arc<dyn Membership>>,
) -> Result<Source> {
    Ok(match sharing.kind {
        CacheSharing::Kubernetes => match external {
            Some(m) => (m.clone(), None),
            None => {
                return Err(strata_types::Error::config(
                    "[cluster] cache = \"kubernetes\" needs the EndpointSlice watch that `strata serve` \
                     starts; this agent was started without one",
                ));
            }
        },
        CacheSharing::Off | CacheSharing::Static => {
            (Arc::new(StaticMembers::new(&sharing.peers)), None)
        }
        CacheSharing::Slurm => (Arc::new(SlurmNodes::from_env(sharing.slurm_port)?), None),
        CacheSharing::Catalog => {
            let m = Arc::new(CatalogMembers::new(&sharing.me, capacity));
            (m.clone(), Some(m))
        }
    })
}
