//! Who the members of a cache cluster are: one [`View`] at a time, from a [`Membership`] source.
//!
//! A view is a set of members (an id, the peer API address other agents call, and a weight, the member's
//! cache capacity share), kept sorted by id so that two agents holding the same members hold equal views.
//! Sources that never change ([`StaticMembers`], [`SlurmNodes`]) return one view for good; sources that do
//! (the catalog's heartbeats, Kubernetes endpoints) publish a new one and readers take the current one.

use std::sync::Arc;

use strata_types::{Error, Result};

/// One agent of the cluster.
#[derive(Debug, Clone, PartialEq)]
pub struct Member {
    /// The member's control API address, `http://host:port`: its id in placement, and where its peer
    /// routes are called.
    pub id: String,
    /// Its share of the blocks relative to the others (its cache capacity); 0 owns nothing.
    pub weight: f64,
}

impl Member {
    /// A member at `id` with `weight` (negative and NaN weights count as 0).
    pub fn new(id: impl Into<String>, weight: f64) -> Self {
        Self {
            id: id.into(),
            weight: if weight.is_finite() && weight > 0.0 {
                weight
            } else {
                0.0
            },
        }
    }
}

/// The members as one source sees them now.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct View {
    members: Vec<Member>,
}

impl View {
    /// A view of `members`, by id; a member named twice counts once (the first given).
    pub fn new(mut members: Vec<Member>) -> Self {
        let mut seen = std::collections::HashSet::new();
        members.retain(|m| seen.insert(m.id.clone()));
        members.sort_by(|a, b| a.id.cmp(&b.id));
        Self { members }
    }

    /// The members, by id.
    pub fn members(&self) -> &[Member] {
        &self.members
    }

    /// The member with this id.
    pub fn member(&self, id: &str) -> Option<&Member> {
        self.members
            .binary_search_by(|m| m.id.as_str().cmp(id))
            .ok()
            .map(|i| &self.members[i])
    }
}

/// A source of cluster membership.
pub trait Membership: Send + Sync + std::fmt::Debug {
    /// The members now.
    fn view(&self) -> Arc<View>;
    /// What the source is, for `strata cluster status` and logs (`static`, `slurm`, ...).
    fn kind(&self) -> &'static str;
}

/// Members listed in the configuration (`[cluster] peers`), each of weight 1.
#[derive(Debug)]
pub struct StaticMembers {
    view: Arc<View>,
}

impl StaticMembers {
    /// The members at these addresses (already in `http://host:port` form).
    pub fn new(addresses: &[String]) -> Self {
        Self {
            view: Arc::new(View::new(
                addresses
                    .iter()
                    .map(|a| Member::new(a.clone(), 1.0))
                    .collect(),
            )),
        }
    }
}

impl Membership for StaticMembers {
    fn view(&self) -> Arc<View> {
        self.view.clone()
    }

    fn kind(&self) -> &'static str {
        "static"
    }
}

/// The nodes of a Slurm job (`SLURM_JOB_NODELIST`), each an agent on the same port, of weight 1.
#[derive(Debug)]
pub struct SlurmNodes {
    view: Arc<View>,
}

impl SlurmNodes {
    /// The members named by the host list `nodelist`, each reached at `http://<node>:<port>`.
    pub fn new(nodelist: &str, port: u16) -> Result<Self> {
        let hosts = crate::hostlist::expand(nodelist)?;
        if hosts.is_empty() {
            return Err(Error::config(format!(
                "the Slurm node list {nodelist:?} names no node"
            )));
        }
        Ok(Self {
            view: Arc::new(View::new(
                hosts
                    .into_iter()
                    .map(|h| Member::new(format!("http://{h}:{port}"), 1.0))
                    .collect(),
            )),
        })
    }

    /// The members of the job this process runs in (`SLURM_JOB_NODELIST`, else `SLURM_NODELIST`).
    pub fn from_env(port: u16) -> Result<Self> {
        let list = std::env::var("SLURM_JOB_NODELIST")
            .or_else(|_| std::env::var("SLURM_NODELIST"))
            .map_err(|_| {
                Error::config("no SLURM_JOB_NODELIST: this process is not in a Slurm job")
            })?;
        Self::new(&list, port)
    }
}

impl Membership for SlurmNodes {
    fn view(&self) -> Arc<View> {
        self.view.clone()
    }

    fn kind(&self) -> &'static str {
        "slurm"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn views_are_equal_whatever_order_the_members_came_in() {
        let a = View::new(vec![
            Member::new("http://b:1", 1.0),
            Member::new("http://a:1", 2.0),
        ]);
        let b = View::new(vec![
            Member::new("http://a:1", 2.0),
            Member::new("http://b:1", 1.0),
        ]);
        assert_eq!(a, b);
        assert_eq!(a.member("http://b:1").map(|m| m.weight), Some(1.0));
        assert_eq!(a.member("http://c:1"), None);
        let twice = View::new(vec![
            Member::new("http://a:1", 1.0),
            Member::new("http://a:1", 5.0),
        ]);
        assert_eq!(twice.members().len(), 1);
        assert_eq!(Member::new("x", f64::NAN).weight, 0.0);
    }

    #[test]
    fn a_slurm_job_s_nodes_are_its_members() {
        let s = SlurmNodes::new("gpu[01-03]", 7070).unwrap();
        let ids: Vec<_> = s.view().members().iter().map(|m| m.id.clone()).collect();
        assert_eq!(
            ids,
            [
                "http://gpu01:7070",
                "http://gpu02:7070",
                "http://gpu03:7070"
            ]
        );
        assert_eq!(s.kind(), "slurm");
        assert!(SlurmNodes::new("", 7070).is_err());
        let st = StaticMembers::new(&["http://a:1".into(), "http://b:1".into()]);
        assert_eq!(st.view().members().len(), 2);
    }
}
