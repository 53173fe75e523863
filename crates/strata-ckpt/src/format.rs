//! Shard files in the safetensors format: `u64 LE header length | JSON header | tensor bytes`.
//!
//! The header maps each tensor name to `{"dtype", "shape", "data_offsets": [begin, end]}` (offsets relative to
//! the end of the header) and may hold `"__metadata__"` (string to string). Any safetensors reader
//! (`safetensors.numpy.load_file`, `safetensors.torch.load_file`) reads Strata's shards. The header is padded
//! with spaces to a multiple of 8 bytes, as the reference implementation does, so tensor data is aligned.

use std::collections::BTreeMap;

use bytes::Bytes;
use serde_json::{Map, Value, json};
use strata_types::{Error, ErrorKind, Result};

/// One named tensor (or byte blob: dtype `U8`, shape `[len]`).
#[derive(Debug, Clone, PartialEq)]
pub struct Tensor {
    /// Name (unique within a shard).
    pub name: String,
    /// safetensors dtype: `F64 F32 F16 BF16 I64 I32 I16 I8 U64 U32 U16 U8 BOOL F8_E4M3 F8_E5M2`.
    pub dtype: String,
    /// Dimensions.
    pub shape: Vec<u64>,
    /// Little-endian values in C order.
    pub data: Bytes,
}

/// Bytes per element of a safetensors dtype.
pub fn dtype_size(dtype: &str) -> Option<u64> {
    Some(match dtype {
        "BOOL" | "U8" | "I8" | "F8_E4M3" | "F8_E5M2" => 1,
        "I16" | "U16" | "F16" | "BF16" => 2,
        "I32" | "U32" | "F32" => 4,
        "I64" | "U64" | "F64" => 8,
        _ => return None,
    })
}

fn corrupt(file: &str, why: impl std::fmt::Display) -> Error {
    Error::new(ErrorKind::Corrupt, format!("shard {file}: {why}"))
}

impl Tensor {
    /// Check dtype, shape and length against each other.
    pub fn validate(&self) -> Result<()> {
        let size = dtype_size(&self.dtype).ok_or_else(|| {
            Error::invalid_input(format!(
                "tensor {:?}: unknown dtype {:?}",
                self.name, self.dtype
            ))
        })?;
        let want = self
            .shape
            .iter()
            .try_fold(size, |a, &d| a.checked_mul(d))
            .ok_or_else(|| {
                Error::invalid_input(format!("tensor {:?}: shape overflows", self.name))
            })?;
        if want != self.data.len() as u64 {
            return Err(Error::invalid_input(format!(
                "tensor {:?}: {} {:?} needs {want} bytes, got {}",
                self.name,
                self.dtype,
                self.shape,
                self.data.len()
            )));
        }
        if self.name.is_empty() || self.name == "__metadata__" {
            return Err(Error::invalid_input(format!(
                "tensor name {:?} is reserved",
                self.name
            )));
        }
        Ok(())
    }
}

/// A tensor's name, dtype and shape, before its bytes exist.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spec {
    /// Name.
    pub name: String,
    /// safetensors dtype.
    pub dtype: String,
    /// Dimensions.
    pub shape: Vec<u64>,
}

impl Spec {
    /// Bytes of the tensor, checked.
    pub fn byte_len(&self) -> Result<u64> {
        let size = dtype_size(&self.dtype).ok_or_else(|| {
            Error::invalid_input(format!(
                "tensor {:?}: unknown dtype {:?}",
                self.name, self.dtype
            ))
        })?;
        self.shape
            .iter()
            .try_fold(size, |a, &d| a.checked_mul(d))
            .ok_or_else(|| Error::invalid_input(format!("tensor {:?}: shape overflows", self.name)))
    }
}

/// The header for tensors described by `specs`, laid out in order, and the total file size.
pub fn encode_header_for(
    specs: &[Spec],
    metadata: &BTreeMap<String, String>,
) -> Result<(Vec<u8>, u64)> {
    let entries = specs
        .iter()
        .map(|s| {
            Ok((
                s.name.as_str(),
                s.dtype.as_str(),
                &s.shape[..],
                s.byte_len()?,
            ))
        })
        .collect::<Result<Vec<_>>>()?;
    header_of(&entries, metadata)
}

/// The header (with its length prefix) for `tensors` laid out in order, and the total file size.
pub fn encode_header(
    tensors: &[Tensor],
    metadata: &BTreeMap<String, String>,
) -> Result<(Vec<u8>, u64)> {
    for t in tensors {
        t.validate()?;
    }
    let entries: Vec<_> = tensors
        .iter()
        .map(|t| {
            (
                t.name.as_str(),
                t.dtype.as_str(),
                &t.shape[..],
                t.data.len() as u64,
            )
        })
        .collect();
    header_of(&entries, metadata)
}

fn header_of(
    entries: &[(&str, &str, &[u64], u64)],
    metadata: &BTreeMap<String, String>,
) -> Result<(Vec<u8>, u64)> {
    let mut map = Map::new();
    if !metadata.is_empty() {
        map.insert("__metadata__".into(), json!(metadata));
    }
    let mut off = 0u64;
    for &(name, dtype, shape, len) in entries {
        if name.is_empty() || name == "__metadata__" {
            return Err(Error::invalid_input(format!(
                "tensor name {name:?} is reserved"
            )));
        }
        if map.contains_key(name) {
            return Err(Error::invalid_input(format!(
                "tensor name {name:?} appears twice"
            )));
        }
        let end = off + len;
        map.insert(
            name.to_string(),
            json!({"dtype": dtype, "shape": shape, "data_offsets": [off, end]}),
        );
        off = end;
    }
    let mut header =
        serde_json::to_vec(&Value::Object(map)).map_err(|e| Error::internal(e.to_string()))?;
    while header.len() % 8 != 0 {
        header.push(b' ');
    }
    let mut out = Vec::with_capacity(8 + header.len());
    out.extend_from_slice(&(header.len() as u64).to_le_bytes());
    out.extend_from_slice(&header);
    let total = out.len() as u64 + off;
    Ok((out, total))
}

/// One tensor's place in a shard file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Name.
    pub name: String,
    /// safetensors dtype.
    pub dtype: String,
    /// Dimensions.
    pub shape: Vec<u64>,
    /// Byte range in the file.
    pub range: std::ops::Range<usize>,
}

/// Parse a shard file's header: its tensors (in data order, with their byte ranges in `buf`) and metadata.
pub fn parse(file: &str, buf: &[u8]) -> Result<(Vec<Entry>, BTreeMap<String, String>)> {
    parse_header(file, buf, buf.len() as u64)
}

/// Like [`parse`], from the start of a file of `total` bytes (`head` must hold at least its header).
pub fn parse_header(
    file: &str,
    head: &[u8],
    total: u64,
) -> Result<(Vec<Entry>, BTreeMap<String, String>)> {
    let buf = head;
    let n = buf
        .get(..8)
        .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
        .ok_or_else(|| corrupt(file, "shorter than its header length"))?;
    let hend = 8u64
        .checked_add(n)
        .filter(|&e| e <= buf.len() as u64 && e <= total)
        .ok_or_else(|| {
            corrupt(
                file,
                format!("header of {n} bytes runs past the file ({total} bytes)"),
            )
        })? as usize;
    let header: Map<String, Value> = serde_json::from_slice(&buf[8..hend])
        .map_err(|e| corrupt(file, format!("header is not JSON: {e}")))?;
    let data_len = total - hend as u64;
    let mut metadata = BTreeMap::new();
    let mut entries = Vec::new();
    for (name, v) in header {
        if name == "__metadata__" {
            if let Value::Object(m) = v {
                for (k, v) in m {
                    metadata.insert(k, v.as_str().unwrap_or_default().to_string());
                }
            }
            continue;
        }
        let dtype = v["dtype"]
            .as_str()
            .ok_or_else(|| corrupt(file, format!("{name}: no dtype")))?;
        let shape: Vec<u64> = v["shape"]
            .as_array()
            .ok_or_else(|| corrupt(file, format!("{name}: no shape")))?
            .iter()
            .map(|d| {
                d.as_u64()
                    .ok_or_else(|| corrupt(file, format!("{name}: bad shape")))
            })
            .collect::<Result<_>>()?;
        let offs = v["data_offsets"]
            .as_array()
            .ok_or_else(|| corrupt(file, format!("{name}: no offsets")))?;
        let (b, e) = match (
            offs.first().and_then(Value::as_u64),
            offs.get(1).and_then(Value::as_u64),
        ) {
            (Some(b), Some(e)) if b <= e && e <= data_len => (b as usize, e as usize),
            _ => return Err(corrupt(file, format!("{name}: offsets outside the data"))),
        };
        let size = dtype_size(dtype)
            .ok_or_else(|| corrupt(file, format!("{name}: unknown dtype {dtype}")))?;
        let want = shape.iter().try_fold(size, |a, &d| a.checked_mul(d));
        if want != Some((e - b) as u64) {
            return Err(corrupt(
                file,
                format!("{name}: {dtype} {shape:?} does not fit {} bytes", e - b),
            ));
        }
        entries.push(Entry {
            name,
            dtype: dtype.to_string(),
            shape,
            range: hend + b..hend + e,
        });
    }
    entries.sort_by_key(|e| e.range.start);
    Ok((entries, metadata))
}

/// Parse a whole shard file; tensors share `buf` (no copy).
pub fn decode(file: &str, buf: &Bytes) -> Result<(Vec<Tensor>, BTreeMap<String, String>)> {
    let (entries, metadata) = parse(file, buf)?;
    let tensors = entries
        .into_iter()
        .map(|e| Tensor {
            name: e.name,
            dtype: e.dtype,
            shape: e.shape,
            data: buf.slice(e.range),
        })
        .collect();
    Ok((tensors, metadata))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_alignment() {
        let ts = vec![
            Tensor {
                name: "w".into(),
                dtype: "F32".into(),
                shape: vec![2, 3],
                data: Bytes::from(vec![1u8; 24]),
            },
            Tensor {
                name: "blob".into(),
                dtype: "U8".into(),
                shape: vec![5],
                data: Bytes::from_static(b"hello"),
            },
        ];
        let md: BTreeMap<String, String> = [("step".to_string(), "7".to_string())].into();
        let (head, total) = encode_header(&ts, &md).unwrap();
        assert_eq!((head.len() - 8) % 8, 0);
        let mut file = head.clone();
        for t in &ts {
            file.extend_from_slice(&t.data);
        }
        assert_eq!(file.len() as u64, total);
        let (back, md2) = decode("f", &Bytes::from(file)).unwrap();
        assert_eq!(back, ts);
        assert_eq!(md2, md);
    }

    #[test]
    fn bad_tensors_and_files_are_refused() {
        let t = Tensor {
            name: "x".into(),
            dtype: "F32".into(),
            shape: vec![3],
            data: Bytes::from(vec![0u8; 8]),
        };
        assert_eq!(t.validate().unwrap_err().kind(), ErrorKind::InvalidInput);
        let e = decode(
            "s.safetensors",
            &Bytes::from_static(&[255, 255, 0, 0, 0, 0, 0, 0, 1]),
        )
        .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Corrupt);
        assert!(e.message().contains("s.safetensors"));
    }
}
