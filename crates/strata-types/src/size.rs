use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::Error;

/// A byte count written for humans: `8MiB`, `2 GiB`, `512k`, `1048576`. Binary units (KiB = 1024) for
/// `K/KB/KiB` alike: caches and disks are sized in binary units.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct ByteSize(pub u64);

impl ByteSize {
    /// The count in bytes.
    pub fn bytes(self) -> u64 {
        self.0
    }
    /// `n` mebibytes.
    pub const fn mib(n: u64) -> Self {
        Self(n * 1024 * 1024)
    }
    /// `n` gibibytes.
    pub const fn gib(n: u64) -> Self {
        Self(n * 1024 * 1024 * 1024)
    }
}

impl FromStr for ByteSize {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self, Error> {
        let t = s.trim();
        let split = t
            .find(|c: char| !c.is_ascii_digit() && c != '.')
            .unwrap_or(t.len());
        let (num, unit) = t.split_at(split);
        let bad = || {
            Error::invalid_input(format!(
                "invalid byte size {s:?}: expected a number with an optional unit (B, KiB, MiB, GiB, TiB)"
            ))
        };
        let n: f64 = num.parse().map_err(|_| bad())?;
        let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
            "" | "b" => 1,
            "k" | "kb" | "kib" => 1 << 10,
            "m" | "mb" | "mib" => 1 << 20,
            "g" | "gb" | "gib" => 1 << 30,
            "t" | "tb" | "tib" => 1 << 40,
            _ => return Err(bad()),
        };
        let v = n * mult as f64;
        if !v.is_finite() || v < 0.0 || v > u64::MAX as f64 {
            return Err(bad());
        }
        Ok(ByteSize(v.round() as u64))
    }
}

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const UNITS: [(&str, u64); 4] = [
            ("TiB", 1 << 40),
            ("GiB", 1 << 30),
            ("MiB", 1 << 20),
            ("KiB", 1 << 10),
        ];
        for (name, m) in UNITS {
            if self.0 >= m {
                if self.0.is_multiple_of(m) {
                    return write!(f, "{}{name}", self.0 / m);
                }
                return write!(f, "{:.1}{name}", self.0 as f64 / m as f64);
            }
        }
        write!(f, "{}B", self.0)
    }
}

impl Serialize for ByteSize {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_string())
    }
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            N(u64),
            S(String),
        }
        match Raw::deserialize(d)? {
            Raw::N(n) => Ok(ByteSize(n)),
            Raw::S(s) => s.parse().map_err(serde::de::Error::custom),
        }
    }
}

/// The space of a file system as `df` counts it: `usable` is what its users can fill (used + available),
/// not every block, since blocks reserved for root (`tune2fs -m`, most of a disk on some machines) are
/// neither free to Strata nor used; a fullness measured against every block calls such a disk full early.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FsSpace {
    /// Every block, in bytes (`df`'s Size).
    pub size: u64,
    /// Used + available bytes.
    pub usable: u64,
    /// Bytes an unprivileged writer may still fill.
    pub available: u64,
}

impl FsSpace {
    /// From `statvfs(3)`'s block counts (`f_blocks`, `f_bfree`, `f_bavail`) and fragment size.
    pub fn from_blocks(blocks: u64, free: u64, available: u64, frsize: u64) -> Self {
        let used = blocks.saturating_sub(free).saturating_mul(frsize);
        let available = available.saturating_mul(frsize);
        Self {
            size: blocks.saturating_mul(frsize),
            usable: used.saturating_add(available),
            available,
        }
    }

    /// Whether writing `bytes` more still leaves a tenth of `usable` available.
    pub fn keeps_a_tenth_free(&self, bytes: u64) -> bool {
        self.available >= bytes && self.available - bytes >= self.usable / 10
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tenth_free_is_counted_as_df_counts_it() {
        const G: u64 = 1 << 30;
        let fs = |available: u64, free: u64, blocks: u64| {
            FsSpace::from_blocks(blocks / 4096, free / 4096, available / 4096, 4096)
        };
        // A root file system seen on our machines: 252 GiB of blocks, 241 free, 80 available (161 reserved for
        // root): df says 12% used.
        assert_eq!(
            fs(80 * G, 241 * G, 252 * G),
            FsSpace {
                size: 252 * G,
                usable: 91 * G,
                available: 80 * G
            }
        );
        assert!(fs(80 * G, 241 * G, 252 * G).keeps_a_tenth_free(G));
        // The same disk with 52 GiB used and 20 available (df: 72% used): a 1 GiB write leaves 26% of what its
        // users can fill, though only 7.5% of every block.
        assert!(fs(20 * G, 200 * G, 252 * G).keeps_a_tenth_free(G));
        // 89 GiB used, 11 available: 11% free; 1 GiB more leaves 10%, 2 GiB more leave less.
        assert!(fs(11 * G, 11 * G, 100 * G).keeps_a_tenth_free(G));
        assert!(!fs(11 * G, 11 * G, 100 * G).keeps_a_tenth_free(2 * G));
        // Reserved blocks are not free to a writer: available is what counts.
        assert!(!fs(G / 2, 50 * G, 100 * G).keeps_a_tenth_free(G));
        assert!(!fs(0, 0, 0).keeps_a_tenth_free(1));
    }

    #[test]
    fn parses_units() {
        assert_eq!("8MiB".parse::<ByteSize>().unwrap(), ByteSize::mib(8));
        assert_eq!("2 GiB".parse::<ByteSize>().unwrap(), ByteSize::gib(2));
        assert_eq!("512k".parse::<ByteSize>().unwrap(), ByteSize(512 * 1024));
        assert_eq!("1.5KiB".parse::<ByteSize>().unwrap(), ByteSize(1536));
        assert_eq!("42".parse::<ByteSize>().unwrap(), ByteSize(42));
        for bad in ["", "MiB", "8 furlongs", "-1", "1e400"] {
            assert!(bad.parse::<ByteSize>().is_err(), "{bad}");
        }
    }

    #[test]
    fn displays_round_trip() {
        for v in [0, 1, 1024, 8 << 20, 3 << 30] {
            let s = ByteSize(v).to_string();
            assert_eq!(s.parse::<ByteSize>().unwrap(), ByteSize(v), "{s}");
        }
    }
}
