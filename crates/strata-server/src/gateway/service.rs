//! Service and bucket operations: ListBuckets, HeadBucket, GetBucketLocation.

use super::attributes::timestamp;
use super::*;

impl Gateway {
    pub(super) async fn s3_list_buckets(
        &self,
        req: S3Request<ListBucketsInput>,
    ) -> S3Result<S3Response<ListBucketsOutput>> {
        self.ctx(&req)?;
        let buckets = self
            .agent
            .backends()
            .iter()
            .map(|b| Bucket {
                name: Some(b.name.clone()),
                creation_date: Some(timestamp(self.bucket_created(&b.url))),
                bucket_region: Some(self.region.clone()),
            })
            .collect();
        Ok(S3Response::new(ListBucketsOutput {
            buckets: Some(buckets),
            ..Default::default()
        }))
    }

    /// When a configured bucket came to be, as far as this agent knows: a local directory's creation (else
    /// its last change), else when this agent was first started (its `agent-id`); stable across restarts.
    fn bucket_created(&self, url: &str) -> i64 {
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
        self.ctx(&req)?;
        self.backend(&req.input.bucket)?;
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
        self.backend(&req.input.bucket)?;
        Ok(S3Response::new(GetBucketLocationOutput {
            location_constraint: (self.region != "us-east-1")
                .then(|| BucketLocationConstraint::from(self.region.clone())),
        }))
    }
}
