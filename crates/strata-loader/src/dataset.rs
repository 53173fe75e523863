//! A dataset: its shards, their sample counts and (lazily) their sample offsets, and the manifest format.

use std::sync::Arc;

use bytes::Bytes;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use strata_types::{Error, ErrorKind, IoContext, Result};

use crate::format::{mds, tar};
use crate::shard::{Sample, Shard, ShardFormat};
use crate::source::Source;

/// File name of a Strata manifest at the root of a dataset.
pub const MANIFEST_NAME: &str = "strata-manifest.json";
/// File name of an MDS index.
pub const MDS_INDEX_NAME: &str = "index.json";

/// One shard as recorded in a Strata manifest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ManifestShard {
    /// Key relative to the dataset root.
    pub key: String,
    /// Size in bytes.
    pub size: u64,
    /// ETag (or other version tag) when the manifest was built.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etag: Option<String>,
    /// Samples in the shard.
    pub samples: u64,
    /// `samples + 1` offsets: sample `i` is bytes `offsets[i]..offsets[i + 1]`.
    pub offsets: Vec<u64>,
}

/// A Strata manifest: the shards of a dataset with their sample offsets, so a job starts without listing or
/// scanning. Written by `strata dataset index URL` as `strata-manifest.json` at the dataset root.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    /// Always `"strata-manifest"`.
    pub format: String,
    /// Manifest format version (1).
    pub version: u32,
    /// Shard format.
    pub shard_format: ShardFormat,
    /// The MDS index entries when `shard_format` is `mds` (decoding recipes), in shard order.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mds_index: Option<serde_json::Value>,
    /// The shards.
    pub shards: Vec<ManifestShard>,
}

impl Manifest {
    /// Parse and check a manifest.
    pub fn parse(text: &[u8], name: &str) -> Result<Self> {
        let m: Manifest = serde_json::from_slice(text).map_err(|e| {
            Error::new(
                ErrorKind::Corrupt,
                format!("{name}: not a Strata manifest: {e}"),
            )
        })?;
        if m.format != "strata-manifest" || m.version != 1 {
            return Err(Error::new(
                ErrorKind::Unsupported,
                format!(
                    "{name}: format {:?} version {}; expected strata-manifest version 1",
                    m.format, m.version
                ),
            ));
        }
        for s in &m.shards {
            let ok = s.offsets.len() as u64 == s.samples + 1
                && s.offsets.windows(2).all(|w| w[0] <= w[1])
                && s.offsets.last().is_none_or(|&e| e <= s.size);
            if !ok {
                return Err(Error::new(
                    ErrorKind::Corrupt,
                    format!(
                        "{name}: shard {}: offsets do not describe {} samples within {} bytes",
                        s.key, s.samples, s.size
                    ),
                ));
            }
        }
        Ok(m)
    }
}

/// The shards of a dataset, in dataset order, with their sample counts: everything the order needs.
#[derive(Debug)]
pub struct DatasetIndex {
    /// Shard format.
    pub format: ShardFormat,
    /// Shards in dataset order.
    pub shards: Vec<Shard>,
    /// Where the index came from (`strata-manifest.json`, `index.json` or a scan), for messages.
    pub origin: String,
}

impl DatasetIndex {
    /// Sample counts in dataset order.
    pub fn counts(&self) -> Vec<u64> {
        self.shards.iter().map(|s| s.samples).collect()
    }

    /// Average bytes per sample (shard sizes over samples; 0 when unknown or empty).
    pub fn avg_sample_bytes(&self) -> u64 {
        let bytes: u64 = self.shards.iter().filter_map(|s| s.size).sum();
        bytes.checked_div(self.len()).unwrap_or(0)
    }

    /// Samples in the dataset.
    pub fn len(&self) -> u64 {
        self.shards.iter().map(|s| s.samples).sum()
    }

    /// Whether there are no samples.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Open a dataset: a Strata manifest if the root has one, else an MDS `index.json`, else list the `.tar`
    /// shards under the root and scan them (reading every shard once, through the cache).
    pub async fn open(src: &Source, ctx: &IoContext, scan_parallelism: usize) -> Result<Self> {
        match src.read_whole(ctx, MANIFEST_NAME).await {
            Ok(text) => return Self::from_manifest(Manifest::parse(&text, MANIFEST_NAME)?),
            Err(e) if e.kind() == ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        Self::open_without_manifest(src, ctx, scan_parallelism).await
    }

    /// Like [`Self::open`] but ignoring any Strata manifest (to build a new one).
    pub async fn open_without_manifest(
        src: &Source,
        ctx: &IoContext,
        scan_parallelism: usize,
    ) -> Result<Self> {
        match src.read_whole(ctx, MDS_INDEX_NAME).await {
            Ok(text) => return Self::from_mds(mds::Index::parse(&text, MDS_INDEX_NAME)?, None),
            Err(e) if e.kind() == ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        Self::scan_tars(src, ctx, scan_parallelism).await
    }

    fn from_manifest(m: Manifest) -> Result<Self> {
        if m.shard_format == ShardFormat::Mds {
            let idx_json = m.mds_index.clone().ok_or_else(|| {
                Error::new(
                    ErrorKind::Corrupt,
                    format!("{MANIFEST_NAME}: an mds manifest without its mds_index"),
                )
            })?;
            let text = serde_json::to_vec(&idx_json).map_err(|e| Error::internal(e.to_string()))?;
            let idx = mds::Index::parse(&text, MANIFEST_NAME)?;
            return Self::from_mds(idx, Some(m));
        }
        Ok(Self {
            format: ShardFormat::Tar,
            shards: m
                .shards
                .into_iter()
                .map(|s| Shard {
                    key: s.key,
                    size: Some(s.size),
                    etag: s.etag,
                    samples: s.samples,
                    offsets: Mutex::new(Some(Arc::new(s.offsets))),
                    columns: None,
                })
                .collect(),
            origin: MANIFEST_NAME.into(),
        })
    }

    fn from_mds(idx: mds::Index, manifest: Option<Manifest>) -> Result<Self> {
        if let Some(m) = &manifest
            && m.shards.len() != idx.shards.len()
        {
            return Err(Error::new(
                ErrorKind::Corrupt,
                format!(
                    "{MANIFEST_NAME}: {} shards but its MDS index lists {}",
                    m.shards.len(),
                    idx.shards.len()
                ),
            ));
        }
        let mut shards = Vec::with_capacity(idx.shards.len());
        for (i, info) in idx.shards.iter().enumerate() {
            let from_manifest = manifest.as_ref().map(|m| &m.shards[i]);
            shards.push(Shard {
                key: info.raw_data.basename.clone(),
                size: Some(info.raw_data.bytes),
                etag: from_manifest.and_then(|s| s.etag.clone()),
                samples: info.samples,
                offsets: Mutex::new(from_manifest.map(|s| Arc::new(s.offsets.clone()))),
                columns: Some(mds::Columns::new(info)?),
            });
        }
        Ok(Self {
            format: ShardFormat::Mds,
            shards,
            origin: if manifest.is_some() {
                MANIFEST_NAME
            } else {
                MDS_INDEX_NAME
            }
            .into(),
        })
    }

    async fn scan_tars(src: &Source, ctx: &IoContext, parallelism: usize) -> Result<Self> {
        use futures::{StreamExt, TryStreamExt};
        let mut keys: Vec<(String, u64, Option<String>)> = src
            .list(ctx)
            .await?
            .into_iter()
            .filter(|m| m.key.ends_with(".tar"))
            .map(|m| (m.key, m.size, m.etag))
            .collect();
        keys.sort();
        if keys.is_empty() {
            return Err(Error::new(
                ErrorKind::NotFound,
                format!(
                    "{}: no {MANIFEST_NAME}, no {MDS_INDEX_NAME} and no .tar shards under it",
                    src.root()
                ),
            ));
        }
        let shards: Vec<Shard> = futures::stream::iter(keys)
            .map(|(key, size, etag)| async move {
                let mut shard = Shard {
                    key,
                    size: Some(size),
                    etag,
                    samples: 0,
                    offsets: Mutex::new(None),
                    columns: None,
                };
                let bytes = src.read(ctx, &shard, 0..size).await?;
                let spans = tar::scan(&shard.key, &bytes)?;
                // Sample i spans from its first header to the next sample's: entries skipped between samples
                // (directories, names without an extension) are skipped again when the sample is parsed.
                let mut offs: Vec<u64> = spans.iter().map(|s| s.start).collect();
                offs.push(spans.last().map_or(0, |s| s.end));
                shard.samples = spans.len() as u64;
                *shard.offsets.lock() = Some(Arc::new(offs));
                Ok::<_, Error>(shard)
            })
            .buffered(parallelism.max(1))
            .try_collect()
            .await?;
        Ok(Self {
            format: ShardFormat::Tar,
            shards,
            origin: "scan of .tar shards".into(),
        })
    }

    /// A manifest of this dataset (every shard's offsets loaded; reads MDS headers as needed).
    pub async fn to_manifest(&self, src: &Source, ctx: &IoContext) -> Result<Manifest> {
        let mut shards = Vec::with_capacity(self.shards.len());
        for s in &self.shards {
            let meta = src.meta(ctx, s).await?;
            let offsets = src.offsets(ctx, s).await?;
            shards.push(ManifestShard {
                key: s.key.clone(),
                size: meta.size,
                etag: meta.etag.clone(),
                samples: s.samples,
                offsets: offsets.as_ref().clone(),
            });
        }
        let mds_index = match self.format {
            ShardFormat::Mds => {
                let text = src.read_whole(ctx, MDS_INDEX_NAME).await?;
                Some(
                    serde_json::from_slice(&text)
                        .map_err(|e| Error::new(ErrorKind::Corrupt, e.to_string()))?,
                )
            }
            ShardFormat::Tar => None,
        };
        Ok(Manifest {
            format: "strata-manifest".into(),
            version: 1,
            shard_format: self.format,
            mds_index,
            shards,
        })
    }

    /// Read and decode sample `index` of shard `shard`.
    pub async fn sample(
        &self,
        src: &Source,
        ctx: &IoContext,
        shard: usize,
        index: u64,
    ) -> Result<Sample> {
        let s = &self.shards[shard];
        let offs = src.offsets(ctx, s).await?;
        let i = index as usize;
        let range = offs[i]..offs[i + 1];
        let bytes: Bytes = src.read_sample(ctx, s, range.clone()).await?;
        let n = bytes.len() as u64;
        match (&s.columns, self.format) {
            (Some(cols), ShardFormat::Mds) => Ok(Sample {
                key: format!("{}:{index}", s.key),
                fields: cols.decode(&s.key, index, &bytes)?,
                bytes: n,
            }),
            _ => {
                let (key, fields) = tar::parse_sample(&s.key, &bytes, range.start)?;
                Ok(Sample {
                    key,
                    fields: fields
                        .into_iter()
                        .map(|(k, v)| (k, mds::Value::Bytes(v)))
                        .collect(),
                    bytes: n,
                })
            }
        }
    }
}

/// Build the manifest of the dataset at `src` (an MDS index, or a scan of its `.tar` shards; any existing
/// manifest is ignored) and store it as `strata-manifest.json` at the dataset root.
pub async fn write_manifest(
    src: &crate::source::LocalSource,
    ctx: &IoContext,
    parallelism: usize,
) -> Result<Manifest> {
    let source = Source::Local(src.clone());
    let index = DatasetIndex::open_without_manifest(&source, ctx, parallelism).await?;
    let manifest = index.to_manifest(&source, ctx).await?;
    let text = serde_json::to_vec(&manifest)
        .map_err(|e| Error::internal(format!("encoding manifest: {e}")))?;
    src.backend()
        .put(
            ctx,
            MANIFEST_NAME,
            Bytes::from(text),
            strata_object::PutMode::Overwrite,
        )
        .await?;
    Ok(manifest)
}
