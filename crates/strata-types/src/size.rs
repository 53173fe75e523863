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

#[cfg(test)]
mod tests {
    use super::*;

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
