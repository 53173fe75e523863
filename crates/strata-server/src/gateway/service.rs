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
                creation_date: Some(timestamp(0)),
                bucket_region: Some(self.region.clone()),
            })
            .collect();
        Ok(S3Response::new(ListBucketsOutput {
            buckets: Some(buckets),
            ..Default::default()
        }))
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
