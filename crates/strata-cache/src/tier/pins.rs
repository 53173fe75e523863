//! Pins: prefixes whose blocks the pinning tier (disk when there is one, else RAM) never evicts, this agent's
//! own and those kept for other members of a cluster, persisted in `pins.json` in the disk directory.

use std::path::PathBuf;

use parking_lot::RwLock;
use serde::{Deserialize, Serialize};
use strata_types::{BlockKey, Error, Result};

/// A pinned prefix of one backend.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PinSpec {
    /// Canonical backend id.
    pub backend: String,
    /// Key prefix.
    pub prefix: String,
    /// The member of the cluster whose pin this is, kept here for the blocks this agent owns; none: this
    /// agent's own pin ([`crate::BlockCache::set_member_pins`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
}

impl PinSpec {
    pub(crate) fn matches(&self, k: &BlockKey) -> bool {
        *k.object.backend == *self.backend && k.object.key.starts_with(&self.prefix)
    }
}

/// The pins, and the file they are kept in.
pub(crate) struct Pins {
    list: RwLock<Vec<PinSpec>>,
    path: Option<PathBuf>,
}

/// What [`Pins::set_member`] changed.
pub(crate) struct MemberChange {
    pub(crate) added: Vec<PinSpec>,
    pub(crate) removed: Vec<PinSpec>,
}

impl Pins {
    /// The pins saved at `path` (none: kept in memory only); an unreadable file is ignored with a warning.
    pub(crate) fn load(path: Option<PathBuf>) -> Self {
        let list = match &path {
            Some(p) if p.exists() => std::fs::read(p)
                .ok()
                .and_then(|b| serde_json::from_slice(&b).ok())
                .unwrap_or_else(|| {
                    tracing::warn!(path = %p.display(), "unreadable pins file ignored");
                    Vec::new()
                }),
            _ => Vec::new(),
        };
        Self {
            list: RwLock::new(list),
            path,
        }
    }

    /// Whether a pin covers the block.
    pub(crate) fn covers(&self, key: &BlockKey) -> bool {
        self.list.read().iter().any(|p| p.matches(key))
    }

    /// Every pin.
    pub(crate) fn all(&self) -> Vec<PinSpec> {
        self.list.read().clone()
    }

    /// Add a pin (once); saved.
    pub(crate) fn add(&self, spec: &PinSpec) -> Result<()> {
        {
            let mut pins = self.list.write();
            if !pins.contains(spec) {
                pins.push(spec.clone());
            }
        }
        self.save()
    }

    /// Remove a pin; saved. Whether it existed.
    pub(crate) fn remove(&self, spec: &PinSpec) -> Result<bool> {
        let existed = {
            let mut pins = self.list.write();
            let before = pins.len();
            pins.retain(|p| p != spec);
            before != pins.len()
        };
        self.save()?;
        Ok(existed)
    }

    /// This agent's own pins.
    pub(crate) fn own(&self) -> Vec<PinSpec> {
        let pins = self.list.read();
        pins.iter().filter(|p| p.from.is_none()).cloned().collect()
    }

    /// The members whose pins are kept here, sorted.
    pub(crate) fn members(&self) -> Vec<String> {
        let mut v: Vec<String> = self
            .list
            .read()
            .iter()
            .filter_map(|p| p.from.clone())
            .collect();
        v.sort();
        v.dedup();
        v
    }

    /// Make `want` the pins kept for `member` (every one of them names it in `from`); saved. `None` when
    /// nothing changed.
    pub(crate) fn set_member(
        &self,
        member: &str,
        want: &[PinSpec],
    ) -> Result<Option<MemberChange>> {
        let change = {
            let mut all = self.list.write();
            let removed: Vec<PinSpec> = all
                .iter()
                .filter(|p| p.from.as_deref() == Some(member) && !want.contains(p))
                .cloned()
                .collect();
            let added: Vec<PinSpec> = want.iter().filter(|p| !all.contains(p)).cloned().collect();
            if added.is_empty() && removed.is_empty() {
                return Ok(None);
            }
            all.retain(|p| !removed.contains(p));
            all.extend(added.iter().cloned());
            MemberChange { added, removed }
        };
        self.save()?;
        Ok(Some(change))
    }

    fn save(&self) -> Result<()> {
        let Some(path) = &self.path else {
            return Ok(());
        };
        let body = serde_json::to_vec_pretty(&*self.list.read())
            .map_err(|e| Error::internal(format!("encoding pins: {e}")))?;
        let tmp = path.with_extension("json.tmp");
        std::fs::write(&tmp, body)
            .and_then(|_| std::fs::rename(&tmp, path))
            .map_err(|e| Error::from_io(e, format!("saving {}", path.display())))
    }
}
