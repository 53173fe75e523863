use std::fmt;
use std::sync::Arc;

use crate::{Error, Result};

/// The identity of one version of one object: backend id + key + version.
///
/// `version` is the backend's ETag (or version id when the backend has one). Blocks cached under an old
/// version are unreachable once the object changes, which is how Strata never serves stale bytes.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ObjectId {
    /// Canonical backend id, e.g. `s3://bucket@http://127.0.0.1:9000` or `file:///data`.
    pub backend: Arc<str>,
    /// Object key relative to the backend root.
    pub key: Arc<str>,
    /// ETag or version id. Empty only for backends that have neither (then size+mtime is used).
    pub version: Arc<str>,
}

impl ObjectId {
    /// Build an id.
    pub fn new(
        backend: impl Into<Arc<str>>,
        key: impl Into<Arc<str>>,
        version: impl Into<Arc<str>>,
    ) -> Self {
        Self {
            backend: backend.into(),
            key: key.into(),
            version: version.into(),
        }
    }
}

impl fmt::Display for ObjectId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}@{}", self.backend, self.key, self.version)
    }
}

/// One fixed-size block of one object version.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct BlockKey {
    /// The object version.
    pub object: ObjectId,
    /// Block index: the block covers `[index * block_size, (index + 1) * block_size)`.
    pub index: u64,
}

impl BlockKey {
    /// Build a key.
    pub fn new(object: ObjectId, index: u64) -> Self {
        Self { object, index }
    }

    /// The canonical string form, stored in disk block headers and used to detect hash collisions.
    pub fn canonical(&self) -> String {
        // Fields are separated by NUL, which validated keys never contain.
        format!(
            "{}\0{}\0{}\0{}",
            self.object.backend, self.object.key, self.object.version, self.index
        )
    }

    /// A 32-byte digest of [`Self::canonical`], used as the cache index key and the disk file name.
    pub fn digest(&self) -> [u8; 32] {
        *blake3::hash(self.canonical().as_bytes()).as_bytes()
    }
}

/// What a backend knows about an object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectMeta {
    /// Key relative to the backend root.
    pub key: String,
    /// Size in bytes.
    pub size: u64,
    /// ETag, if the backend has one.
    pub etag: Option<String>,
    /// Version id, if the backend versions objects.
    pub version: Option<String>,
    /// Last modification, seconds since the Unix epoch.
    pub last_modified_unix: i64,
    /// What the backend keeps with the object besides its bytes (Content-Type, user metadata), when it keeps
    /// any and the request that produced this metadata returned them (a HEAD or GET does; a listing does not).
    pub attrs: Option<Arc<ObjectAttrs>>,
}

/// What an object store keeps with an object besides its bytes: the HTTP headers S3 stores and returns as
/// they were given, user metadata (`x-amz-meta-*`) and the extras S3 keeps ([`crate::extras`]). Object stores
/// keep them natively (extras in one reserved metadata entry); local directories in an extended attribute.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct ObjectAttrs {
    /// `Content-Type`.
    pub content_type: Option<String>,
    /// `Content-Encoding`.
    pub content_encoding: Option<String>,
    /// `Content-Disposition`.
    pub content_disposition: Option<String>,
    /// `Content-Language`.
    pub content_language: Option<String>,
    /// `Cache-Control`.
    pub cache_control: Option<String>,
    /// User metadata: names without the `x-amz-meta-` prefix, lower case (as S3 returns them).
    pub user: std::collections::BTreeMap<String, String>,
    /// `Expires` as the writer gave it (an HTTP date), returned as it was.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expires: Option<String>,
    /// The checksum the writer sent (or asked for) with the object ([`crate::extras`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub checksum: Option<crate::StoredChecksum>,
    /// The sizes of the parts of a multipart upload, in order (empty: written in one piece).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub parts: Vec<u64>,
}

impl ObjectAttrs {
    /// True when nothing is set.
    pub fn is_empty(&self) -> bool {
        self == &Self::default()
    }

    /// `None` when nothing is set, else the attributes shared.
    pub fn shared(self) -> Option<Arc<Self>> {
        (!self.is_empty()).then(|| Arc::new(self))
    }
}

impl ObjectMeta {
    /// The version string used in cache keys: the version id, else the ETag, else size and mtime.
    pub fn version_tag(&self) -> String {
        if let Some(v) = &self.version {
            return format!("v:{v}");
        }
        if let Some(e) = &self.etag {
            return format!("e:{e}");
        }
        format!("m:{}:{}", self.size, self.last_modified_unix)
    }
}

/// Check that an object key is safe and representable: non-empty, relative, no `.` or `..` segments, no empty
/// segments, no NUL or backslash, at most 1024 bytes. Returns the key unchanged.
pub fn validate_key(key: &str) -> Result<&str> {
    let bad = |why: &str| {
        Err(Error::invalid_input(format!(
            "invalid object key {key:?}: {why}"
        )))
    };
    if key.is_empty() {
        return bad("empty");
    }
    if key.len() > 1024 {
        return bad("longer than 1024 bytes");
    }
    if key.starts_with('/') {
        return bad("absolute keys are not allowed");
    }
    if key.contains('\0') {
        return bad("contains a NUL byte");
    }
    if key.contains(['\n', '\r']) {
        return bad("contains a line break");
    }
    if key.contains('\\') {
        return bad("contains a backslash");
    }
    for seg in key.split('/') {
        match seg {
            "." | ".." => return bad("contains a '.' or '..' segment"),
            "" if !key.ends_with('/') => return bad("contains an empty segment"),
            _ => {}
        }
    }
    Ok(key)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digest_depends_on_version_and_index() {
        let a = BlockKey::new(ObjectId::new("memory://", "k", "e:1"), 0);
        let b = BlockKey::new(ObjectId::new("memory://", "k", "e:2"), 0);
        let c = BlockKey::new(ObjectId::new("memory://", "k", "e:1"), 1);
        assert_ne!(a.digest(), b.digest());
        assert_ne!(a.digest(), c.digest());
        assert_eq!(a.digest(), a.clone().digest());
    }

    #[test]
    fn keys_are_validated() {
        for good in ["a", "a/b/c.bin", "dir/", "x..y", "..a/b"] {
            assert!(validate_key(good).is_ok(), "{good}");
        }
        for bad in [
            "", "/abs", "a/../b", "..", "a/./b", "a//b", "a\0b", "a\\..\\b",
        ] {
            let e = validate_key(bad).unwrap_err();
            assert_eq!(e.kind(), crate::ErrorKind::InvalidInput, "{bad}");
        }
    }
}
