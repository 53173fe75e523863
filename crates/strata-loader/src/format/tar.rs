//! WebDataset tar shards: POSIX/ustar, GNU long names and pax headers; samples are runs of consecutive entries
//! sharing a key, as WebDataset groups them.
//!
//! The key of `dir/abc.seg.jpg` is `dir/abc` and its field is `seg.jpg` (lower-cased): the basename is split
//! at its first dot, like WebDataset's `base_plus_ext`. Entries without an extension, directories and other
//! non-file entries are skipped.

use bytes::Bytes;
use strata_types::{Error, ErrorKind, Result};

const BLOCK: usize = 512;

/// Where one sample lies in a shard: `[start, end)` covers its headers and padded data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SampleSpan {
    /// The sample's key.
    pub key: String,
    /// Offset of its first header.
    pub start: u64,
    /// Offset just past its last entry's padded data.
    pub end: u64,
}

/// One file entry of a tar.
#[derive(Debug, Clone)]
struct Entry {
    name: String,
    header_start: usize,
    data: std::ops::Range<usize>,
    end: usize,
}

fn corrupt(shard: &str, offset: usize, why: impl std::fmt::Display) -> Error {
    Error::new(
        ErrorKind::Corrupt,
        format!("shard {shard}: bad tar at byte {offset}: {why}"),
    )
}

fn octal(field: &[u8]) -> Option<u64> {
    // Base-256 (GNU) for large values: high bit of the first byte set.
    if let Some(&first) = field.first()
        && first & 0x80 != 0
    {
        let mut v: u64 = u64::from(first & 0x7f);
        for &b in &field[1..] {
            v = v.checked_mul(256)?.checked_add(u64::from(b))?;
        }
        return Some(v);
    }
    let s: Vec<u8> = field
        .iter()
        .copied()
        .take_while(|&b| b != 0)
        .filter(|&b| b != b' ')
        .collect();
    if s.is_empty() {
        return Some(0);
    }
    u64::from_str_radix(std::str::from_utf8(&s).ok()?, 8).ok()
}

fn cstr(field: &[u8]) -> &[u8] {
    let n = field.iter().position(|&b| b == 0).unwrap_or(field.len());
    &field[..n]
}

fn pax_path(data: &[u8]) -> Option<String> {
    // Records: "<len> key=value\n".
    let mut rest = data;
    let mut path = None;
    while !rest.is_empty() {
        let sp = rest.iter().position(|&b| b == b' ')?;
        let len: usize = std::str::from_utf8(&rest[..sp]).ok()?.parse().ok()?;
        if len == 0 || len > rest.len() {
            return None;
        }
        let rec = &rest[sp + 1..len];
        let rec = rec.strip_suffix(b"\n").unwrap_or(rec);
        if let Some(v) = rec.strip_prefix(b"path=") {
            path = Some(String::from_utf8_lossy(v).into_owned());
        }
        rest = &rest[len..];
    }
    path
}

/// Iterate over file entries of `buf`: a whole shard (`whole`), which must end with tar's end-of-archive
/// block, or one sample's span. `base` is the offset of `buf` in the shard, for error messages.
fn entries(shard: &str, buf: &[u8], base: usize, whole: bool) -> Result<Vec<Entry>> {
    let mut out = Vec::new();
    let mut off = 0usize;
    let mut long_name: Option<String> = None;
    let mut entry_start: Option<usize> = None;
    if whole && buf.is_empty() {
        return Err(corrupt(
            shard,
            0,
            "the shard is empty (0 bytes): not a tar archive",
        ));
    }
    loop {
        if off == buf.len() {
            if whole {
                // tar, webdataset and GNU tar all end an archive with zero blocks. Without them, a shard cut
                // at a block boundary would pass for complete, its last sample short of fields.
                return Err(corrupt(
                    shard,
                    base + off,
                    "the shard ends without tar's end-of-archive blocks: it was cut short",
                ));
            }
            break;
        }
        if off + BLOCK > buf.len() {
            return Err(corrupt(
                shard,
                base + off,
                format!("truncated header ({} of 512 bytes)", buf.len() - off),
            ));
        }
        let h = &buf[off..off + BLOCK];
        if h.iter().all(|&b| b == 0) {
            break; // end of archive
        }
        let stored =
            octal(&h[148..156]).ok_or_else(|| corrupt(shard, base + off, "checksum field"))?;
        let sum: u64 = h
            .iter()
            .enumerate()
            .map(|(i, &b)| {
                if (148..156).contains(&i) {
                    32
                } else {
                    u64::from(b)
                }
            })
            .sum();
        if stored != sum {
            return Err(corrupt(
                shard,
                base + off,
                format!("header checksum {stored} != computed {sum}"),
            ));
        }
        let size = octal(&h[124..136]).ok_or_else(|| corrupt(shard, base + off, "size field"))?;
        let size =
            usize::try_from(size).map_err(|_| corrupt(shard, base + off, "size too large"))?;
        let data_start = off + BLOCK;
        let padded = size.div_ceil(BLOCK) * BLOCK;
        let data_end = data_start
            .checked_add(size)
            .ok_or_else(|| corrupt(shard, base + off, "size overflows"))?;
        if data_end > buf.len() {
            return Err(corrupt(
                shard,
                base + off,
                format!(
                    "truncated entry: {size} bytes declared, {} present",
                    buf.len().saturating_sub(data_start)
                ),
            ));
        }
        let next = (data_start + padded).min(buf.len());
        let start = *entry_start.get_or_insert(off);
        match h[156] {
            b'L' => {
                long_name =
                    Some(String::from_utf8_lossy(cstr(&buf[data_start..data_end])).into_owned());
            }
            b'x' => {
                if let Some(p) = pax_path(&buf[data_start..data_end]) {
                    long_name = Some(p);
                }
            }
            b'0' | 0 | b'7' => {
                let name = match long_name.take() {
                    Some(n) => n,
                    None => {
                        let name = String::from_utf8_lossy(cstr(&h[0..100])).into_owned();
                        let prefix = cstr(&h[345..500]);
                        if &h[257..262] == b"ustar" && !prefix.is_empty() {
                            format!("{}/{name}", String::from_utf8_lossy(prefix))
                        } else {
                            name
                        }
                    }
                };
                out.push(Entry {
                    name,
                    header_start: start,
                    data: data_start..data_end,
                    end: next,
                });
                entry_start = None;
            }
            // Global pax headers, directories, links, devices: not sample data.
            _ => {
                long_name = None;
                entry_start = None;
            }
        }
        off = next;
    }
    Ok(out)
}

/// Split a member name into (key, field) as WebDataset does; `None` for names without an extension.
pub fn split_name(name: &str) -> Option<(&str, String)> {
    let name = name.strip_prefix("./").unwrap_or(name);
    let slash = name.rfind('/').map_or(0, |i| i + 1);
    let dot = name[slash..].find('.')? + slash;
    if dot == slash {
        return None; // hidden file such as `.DS_Store`
    }
    Some((&name[..dot], name[dot + 1..].to_lowercase()))
}

/// Scan a whole shard into sample spans.
pub fn scan(shard: &str, buf: &[u8]) -> Result<Vec<SampleSpan>> {
    let mut spans: Vec<SampleSpan> = Vec::new();
    for e in entries(shard, buf, 0, true)? {
        let Some((key, _)) = split_name(&e.name) else {
            continue;
        };
        match spans.last_mut() {
            Some(last) if last.key == key => last.end = e.end as u64,
            _ => spans.push(SampleSpan {
                key: key.to_string(),
                start: e.header_start as u64,
                end: e.end as u64,
            }),
        }
    }
    Ok(spans)
}

/// Decode one sample from the bytes of its span (`span_start` = its offset in the shard, for errors).
/// Returns the key and the fields in tar order; a field's bytes share `buf`'s allocation (no copy).
pub fn parse_sample(
    shard: &str,
    buf: &Bytes,
    span_start: u64,
) -> Result<(String, Vec<(String, Bytes)>)> {
    let mut key: Option<String> = None;
    let mut fields = Vec::new();
    for e in entries(shard, buf, span_start as usize, false)? {
        let Some((k, field)) = split_name(&e.name) else {
            continue;
        };
        match &key {
            None => key = Some(k.to_string()),
            Some(prev) if prev != k => {
                return Err(corrupt(
                    shard,
                    span_start as usize + e.header_start,
                    format!(
                        "entry {:?} does not belong to sample {prev:?}; the index does not match the shard",
                        e.name
                    ),
                ));
            }
            Some(_) => {}
        }
        fields.push((field, buf.slice(e.data.clone())));
    }
    let key = key.ok_or_else(|| {
        corrupt(
            shard,
            span_start as usize,
            "no file entries where a sample was expected; the index does not match the shard",
        )
    })?;
    Ok((key, fields))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    fn header(name: &str, size: usize, kind: u8) -> Vec<u8> {
        let mut h = vec![0u8; BLOCK];
        h[..name.len()].copy_from_slice(name.as_bytes());
        h[100..107].copy_from_slice(b"0000644");
        h[124..135].copy_from_slice(format!("{size:011o}").as_bytes());
        h[156] = kind;
        h[257..263].copy_from_slice(b"ustar\0");
        h[148..156].copy_from_slice(b"        ");
        let sum: u32 = h.iter().map(|&b| u32::from(b)).sum();
        h[148..155].copy_from_slice(format!("{sum:06o}\0").as_bytes());
        h
    }

    pub(crate) fn tar(files: &[(&str, &[u8])]) -> Vec<u8> {
        let mut out = Vec::new();
        for (name, data) in files {
            out.extend(header(name, data.len(), b'0'));
            out.extend_from_slice(data);
            out.resize(out.len().div_ceil(BLOCK) * BLOCK, 0);
        }
        out.extend(vec![0u8; 2 * BLOCK]);
        out
    }

    #[test]
    fn groups_by_key_and_parses() {
        let t = tar(&[
            ("a/000.jpg", b"J0"),
            ("a/000.cls", b"1"),
            ("a/001.jpg", b"J1"),
            ("a/001.seg.PNG", b"P1"),
        ]);
        let spans = scan("s", &t).unwrap();
        assert_eq!(spans.len(), 2);
        assert_eq!(spans[0].key, "a/000");
        let b = Bytes::from(t.clone());
        let (key, fields) = parse_sample(
            "s",
            &b.slice(spans[1].start as usize..spans[1].end as usize),
            spans[1].start,
        )
        .unwrap();
        assert_eq!(key, "a/001");
        assert_eq!(fields[0], ("jpg".to_string(), Bytes::from_static(b"J1")));
        assert_eq!(
            fields[1],
            ("seg.png".to_string(), Bytes::from_static(b"P1"))
        );
    }

    #[test]
    fn corrupt_header_and_truncation_are_named() {
        let mut t = tar(&[("x.bin", &[7u8; 1000])]);
        t[10] ^= 0xff;
        let e = scan("shard-3.tar", &t).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Corrupt);
        assert!(
            e.message().contains("shard-3.tar") && e.message().contains("checksum"),
            "{e}"
        );
        let t = tar(&[("x.bin", &[7u8; 1000])]);
        let e = scan("s.tar", &t[..700]).unwrap_err();
        assert!(e.message().contains("truncated"), "{e}");
    }

    #[test]
    fn a_shard_cut_at_a_block_boundary_or_empty_is_corrupt_not_short() {
        let t = tar(&[("a.cls", b"1"), ("a.bin", &[7u8; 1000]), ("b.cls", b"2")]);
        // Cut right before the second member's header: every block whole, the last sample short a field.
        let e = scan("s.tar", &t[..1024]).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Corrupt);
        assert!(
            e.message().contains("s.tar") && e.message().contains("cut short"),
            "{e}"
        );
        let e = scan("e.tar", &[]).unwrap_err();
        assert!(e.message().contains("empty"), "{e}");
        assert_eq!(scan("s.tar", &t).unwrap().len(), 2);
    }
}
