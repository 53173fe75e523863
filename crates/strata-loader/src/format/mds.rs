//! MosaicML Streaming (MDS) shards: `index.json` plus `shard.NNNNN.mds` files.
//!
//! A shard is `u32 n`, `n + 1` u32 absolute sample offsets, the shard's JSON config, then the samples. A sample
//! holds one little-endian u32 size per variable-size column, then the columns' bytes in column order. Column
//! values are decoded here into [`Value`]s; image and pickle columns stay bytes (the loader never unpickles).
//! Compressed shards (`zip_data`) are refused with a clear error.

use bytes::Bytes;
use serde::Deserialize;
use strata_types::{Error, ErrorKind, Result};

/// A decoded column value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// Raw bytes (`bytes`, `jpeg`, `png`, `pil`, `pkl`, `jpeg_array`, `list[...]`).
    Bytes(Bytes),
    /// `str` and `str_decimal`.
    Str(String),
    /// `int`, the integer scalars and `str_int`.
    Int(i64),
    /// Unsigned 64-bit values above `i64::MAX`.
    UInt(u64),
    /// `float16/32/64` and `str_float`.
    Float(f64),
    /// `ndarray[:dtype[:shape]]`: numpy dtype name, shape, little-endian values.
    Array {
        /// numpy dtype name (`float32`, `uint8`, ...).
        dtype: &'static str,
        /// Dimensions.
        shape: Vec<u64>,
        /// The values, C order.
        data: Bytes,
    },
    /// `json`: the JSON text, for the caller to parse.
    Json(String),
}

/// `index.json` of an MDS dataset.
#[derive(Debug, Clone, Deserialize)]
pub struct Index {
    /// The shards in order.
    pub shards: Vec<ShardInfo>,
    /// Format version (2).
    #[serde(default)]
    pub version: u32,
}

/// One entry of `index.json`.
#[derive(Debug, Clone, Deserialize)]
pub struct ShardInfo {
    /// Column encodings.
    pub column_encodings: Vec<String>,
    /// Column names.
    pub column_names: Vec<String>,
    /// Fixed sizes, `None` for variable-size columns.
    pub column_sizes: Vec<Option<u64>>,
    /// Compression algorithm, if any.
    #[serde(default)]
    pub compression: Option<String>,
    /// `"mds"`.
    pub format: String,
    /// The uncompressed shard file.
    pub raw_data: FileInfo,
    /// Samples in the shard.
    pub samples: u64,
}

/// A shard file named by the index.
#[derive(Debug, Clone, Deserialize)]
pub struct FileInfo {
    /// File name relative to the index.
    pub basename: String,
    /// Size in bytes.
    pub bytes: u64,
}

fn bad(what: impl std::fmt::Display) -> Error {
    Error::new(ErrorKind::Corrupt, what.to_string())
}

impl Index {
    /// Parse and check `index.json`.
    pub fn parse(text: &[u8], name: &str) -> Result<Self> {
        let idx: Index = serde_json::from_slice(text)
            .map_err(|e| bad(format!("{name}: not an MDS index: {e}")))?;
        for (i, s) in idx.shards.iter().enumerate() {
            let shard = &s.raw_data.basename;
            if s.format != "mds" {
                return Err(Error::new(
                    ErrorKind::Unsupported,
                    format!(
                        "{name}: shard {i} ({shard}) has format {:?}; only \"mds\" is read",
                        s.format
                    ),
                ));
            }
            if let Some(c) = &s.compression {
                return Err(Error::new(
                    ErrorKind::Unsupported,
                    format!(
                        "{name}: shard {shard} is compressed with {c}; compressed MDS shards are not read yet (write them with compression=None)"
                    ),
                ));
            }
            if s.column_names.len() != s.column_encodings.len()
                || s.column_names.len() != s.column_sizes.len()
            {
                return Err(bad(format!(
                    "{name}: shard {shard}: column names, encodings and sizes differ in length"
                )));
            }
            for enc in &s.column_encodings {
                Encoding::parse(enc).map_err(|e| e.context(format!("{name}: shard {shard}")))?;
            }
            if shard.contains("..") || shard.starts_with('/') {
                return Err(bad(format!(
                    "{name}: shard basename {shard:?} leaves the dataset"
                )));
            }
        }
        Ok(idx)
    }
}

/// Parsed column encoding.
#[derive(Debug, Clone, PartialEq)]
enum Encoding {
    Raw,
    Str,
    Int,
    Scalar(&'static str),
    StrInt,
    StrFloat,
    StrDecimal,
    NdArray {
        dtype: Option<&'static str>,
        shape: Option<Vec<u64>>,
    },
    Json,
}

const DTYPES: &[(u8, &str, usize)] = &[
    (8, "uint8", 1),
    (9, "int8", 1),
    (16, "uint16", 2),
    (17, "int16", 2),
    (18, "float16", 2),
    (32, "uint32", 4),
    (33, "int32", 4),
    (34, "float32", 4),
    (64, "uint64", 8),
    (65, "int64", 8),
    (66, "float64", 8),
];

fn dtype_named(name: &str) -> Option<(&'static str, usize)> {
    DTYPES.iter().find(|d| d.1 == name).map(|d| (d.1, d.2))
}

impl Encoding {
    fn parse(s: &str) -> Result<Self> {
        Ok(match s {
            "bytes" | "pkl" | "jpeg" | "png" | "pil" | "jpeg_array" | "jpegarray" | "list[pil]"
            | "list[jpeg]" | "list[png]" => Self::Raw,
            "str" => Self::Str,
            "int" => Self::Int,
            "str_int" => Self::StrInt,
            "str_float" => Self::StrFloat,
            "str_decimal" => Self::StrDecimal,
            "json" => Self::Json,
            s if dtype_named(s).is_some() => {
                Self::Scalar(dtype_named(s).map(|d| d.0).unwrap_or(""))
            }
            s if s == "ndarray" || s.starts_with("ndarray:") => {
                let mut parts = s.split(':').skip(1);
                let dtype = match parts.next() {
                    Some(d) => Some(
                        dtype_named(d)
                            .ok_or_else(|| bad(format!("ndarray dtype {d:?} is not an MDS dtype")))?
                            .0,
                    ),
                    None => None,
                };
                let shape = match parts.next() {
                    Some(sh) => Some(
                        sh.split(',')
                            .map(|x| {
                                x.trim()
                                    .parse::<u64>()
                                    .map_err(|_| bad(format!("ndarray shape {sh:?}")))
                            })
                            .collect::<Result<Vec<_>>>()?,
                    ),
                    None => None,
                };
                Self::NdArray { dtype, shape }
            }
            other => {
                return Err(Error::new(
                    ErrorKind::Unsupported,
                    format!("MDS column encoding {other:?} is not supported"),
                ));
            }
        })
    }
}

/// A shard's decoding recipe, from its index entry.
#[derive(Debug, Clone)]
pub struct Columns {
    names: Vec<String>,
    encodings: Vec<Encoding>,
    sizes: Vec<Option<u64>>,
}

impl Columns {
    /// From an (already validated) index entry.
    pub fn new(info: &ShardInfo) -> Result<Self> {
        Ok(Self {
            names: info.column_names.clone(),
            encodings: info
                .column_encodings
                .iter()
                .map(|e| Encoding::parse(e))
                .collect::<Result<_>>()?,
            sizes: info.column_sizes.clone(),
        })
    }

    /// Decode one sample's bytes into named values (byte values share `buf`).
    pub fn decode(&self, shard: &str, index: u64, buf: &Bytes) -> Result<Vec<(String, Value)>> {
        let err = |why: String| bad(format!("shard {shard}: sample {index}: {why}"));
        let mut idx = 0usize;
        let mut sizes = Vec::with_capacity(self.sizes.len());
        for s in &self.sizes {
            match s {
                Some(n) => sizes.push(*n as usize),
                None => {
                    let b = buf
                        .get(idx..idx + 4)
                        .ok_or_else(|| err("truncated size table".into()))?;
                    sizes.push(u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize);
                    idx += 4;
                }
            }
        }
        let mut out = Vec::with_capacity(self.names.len());
        for ((name, enc), size) in self.names.iter().zip(&self.encodings).zip(sizes) {
            let end = idx
                .checked_add(size)
                .filter(|&e| e <= buf.len())
                .ok_or_else(|| err(format!("column {name:?} runs past the sample ({size} bytes at {idx}, sample is {})", buf.len())))?;
            let raw = buf.slice(idx..end);
            idx = end;
            let text = |raw: &Bytes| {
                std::str::from_utf8(raw)
                    .map(str::to_string)
                    .map_err(|_| err(format!("column {name:?} is not UTF-8")))
            };
            let v = match enc {
                Encoding::Raw => Value::Bytes(raw),
                Encoding::Str | Encoding::StrDecimal => Value::Str(text(&raw)?),
                Encoding::Json => Value::Json(text(&raw)?),
                Encoding::StrInt => Value::Int(
                    text(&raw)?
                        .trim()
                        .parse()
                        .map_err(|_| err(format!("column {name:?} is not an integer")))?,
                ),
                Encoding::StrFloat => Value::Float(
                    text(&raw)?
                        .trim()
                        .parse()
                        .map_err(|_| err(format!("column {name:?} is not a float")))?,
                ),
                Encoding::Int => {
                    scalar("int64", &raw).ok_or_else(|| err(format!("column {name:?}: bad int")))?
                }
                Encoding::Scalar(dt) => {
                    scalar(dt, &raw).ok_or_else(|| err(format!("column {name:?}: bad {dt}")))?
                }
                Encoding::NdArray { dtype, shape } => ndarray(*dtype, shape.as_deref(), raw)
                    .map_err(|why| err(format!("column {name:?}: {why}")))?,
            };
            out.push((name.clone(), v));
        }
        Ok(out)
    }
}

fn f16_to_f64(bits: u16) -> f64 {
    let sign = if bits & 0x8000 != 0 { -1.0 } else { 1.0 };
    let exp = i32::from((bits >> 10) & 0x1f);
    let frac = f64::from(bits & 0x3ff);
    match exp {
        0 => sign * frac * 2f64.powi(-24),
        31 if frac == 0.0 => sign * f64::INFINITY,
        31 => f64::NAN,
        e => sign * (1.0 + frac / 1024.0) * 2f64.powi(e - 15),
    }
}

fn scalar(dtype: &str, b: &[u8]) -> Option<Value> {
    let arr = |n: usize| -> Option<[u8; 8]> {
        if b.len() != n {
            return None;
        }
        let mut a = [0u8; 8];
        a[..n].copy_from_slice(b);
        Some(a)
    };
    Some(match dtype {
        "uint8" => Value::Int(i64::from(b.first().copied().filter(|_| b.len() == 1)?)),
        "int8" => Value::Int(i64::from(i8::from_le_bytes([*b
            .first()
            .filter(|_| b.len() == 1)?]))),
        "uint16" => Value::Int(i64::from(u16::from_le_bytes(arr(2)?[..2].try_into().ok()?))),
        "int16" => Value::Int(i64::from(i16::from_le_bytes(arr(2)?[..2].try_into().ok()?))),
        "uint32" => Value::Int(i64::from(u32::from_le_bytes(arr(4)?[..4].try_into().ok()?))),
        "int32" => Value::Int(i64::from(i32::from_le_bytes(arr(4)?[..4].try_into().ok()?))),
        "uint64" => {
            let v = u64::from_le_bytes(arr(8)?);
            i64::try_from(v).map_or(Value::UInt(v), Value::Int)
        }
        "int64" => Value::Int(i64::from_le_bytes(arr(8)?)),
        "float16" => Value::Float(f16_to_f64(u16::from_le_bytes(
            arr(2)?[..2].try_into().ok()?,
        ))),
        "float32" => Value::Float(f64::from(f32::from_le_bytes(arr(4)?[..4].try_into().ok()?))),
        "float64" => Value::Float(f64::from_le_bytes(arr(8)?)),
        _ => return None,
    })
}

fn ndarray(
    dtype: Option<&'static str>,
    shape: Option<&[u64]>,
    raw: Bytes,
) -> Result<Value, String> {
    let mut idx = 0usize;
    let dtype = match dtype {
        Some(d) => d,
        None => {
            let code = *raw.first().ok_or("empty ndarray")?;
            idx += 1;
            DTYPES
                .iter()
                .find(|d| d.0 == code)
                .map(|d| d.1)
                .ok_or_else(|| format!("unknown ndarray dtype code {code}"))?
        }
    };
    let shape: Vec<u64> = match shape {
        Some(s) => s.to_vec(),
        None => {
            let byte = *raw.get(idx).ok_or("truncated ndarray header")?;
            idx += 1;
            let ndim = usize::from(byte >> 2);
            let w = 1usize << (byte & 3);
            let dims = raw
                .get(idx..idx + ndim * w)
                .ok_or("truncated ndarray shape")?;
            idx += ndim * w;
            dims.chunks(w)
                .map(|c| {
                    let mut a = [0u8; 8];
                    a[..w].copy_from_slice(c);
                    u64::from_le_bytes(a)
                })
                .collect()
        }
    };
    let item = dtype_named(dtype).map(|d| d.1).unwrap_or(1) as u64;
    let want = shape
        .iter()
        .try_fold(item, |a, &d| a.checked_mul(d))
        .ok_or("ndarray shape overflows")?;
    let data = raw.slice(idx..);
    if data.len() as u64 != want {
        return Err(format!(
            "ndarray of {dtype} {shape:?} needs {want} bytes, has {}",
            data.len()
        ));
    }
    Ok(Value::Array { dtype, shape, data })
}

/// Parse a shard's header: the sample offsets (n + 1 of them) from the first bytes of the shard.
/// `head` must hold at least `4 * (n + 2)` bytes, where `n` is the index's sample count.
pub fn offsets(shard: &str, head: &[u8], samples: u64, size: u64) -> Result<Vec<u64>> {
    let n = head
        .get(..4)
        .map(|b| u64::from(u32::from_le_bytes([b[0], b[1], b[2], b[3]])))
        .ok_or_else(|| bad(format!("shard {shard}: truncated header")))?;
    if n != samples {
        return Err(bad(format!(
            "shard {shard}: holds {n} samples, the index says {samples}; the index does not match the shard"
        )));
    }
    let table = head
        .get(4..4 + 4 * (n as usize + 1))
        .ok_or_else(|| bad(format!("shard {shard}: truncated offset table")))?;
    let offs: Vec<u64> = table
        .chunks_exact(4)
        .map(|c| u64::from(u32::from_le_bytes([c[0], c[1], c[2], c[3]])))
        .collect();
    if offs.windows(2).any(|w| w[1] < w[0]) || offs.last().copied().unwrap_or(0) > size {
        return Err(bad(format!(
            "shard {shard}: sample offsets are not increasing or run past the shard's {size} bytes (truncated shard?)"
        )));
    }
    Ok(offs)
}
