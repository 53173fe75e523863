//! Where checkpoints are kept: a local directory (node-local NVMe, fsync'd, renamed into place) or an object
//! store (multipart upload; the manifest written with put-if-absent).
//!
//! Layout, identical in both: `<run>/step-<20 digits>/rank-NNNNN.safetensors`, `rank-NNNNN.json` (the rank's
//! record, written once its shard is durable) and `manifest.json` (written last, by rank 0, once every rank's
//! record is there). Deleting a checkpoint removes its manifest first, so a half-deleted checkpoint is never
//! mistaken for a complete one.

use std::io::Write;
use std::path::{Path, PathBuf};

use bytes::Bytes;
use strata_object::{Backend, PutMode};
use strata_types::{Error, ErrorKind, IoContext, Result};

use crate::format::Tensor;
use crate::manifest::{
    MANIFEST, Manifest, ShardRecord, parse_step_dir, record_file, shard_file, step_dir,
};

/// Part size of shard uploads.
const PART_SIZE: usize = 16 << 20;

/// A checkpoint tier.
#[derive(Debug, Clone)]
pub enum Tier {
    /// A local directory.
    Local(PathBuf),
    /// An object store (or any backend) at a URL.
    Remote(Backend),
    /// Another node's agent (`strata serve`), through its peer API.
    Peer(Peer),
}

/// A peer agent's checkpoint replica store (`/v1/peer/ckpt/...` on its control API).
#[derive(Debug, Clone)]
pub struct Peer {
    client: strata_client::AgentClient,
}

impl Peer {
    /// The agent whose control API is at `api` (`http://node7:7070` or `node7:7070`), with the token from
    /// the environment. Requests to a peer are not retried: a peer that fails is skipped for the next tier,
    /// and retrying it would only delay that.
    pub fn new(api: &str) -> Result<Self> {
        let mut opts = strata_client::ClientOptions::from_env();
        opts.retry.max_retries = 0;
        Self::with_options(api, &opts)
    }

    /// The agent at `api`, called by another agent of its cluster for `cred`'s team (no token is sent).
    pub fn for_cluster(api: &str, cred: strata_client::ClusterCredential) -> Result<Self> {
        let mut opts = strata_client::ClientOptions {
            cluster: Some(cred),
            ..Default::default()
        };
        opts.retry.max_retries = 0;
        Self::with_options(api, &opts)
    }

    /// The agent at `api`, connecting with `opts`.
    pub fn with_options(api: &str, opts: &strata_client::ClientOptions) -> Result<Self> {
        Ok(Self {
            client: strata_client::AgentClient::new(api, opts)?,
        })
    }

    /// The agent's address.
    pub fn base(&self) -> &str {
        self.client.base()
    }

    fn url(&self, run: &str, step: Option<u64>, file: Option<&str>) -> String {
        let mut u = self.client.url(&format!("/v1/peer/ckpt/{run}"));
        if let Some(s) = step {
            u.push_str(&format!("/{s}"));
        }
        if let Some(f) = file {
            u.push('/');
            u.push_str(f);
        }
        u
    }

    /// Store `file`, whose `len` bytes `body` streams: the length goes first (`Content-Length`), so the
    /// agent admits a replica charged to its team's quota before it reads it.
    async fn put(
        &self,
        run: &str,
        step: u64,
        file: &str,
        body: strata_client::Body,
        len: u64,
        blake3: Option<&str>,
    ) -> Result<()> {
        let mut req = self
            .client
            .request(
                strata_client::Method::PUT,
                self.url(run, Some(step), Some(file)),
            )
            .header(strata_client::reqwest::header::CONTENT_LENGTH, len)
            .body(body);
        if let Some(h) = blake3 {
            req = req.header("x-strata-blake3", h);
        }
        self.client
            .send(req, &format!("peer PUT {file}"))
            .await
            .map(|_| ())
    }

    async fn get(&self, run: &str, step: u64, file: &str) -> Result<Bytes> {
        let what = format!("peer GET {file}");
        let url = self.url(run, Some(step), Some(file));
        let resp = self
            .client
            .send_retried(&what, || {
                self.client
                    .request(strata_client::Method::GET, url.as_str())
            })
            .await?;
        resp.bytes().await.map_err(|e| {
            Error::new(
                ErrorKind::Unavailable,
                format!("{what} at {}: {e}", self.base()),
            )
        })
    }

    async fn list(&self, run: &str) -> Result<(Vec<u64>, Vec<u64>)> {
        let s = self
            .client
            .call::<strata_api::ckpt::ListReplicas>(&[run], &strata_api::NoQuery {}, &())
            .await?;
        Ok((s.steps, s.committed))
    }

    async fn delete(&self, run: &str, step: u64) -> Result<()> {
        let req = self.client.request(
            strata_client::Method::DELETE,
            self.url(run, Some(step), None),
        );
        self.client.send(req, "peer DELETE").await.map(|_| ())
    }
}

fn failpoint(name: &str) -> Result<()> {
    fail::fail_point!(name, |arg| Err(Error::new(
        ErrorKind::Io,
        format!("injected failure at {name} ({})", arg.unwrap_or_default())
    )));
    let _ = name;
    Ok(())
}

fn read_no_follow(path: &Path) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)?;
    let mut out = Vec::new();
    f.read_to_end(&mut out)?;
    Ok(out)
}

fn io(e: std::io::Error, what: impl std::fmt::Display) -> Error {
    Error::from_io(e, what)
}

fn fsync_dir(dir: &Path) -> Result<()> {
    std::fs::File::open(dir)
        .and_then(|f| f.sync_all())
        .map_err(|e| io(e, format!("fsync {}", dir.display())))
}

/// Write `bytes` to `path` atomically: a temp file in the same directory, fsync, rename, fsync the directory.
fn write_atomic(path: &Path, bytes: &[u8], fp_write: &str, fp_rename: &str) -> Result<()> {
    let dir = path
        .parent()
        .ok_or_else(|| Error::internal("path without parent"))?;
    let tmp = dir.join(format!(
        ".{}.tmp-{}",
        path.file_name().and_then(|n| n.to_str()).unwrap_or("f"),
        std::process::id()
    ));
    let result = (|| {
        failpoint(fp_write)?;
        let mut f =
            std::fs::File::create(&tmp).map_err(|e| io(e, format!("create {}", tmp.display())))?;
        f.write_all(bytes)
            .map_err(|e| io(e, format!("write {}", tmp.display())))?;
        failpoint("ckpt-fsync")?;
        f.sync_all()
            .map_err(|e| io(e, format!("fsync {}", tmp.display())))?;
        failpoint(fp_rename)?;
        std::fs::rename(&tmp, path).map_err(|e| io(e, format!("rename to {}", path.display())))?;
        fsync_dir(dir)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

impl Tier {
    /// A short name for messages.
    pub fn describe(&self) -> String {
        match self {
            Tier::Local(p) => format!("local {}", p.display()),
            Tier::Remote(b) => format!("remote {}", b.id()),
            Tier::Peer(p) => format!("peer {}", p.base()),
        }
    }

    /// The directory of `step` of `run` in a local tier rooted at `root`.
    pub fn local_step(root: &Path, run: &str, step: u64) -> PathBuf {
        root.join(run).join(step_dir(step))
    }

    /// The object key of `rank`'s shard of `step` in an object-store tier.
    pub fn shard_key(run: &str, step: u64, rank: u32) -> String {
        Self::key(run, step, &shard_file(rank))
    }

    fn key(run: &str, step: u64, file: &str) -> String {
        format!("{run}/{}/{file}", step_dir(step))
    }

    /// Write a rank's shard (header, then every tensor's bytes), durably, and return its record.
    pub async fn write_shard(
        &self,
        ctx: &IoContext,
        run: &str,
        step: u64,
        rank: u32,
        header: &[u8],
        tensors: &[Tensor],
    ) -> Result<ShardRecord> {
        let file = shard_file(rank);
        match self {
            Tier::Local(_) => {
                // One writer for both paths: the tensors are all here, so queue them at once.
                let (tx, rx) = std::sync::mpsc::channel();
                for t in tensors {
                    let _ = tx.send(t.data.clone());
                }
                drop(tx);
                let (r, _) = self
                    .write_shard_stream(run, step, rank, header.to_vec(), tensors.len(), rx)
                    .await;
                r
            }
            Tier::Peer(p) => {
                let mut h = blake3::Hasher::new();
                let mut size = 0u64;
                let chunks: Vec<Bytes> = std::iter::once(Bytes::copy_from_slice(header))
                    .chain(tensors.iter().map(|t| t.data.clone()))
                    .collect();
                for c in &chunks {
                    h.update(c);
                    size += c.len() as u64;
                }
                let sum = h.finalize().to_hex().to_string();
                failpoint("ckpt-peer-send")?;
                let body = strata_client::Body::wrap_stream(futures::stream::iter(
                    chunks.into_iter().map(Ok::<_, std::io::Error>),
                ));
                p.put(run, step, &file, body, size, Some(&sum)).await?;
                Ok(ShardRecord {
                    rank,
                    file,
                    size,
                    blake3: sum,
                    tensors: tensors.len(),
                })
            }
            Tier::Remote(b) => {
                let key = Self::key(run, step, &file);
                let mut up = b.put_multipart(ctx, &key, PART_SIZE).await?;
                let mut h = blake3::Hasher::new();
                let mut size = 0u64;
                let chunks = std::iter::once(Bytes::copy_from_slice(header))
                    .chain(tensors.iter().map(|t| t.data.clone()));
                for chunk in chunks {
                    h.update(&chunk);
                    size += chunk.len() as u64;
                    if let Err(e) = async {
                        failpoint("ckpt-upload-part")?;
                        up.write(chunk).await
                    }
                    .await
                    {
                        let _ = up.abort().await;
                        return Err(e);
                    }
                }
                if let Err(e) = failpoint("ckpt-upload-complete") {
                    let _ = up.abort().await;
                    return Err(e);
                }
                up.complete().await?;
                Ok(ShardRecord {
                    rank,
                    file,
                    size,
                    blake3: h.finalize().to_hex().to_string(),
                    tensors: tensors.len(),
                })
            }
        }
    }

    /// Like [`Self::write_shard`] for the local tier, but tensors arrive one by one on `rx` while the caller
    /// is still copying the next ones: the write overlaps the copy. Returns the record (or the error) and the
    /// tensors received. Other tiers just collect the tensors and return `Unsupported`.
    pub async fn write_shard_stream(
        &self,
        run: &str,
        step: u64,
        rank: u32,
        header: Vec<u8>,
        count: usize,
        rx: std::sync::mpsc::Receiver<Bytes>,
    ) -> (Result<ShardRecord>, Vec<Bytes>) {
        let Tier::Local(root) = self else {
            let got: Vec<Bytes> = rx.iter().take(count).collect();
            return (
                Err(Error::new(ErrorKind::Unsupported, "streamed write")),
                got,
            );
        };
        let dir = Self::local_step(root, run, step);
        let file = shard_file(rank);
        let path = dir.join(&file);
        let joined = tokio::task::spawn_blocking(move || {
            let mut got = Vec::with_capacity(count);
            let tmp = dir.join(format!(".{file}.tmp-{}", std::process::id()));
            let r = (|| -> Result<ShardRecord> {
                std::fs::create_dir_all(&dir)
                    .map_err(|e| io(e, format!("create {}", dir.display())))?;
                let mut f = std::fs::File::create(&tmp)
                    .map_err(|e| io(e, format!("create {}", tmp.display())))?;
                let (htx, hrx) = std::sync::mpsc::channel::<Bytes>();
                let hasher = std::thread::spawn(move || {
                    let mut h = blake3::Hasher::new();
                    for c in hrx {
                        h.update(&c);
                    }
                    h.finalize().to_hex().to_string()
                });
                let mut size = 0u64;
                let mut write = |chunk: Bytes| -> Result<()> {
                    failpoint("ckpt-shard-write")?;
                    f.write_all(&chunk)
                        .map_err(|e| io(e, format!("write {}", tmp.display())))?;
                    size += chunk.len() as u64;
                    let _ = htx.send(chunk);
                    Ok(())
                };
                let mut r = write(Bytes::from(header));
                while r.is_ok() && got.len() < count {
                    match rx.recv() {
                        Ok(b) => {
                            got.push(b.clone());
                            r = write(b);
                        }
                        Err(_) => {
                            r = Err(Error::new(
                                ErrorKind::Cancelled,
                                "the save was abandoned while its state was being copied",
                            ))
                        }
                    }
                }
                drop(htx);
                let sum = hasher
                    .join()
                    .map_err(|_| Error::internal("shard hasher panicked"))?;
                r?;
                failpoint("ckpt-fsync")?;
                f.sync_all()
                    .map_err(|e| io(e, format!("fsync {}", tmp.display())))?;
                failpoint("ckpt-shard-rename")?;
                std::fs::rename(&tmp, &path)
                    .map_err(|e| io(e, format!("rename to {}", path.display())))?;
                fsync_dir(&dir)?;
                Ok(ShardRecord {
                    rank,
                    file: file.clone(),
                    size,
                    blake3: sum,
                    tensors: count,
                })
            })();
            if r.is_err() {
                let _ = std::fs::remove_file(&tmp);
                // Take the rest, so the caller's copies are not stuck and the tensors come back.
                while got.len() < count {
                    match rx.recv() {
                        Ok(b) => got.push(b),
                        Err(_) => break,
                    }
                }
            }
            (r, got)
        })
        .await;
        match joined {
            Ok(v) => v,
            Err(e) => (
                Err(Error::internal(format!("shard writer: {e}"))),
                Vec::new(),
            ),
        }
    }

    /// Record that a rank's shard is durable in this tier.
    pub async fn write_record(
        &self,
        ctx: &IoContext,
        run: &str,
        step: u64,
        rec: &ShardRecord,
    ) -> Result<()> {
        let text = serde_json::to_vec(rec).map_err(|e| Error::internal(e.to_string()))?;
        let file = record_file(rec.rank);
        match self {
            Tier::Local(root) => {
                let path = Self::local_step(root, run, step).join(file);
                tokio::task::spawn_blocking(move || {
                    write_atomic(&path, &text, "ckpt-record-write", "ckpt-record-rename")
                })
                .await
                .map_err(|e| Error::internal(e.to_string()))?
            }
            Tier::Peer(p) => {
                let len = text.len() as u64;
                p.put(run, step, &file, strata_client::Body::from(text), len, None)
                    .await
            }
            Tier::Remote(b) => {
                failpoint("ckpt-record-write")?;
                b.put(
                    ctx,
                    &Self::key(run, step, &file),
                    Bytes::from(text),
                    PutMode::Overwrite,
                )
                .await?;
                Ok(())
            }
        }
    }

    /// The records present for a step, by rank (`None` where a rank's is missing).
    pub async fn records(
        &self,
        ctx: &IoContext,
        run: &str,
        step: u64,
        world: u32,
    ) -> Result<Vec<Option<ShardRecord>>> {
        let mut out = Vec::with_capacity(world as usize);
        for rank in 0..world {
            let text = match self.read_file(ctx, run, step, &record_file(rank)).await {
                Ok(t) => t,
                Err(e) if e.kind() == ErrorKind::NotFound => {
                    out.push(None);
                    continue;
                }
                Err(e) => return Err(e),
            };
            out.push(ShardRecord::parse(&text, &record_file(rank)).ok());
        }
        Ok(out)
    }

    /// Commit: write the manifest, atomically. On an object store the write is put-if-absent; an existing,
    /// identical manifest (a retried commit) is success.
    pub async fn commit(&self, ctx: &IoContext, m: &Manifest) -> Result<()> {
        let text = m.to_json();
        match self {
            Tier::Local(root) => {
                let path = Self::local_step(root, &m.run_id, m.step).join(MANIFEST);
                tokio::task::spawn_blocking(move || {
                    write_atomic(&path, &text, "ckpt-manifest-write", "ckpt-manifest-rename")
                })
                .await
                .map_err(|e| Error::internal(e.to_string()))?
            }
            Tier::Peer(p) => {
                failpoint("ckpt-manifest-write")?;
                let len = text.len() as u64;
                p.put(
                    &m.run_id,
                    m.step,
                    MANIFEST,
                    strata_client::Body::from(text),
                    len,
                    None,
                )
                .await
            }
            Tier::Remote(b) => {
                failpoint("ckpt-manifest-write")?;
                let key = Self::key(&m.run_id, m.step, MANIFEST);
                match b.put(ctx, &key, Bytes::from(text), PutMode::Create).await {
                    Ok(_) => Ok(()),
                    Err(e) if e.kind() == ErrorKind::AlreadyExists => {
                        let existing = Manifest::parse(&b.get(ctx, &key).await?.1, &key)?;
                        if existing.shards == m.shards {
                            Ok(())
                        } else {
                            Err(Error::new(
                                ErrorKind::AlreadyExists,
                                format!(
                                    "{key} exists with other shards: step {} was committed by another save",
                                    m.step
                                ),
                            ))
                        }
                    }
                    Err(e) => Err(e),
                }
            }
        }
    }

    /// A file of a checkpoint.
    pub async fn read_file(
        &self,
        ctx: &IoContext,
        run: &str,
        step: u64,
        file: &str,
    ) -> Result<Bytes> {
        match self {
            Tier::Local(root) => {
                let path = Self::local_step(root, run, step).join(file);
                // A checkpoint's files are never links: following one would read a file outside the tier.
                tokio::task::spawn_blocking(move || match read_no_follow(&path) {
                    Ok(b) => Ok(Bytes::from(b)),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(Error::new(
                        ErrorKind::NotFound,
                        format!("{} does not exist", path.display()),
                    )),
                    Err(e) => Err(io(e, format!("read {}", path.display()))),
                })
                .await
                .map_err(|e| Error::internal(e.to_string()))?
            }
            Tier::Remote(b) => Ok(b.get(ctx, &Self::key(run, step, file)).await?.1),
            Tier::Peer(p) => p.get(run, step, file).await,
        }
    }

    /// The manifest of a step, if the step is committed here.
    pub async fn manifest(
        &self,
        ctx: &IoContext,
        run: &str,
        step: u64,
    ) -> Result<Option<Manifest>> {
        match self.read_file(ctx, run, step, MANIFEST).await {
            Ok(text) => Ok(Some(Manifest::parse(
                &text,
                &format!("{} {run} step {step}", self.describe()),
            )?)),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Steps of a run that have anything in this tier (committed or not), ascending.
    pub async fn steps(&self, ctx: &IoContext, run: &str) -> Result<Vec<u64>> {
        let mut steps: Vec<u64> = match self {
            Tier::Local(root) => {
                let dir = root.join(run);
                match std::fs::read_dir(&dir) {
                    Ok(rd) => rd
                        .filter_map(|e| e.ok())
                        .filter_map(|e| e.file_name().to_str().and_then(parse_step_dir))
                        .collect(),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
                    Err(e) => return Err(io(e, format!("list {}", dir.display()))),
                }
            }
            Tier::Remote(b) => b
                .list_delimited(ctx, &format!("{run}/"))
                .await?
                .common_prefixes
                .iter()
                .filter_map(|p| {
                    p.trim_end_matches('/')
                        .rsplit('/')
                        .next()
                        .and_then(parse_step_dir)
                })
                .collect(),
            Tier::Peer(p) => p.list(run).await?.0,
        };
        steps.sort_unstable();
        Ok(steps)
    }

    /// Committed steps of a run, ascending.
    pub async fn committed(&self, ctx: &IoContext, run: &str) -> Result<Vec<u64>> {
        if let Tier::Peer(p) = self {
            let mut c = p.list(run).await?.1;
            c.sort_unstable();
            return Ok(c);
        }
        let mut out = Vec::new();
        for s in self.steps(ctx, run).await? {
            match self.read_file(ctx, run, s, MANIFEST).await {
                Ok(_) => out.push(s),
                Err(e) if e.kind() == ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
        }
        Ok(out)
    }

    /// Delete a step: the manifest first (so it is never seen complete but partial), then everything else.
    pub async fn delete_step(&self, ctx: &IoContext, run: &str, step: u64) -> Result<()> {
        failpoint("ckpt-retention-delete")?;
        match self {
            Tier::Local(root) => {
                let dir = Self::local_step(root, run, step);
                tokio::task::spawn_blocking(move || {
                    match std::fs::remove_file(dir.join(MANIFEST)) {
                        Ok(()) => fsync_dir(&dir)?,
                        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                        Err(e) => return Err(io(e, format!("remove {}", dir.display()))),
                    }
                    match std::fs::remove_dir_all(&dir) {
                        Ok(()) => Ok(()),
                        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
                        Err(e) => Err(io(e, format!("remove {}", dir.display()))),
                    }
                })
                .await
                .map_err(|e| Error::internal(e.to_string()))?
            }
            Tier::Peer(p) => p.delete(run, step).await,
            Tier::Remote(b) => {
                let prefix = format!("{run}/{}/", step_dir(step));
                match b.delete(ctx, &format!("{prefix}{MANIFEST}")).await {
                    Ok(()) => {}
                    Err(e) if e.kind() == ErrorKind::NotFound => {}
                    Err(e) => return Err(e),
                }
                let mut after = None;
                loop {
                    let page = b.list_page(ctx, &prefix, after.as_deref(), 1000).await?;
                    for o in &page.objects {
                        match b.delete(ctx, &o.key).await {
                            Ok(()) => {}
                            Err(e) if e.kind() == ErrorKind::NotFound => {}
                            Err(e) => return Err(e),
                        }
                    }
                    match page.next_start_after {
                        Some(n) => after = Some(n),
                        None => break,
                    }
                }
                Ok(())
            }
        }
    }
}
