//! A shard checked against its record, written once: whether bytes in memory are the recorded shard
//! ([`ShardRecord::matches`]), and a local shard file read or mapped after it was hashed, reading on one
//! thread while another hashes ([`read_into`], [`verify_local`]). The checkpointer's restore and its CLI
//! operations, and the Python binding's restore, all go through here.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::Path;

use strata_types::{Error, ErrorKind, Result};

use crate::format::{self, Entry};
use crate::manifest::ShardRecord;

/// Bytes read at a time while hashing a shard.
const CHUNK: usize = 8 << 20;

/// The local shard at `path`, opened, if it is there with its record's size (`None`: the caller tries the
/// other tiers).
pub fn open(path: &Path, rec: &ShardRecord) -> Option<std::fs::File> {
    let f = std::fs::File::open(path).ok()?;
    match f.metadata() {
        Ok(md) if md.len() == rec.size => Some(f),
        _ => None,
    }
}

/// Read the shard `f` (from [`open`]) into `buf` (its record's size), hashing it on a second thread as it is
/// read, and parse its header: the tensors and metadata, or `Corrupt` when it does not match its record.
pub fn read_into(
    mut f: std::fs::File,
    rec: &ShardRecord,
    buf: &mut [u8],
) -> Result<(Vec<Entry>, BTreeMap<String, String>)> {
    let sum = std::thread::scope(|s| {
        let (tx, rx) = std::sync::mpsc::sync_channel::<&[u8]>(4);
        let hasher = s.spawn(move || {
            let mut h = blake3::Hasher::new();
            for chunk in rx {
                h.update(chunk);
            }
            h.finalize().to_hex().to_string()
        });
        let mut result = Ok(());
        for chunk in buf.chunks_mut(CHUNK) {
            if let Err(e) = f.read_exact(chunk) {
                result = Err(e);
                break;
            }
            let chunk: &[u8] = chunk;
            if tx.send(chunk).is_err() {
                break;
            }
        }
        drop(tx);
        let sum = hasher.join().unwrap_or_default();
        result.map(|()| sum)
    })
    .map_err(|e| Error::from_io(e, format!("reading shard {}", rec.file)))?;
    if sum != rec.blake3 {
        return Err(Error::new(ErrorKind::Corrupt, "checksum mismatch"));
    }
    format::parse(&rec.file, buf)
}

/// A local shard that verified: its tensors and metadata, and the file's identity (device, inode, size,
/// mtime in ns), so that whoever maps it can check it maps the file that was hashed.
#[derive(Debug, Clone)]
pub struct LocalShard {
    /// Tensors.
    pub entries: Vec<Entry>,
    /// Metadata of the safetensors header.
    pub metadata: BTreeMap<String, String>,
    /// (device, inode, size, mtime ns).
    pub identity: (u64, u64, u64, i64),
}

/// Hash a local shard (reading on one thread, hashing on another) and parse its header. `Ok(None)` when it
/// is missing, of another size or does not match its record.
pub fn verify_local(path: &Path, rec: &ShardRecord) -> Result<Option<LocalShard>> {
    use std::os::unix::fs::MetadataExt;
    let Ok(mut f) = std::fs::File::open(path) else {
        return Ok(None);
    };
    let md = f
        .metadata()
        .map_err(|e| Error::from_io(e, path.display()))?;
    if md.len() != rec.size {
        return Ok(None);
    }
    let (full_tx, full_rx) = std::sync::mpsc::sync_channel::<(Vec<u8>, usize)>(2);
    let (free_tx, free_rx) = std::sync::mpsc::channel::<Vec<u8>>();
    for _ in 0..3 {
        let _ = free_tx.send(vec![0u8; CHUNK]);
    }
    let mut head: Vec<u8> = Vec::new();
    let sum = std::thread::scope(|s| {
        let hasher = s.spawn(move || {
            let mut h = blake3::Hasher::new();
            for (buf, n) in full_rx {
                h.update(&buf[..n]);
                let _ = free_tx.send(buf);
            }
            h.finalize().to_hex().to_string()
        });
        let mut first = true;
        let read = (|| -> std::io::Result<()> {
            loop {
                let Ok(mut buf) = free_rx.recv() else {
                    return Ok(());
                };
                let mut n = 0;
                while n < CHUNK {
                    let k = f.read(&mut buf[n..])?;
                    if k == 0 {
                        break;
                    }
                    n += k;
                }
                if first {
                    head = buf[..n.min(1 << 20)].to_vec();
                    first = false;
                }
                if n == 0 {
                    return Ok(());
                }
                if full_tx.send((buf, n)).is_err() {
                    return Ok(());
                }
                if n < CHUNK {
                    return Ok(());
                }
            }
        })();
        drop(full_tx);
        let sum = hasher.join().unwrap_or_default();
        read.map(|()| sum)
    })
    .map_err(|e| Error::from_io(e, path.display()))?;
    if sum != rec.blake3 {
        return Ok(None);
    }
    // The header may be longer than the first MiB kept: read it whole then.
    let hlen = head
        .get(..8)
        .map(|b| u64::from_le_bytes(b.try_into().unwrap_or([0; 8])))
        .unwrap_or(0);
    if 8 + hlen > head.len() as u64 && 8 + hlen <= rec.size {
        use std::os::unix::fs::FileExt;
        head = vec![0u8; (8 + hlen) as usize];
        f.read_exact_at(&mut head, 0)
            .map_err(|e| Error::from_io(e, path.display()))?;
    }
    let (entries, meta) = format::parse_header(&rec.file, &head, rec.size)?;
    Ok(Some(LocalShard {
        entries,
        metadata: meta,
        identity: (
            md.dev(),
            md.ino(),
            md.len(),
            md.mtime() * 1_000_000_000 + md.mtime_nsec(),
        ),
    }))
}
