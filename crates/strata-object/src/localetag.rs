//! ETags of a local-directory backend: the MD5 of the content, as S3 gives single-part objects, so that
//! clients that check hashes by ETag (rclone, the aws cli's sync) can.
//!
//! The file store's own ETag is `inode-mtime-size`: it names a version (and pins fills to it: a read pinned
//! to it fails if the file is replaced), but it is no hash. So every write through Strata records the
//! public ETag (the content's MD5, or the S3 multipart form the gateway gives) in the file's
//! [`ETAG_XATTR`] extended attribute, stamped with the file store's ETag of the file written. A read takes
//! the recorded ETag only while the stamp is still the file's (a file rewritten in place by another tool has
//! another mtime or size), else the file store's; a read pinned to the public ETag is pinned to the stamp, so
//! the file store still checks it against the very file it opened. Files put there by other tools have the
//! file store's ETag until Strata writes them.

use std::path::Path;

/// The extended attribute holding a file's public ETag and its stamp (`<etag>\n<file store etag>`).
pub(crate) const ETAG_XATTR: &str = "user.strata.etag";

/// Record `public` as the ETag of `file`, whose file store ETag is `stamp`. A file system without user
/// extended attributes keeps none (the file store's ETag stands).
pub(crate) fn record(file: &Path, public: &str, stamp: &str) {
    let value = format!("{public}\n{stamp}");
    let _ = rustix::fs::setxattr(
        file,
        ETAG_XATTR,
        value.as_bytes(),
        rustix::fs::XattrFlags::empty(),
    );
}

/// The recorded (public ETag, stamp) of `file`, if any.
fn recorded(file: &Path) -> Option<(String, String)> {
    let mut buf = [0u8; 512];
    let n = rustix::fs::getxattr(file, ETAG_XATTR, &mut buf[..]).ok()?;
    let text = std::str::from_utf8(buf.get(..n)?).ok()?;
    let (public, stamp) = text.split_once('\n')?;
    Some((public.to_string(), stamp.to_string()))
}

/// The ETag to show for `file`, whose file store ETag is `store`: the recorded one while its stamp is `store`.
pub(crate) fn public(file: &Path, store: &str) -> String {
    match recorded(file) {
        Some((public, stamp)) if stamp == store => public,
        _ => store.to_string(),
    }
}

/// The file store ETag to pin a read of `file` to when the caller pins it to `want` (a public ETag it was
/// shown): the recorded stamp when `want` is the recorded ETag, else `want` itself.
pub(crate) fn pin(file: &Path, want: &str) -> String {
    let bare = |s: &str| s.trim_start_matches("W/").trim_matches('"').to_string();
    match recorded(file) {
        Some((public, stamp)) if bare(&public) == bare(want) => stamp,
        // Not the recorded ETag: the file store's own, as the caller was given it (quotes and all).
        _ => want.to_string(),
    }
}

/// Hex MD5 of bytes fed in pieces.
#[derive(Default, Clone)]
pub(crate) struct Md5(md5::Md5);

impl Md5 {
    pub(crate) fn update(&mut self, bytes: &[u8]) {
        use md5::Digest;
        self.0.update(bytes);
    }

    pub(crate) fn hex(self) -> String {
        use md5::Digest;
        self.0
            .finalize()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_recorded_etag_holds_only_for_the_file_it_was_stamped_for() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("obj");
        std::fs::write(&f, b"x").unwrap();
        assert_eq!(public(&f, "ino-1-1"), "ino-1-1");
        record(&f, "9dd4e461268c8034f5c8564e155c67a6", "ino-1-1");
        assert_eq!(public(&f, "ino-1-1"), "9dd4e461268c8034f5c8564e155c67a6");
        assert_eq!(pin(&f, "\"9dd4e461268c8034f5c8564e155c67a6\""), "ino-1-1");
        // Rewritten in place by another tool: another mtime, the file store's ETag again.
        assert_eq!(public(&f, "ino-2-1"), "ino-2-1");
        assert_eq!(pin(&f, "\"ino-2-1\""), "\"ino-2-1\"");
        let mut h = Md5::default();
        h.update(b"x");
        assert_eq!(h.hex(), "9dd4e461268c8034f5c8564e155c67a6");
    }
}
