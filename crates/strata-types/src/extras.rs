//! What S3 keeps with an object that object stores other than S3 (and `object_store`'s attributes) have no
//! field for: `Expires`, the checksum a writer sent, and the sizes of the parts a multipart upload was made
//! of (for `partNumber` reads and `PartsCount`).
//!
//! A local directory keeps them in its attributes' JSON like every other attribute. An object store keeps
//! them in one reserved user-metadata entry, [`RESERVED_META`] (`x-amz-meta-strataobject` on S3; one word, as Azure allows only identifiers), written
//! by [`ObjectAttrs::extras_value`] and taken back out by [`ObjectAttrs::absorb_extras`], so clients never
//! see it among their metadata. Its value is form-encoded (`e=`, `c=`, `p=`, `k=`) and bounded: S3 allows 2
//! KiB of user metadata, so what does not fit in what the user's own metadata leaves is dropped, per-part
//! checksums first, then the part layout (documented in `docs/gateway.md`).

use crate::ObjectAttrs;

/// The user-metadata name under which object stores keep [`ObjectAttrs`]' extras.
pub const RESERVED_META: &str = "strataobject";

/// A checksum algorithm S3 accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum ChecksumAlgorithm {
    /// CRC-32 (IEEE).
    Crc32,
    /// CRC-32C (Castagnoli).
    Crc32c,
    /// CRC-64/NVME.
    Crc64nvme,
    /// SHA-1.
    Sha1,
    /// SHA-256.
    Sha256,
}

impl ChecksumAlgorithm {
    /// Every algorithm, in S3's order.
    pub const ALL: [Self; 5] = [
        Self::Crc32,
        Self::Crc32c,
        Self::Crc64nvme,
        Self::Sha1,
        Self::Sha256,
    ];

    /// S3's name (`CRC32`, `CRC32C`, `CRC64NVME`, `SHA1`, `SHA256`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Crc32 => "CRC32",
            Self::Crc32c => "CRC32C",
            Self::Crc64nvme => "CRC64NVME",
            Self::Sha1 => "SHA1",
            Self::Sha256 => "SHA256",
        }
    }

    /// The algorithm S3 names `s` (any case).
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL
            .into_iter()
            .find(|a| a.as_str().eq_ignore_ascii_case(s))
    }

    /// The suffix of its header, `x-amz-checksum-<suffix>`.
    pub fn header_suffix(self) -> &'static str {
        match self {
            Self::Crc32 => "crc32",
            Self::Crc32c => "crc32c",
            Self::Crc64nvme => "crc64nvme",
            Self::Sha1 => "sha1",
            Self::Sha256 => "sha256",
        }
    }

    /// Whether S3 can keep a full-object checksum of a multipart upload with it (the CRCs, which combine).
    pub fn combines(self) -> bool {
        matches!(self, Self::Crc32 | Self::Crc32c | Self::Crc64nvme)
    }
}

/// The checksum kept with an object, as S3 returns it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct StoredChecksum {
    /// Its algorithm.
    pub algorithm: ChecksumAlgorithm,
    /// Base64 of the checksum; for a composite checksum, of the checksum of the parts' raw checksums, then
    /// `-<number of parts>`.
    pub value: String,
    /// `FULL_OBJECT` (of all the bytes) rather than `COMPOSITE` (of the parts' checksums).
    pub full_object: bool,
    /// Base64 of each part's checksum, for a multipart object (empty where they were not kept).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub parts: Vec<String>,
}

impl StoredChecksum {
    /// `FULL_OBJECT` or `COMPOSITE`.
    pub fn kind(&self) -> &'static str {
        if self.full_object {
            "FULL_OBJECT"
        } else {
            "COMPOSITE"
        }
    }
}

/// Part sizes as runs, `size*count` joined by `.`: uploads of equal parts take a few bytes.
fn runs(parts: &[u64]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < parts.len() {
        let n = parts[i..].iter().take_while(|&&s| s == parts[i]).count();
        out.push(format!("{}*{n}", parts[i]));
        i += n;
    }
    out.join(".")
}

fn parse_runs(s: &str) -> Option<Vec<u64>> {
    let mut out = Vec::new();
    for run in s.split('.') {
        let (size, n) = run.split_once('*')?;
        let (size, n): (u64, usize) = (size.parse().ok()?, n.parse().ok()?);
        if n == 0 || out.len() + n > 10_000 {
            return None;
        }
        out.extend(std::iter::repeat_n(size, n));
    }
    Some(out)
}

/// Percent-encode a form value (everything but `A-Za-z0-9-_.~*:`).
fn enc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~*:".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn dec(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let h = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(h, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

impl ObjectAttrs {
    /// Whether any extra ([`Self::expires`], [`Self::checksum`], [`Self::parts`]) is set.
    pub fn has_extras(&self) -> bool {
        self.expires.is_some() || self.checksum.is_some() || !self.parts.is_empty()
    }

    /// The extras as the value of the [`RESERVED_META`] entry, at most `budget` bytes long (what the user's
    /// metadata leaves of S3's 2 KiB): per-part checksums go first, then the part layout, when they do
    /// not fit. `None` when there is nothing to keep.
    pub fn extras_value(&self, budget: usize) -> Option<String> {
        let mut fields: Vec<(char, String)> = Vec::new();
        if let Some(e) = &self.expires {
            fields.push(('e', enc(e)));
        }
        if let Some(c) = &self.checksum {
            let kind = if c.full_object { 'F' } else { 'C' };
            fields.push((
                'c',
                format!("{}:{}:{kind}", c.algorithm.as_str(), enc(&c.value)),
            ));
        }
        let layout = (!self.parts.is_empty()).then(|| runs(&self.parts));
        let part_sums = self
            .checksum
            .as_ref()
            .filter(|c| !c.parts.is_empty() && c.parts.len() == self.parts.len())
            .map(|c| c.parts.iter().map(|p| enc(p)).collect::<Vec<_>>().join("."));
        let join = |f: &[(char, String)]| {
            f.iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join("&")
        };
        let mut with = fields.clone();
        if let Some(l) = &layout {
            with.push(('p', l.clone()));
            if let Some(k) = &part_sums {
                let mut all = with.clone();
                all.push(('k', k.clone()));
                let v = join(&all);
                if RESERVED_META.len() + v.len() <= budget {
                    return Some(v);
                }
            }
        }
        for f in [with, fields] {
            let v = join(&f);
            if !f.is_empty() && RESERVED_META.len() + v.len() <= budget {
                return Some(v);
            }
        }
        None
    }

    /// Take the [`RESERVED_META`] entry out of the user metadata into the extras (an entry that does not
    /// parse is dropped: it is Strata's, never the user's).
    pub fn absorb_extras(&mut self) {
        let Some(v) = self.user.remove(RESERVED_META) else {
            return;
        };
        let mut part_sums = Vec::new();
        for pair in v.split('&') {
            let Some((k, val)) = pair.split_once('=') else {
                continue;
            };
            match k {
                "e" => self.expires = dec(val),
                "c" => {
                    let mut it = val.splitn(3, ':');
                    let (Some(a), Some(value), Some(kind)) = (it.next(), it.next(), it.next())
                    else {
                        continue;
                    };
                    if let (Some(algorithm), Some(value)) =
                        (ChecksumAlgorithm::parse(a), dec(value))
                    {
                        self.checksum = Some(StoredChecksum {
                            algorithm,
                            value,
                            full_object: kind == "F",
                            parts: Vec::new(),
                        });
                    }
                }
                "p" => self.parts = parse_runs(val).unwrap_or_default(),
                "k" => part_sums = val.split('.').filter_map(dec).collect(),
                _ => {}
            }
        }
        if let Some(c) = &mut self.checksum
            && part_sums.len() == self.parts.len()
        {
            c.parts = part_sums;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> ObjectAttrs {
        ObjectAttrs {
            expires: Some("Thu, 01 Dec 2033 16:00:00 GMT".into()),
            checksum: Some(StoredChecksum {
                algorithm: ChecksumAlgorithm::Sha256,
                value: "n4bQgYhMfWWaL+qgxVrQFaO/TxsrC4Is0V1sFbDwCgg=-3".into(),
                full_object: false,
                parts: vec!["a+/=".into(), "b".into(), "c".into()],
            }),
            parts: vec![5 << 20, 5 << 20, 17],
            ..Default::default()
        }
    }

    #[test]
    fn extras_round_trip_through_the_reserved_entry() {
        let a = sample();
        let v = a.extras_value(2048).unwrap();
        let mut b = ObjectAttrs::default();
        b.user.insert(RESERVED_META.into(), v);
        b.user.insert("mine".into(), "x".into());
        b.absorb_extras();
        assert_eq!(b.expires, a.expires);
        assert_eq!(b.checksum, a.checksum);
        assert_eq!(b.parts, a.parts);
        assert_eq!(b.user.len(), 1, "the reserved entry is never the user's");
    }

    #[test]
    fn what_does_not_fit_goes_part_checksums_first_then_the_layout() {
        let a = sample();
        let full = a.extras_value(2048).unwrap();
        let no_sums = a
            .extras_value(full.len() + RESERVED_META.len() - 1)
            .unwrap();
        assert!(no_sums.contains("p=") && !no_sums.contains("k="));
        let bare = a
            .extras_value(no_sums.len() + RESERVED_META.len() - 1)
            .unwrap();
        assert!(!bare.contains("p=") && bare.contains("c="));
        assert_eq!(a.extras_value(10), None);
        assert_eq!(ObjectAttrs::default().extras_value(2048), None);
    }

    #[test]
    fn a_damaged_entry_is_dropped_not_shown() {
        let mut b = ObjectAttrs::default();
        b.user
            .insert(RESERVED_META.into(), "c=NOPE:x:F&p=5*0&zz".into());
        b.absorb_extras();
        assert!(b.user.is_empty() && !b.has_extras());
    }

    #[test]
    fn runs_are_compact_and_exact() {
        let p = vec![8u64, 8, 8, 3, 8];
        assert_eq!(runs(&p), "8*3.3*1.8*1");
        assert_eq!(parse_runs(&runs(&p)).unwrap(), p);
        assert_eq!(parse_runs("1*10001"), None);
    }
}
