//! The one access decision of the agent's data: who may read or write a key, or act on a prefix, of a
//! configured backend. The S3 gateway ([`crate::gateway::tenancy`]) and the data-plane routes
//! ([`crate::api`]: `read`, `prefetch`, `cache/warm`, `cache/pin`, `cache/unpin`) ask the same question here.
//!
//! A key under a prefix owned by a team (`strata prefix set`; longest owned prefix, segment-aware) belongs to
//! that team: the caller needs the role the operation asks for there (reading: reader; writing, pinning:
//! member). Keys outside owned prefixes belong to nobody: every principal may read them, and writing them
//! takes the operation's role in the caller's home team (a reader's key writes nowhere); they count against
//! the writer's home team, and an object written there stays its writer's team's: another team overwrites or
//! deletes it only with the role in the writer's team. A prefix operation (warm-up, pin) also covers every owned prefix under
//! the prefix it names: warming `data/` when `data/team-a/` is team A's is refused to a caller who may not
//! read team A's data, since the warm-up would read it and report its sizes. Global administrators and
//! root keys pass every check. Owned prefixes are read from the catalog at most every 5 s, so a new owner
//! takes effect within that.

use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use strata_catalog::inventory::{OwnedPrefix, owner_in};
use strata_catalog::{Catalog, Principal, Role};
use strata_types::{Error, ErrorKind, Result};

/// How long the owned prefixes read from the catalog are reused.
const TTL: Duration = Duration::from_secs(5);

/// Who is calling: a root key (configuration, environment, generated), a configured key of one team, or a
/// catalog principal.
#[derive(Debug, Clone)]
pub enum Caller {
    /// A key from the configuration or environment that names no team, or a member of this agent's cluster
    /// acting for a request another member authorized (with that request's team): every check passes.
    Root {
        /// The team the request is charged to, if any.
        team: Option<String>,
    },
    /// A `[[gateway.keys]]` key that names a team: every role in that team, nothing in any other (its
    /// buckets and owned prefixes are closed to it, as to the team's members).
    TeamKey {
        /// The team the key acts for.
        team: String,
    },
    /// A principal from the catalog.
    Principal(Principal),
}

/// The owner recorded for a created bucket whose creator had no team (a root key): only root keys and
/// administrators hold a role in it. No team can have this name (team names are never empty).
pub const ROOT_ONLY: &str = "";

impl Caller {
    /// Root keys and global administrators: every check passes.
    pub fn is_root(&self) -> bool {
        match self {
            Caller::Root { .. } => true,
            Caller::TeamKey { .. } => false,
            Caller::Principal(p) => p.is_admin,
        }
    }

    /// The team writes outside owned prefixes count against.
    pub fn home_team(&self) -> Option<String> {
        match self {
            Caller::Root { team } => team.clone(),
            Caller::TeamKey { team } => Some(team.clone()),
            Caller::Principal(p) => p.team.clone(),
        }
    }

    /// The principal id recorded in the inventory.
    pub fn id(&self) -> Option<String> {
        match self {
            Caller::Root { .. } | Caller::TeamKey { .. } => None,
            Caller::Principal(p) => Some(p.id.clone()),
        }
    }

    /// Whether the caller holds `need` in `team` (root: everywhere).
    pub fn can(&self, team: &str, need: Role) -> bool {
        match self {
            Caller::Root { .. } => true,
            Caller::TeamKey { team: mine } => mine == team && team != ROOT_ONLY,
            Caller::Principal(p) => p.can(team, need),
        }
    }
}

/// The owned prefixes, cached.
#[derive(Debug)]
pub struct Ownership {
    catalog: Catalog,
    prefixes: Mutex<Option<(Instant, Arc<Vec<OwnedPrefix>>)>>,
    outage: Arc<crate::outage::Outage>,
}

impl Ownership {
    /// Ownership as the catalog records it.
    pub fn new(catalog: Catalog) -> Self {
        Self {
            catalog,
            prefixes: Mutex::new(None),
            outage: Arc::default(),
        }
    }

    /// Whether the catalog is away, shared by every lookup that may use a cached answer then
    /// ([`crate::outage`]).
    pub fn outage(&self) -> &Arc<crate::outage::Outage> {
        &self.outage
    }

    /// Forget the cached prefixes: a change made through this agent takes effect here at once (other agents
    /// see it within [`TTL`]).
    pub fn invalidate(&self) {
        *self.prefixes.lock() = None;
    }

    /// Every owned prefix (at most [`TTL`] old; while the catalog is away, the last ones read, for up to
    /// [`crate::outage::GRACE`]).
    pub async fn owned(&self) -> Result<Arc<Vec<OwnedPrefix>>> {
        let cached = self.prefixes.lock().clone();
        if let Some((at, p)) = &cached
            && at.elapsed() < TTL
        {
            return Ok(p.clone());
        }
        // A created bucket's team owns every key in it: an owned empty prefix (longer owned prefixes inside
        // it still decide for theirs). A bucket made by a root key is root's alone ([`ROOT_ONLY`]).
        let fetch = async {
            let mut all = self.catalog.list_prefixes().await?;
            for b in self.catalog.list_buckets().await? {
                all.push(strata_catalog::inventory::OwnedPrefix {
                    backend: b.name,
                    prefix: String::new(),
                    team: b.team.unwrap_or_else(|| ROOT_ONLY.to_string()),
                });
            }
            let p = Arc::new(all);
            *self.prefixes.lock() = Some((Instant::now(), p.clone()));
            Ok(p)
        };
        self.outage.fetch("owned prefixes", cached, fetch).await
    }

    /// Whether `name` is a bucket CreateBucket made (and not deleted), as [`Self::owned`] last read it.
    pub async fn is_created_bucket(&self, name: &str) -> Result<bool> {
        Ok(self
            .owned()
            .await?
            .iter()
            .any(|p| p.backend == name && p.prefix.is_empty()))
    }

    /// The team `key` of backend `backend` belongs to (`None` outside owned prefixes), or
    /// [`ErrorKind::PermissionDenied`] unless `caller` holds `need` in it.
    pub async fn check_key(
        &self,
        caller: &Caller,
        backend: &str,
        key: &str,
        need: Role,
    ) -> Result<Option<String>> {
        let owned = self.owned().await?;
        let owner = owner_in(&owned, backend, key);
        // A key naming a directory above a team's owned prefix (`team-a` above `team-a/`) is that team's to
        // write: as a file of a local directory it would block every write under the prefix.
        if need > Role::Reader && !caller.is_root() && !key.ends_with('/') {
            let dir = format!("{key}/");
            if let Some(p) = owned.iter().find(|p| {
                p.backend == backend && p.prefix.starts_with(&dir) && !caller.can(&p.team, need)
            }) {
                return Err(Error::new(
                    ErrorKind::PermissionDenied,
                    format!(
                        "{backend}/{key} would stand in the way of team {:?}'s prefix {:?}; writing it needs the role {} there",
                        p.team,
                        p.prefix,
                        need.as_str()
                    ),
                ));
            }
        }
        match owner {
            Some(team) if !caller.can(&team, need) => Err(denied(backend, key, &team, need)),
            // Outside owned prefixes anyone may read; writing (or pinning) takes the role in the caller's
            // home team: a reader's key writes nowhere.
            None if need > Role::Reader && !caller.is_root() => match caller.home_team() {
                Some(home) if caller.can(&home, need) => {
                    // An object another team wrote here stays that team's: overwriting or deleting it takes
                    // the role in the writer's team (it would also hand that team's usage back).
                    self.outage.refuse_if_down()?;
                    let rec = self.catalog.object(backend, key).await;
                    self.outage.note(&rec);
                    if let Some(rec) = rec?
                        && let Some(writer) = rec.team
                        && writer != home
                        && !caller.can(&writer, need)
                    {
                        return Err(Error::new(
                            ErrorKind::PermissionDenied,
                            format!(
                                "{backend}/{key} was written by team {writer:?}; changing it needs the role {} there",
                                need.as_str()
                            ),
                        ));
                    }
                    Ok(None)
                }
                Some(home) => Err(Error::new(
                    ErrorKind::PermissionDenied,
                    format!(
                        "writing {backend}/{key} needs the role {} in the caller's team {home:?}",
                        need.as_str()
                    ),
                )),
                None => Err(Error::new(
                    ErrorKind::PermissionDenied,
                    format!("writing {backend}/{key} needs a home team, and the caller has none"),
                )),
            },
            owner => Ok(owner),
        }
    }

    /// [`Self::check_key`] for an operation on every key under `prefix`: the prefix's own owner, and the
    /// owner of every owned prefix beneath it, must each grant `need`. Returns the prefix's own owner.
    pub async fn check_prefix(
        &self,
        caller: &Caller,
        backend: &str,
        prefix: &str,
        need: Role,
    ) -> Result<Option<String>> {
        let owner = self.check_key(caller, backend, prefix, need).await?;
        if caller.is_root() {
            return Ok(owner);
        }
        for p in self.owned().await?.iter() {
            if p.backend == backend && p.prefix.starts_with(prefix) && !caller.can(&p.team, need) {
                return Err(denied(backend, &p.prefix, &p.team, need));
            }
        }
        Ok(owner)
    }
}

fn denied(backend: &str, key: &str, team: &str, need: Role) -> Error {
    if team == ROOT_ONLY {
        return Error::new(
            ErrorKind::PermissionDenied,
            format!(
                "{backend}/{key} is in a bucket made by a root key: only root keys and administrators act there"
            ),
        );
    }
    Error::new(
        ErrorKind::PermissionDenied,
        format!(
            "{backend}/{key} belongs to team {team:?}; the caller is not a {} of it",
            need.as_str()
        ),
    )
}

/// A call of another agent of the cluster, authenticated by the cluster secret: it acts on the replicas of the
/// team it names.
#[derive(Debug, Clone)]
pub struct ClusterCall {
    /// The team the call acts for (`None`: the shared store of callers without a team).
    pub team: Option<String>,
}

/// Check a call's cluster credential (the headers of [`strata_client::ClusterCredential`]).
pub fn cluster_call(
    agent: &crate::Agent,
    key: &[u8],
    team: Option<&[u8]>,
) -> Result<ClusterCall, Error> {
    let Some(secret) = &agent.config().cluster_secret else {
        return Err(Error::new(
            ErrorKind::Unauthenticated,
            "this agent has no cluster secret (STRATA_CLUSTER_SECRET), so it accepts no other agent's call",
        ));
    };
    // Compared as hashes: the comparison takes the same time wherever the keys differ.
    if blake3::hash(key) != blake3::hash(secret.as_bytes()) {
        return Err(Error::new(
            ErrorKind::Unauthenticated,
            "the cluster key is not valid",
        ));
    }
    let team = match team {
        None => None,
        Some(t) => {
            let t = std::str::from_utf8(t)
                .map_err(|_| Error::invalid_input("the team header is not UTF-8"))?;
            strata_catalog::validate_team_name(t)?;
            Some(t.to_string())
        }
    };
    Ok(ClusterCall { team })
}
