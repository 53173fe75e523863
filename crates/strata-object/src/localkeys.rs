//! How S3 keys map to files in a local-directory backend, so that every key S3 allows can be stored.
//!
//! A key is a **plain** file at its own path whenever it can be: every segment non-empty, not `.` or `..`,
//! at most 255 bytes, not ending in `#<digits>` (the file store's in-progress uploads), the key not ending in
//! `/`, and nothing else in the way: no object where one of its directories would be, no directory where
//! its file would be. Files other tools put in the directory are read as the keys their paths spell, and new
//! objects are plain files wherever their key is a plain path.
//!
//! Every other key is **escaped**: stored under the reserved directory [`ESCAPE_DIR`] as the hex of its
//! bytes, cut into directory levels of at most 200 characters, the last one ending in `.k`
//! (`.strata-keys/<hex>/<hex>.k`). The name is the key, reversibly: listings decode it, and no key can name
//! a path outside the escape directory. The `.k` ending keeps a key whose hex is a prefix of another's from
//! being a file where the other needs a directory. Attributes stay where they are for plain files (the file's
//! extended attribute).
//!
//! A key lives in exactly one place: a write to one place removes the key from the other (a key escaped for a
//! conflict that has since gone is written plain again), reads look at the plain path first and then the
//! escaped one, deletes remove both, and a listing that finds both shows the key once.

use std::path::Path as FsPath;

/// The directory escaped keys live in, directly under the backend's root. No key is ever stored plain there.
pub(crate) const ESCAPE_DIR: &str = ".strata-keys";

/// Hex characters per escaped directory level (the last level adds `.k`: within 255 bytes).
const LEVEL: usize = 200;

/// Whether `key` has the shape of a plain file path (conflicts with what exists aside).
pub(crate) fn plain_shape(key: &str) -> bool {
    if key.is_empty() || key.ends_with('/') || key.starts_with('/') {
        return false;
    }
    if key == ESCAPE_DIR || key.starts_with(&format!("{ESCAPE_DIR}/")) {
        return false;
    }
    if key.contains('\0') || key.contains('\\') {
        return false;
    }
    key.split('/').all(|seg| {
        !seg.is_empty()
            && seg != "."
            && seg != ".."
            && seg.len() <= 255
            && !ends_with_hash_digits(seg)
            // object_store's `Path` must keep it as it is.
            && object_store::path::Path::parse(seg).is_ok_and(|p| p.as_ref() == seg)
    })
}

fn ends_with_hash_digits(seg: &str) -> bool {
    match seg.rfind('#') {
        Some(i) => {
            let digits = &seg[i + 1..];
            !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit())
        }
        None => false,
    }
}

/// The longest file name a write makes plain: the file store writes `<name>#<n>` first and renames it, and
/// that name too must fit in 255 bytes. A longer name is written escaped (one another tool put there as a
/// plain file is still read).
const PLAIN_WRITE_NAME_MAX: usize = 255 - 11;

/// Whether `key` can be written as a plain file under `root` now: plain in shape, its file name short enough
/// to be written ([`PLAIN_WRITE_NAME_MAX`]), no object where one of its directories would be, no directory
/// where its file would be.
pub(crate) fn plain_now(root: &FsPath, key: &str) -> bool {
    if !plain_shape(key) {
        return false;
    }
    if key
        .rsplit('/')
        .next()
        .is_some_and(|name| name.len() > PLAIN_WRITE_NAME_MAX)
    {
        return false;
    }
    let mut here = root.to_path_buf();
    let segments: Vec<&str> = key.split('/').collect();
    for (i, seg) in segments.iter().enumerate() {
        here.push(seg);
        let last = i + 1 == segments.len();
        match std::fs::symlink_metadata(&here) {
            Ok(m) if !last && !m.is_dir() => return false,
            Ok(m) if last && m.is_dir() => return false,
            Ok(_) => {}
            Err(_) => return true,
        }
    }
    true
}

/// The store path (relative to the root) of an escaped key.
pub(crate) fn escaped(key: &str) -> String {
    let mut hex = String::with_capacity(key.len() * 2);
    for b in key.as_bytes() {
        hex.push_str(&format!("{b:02x}"));
    }
    let mut out = String::from(ESCAPE_DIR);
    let levels: Vec<&str> = hex
        .as_bytes()
        .chunks(LEVEL)
        .map(|c| std::str::from_utf8(c).unwrap_or_default())
        .collect();
    for (i, l) in levels.iter().enumerate() {
        out.push('/');
        out.push_str(l);
        if i + 1 == levels.len() {
            out.push_str(".k");
        }
    }
    if levels.is_empty() {
        out.push_str("/.k");
    }
    out
}

/// The key a store location (relative to the root) holds: the location itself for a plain file, the decoded
/// name under [`ESCAPE_DIR`]; `None` for anything else there (a partial write, a stray file).
pub(crate) fn key_of(location: &str) -> Option<String> {
    let Some(rest) = location.strip_prefix(ESCAPE_DIR) else {
        return Some(location.to_string());
    };
    let hex = rest.strip_prefix('/')?.strip_suffix(".k")?;
    let hex: String = hex.split('/').collect();
    if !hex.len().is_multiple_of(2) {
        return None;
    }
    let bytes: Option<Vec<u8>> = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok())
        .collect();
    String::from_utf8(bytes?).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes() {
        for k in ["a", "a/b.bin", "x y/+%#z", "d/é"] {
            assert!(plain_shape(k), "{k}");
        }
        for k in [
            "",
            "a/",
            "/a",
            "a//b",
            "./z",
            "a/../b",
            "version#1",
            "v#12/x",
            ".strata-keys/x",
            ".strata-keys",
            "a\\b",
        ] {
            assert!(!plain_shape(k), "{k:?}");
        }
        assert!(plain_shape("a#b") && plain_shape("a#") && plain_shape(".strata-keysx"));
        assert!(!plain_shape(&"s".repeat(256)) && plain_shape(&"s".repeat(255)));
    }

    #[test]
    fn escaped_names_decode_to_their_keys_and_never_nest_in_each_other() {
        for k in [
            "a/",
            "x//y",
            "../../etc/passwd",
            "v#1",
            &"k".repeat(1024),
            "é/",
        ] {
            let p = escaped(k);
            assert!(p.starts_with(".strata-keys/") && p.ends_with(".k"), "{p}");
            assert!(
                p.split('/')
                    .all(|s| s.len() <= 255 && s != ".." && s != ".")
            );
            assert_eq!(key_of(&p).as_deref(), Some(k));
        }
        // 100 bytes = one full level of hex: a longer key with the same start is a directory beside it.
        let a = "a".repeat(100);
        let b = "a".repeat(150);
        let (pa, pb) = (escaped(&a), escaped(&b));
        assert!(!pb.starts_with(&format!("{pa}/")));
        assert_eq!(key_of("plain/key"), Some("plain/key".into()));
        assert_eq!(key_of(".strata-keys/zz.k"), None);
        assert_eq!(key_of(".strata-keys/6162"), None);
    }
}
