//! The gateway's link to the catalog: S3 keys issued by `strata token create --s3`, prefix ownership (who may
//! read and write where), attribution of every write to a team, quota admission before a body is accepted,
//! the inventory, and access times.
//!
//! Over a hard limit (or a soft limit past its grace period) a write is refused with `403 QuotaExceeded`
//! before its body is read; nothing is stored. Multipart uploads are admitted part by part (each part's
//! bytes are reserved before the part is accepted), so concurrent writers can never overshoot a limit.
//!
//! Who may read or write a key is decided by [`crate::access`], the same decision the data-plane routes use:
//! a key under a prefix owned by a team belongs to that team and needs the operation's role there; listings
//! drop what the caller may not read; other keys count against the writer's home team. S3 keys are read from
//! the catalog at most every 5 s, so a revoked key takes effect within that. Recording a write or a deletion in the catalog is
//! best effort: a failure is logged and reconciliation corrects the usage.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use s3s::auth::{S3Auth, SecretKey};
use s3s::{S3Error, S3ErrorCode, S3Result, s3_error};
use strata_catalog::inventory::{ObjectRecord, OwnedPrefix, owner_in};
use strata_catalog::quota::Reservation;
use strata_catalog::{Catalog, Principal, Role};
use strata_types::{Error, ErrorKind};

/// How long a catalog lookup (S3 key, prefix ownership) is reused.
const TTL: Duration = Duration::from_secs(5);
/// Most S3 keys remembered.
const MAX_KEYS: usize = 10_000;

type KeyCache = Mutex<HashMap<String, (Instant, Option<(String, Principal)>)>>;

/// SigV4 secrets: the configured/generated root keys, then the catalog's S3 keys.
pub struct CatalogAuth {
    statics: HashMap<String, String>,
    catalog: Catalog,
    keys: Arc<KeyCache>,
    outage: Arc<crate::outage::Outage>,
}

impl std::fmt::Debug for CatalogAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CatalogAuth")
            .field("static_keys", &self.statics.len())
            .finish()
    }
}

#[async_trait::async_trait]
impl S3Auth for CatalogAuth {
    async fn get_secret_key(&self, access_key: &str) -> S3Result<SecretKey> {
        if let Some(s) = self.statics.get(access_key) {
            return Ok(SecretKey::from(s.clone()));
        }
        match lookup(&self.catalog, &self.keys, &self.outage, access_key).await? {
            Some((secret, _)) => Ok(SecretKey::from(secret)),
            None => Err(s3_error!(InvalidAccessKeyId)),
        }
    }
}

async fn lookup(
    catalog: &Catalog,
    keys: &KeyCache,
    outage: &crate::outage::Outage,
    access_key: &str,
) -> S3Result<Option<(String, Principal)>> {
    let cached = keys.lock().get(access_key).cloned();
    if let Some((at, v)) = &cached
        && at.elapsed() < TTL
    {
        return Ok(v.clone());
    }
    // While the catalog is away, a key it knew lately still works ([`crate::outage`]).
    // Only a fresh answer is remembered (a cached one stands in without being renewed).
    let fetch = async {
        let v = catalog.s3_key(access_key).await?;
        let mut k = keys.lock();
        if k.len() >= MAX_KEYS {
            k.clear();
        }
        k.insert(access_key.to_string(), (Instant::now(), v.clone()));
        Ok(v)
    };
    outage
        .fetch("S3 key", cached, fetch)
        .await
        .map_err(|e| S3Error::with_message(S3ErrorCode::ServiceUnavailable, e.to_string()))
}

pub use crate::access::Caller;

/// The gateway's tenancy state.
#[derive(Debug)]
pub struct Tenancy {
    catalog: Catalog,
    keys: Arc<KeyCache>,
    ownership: Arc<crate::access::Ownership>,
    parts: Mutex<HashMap<(String, i32), Reservation>>,
    ttl_secs: i64,
}

/// The S3 error for a refused quota admission.
pub fn quota_exceeded(e: &Error) -> S3Error {
    let mut err = S3Error::with_message(
        S3ErrorCode::Custom("QuotaExceeded".into()),
        e.message().to_string(),
    );
    err.set_status_code(http::StatusCode::FORBIDDEN);
    err
}

fn unavailable(e: Error) -> S3Error {
    S3Error::with_message(S3ErrorCode::ServiceUnavailable, e.to_string())
}

impl Tenancy {
    /// Tenancy over `catalog`, deciding access with the agent's `ownership`; reservations expire after
    /// `ttl_secs` if never settled.
    pub fn new(catalog: Catalog, ownership: Arc<crate::access::Ownership>, ttl_secs: i64) -> Self {
        Self {
            catalog,
            keys: Arc::new(Mutex::new(HashMap::new())),
            ownership,
            parts: Mutex::new(HashMap::new()),
            ttl_secs,
        }
    }

    /// The authenticator for s3s, sharing this tenancy's key cache.
    pub fn auth(&self, statics: HashMap<String, String>) -> CatalogAuth {
        CatalogAuth {
            statics,
            catalog: self.catalog.clone(),
            keys: self.keys.clone(),
            outage: self.ownership.outage().clone(),
        }
    }

    /// The catalog principal behind an access key (after authentication filled the cache).
    pub async fn principal(&self, access_key: &str) -> S3Result<Option<Principal>> {
        Ok(lookup(
            &self.catalog,
            &self.keys,
            self.ownership.outage(),
            access_key,
        )
        .await?
        .map(|(_, p)| p))
    }

    async fn prefixes(&self) -> S3Result<Arc<Vec<OwnedPrefix>>> {
        self.ownership.owned().await.map_err(unavailable)
    }

    /// The team a key of `bucket` belongs to, checking that `caller` holds `need` there. Keys under a prefix
    /// owned by a team belong to it (only its members may read or write them); other keys belong to the
    /// writer's home team.
    pub async fn attribute(
        &self,
        bucket: &str,
        key: &str,
        caller: &Caller,
        need: Role,
    ) -> S3Result<Option<String>> {
        self.ownership
            .check_key(caller, bucket, key, need)
            .await
            .map(|owner| owner.or_else(|| caller.home_team()))
            .map_err(|e| match e.kind() {
                ErrorKind::PermissionDenied => {
                    S3Error::with_message(S3ErrorCode::AccessDenied, e.message().to_string())
                }
                _ => unavailable(e),
            })
    }

    /// Drop listed keys and common prefixes that lie under a prefix owned by a team `caller` may not read.
    pub async fn visible(
        &self,
        bucket: &str,
        caller: &Caller,
        objects: Vec<s3s::dto::Object>,
        prefixes: Vec<s3s::dto::CommonPrefix>,
    ) -> S3Result<(Vec<s3s::dto::Object>, Vec<s3s::dto::CommonPrefix>)> {
        if caller.is_root() {
            return Ok((objects, prefixes));
        }
        let owned = self.prefixes().await?;
        let hidden = |key: &str| match owner_in(&owned, bucket, key) {
            Some(team) => !caller.can(&team, Role::Reader),
            None => false,
        };
        Ok((
            objects
                .into_iter()
                .filter(|o| !o.key.as_deref().is_some_and(hidden))
                .collect(),
            prefixes
                .into_iter()
                .filter(|p| !p.prefix.as_deref().is_some_and(hidden))
                .collect(),
        ))
    }

    /// Admit a write of `bytes` (and `objects`) for `team` on `bucket`, before its body is accepted.
    pub async fn admit(
        &self,
        team: Option<&str>,
        bucket: &str,
        bytes: i64,
        objects: i64,
    ) -> S3Result<Option<Reservation>> {
        let Some(team) = team else { return Ok(None) };
        // The catalog is away: refused now (retryable), not after the pool's wait.
        self.ownership
            .outage()
            .refuse_if_down()
            .map_err(unavailable)?;
        let r = self
            .catalog
            .reserve(team, bucket, bytes.max(0), objects, self.ttl_secs)
            .await;
        self.ownership.outage().note(&r);
        match r {
            Ok(r) => Ok(Some(r)),
            Err(e) if e.kind() == ErrorKind::ResourceExhausted => Err(quota_exceeded(&e)),
            Err(e) => Err(unavailable(e)),
        }
    }

    /// Give a reservation back (the write failed).
    pub async fn release(&self, res: Option<Reservation>) {
        if let Some(r) = res
            && let Err(e) = self.catalog.release_reservation(&r).await
        {
            tracing::warn!(error = %e, "releasing a quota reservation (it expires on its own)");
        }
    }

    /// Record a completed write: inventory row, usage charged to `team` (an overwrite charges the difference,
    /// and the previous owner gets its bytes back).
    #[allow(clippy::too_many_arguments)]
    pub async fn written(
        &self,
        res: Vec<Reservation>,
        bucket: &str,
        key: &str,
        size: i64,
        etag: Option<String>,
        team: Option<String>,
        caller: &Caller,
        job: Option<String>,
        dataset: Option<String>,
    ) {
        let r = self
            .catalog
            .commit_write(
                res,
                &ObjectRecord {
                    backend: bucket.to_string(),
                    key: key.to_string(),
                    size,
                    etag: etag.unwrap_or_default(),
                    modified_at: self.catalog.now(),
                    team,
                    principal: caller.id(),
                    job,
                    dataset,
                    accessed_at: None,
                },
            )
            .await;
        if let Err(e) = r {
            tracing::warn!(error = %e, bucket, key, "recording a write in the catalog (reconciliation will correct usage)");
        }
    }

    /// Record a deletion: the owner gets its bytes back.
    pub async fn deleted(&self, bucket: &str, key: &str) {
        let r = self.catalog.commit_delete(bucket, key).await;
        if let Err(e) = r {
            tracing::warn!(error = %e, bucket, key, "recording a deletion in the catalog");
        }
    }

    /// Admit one part of a multipart upload (a part uploaded again replaces its reservation).
    pub async fn admit_part(
        &self,
        team: Option<&str>,
        bucket: &str,
        upload_id: &str,
        part: i32,
        bytes: i64,
    ) -> S3Result<()> {
        let res = self.admit(team, bucket, bytes, 0).await?;
        let old = match res {
            Some(r) => self.parts.lock().insert((upload_id.to_string(), part), r),
            None => None,
        };
        self.release(old).await;
        Ok(())
    }

    /// Release one part's reservation (the part failed, or its upload was aborted meanwhile).
    pub async fn release_part(&self, upload_id: &str, part: i32) {
        let r = self.parts.lock().remove(&(upload_id.to_string(), part));
        self.release(r).await;
    }

    /// Take the reservations of an upload's parts (on complete or abort).
    pub fn take_parts(&self, upload_id: &str) -> Vec<Reservation> {
        let mut parts = self.parts.lock();
        let keys: Vec<(String, i32)> = parts
            .keys()
            .filter(|(u, _)| u == upload_id)
            .cloned()
            .collect();
        keys.into_iter().filter_map(|k| parts.remove(&k)).collect()
    }

    /// Release every reservation of an aborted or failed upload.
    pub async fn release_parts(&self, upload_id: &str) {
        for r in self.take_parts(upload_id) {
            self.release(Some(r)).await;
        }
    }
}
