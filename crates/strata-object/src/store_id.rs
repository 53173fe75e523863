//! [`StoreLocation`]: where an object store URL really points, whatever its spelling.
//!
//! The same S3 object is named by `s3://bucket/prefix/key`, `s3a://bucket/prefix/key`, `S3://BUCKET/...`,
//! with the endpoint written `http://host:9000` or `http://HOST:9000/`. Access decisions are made on the
//! location this module computes (the endpoint as a URL parser normalizes it, the bucket in lower case as S3
//! names buckets, the key as it is), so no spelling of a URL reaches data another spelling is refused.

use std::fmt;

use crate::BackendOptions;
use crate::backend::s3_endpoint;

/// An S3 location, canonical: two URLs that reach the same bucket of the same endpoint compare equal on
/// `endpoint` and `bucket`; `key` is the key (or key prefix) after the bucket, never normalized (S3 keys are
/// taken as they are: `x//y` is not `x/y`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreLocation {
    /// The endpoint: `scheme://host:port/path` in lower case with the port spelled out, or `aws` when none is
    /// set (the options', else the AWS environment's).
    pub endpoint: String,
    /// The bucket name, lower case.
    pub bucket: String,
    /// The key or key prefix after `bucket/` (no leading `/` taken off beyond the one after the bucket).
    pub key: String,
}

impl StoreLocation {
    /// The location of an `s3://`, `s3a://` or `s3n://` URL (scheme in any case) reached with `options`, or
    /// `None` for another scheme or a URL with no bucket. A trailing `/` is kept in the key: it names a prefix.
    pub fn of_s3_url(url: &str, options: &BackendOptions) -> Option<Self> {
        let (scheme, rest) = url.split_once("://")?;
        if !["s3", "s3a", "s3n"].contains(&scheme.to_ascii_lowercase().as_str()) {
            return None;
        }
        let (bucket, key) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.is_empty() {
            return None;
        }
        Some(Self {
            endpoint: canonical_endpoint(s3_endpoint(options).as_deref()),
            bucket: bucket.to_ascii_lowercase(),
            key: key.to_string(),
        })
    }

    /// Whether `other` is in the same bucket of the same endpoint.
    pub fn same_bucket(&self, other: &StoreLocation) -> bool {
        self.endpoint == other.endpoint && self.bucket == other.bucket
    }

    /// Where this location stands against `root`, a location in the same bucket naming a prefix (a
    /// configured backend's, a bucket root's; without its trailing `/`).
    pub fn against(&self, root: &StoreLocation) -> Relation {
        if !self.same_bucket(root) {
            return Relation::Apart;
        }
        let p = root.key.trim_end_matches('/');
        if p.is_empty() {
            return Relation::Inside(self.key.clone());
        }
        if self.key == p {
            return Relation::Inside(String::new());
        }
        if let Some(k) = self.key.strip_prefix(p).and_then(|k| k.strip_prefix('/')) {
            return Relation::Inside(k.to_string());
        }
        if p.starts_with(self.key.as_str()) {
            Relation::Covers
        } else {
            Relation::Apart
        }
    }
}

/// How a location stands against a root prefix of the same store ([`StoreLocation::against`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Relation {
    /// Under the root: the key relative to it.
    Inside(String),
    /// A prefix of the root (`""`, `pre` of `prefix`): a listing or warm-up of it would cover the root.
    Covers,
    /// Elsewhere: another bucket, endpoint or prefix.
    Apart,
}

impl fmt::Display for StoreLocation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "s3://{}/{} at {}", self.bucket, self.key, self.endpoint)
    }
}

/// An endpoint as a URL parser normalizes it (scheme and host in lower case, the default port spelled out, no
/// trailing `/`); `aws` when unset. A string that does not parse is compared as it is, trimmed.
fn canonical_endpoint(e: Option<&str>) -> String {
    let Some(e) = e.map(str::trim).filter(|e| !e.is_empty()) else {
        return "aws".into();
    };
    match url::Url::parse(e) {
        Ok(u) if u.host_str().is_some() => format!(
            "{}://{}:{}{}",
            u.scheme(),
            u.host_str().unwrap_or_default().to_ascii_lowercase(),
            u.port_or_known_default().unwrap_or(0),
            u.path().trim_end_matches('/')
        ),
        _ => e.trim_end_matches('/').to_ascii_lowercase(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(endpoint: &str) -> BackendOptions {
        BackendOptions {
            endpoint: Some(endpoint.into()),
            ..Default::default()
        }
    }

    #[test]
    fn every_spelling_of_one_store_is_one_location() {
        let a = StoreLocation::of_s3_url("s3a://Bucket/pre/k", &at("http://HOST:80/")).unwrap();
        let b = StoreLocation::of_s3_url("S3://bucket/pre/k", &at("http://host")).unwrap();
        assert_eq!(a, b);
        assert_eq!(a.endpoint, "http://host:80");
        let c = StoreLocation::of_s3_url("s3://bucket/pre/k", &at("http://host:9000")).unwrap();
        assert!(!a.same_bucket(&c), "another port is another store");
        assert!(StoreLocation::of_s3_url("file:///x", &at("http://host")).is_none());
        assert!(StoreLocation::of_s3_url("s3:///k", &at("http://host")).is_none());
    }

    #[test]
    fn a_location_is_inside_covering_or_apart_from_a_root() {
        let o = at("http://h:1");
        let root = StoreLocation::of_s3_url("s3://b/pre/", &o).unwrap();
        let rel = |u: &str| StoreLocation::of_s3_url(u, &o).unwrap().against(&root);
        assert_eq!(rel("s3://b/pre/team/x"), Relation::Inside("team/x".into()));
        assert_eq!(rel("s3://b/pre/"), Relation::Inside(String::new()));
        assert_eq!(rel("s3://b/pre"), Relation::Inside(String::new()));
        assert_eq!(rel("s3://b/pre//x"), Relation::Inside("/x".into()));
        assert_eq!(rel("s3://b/pr"), Relation::Covers);
        assert_eq!(rel("s3://b/"), Relation::Covers);
        assert_eq!(rel("s3://b"), Relation::Covers);
        assert_eq!(rel("s3://b/prefix/x"), Relation::Apart);
        assert_eq!(rel("s3://other/pre/x"), Relation::Apart);
        let whole = StoreLocation::of_s3_url("s3://b", &o).unwrap();
        assert_eq!(
            StoreLocation::of_s3_url("s3://b/any/k", &o)
                .unwrap()
                .against(&whole),
            Relation::Inside("any/k".into())
        );
    }
}
