//! Service and bucket operations: ListBuckets, HeadBucket, GetBucketLocation (CreateBucket and DeleteBucket
//! are [`super::buckets`]).

use super::attributes::timestamp;
use super::*;

/// The owner S3 names for buckets and objects (ListBuckets, ListObjects, `FetchOwner`): one for the gateway,
/// in S3's canonical-ID form. Who wrote an object and which team owns it are Strata's inventory and ownership
/// (`strata usage`, `docs/quotas.md`), not this.
pub(super) fn owner() -> Owner {
    Owner {
        id: Some("7374726174612d676174657761792d6f776e65722d3030303030303030303030".into()),
        display_name: Some("strata".into()),
    }
}

impl Gateway {
    pub(super) async fn s3_list_buckets(
        &self,
        req: S3Request<ListBucketsInput>,
    ) -> S3Result<S3Response<ListBucketsOutput>> {
        let who = self.who(&req).await?;
        let buckets = self
            .buckets_for(&who.caller)
            .await?
            .into_iter()
            .map(|(name, created)| Bucket {
                name: Some(name),
                creation_date: Some(timestamp(created)),
                bucket_region: Some(self.region.clone()),
            })
            .collect();
        Ok(S3Response::new(ListBucketsOutput {
            owner: Some(owner()),
            buckets: Some(buckets),
            ..Default::default()
        }))
    }

    /// When a configured bucket came to be, as far as this agent knows: a local directory's creation (else
    /// its last change), else when this agent was first started (its `agent-id`); stable across restarts.
    pub(super) fn bucket_created(&self, url: &str) -> i64 {
        let created = |p: &std::path::Path| {
            let m = std::fs::metadata(p).ok()?;
            let t = m.created().or_else(|_| m.modified()).ok()?;
            t.duration_since(std::time::UNIX_EPOCH)
                .ok()
                .map(|d| d.as_secs() as i64)
        };
        url.strip_prefix("file://")
            .and_then(|p| created(std::path::Path::new(p)))
            .or_else(|| created(&self.agent.config().data_dir.join("agent-id")))
            .unwrap_or_else(|| self.agent.catalog().now())
    }

    pub(super) async fn s3_head_bucket(
        &self,
        req: S3Request<HeadBucketInput>,
    ) -> S3Result<S3Response<HeadBucketOutput>> {
        let who = self.who(&req).await?;
        self.backend(&req.input.bucket).await?;
        if let Some(b) = self
            .agent
            .catalog()
            .bucket(&req.input.bucket)
            .await
            .map_err(s3err)?
            && !super::buckets::may_see(&who.caller, b.team.as_deref())
        {
            return Err(s3_error!(
                AccessDenied,
                "the bucket belongs to another team"
            ));
        }
        Ok(S3Response::new(HeadBucketOutput {
            bucket_region: Some(self.region.clone()),
            ..Default::default()
        }))
    }

    pub(super) async fn s3_get_bucket_location(
        &self,
        req: S3Request<GetBucketLocationInput>,
    ) -> S3Result<S3Response<GetBucketLocationOutput>> {
        self.ctx(&req)?;
        self.backend(&req.input.bucket).await?;
        Ok(S3Response::new(GetBucketLocationOutput {
            location_constraint: (self.region != "us-east-1")
                .then(|| BucketLocationConstraint::from(self.region.clone())),
        }))
    }
}
