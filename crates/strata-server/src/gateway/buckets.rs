//! Buckets: the configured backends, and those made by CreateBucket under `[gateway] bucket_root` (a
//! directory or an S3 prefix per bucket), recorded in the catalog with the team that owns every key in them
//! (so writes there are charged to it and other teams cannot read them), found by every agent sharing the
//! catalog. Names follow S3's rules; a configured backend's name is taken.

use super::*;
use crate::cluster::coherence::Change;

/// How long a created bucket found in the catalog is used without asking again (a bucket deleted through
/// another agent is gone here within this).
const CREATED_TTL: std::time::Duration = std::time::Duration::from_secs(10);
/// The most created buckets kept open at once (others are opened again when used).
const CREATED_MAX: usize = 4096;

/// Created buckets this agent has opened, by name, and the writes in progress into them.
#[derive(Debug, Default)]
pub(super) struct Created {
    open: parking_lot::Mutex<HashMap<String, (Backend, std::time::Instant)>>,
    writes: parking_lot::Mutex<Writes>,
}

/// Writes in progress through this agent per bucket, and the buckets being deleted here: a DeleteBucket and
/// a write into the same bucket exclude each other on this agent.
#[derive(Debug, Default)]
struct Writes {
    in_flight: HashMap<String, usize>,
    deleting: std::collections::HashSet<String>,
}

/// A write into a bucket in progress ([`Created::begin_write`]); ends when dropped.
pub(super) struct Writing<'a> {
    created: &'a Created,
    bucket: String,
}

impl Drop for Writing<'_> {
    fn drop(&mut self) {
        let mut w = self.created.writes.lock();
        if let Some(n) = w.in_flight.get_mut(&self.bucket) {
            *n -= 1;
            if *n == 0 {
                w.in_flight.remove(&self.bucket);
            }
        }
    }
}

/// A DeleteBucket in progress ([`Created::begin_delete`]); ends when dropped.
pub(super) struct Deleting<'a> {
    created: &'a Created,
    bucket: String,
}

impl Drop for Deleting<'_> {
    fn drop(&mut self) {
        self.created.writes.lock().deleting.remove(&self.bucket);
    }
}

impl Created {
    /// Start a write into `bucket`: refused (`NoSuchBucket`) while the bucket is being deleted here.
    pub(super) fn begin_write(&self, bucket: &str) -> S3Result<Writing<'_>> {
        let mut w = self.writes.lock();
        if w.deleting.contains(bucket) {
            return Err(s3_error!(
                NoSuchBucket,
                "The specified bucket is being deleted"
            ));
        }
        *w.in_flight.entry(bucket.to_string()).or_default() += 1;
        Ok(Writing {
            created: self,
            bucket: bucket.to_string(),
        })
    }

    /// Start deleting `bucket`: refused (`BucketNotEmpty`) while a write into it is in progress here.
    fn begin_delete(&self, bucket: &str) -> S3Result<Deleting<'_>> {
        let mut w = self.writes.lock();
        if w.in_flight.get(bucket).is_some_and(|n| *n > 0) || !w.deleting.insert(bucket.to_string())
        {
            return Err(s3_error!(
                BucketNotEmpty,
                "The bucket you tried to delete is not empty (a write into it is in progress)"
            ));
        }
        Ok(Deleting {
            created: self,
            bucket: bucket.to_string(),
        })
    }
}

/// Quota scopes that are not backends: a created bucket is charged on the scope of its name, so none may take
/// one of these (its writes would count as pinned cache, scratch, checkpoints or peer replicas).
const RESERVED_SCOPES: [&str; 4] = [
    crate::api::CACHE_SCOPE,
    "scratch",
    strata_ckpt::quota::SCOPE,
    crate::replicas::PEER_SCOPE,
];

/// Whether `name` is a bucket name S3 allows: 3-63 of `a-z 0-9 . -`, starting and ending with a letter or
/// digit, no `..`, not an IP address, none of the reserved prefixes and suffixes.
pub(super) fn valid_bucket_name(name: &str) -> bool {
    let b = name.as_bytes();
    (3..=63).contains(&b.len())
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'.' || *c == b'-')
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && !name.contains("..")
        && name.parse::<std::net::Ipv4Addr>().is_err()
        && !["xn--", "sthree-", "amzn-s3-demo-"]
            .iter()
            .any(|p| name.starts_with(p))
        && !["-s3alias", "--ol-s3", ".mrap", "--x-s3", "--table-s3"]
            .iter()
            .any(|s| name.ends_with(s))
}

impl Gateway {
    /// The backend of bucket `bucket`: a configured backend by name, else a created bucket.
    pub(super) async fn backend(&self, bucket: &str) -> S3Result<Backend> {
        if let Some(b) = self.agent.backends().iter().find(|b| b.name == bucket) {
            return Ok(b.backend.clone());
        }
        let no_such = || s3_error!(NoSuchBucket, "The specified bucket does not exist");
        let Some((root, options)) = self.agent.config().bucket_root.clone() else {
            return Err(no_such());
        };
        let cached = self.created.open.lock().get(bucket).cloned();
        if let Some((b, at)) = &cached
            && at.elapsed() < CREATED_TTL
        {
            return Ok(b.clone());
        }
        if !valid_bucket_name(bucket) {
            return Err(no_such());
        }
        // While the catalog is away, a bucket it had lately still is ([`crate::outage`]).
        let found = self
            .agent
            .ownership()
            .outage()
            .fetch(
                "bucket",
                cached.as_ref().map(|(_, at)| (*at, Some(()))),
                async {
                    let found = self.agent.catalog().bucket(bucket).await?.map(|_| ());
                    // A fresh answer renews the open backend's time (a cached one stands in unrenewed).
                    if let (Some(()), Some((b, _))) = (&found, &cached) {
                        self.created
                            .open
                            .lock()
                            .insert(bucket.to_string(), (b.clone(), std::time::Instant::now()));
                    }
                    Ok(found)
                },
            )
            .await
            .map_err(s3err)?;
        if let (Some((b, _)), Some(())) = (&cached, &found) {
            return Ok(b.clone());
        }
        let Some(_) = found else {
            self.created.open.lock().remove(bucket);
            return Err(no_such());
        };
        let b = Backend::open(
            &format!("{root}/{bucket}"),
            &options,
            self.agent.config().retry,
            self.agent.telemetry().clone(),
        )
        .map_err(s3err)?;
        let mut open = self.created.open.lock();
        if open.len() >= CREATED_MAX {
            open.clear();
        }
        open.insert(bucket.to_string(), (b.clone(), std::time::Instant::now()));
        Ok(b)
    }

    /// After a write of `key` into `bucket` landed: if the bucket is a created one that was deleted meanwhile
    /// (through another agent: this one refuses to delete a bucket it is writing into), the object is
    /// removed again and the write answered `NoSuchBucket`, so nothing outlives its bucket for the next team
    /// that makes one of that name.
    pub(super) async fn still_there(
        &self,
        ctx: &IoContext,
        bucket: &str,
        backend: &Backend,
        key: &str,
    ) -> S3Result<()> {
        if self.agent.backends().iter().any(|b| b.name == bucket) {
            return Ok(());
        }
        if self
            .agent
            .catalog()
            .bucket(bucket)
            .await
            .map_err(s3err)?
            .is_some()
        {
            return Ok(());
        }
        if let Err(e) = backend.delete(ctx, key).await {
            tracing::warn!(%bucket, %key, error = %e, "removing an object written into a bucket deleted meanwhile");
        }
        self.agent
            .announce(vec![Change::key(backend.id(), key)])
            .await;
        self.created.open.lock().remove(bucket);
        Err(s3_error!(
            NoSuchBucket,
            "The specified bucket was deleted while the object was being written; nothing was kept"
        ))
    }

    /// The backend of `bucket` for a listing by `who`: a created bucket of a team the caller may not read is
    /// `403` as a whole, as S3 answers a bucket one has no access to (not an empty `200`); a configured
    /// backend lists, each owned prefix filtered as the listing goes.
    pub(super) async fn listable(&self, who: &Who, bucket: &str) -> S3Result<Backend> {
        let backend = self.backend(bucket).await?;
        self.tenancy
            .attribute(bucket, "", &who.caller, Role::Reader)
            .await?;
        Ok(backend)
    }

    /// Every bucket `caller` may see: the configured backends, and created buckets of teams it reads (all,
    /// for root), with when each was made.
    pub(super) async fn buckets_for(&self, caller: &Caller) -> S3Result<Vec<(String, i64)>> {
        let mut out: Vec<(String, i64)> = Vec::new();
        for b in self.agent.backends() {
            out.push((b.name.clone(), self.bucket_created(&b.url)));
        }
        if self.agent.config().bucket_root.is_some() {
            for b in self.agent.catalog().list_buckets().await.map_err(s3err)? {
                if may_see(caller, b.team.as_deref()) {
                    out.push((b.name, b.created_at));
                }
            }
        }
        out.sort();
        Ok(out)
    }

    pub(super) async fn s3_create_bucket(
        &self,
        req: S3Request<CreateBucketInput>,
    ) -> S3Result<S3Response<CreateBucketOutput>> {
        let who = self.who(&req).await?;
        let input = req.input;
        if self.agent.backends().iter().any(|b| b.name == input.bucket) {
            // A configured backend is every caller's bucket already (clients such as rclone make sure of the
            // bucket before writing): as S3 answers an owner, 200 in us-east-1, else BucketAlreadyOwnedByYou.
            if self.region == "us-east-1" {
                return Ok(S3Response::new(CreateBucketOutput {
                    location: Some(format!("/{}", input.bucket)),
                }));
            }
            return Err(s3_error!(
                BucketAlreadyOwnedByYou,
                "Your previous request to create the named bucket succeeded and you already own it."
            ));
        }
        let Some((root, options)) = self.agent.config().bucket_root.clone() else {
            return Err(s3_error!(
                NotImplemented,
                "CreateBucket needs [gateway] bucket_root; the buckets here are the configured backends"
            ));
        };
        if let Some(lc) = input
            .create_bucket_configuration
            .as_ref()
            .and_then(|c| c.location_constraint.as_ref())
            && lc.as_str() != self.region
        {
            return Err(s3_error!(
                InvalidLocationConstraint,
                "The specified location-constraint is not valid: this gateway is {}",
                self.region
            ));
        }
        if input.acl.as_ref().is_some_and(|a| a.as_str() != "private")
            || input.grant_full_control.is_some()
            || input.grant_read.is_some()
            || input.grant_write.is_some()
            || input.object_lock_enabled_for_bucket == Some(true)
        {
            return Err(s3_error!(
                NotImplemented,
                "bucket ACLs and object lock are not implemented by this gateway; no bucket was made"
            ));
        }
        let name = input.bucket;
        if !valid_bucket_name(&name) {
            return Err(s3_error!(
                InvalidBucketName,
                "The specified bucket is not valid: 3-63 characters of a-z, 0-9, '.' and '-', starting and ending with a letter or digit"
            ));
        }
        if RESERVED_SCOPES.contains(&name.as_str()) {
            return Err(s3_error!(
                InvalidBucketName,
                "The bucket name {name:?} is reserved: it names a quota scope of its own (cache, scratch, ckpt, peer)"
            ));
        }
        let team = who.caller.home_team();
        if !who.caller.is_root() {
            match &team {
                Some(t) if who.caller.can(t, Role::Member) => {}
                _ => {
                    return Err(s3_error!(
                        AccessDenied,
                        "making a bucket needs membership of a team, which will own it"
                    ));
                }
            }
        }
        let taken = |mine: bool| {
            if mine {
                s3_error!(
                    BucketAlreadyOwnedByYou,
                    "Your previous request to create the named bucket succeeded and you already own it."
                )
            } else {
                s3_error!(
                    BucketAlreadyExists,
                    "The requested bucket name is not available. Please select a different name and try again."
                )
            }
        };
        let url = format!("{root}/{name}");
        if let Some(dir) = url.strip_prefix("file://") {
            std::fs::create_dir_all(dir)
                .map_err(|e| s3err(Error::from_io(e, "making the bucket's directory")))?;
        }
        let creator = who
            .ctx
            .principal
            .as_deref()
            .unwrap_or(&who.access_key)
            .to_string();
        match self
            .agent
            .catalog()
            .create_bucket(&name, team.as_deref(), &creator)
            .await
        {
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::AlreadyExists => {
                let existing = self.agent.catalog().bucket(&name).await.map_err(s3err)?;
                let mine = existing.is_some_and(|b| b.team == team);
                // As S3 in us-east-1: making again a bucket one owns succeeds.
                if mine && self.region == "us-east-1" {
                    return Ok(S3Response::new(CreateBucketOutput {
                        location: Some(format!("/{name}")),
                    }));
                }
                return Err(taken(mine));
            }
            Err(e) => return Err(s3err(e)),
        }
        // The bucket must open (a bad root or options is the operator's error, said once here).
        Backend::open(
            &url,
            &options,
            self.agent.config().retry,
            self.agent.telemetry().clone(),
        )
        .map_err(s3err)?;
        self.agent.ownership().invalidate();
        tracing::info!(bucket = %name, team = ?team, %creator, "bucket created");
        Ok(S3Response::new(CreateBucketOutput {
            location: Some(format!("/{name}")),
        }))
    }

    pub(super) async fn s3_delete_bucket(
        &self,
        req: S3Request<DeleteBucketInput>,
    ) -> S3Result<S3Response<DeleteBucketOutput>> {
        let who = self.who(&req).await?;
        let name = req.input.bucket;
        if self.agent.backends().iter().any(|b| b.name == name) {
            return Err(s3_error!(
                AccessDenied,
                "the bucket {name:?} is a configured backend; it is removed from the configuration, not deleted"
            ));
        }
        let backend = self.backend(&name).await?;
        let record = self
            .agent
            .catalog()
            .bucket(&name)
            .await
            .map_err(s3err)?
            .ok_or_else(|| s3_error!(NoSuchBucket))?;
        // No write into it starts here from now on, and none is in progress.
        let _deleting = self.created.begin_delete(&name)?;
        let allowed = who.caller.is_root()
            || record
                .team
                .as_deref()
                .is_some_and(|t| who.caller.can(t, Role::Member));
        if !allowed {
            return Err(s3_error!(
                AccessDenied,
                "the bucket belongs to another team"
            ));
        }
        let page = backend
            .list_page(&who.ctx, "", None, 1)
            .await
            .map_err(s3err)?;
        if !page.objects.is_empty() || self.staging.list().iter().any(|(_, u, _)| u.bucket == name)
        {
            return Err(s3_error!(
                BucketNotEmpty,
                "The bucket you tried to delete is not empty (objects or multipart uploads in progress)"
            ));
        }
        self.agent
            .catalog()
            .delete_bucket(
                &who.caller.id().unwrap_or_else(|| who.access_key.clone()),
                &name,
            )
            .await
            .map_err(s3err)?;
        self.created.open.lock().remove(&name);
        self.agent.ownership().invalidate();
        if let Some((root, _)) = &self.agent.config().bucket_root
            && let Some(dir) = root.strip_prefix("file://")
        {
            remove_empty_dirs(&std::path::Path::new(dir).join(&name));
        }
        tracing::info!(bucket = %name, "bucket deleted");
        Ok(S3Response::new(DeleteBucketOutput {}))
    }
}

/// Whether `caller` may see a created bucket of `team`.
pub(super) fn may_see(caller: &Caller, team: Option<&str>) -> bool {
    caller.is_root() || team.is_some_and(|t| caller.can(t, Role::Reader))
}

/// Remove `dir` and the empty directories under it, never a file (one written meanwhile stays).
fn remove_empty_dirs(dir: &std::path::Path) {
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                remove_empty_dirs(&e.path());
            }
        }
    }
    let _ = std::fs::remove_dir(dir);
}
