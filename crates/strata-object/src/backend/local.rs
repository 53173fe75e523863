//! A local-directory backend's own ground: where keys live as files ([`crate::localkeys`]), the attributes
//! and ETags kept with them (extended attributes, [`crate::localetag`]), and listings that merge plain files
//! with escaped keys.

use super::*;

impl Backend {
    /// The store path `key` is written to: on a local directory its plain path when it can be one now, else
    /// its escaped one; elsewhere the key itself.
    pub(super) fn write_path(&self, key: &str) -> Result<Path> {
        let Some(root) = &self.inner.local_root else {
            return to_path(key);
        };
        s3_key(key)?;
        let p = match crate::localkeys::plain_now(root, key) {
            true => key.to_string(),
            false => crate::localkeys::escaped(key),
        };
        Path::parse(&p)
            .map_err(|e| Error::invalid_input(format!("invalid object key {key:?}: {e}")))
    }

    /// After `key` was written to `written` on a local directory: the key's other place no longer holds it
    /// (escaped, when it was written plain; its plain file, when it was written escaped: a name too long for
    /// a write that another tool put there).
    pub(super) fn forget_other_place(&self, key: &str, written: &Path) {
        let Some(root) = &self.inner.local_root else {
            return;
        };
        if written.as_ref() == key {
            let _ = std::fs::remove_file(root.join(crate::localkeys::escaped(key)));
        } else if crate::localkeys::plain_shape(key) && root.join(key).is_file() {
            let _ = std::fs::remove_file(root.join(key));
        }
    }

    /// The store path `key` is read from on a local directory: its plain file when there is one, else its
    /// escaped one.
    pub(super) fn local_read_path(&self, root: &std::path::Path, key: &str) -> Result<Path> {
        let p = match crate::localkeys::plain_shape(key) && root.join(key).is_file() {
            true => key.to_string(),
            false => crate::localkeys::escaped(key),
        };
        Path::parse(&p)
            .map_err(|e| Error::invalid_input(format!("invalid object key {key:?}: {e}")))
    }

    /// Keep `attrs` with the local file just written at `path` (nothing for object stores, which got them
    /// with the write). The file is new (writes replace files, never rewrite them), so there is nothing to
    /// clear when `attrs` is empty. A file system that refuses user extended attributes loses them, with one
    /// warning per process; the write itself stands.
    pub(super) fn keep_local_attrs(&self, path: &Path, attrs: &ObjectAttrs) {
        let Some(fs) = &self.inner.local else { return };
        if attrs.is_empty() {
            return;
        }
        let (Ok(file), Ok(json)) = (fs.path_to_filesystem(path), local_attrs_json(attrs)) else {
            return;
        };
        if let Err(e) =
            rustix::fs::setxattr(&file, ATTRS_XATTR, &json, rustix::fs::XattrFlags::empty())
            && !XATTR_WARNED.swap(true, std::sync::atomic::Ordering::Relaxed)
        {
            tracing::warn!(backend = %self.inner.id, error = %e,
                "this file system refuses extended attributes: object attributes (Content-Type, user metadata) are not kept");
        }
    }

    /// The file of a store path on a local directory.
    pub(super) fn local_file(&self, path: &Path) -> Option<std::path::PathBuf> {
        self.inner.local.as_ref()?.path_to_filesystem(path).ok()
    }

    /// On a local directory: the ETag shown for the file at `path` is the one recorded when Strata wrote it
    /// (its content's MD5), while it is still that file ([`crate::localetag`]).
    pub(super) fn show_local_etag(&self, path: &Path, meta: &mut ObjectMeta) {
        if let (Some(file), Some(store)) = (self.local_file(path), meta.etag.as_deref()) {
            meta.etag = Some(crate::localetag::public(&file, store));
        }
    }

    /// On a local directory: record `public` as the ETag of the file just written at `path`, whose file store
    /// ETag is `store`; returns the ETag to report for the write.
    pub(super) fn record_local_etag(
        &self,
        path: &Path,
        public: String,
        store: Option<String>,
    ) -> Option<String> {
        match (self.local_file(path), store) {
            (Some(file), Some(store)) => {
                crate::localetag::record(&file, &public, &store);
                Some(public)
            }
            (_, store) => store,
        }
    }

    /// The attributes kept with a local file, if any.
    pub(super) fn local_attrs(&self, path: &Path) -> Option<Arc<ObjectAttrs>> {
        let file = self.inner.local.as_ref()?.path_to_filesystem(path).ok()?;
        let mut buf = [0u8; 8192];
        let json = match rustix::fs::getxattr(&file, ATTRS_XATTR, &mut buf[..]) {
            Ok(n) => buf.get(..n)?.to_vec(),
            Err(rustix::io::Errno::RANGE) => {
                let n = rustix::fs::getxattr_query(&file, ATTRS_XATTR).ok()?;
                let mut big = vec![0u8; n];
                let n = rustix::fs::getxattr(&file, ATTRS_XATTR, &mut big[..]).ok()?;
                big.truncate(n);
                big
            }
            Err(_) => return None,
        };
        serde_json::from_slice::<ObjectAttrs>(&json).ok()?.shared()
    }

    /// The objects of a local directory whose key starts with `prefix`, after `start_after`, in key order,
    /// at most `limit`: the plain files under the prefix's directory (when it can be a plain path) and the
    /// escaped keys ([`crate::localkeys`]); a key found in both places is shown once. The walk skips what
    /// lies at or before `start_after` without a `stat` (the file store's offset listing), and the ETags
    /// (an extended attribute each) are read for the entries returned only.
    pub(super) async fn local_list(
        &self,
        prefix: &str,
        start_after: Option<&str>,
        limit: usize,
        what: &str,
    ) -> Result<Vec<ObjectMeta>> {
        // Each entry with the store path of its plain file (its ETag still to be read), or none (escaped).
        let mut out: std::collections::BTreeMap<String, (ObjectMeta, Option<Path>)> =
            Default::default();
        let after = |k: &str| start_after.is_none_or(|s| k > s);
        if local_dir_walkable(prefix) {
            let dir = match prefix.rfind('/') {
                Some(i) if i > 0 => Some(
                    Path::parse(&prefix[..i]).map_err(|e| Error::invalid_input(e.to_string()))?,
                ),
                _ => None,
            };
            let mut stream = match start_after.and_then(super::list::offset_path) {
                Some(s) => self.inner.store.list_with_offset(dir.as_ref(), &s),
                None => self.inner.store.list(dir.as_ref()),
            };
            let escape = format!("{}/", crate::localkeys::ESCAPE_DIR);
            while let Some(m) = stream.next().await {
                let m = m.map_err(|e| classify(e, what))?;
                let loc = m.location.as_ref();
                if loc.starts_with(&escape) || !loc.starts_with(prefix) || !after(loc) {
                    continue;
                }
                let location = m.location.clone();
                let meta = convert_meta(m);
                out.insert(meta.key.clone(), (meta, Some(location)));
            }
        }
        for m in self.local_escaped(prefix, what).await? {
            if after(&m.key) {
                out.entry(m.key.clone()).or_insert((m, None));
            }
        }
        Ok(out
            .into_values()
            .take(limit)
            .map(|(mut meta, plain)| {
                if let Some(location) = plain {
                    self.show_local_etag(&location, &mut meta);
                }
                meta
            })
            .collect())
    }

    /// The escaped keys of a local directory that start with `prefix` (none, at no cost, while there are none).
    pub(super) async fn local_escaped(&self, prefix: &str, what: &str) -> Result<Vec<ObjectMeta>> {
        let Some(root) = &self.inner.local_root else {
            return Ok(Vec::new());
        };
        if !root.join(crate::localkeys::ESCAPE_DIR).is_dir() {
            return Ok(Vec::new());
        }
        let dir = Path::from(crate::localkeys::ESCAPE_DIR);
        let mut stream = self.inner.store.list(Some(&dir));
        let mut out = Vec::new();
        while let Some(m) = stream.next().await {
            let m = m.map_err(|e| classify(e, what))?;
            let Some(key) = crate::localkeys::key_of(m.location.as_ref()) else {
                continue;
            };
            if key.starts_with(prefix) {
                let location = m.location.clone();
                let mut meta = convert_meta(m);
                self.show_local_etag(&location, &mut meta);
                meta.key = key;
                out.push(meta);
            }
        }
        out.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(out)
    }

    /// Whether a local directory holds `key` (in either of its places).
    pub(super) fn local_holds(&self, key: &str) -> bool {
        let Some(root) = &self.inner.local_root else {
            return false;
        };
        (crate::localkeys::plain_shape(key) && root.join(key).is_file())
            || root.join(crate::localkeys::escaped(key)).is_file()
    }
}

/// Whether the directory part of a listing prefix (up to its last `/`) can be a plain path on a local
/// directory, so that plain files can be under it.
pub(super) fn local_dir_walkable(prefix: &str) -> bool {
    match prefix.rfind('/') {
        Some(i) if i > 0 => crate::localkeys::plain_shape(&prefix[..i]),
        Some(_) => false,
        None => true,
    }
}

/// The most a local file's attributes take as JSON: ext4 keeps all of a file's extended attributes in one
/// 4 KiB block, which the ETag's attribute shares.
const LOCAL_ATTRS_MAX: usize = 3 * 1024;

/// `attrs` as the JSON kept with a local file, within [`LOCAL_ATTRS_MAX`]: the parts' checksums go first,
/// then the part sizes, as on object stores (`strata_types::extras`).
fn local_attrs_json(attrs: &ObjectAttrs) -> serde_json::Result<Vec<u8>> {
    let json = serde_json::to_vec(attrs)?;
    if json.len() <= LOCAL_ATTRS_MAX {
        return Ok(json);
    }
    let mut a = attrs.clone();
    if let Some(c) = &mut a.checksum {
        c.parts.clear();
    }
    let json = serde_json::to_vec(&a)?;
    if json.len() <= LOCAL_ATTRS_MAX {
        return Ok(json);
    }
    a.parts.clear();
    serde_json::to_vec(&a)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_attributes_fit_one_block_dropping_part_checksums_then_sizes() {
        let mut a = ObjectAttrs {
            content_type: Some("application/x-tar".into()),
            checksum: Some(strata_types::StoredChecksum {
                algorithm: strata_types::ChecksumAlgorithm::Sha256,
                value: "x".repeat(44) + "-200",
                full_object: false,
                parts: vec!["y".repeat(44); 200],
            }),
            parts: vec![5 << 20; 200],
            ..Default::default()
        };
        let json = local_attrs_json(&a).unwrap();
        assert!(json.len() <= LOCAL_ATTRS_MAX);
        let back: ObjectAttrs = serde_json::from_slice(&json).unwrap();
        assert!(back.checksum.as_ref().unwrap().parts.is_empty());
        assert_eq!(back.parts.len(), 200, "the sizes still fit");
        assert_eq!(back.content_type, a.content_type);
        a.parts = (0..1000).map(|i| (5 << 20) + i).collect();
        let back: ObjectAttrs = serde_json::from_slice(&local_attrs_json(&a).unwrap()).unwrap();
        assert!(back.parts.is_empty() && back.checksum.is_some());
        a.parts.truncate(3);
        a.checksum.as_mut().unwrap().parts.truncate(3);
        let back: ObjectAttrs = serde_json::from_slice(&local_attrs_json(&a).unwrap()).unwrap();
        assert_eq!(back, a, "small attributes are kept whole");
    }
}
