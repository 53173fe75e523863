//! `Checkpointer` and `SaveHandle`: async sharded saves, verified restores.

use std::sync::Arc;

use parking_lot::Mutex;
use pyo3::prelude::*;
use strata_loader::source::dataset_url;
use strata_types::{Error, IoContext};

use crate::errors::{InvalidInputError, StrataError, py_warn, to_py};
use crate::runtime::proc;

/// Where a save stands (native). `strata.SaveHandle` wraps it.
#[pyclass(module = "strata._native", frozen)]
pub(crate) struct SaveHandle {
    inner: strata_ckpt::SaveHandle,
    rt: Arc<tokio::runtime::Runtime>,
}

pub(crate) fn state_name(s: &strata_ckpt::SaveState) -> &'static str {
    match s {
        strata_ckpt::SaveState::Pending => "pending",
        strata_ckpt::SaveState::HandedOver => "handed_over",
        strata_ckpt::SaveState::Done => "done",
        strata_ckpt::SaveState::Skipped => "skipped",
        strata_ckpt::SaveState::Failed(_) => "failed",
    }
}

#[pymethods]
impl SaveHandle {
    /// The step.
    #[getter]
    fn step(&self) -> u64 {
        self.inner.step()
    }

    /// `"pending"`, `"done"`, `"skipped"` or `"failed"`.
    #[getter]
    fn state(&self) -> &'static str {
        state_name(&self.inner.state())
    }

    /// The failure, if the save failed.
    #[getter]
    fn error(&self) -> Option<String> {
        match self.inner.state() {
            strata_ckpt::SaveState::Failed(e) => Some(e.to_string()),
            _ => None,
        }
    }

    /// Whether the save finished (done, skipped or failed).
    fn done(&self) -> bool {
        self.inner.done()
    }

    /// Wait until the save finishes, at most `timeout` seconds; returns the state. Never raises for a failed
    /// save: check the state (or `error`). With `released`, return once this process's part is over (the
    /// save finished, or the node agent took it over).
    #[pyo3(signature = (timeout=None, released=false))]
    fn wait(&self, py: Python<'_>, timeout: Option<f64>, released: bool) -> &'static str {
        let h = self.inner.clone();
        let rt = self.rt.clone();
        let s = py.detach(move || {
            rt.block_on(async move {
                let fut = async {
                    if released {
                        h.wait_released().await
                    } else {
                        h.wait().await
                    }
                };
                match timeout {
                    Some(t) => {
                        tokio::time::timeout(std::time::Duration::from_secs_f64(t.max(0.0)), fut)
                            .await
                            .unwrap_or_else(|_| h.state())
                    }
                    None => fut.await,
                }
            })
        });
        state_name(&s)
    }
}

type Loaded<'py> = (
    u64,
    Vec<(String, String, Vec<u64>, usize, usize)>,
    std::collections::BTreeMap<String, String>,
    Bound<'py, pyo3::types::PyByteArray>,
);

/// Read a local shard straight into a new bytearray, hashed on a second thread as it is read
/// ([`strata_ckpt::verify::read_into`]). `Ok(None)` when the file is missing or of another size (the caller
/// tries the other tiers).
#[allow(clippy::type_complexity)]
pub(crate) fn read_verified<'py>(
    py: Python<'py>,
    path: &std::path::Path,
    rec: &strata_ckpt::ShardRecord,
) -> PyResult<
    Option<(
        Vec<(String, String, Vec<u64>, usize, usize)>,
        std::collections::BTreeMap<String, String>,
        Bound<'py, pyo3::types::PyByteArray>,
    )>,
> {
    let Some(f) = strata_ckpt::verify::open(path, rec) else {
        return Ok(None);
    };
    let size = usize::try_from(rec.size).map_err(|_| StrataError::new_err("shard too large"))?;
    let mut verdict = None;
    let buf = pyo3::types::PyByteArray::new_with(py, size, |b| {
        verdict = Some(strata_ckpt::verify::read_into(f, rec, b));
        Ok(())
    })?;
    match verdict {
        Some(Ok((entries, md))) => Ok(Some((tuples(entries), md, buf))),
        Some(Err(e)) => Err(to_py(e)),
        None => Ok(None),
    }
}

/// Tensors as Python takes them: (name, dtype, shape, offset, length).
fn tuples(
    entries: Vec<strata_ckpt::format::Entry>,
) -> Vec<(String, String, Vec<u64>, usize, usize)> {
    entries
        .into_iter()
        .map(|e| (e.name, e.dtype, e.shape, e.range.start, e.range.len()))
        .collect()
}

/// A rank's checkpointer (native). `strata.Checkpointer` wraps it.
#[pyclass(module = "strata._native", frozen)]
pub(crate) struct Checkpointer {
    inner: strata_ckpt::Checkpointer,
    /// Staging buffers of finished saves, reused by the next one: copying into memory that is already
    /// mapped costs a memcpy, not a page fault per 4 KiB. Holds at most the size of the last save.
    pool: Arc<Mutex<Vec<Vec<u8>>>>,
}

/// A staging buffer of exactly `len` bytes: the smallest pooled one that fits, or a new one.
pub(crate) fn staging(pool: &Mutex<Vec<Vec<u8>>>, len: usize) -> Vec<u8> {
    let mut p = pool.lock();
    let best = p
        .iter()
        .enumerate()
        .filter(|(_, v)| v.len() >= len)
        .min_by_key(|(_, v)| v.len())
        .map(|(i, _)| i);
    match best {
        Some(i) => {
            let mut v = p.swap_remove(i);
            v.truncate(len);
            v
        }
        None => vec![0u8; len],
    }
}

/// Tensors are staged in groups of at least this many bytes, each group's copy split over the threads.
pub(crate) const STAGE_GROUP_BYTES: usize = 64 << 20;

/// The bytes of a C-contiguous buffer, readable from any thread while `buf` is alive and the GIL is held.
#[allow(unsafe_code)] // reading an exported buffer's memory from several threads at once; see SAFETY
pub(crate) fn contiguous_bytes<'a>(
    _py: Python<'a>,
    buf: &'a pyo3::buffer::PyBuffer<u8>,
) -> Option<&'a [u8]> {
    if !buf.is_c_contiguous() {
        return None;
    }
    if buf.len_bytes() == 0 {
        return Some(&[]);
    }
    // SAFETY: a C-contiguous buffer's `len_bytes` bytes start at `buf_ptr` (the buffer protocol's contract)
    // and stay valid while the `PyBuffer` holds its export (exporters such as bytearray refuse to resize
    // while exported). The slice lives no longer than `buf` and the GIL token: no Python code of this
    // interpreter runs while the caller holds the GIL, so nothing rewrites the tensors during the copy
    // (exactly what `PyBuffer::copy_to_slice` relies on, only read by several threads here).
    Some(unsafe { std::slice::from_raw_parts(buf.buf_ptr() as *const u8, buf.len_bytes()) })
}

/// Copy every buffer into a staging buffer (from `pool` when one fits), in order. The copy of each group
/// of tensors is split over the machine's cores: copying into fresh staging memory is bound by page
/// faults, which one thread serves at about half the rate of two. The GIL stays held, as for a plain copy.
/// Non-contiguous buffers are copied by the buffer protocol instead.
pub(crate) fn stage_parallel(
    py: Python<'_>,
    pool: &Mutex<Vec<Vec<u8>>>,
    bufs: &[&pyo3::buffer::PyBuffer<u8>],
) -> PyResult<Vec<Vec<u8>>> {
    let mut out = Vec::with_capacity(bufs.len());
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get().min(8));
    let mut i = 0;
    while i < bufs.len() {
        // The next group: tensors until STAGE_GROUP_BYTES (at least one).
        let mut j = i;
        let mut group_bytes = 0;
        while j < bufs.len() && (j == i || group_bytes < STAGE_GROUP_BYTES) {
            group_bytes += bufs[j].len_bytes();
            j += 1;
        }
        let mut staged: Vec<Vec<u8>> = bufs[i..j]
            .iter()
            .map(|b| staging(pool, b.len_bytes()))
            .collect();
        // (source, destination) pieces, cut into `threads` lists of about equal bytes.
        let share = group_bytes.div_ceil(threads).max(1);
        let mut lists: Vec<Vec<(&[u8], &mut [u8])>> = (0..threads).map(|_| Vec::new()).collect();
        let (mut t, mut room) = (0, share);
        for (b, dst) in bufs[i..j].iter().zip(staged.iter_mut()) {
            let Some(mut src) = contiguous_bytes(py, b) else {
                b.copy_to_slice(py, dst)?;
                continue;
            };
            let mut dst: &mut [u8] = dst;
            while !src.is_empty() {
                let n = src.len().min(room);
                let (s, s_rest) = src.split_at(n);
                let (d, d_rest) = std::mem::take(&mut dst).split_at_mut(n);
                lists[t].push((s, d));
                (src, dst) = (s_rest, d_rest);
                room -= n;
                if room == 0 {
                    t = (t + 1).min(threads - 1);
                    room = share;
                }
            }
        }
        let mut lists = lists.into_iter().filter(|l| !l.is_empty());
        let mine = lists.next();
        std::thread::scope(|s| {
            for list in lists {
                s.spawn(move || {
                    for (src, dst) in list {
                        dst.copy_from_slice(src);
                    }
                });
            }
            for (src, dst) in mine.into_iter().flatten() {
                dst.copy_from_slice(src);
            }
        });
        out.extend(staged);
        i = j;
    }
    Ok(out)
}

type TensorTuple = (String, String, Vec<u64>, pyo3::buffer::PyBuffer<u8>);

#[pymethods]
impl Checkpointer {
    #[new]
    #[pyo3(signature = (run_id, local_dir, *, remote_url=None, peers=Vec::new(), self_peer=None, replicas=1, agent=None,
        rank=0, world_size=1, local_is_shared=true, upload_every=1, keep_local=2, keep_remote=0, keep_every=None, overlap="wait", commit_timeout=600.0, team=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        run_id: &str,
        local_dir: std::path::PathBuf,
        remote_url: Option<&str>,
        peers: Vec<String>,
        self_peer: Option<usize>,
        replicas: usize,
        agent: Option<String>,
        rank: u32,
        world_size: u32,
        local_is_shared: bool,
        upload_every: u64,
        keep_local: usize,
        keep_remote: usize,
        keep_every: Option<u64>,
        overlap: &str,
        commit_timeout: f64,
        team: Option<String>,
    ) -> PyResult<Self> {
        let (rt, telemetry) = proc()?;
        let remote = match remote_url {
            Some(u) => {
                let _guard = rt.enter();
                Some(strata_ckpt::Tier::Remote(
                    strata_object::Backend::open(
                        &dataset_url(u)
                            .or_else(|_| Ok::<_, Error>(u.to_string()))
                            .map_err(to_py)?,
                        &strata_object::BackendOptions::default(),
                        strata_object::RetryPolicy::default(),
                        telemetry,
                    )
                    .map_err(to_py)?,
                ))
            }
            None => None,
        };
        let overlap = match overlap {
            "wait" => strata_ckpt::Overlap::Wait,
            "skip" => strata_ckpt::Overlap::Skip,
            o => {
                return Err(InvalidInputError::new_err(format!(
                    "overlap={o:?}: expected 'wait' or 'skip'"
                )));
            }
        };
        if !commit_timeout.is_finite() || commit_timeout <= 0.0 {
            return Err(InvalidInputError::new_err(
                "commit_timeout must be a positive number of seconds",
            ));
        }
        let quota = match (&team, &agent) {
            (Some(t), Some(a)) => Some(strata_ckpt::quota::QuotaGate::new(a, t).map_err(to_py)?),
            (Some(_), None) => {
                return Err(InvalidInputError::new_err(
                    "team= charges saves to a quota through the node agent: give agent= (or STRATA_AGENT) too",
                ));
            }
            (None, _) => None,
        };
        let cfg = strata_ckpt::CheckpointConfig {
            quota,
            run_id: run_id.to_string(),
            rank,
            world_size,
            local_is_shared,
            local: strata_ckpt::Tier::Local(local_dir.clone()),
            remote,
            peers: peers
                .iter()
                .map(|p| strata_ckpt::tier::Peer::new(p).map(strata_ckpt::Tier::Peer))
                .collect::<Result<_, Error>>()
                .map_err(to_py)?,
            self_peer: self_peer.filter(|&i| i < peers.len()),
            replicas: if peers.is_empty() { 0 } else { replicas },
            upload_every,
            keep_local: strata_ckpt::Retention {
                keep_last: keep_local,
                keep_every,
            },
            keep_remote: strata_ckpt::Retention {
                keep_last: keep_remote,
                keep_every,
            },
            overlap,
            commit_timeout: std::time::Duration::from_secs_f64(commit_timeout),
            handoff: match agent {
                Some(a) => Some(
                    strata_ckpt::handoff::Handoff::new(
                        &a,
                        local_dir.clone(),
                        remote_url.map(str::to_string),
                        peers.clone(),
                    )
                    .map_err(to_py)?,
                ),
                None => None,
            },
        };
        Ok(Self {
            inner: strata_ckpt::Checkpointer::new(cfg, IoContext::default()).map_err(to_py)?,
            pool: Arc::new(Mutex::new(Vec::new())),
        })
    }

    /// Upload this rank's steps that a previous process committed locally but never got to the object store
    /// (it was down, the process was killed); returns them. Blocks; `strata.Checkpointer` runs it in a
    /// background thread when it starts.
    fn finish_pending(&self, py: Python<'_>) -> PyResult<Vec<u64>> {
        let (rt, _) = proc()?;
        let inner = self.inner.clone();
        py.detach(|| rt.block_on(async move { inner.finish_pending().await }))
            .map_err(to_py)
    }

    /// Copy `tensors` (`(name, dtype, shape, buffer)`; the buffer's bytes) into staging memory and save them
    /// as `step` in the background. Only the copy (and, with overlap="wait", waiting for the previous save)
    /// blocks.
    fn save(
        &self,
        py: Python<'_>,
        step: u64,
        tensors: Vec<TensorTuple>,
        metadata: std::collections::BTreeMap<String, String>,
    ) -> PyResult<SaveHandle> {
        let (rt, _) = proc()?;
        // With overlap="wait", wait first: the previous save's staging memory is then free to reuse.
        if self.inner.config().overlap == strata_ckpt::Overlap::Wait {
            let inner = self.inner.clone();
            py.detach(|| rt.block_on(async move { inner.wait_idle().await }));
        }
        let specs: Vec<strata_ckpt::format::Spec> = tensors
            .iter()
            .map(|(name, dtype, shape, _)| strata_ckpt::format::Spec {
                name: name.clone(),
                dtype: dtype.clone(),
                shape: shape.clone(),
            })
            .collect();
        let total: usize = tensors.iter().map(|t| t.3.len_bytes()).sum();
        let pool = self.pool.clone();
        let recycle: strata_ckpt::Recycle = Box::new(move |tensors| {
            let mut p = pool.lock();
            let mut kept: usize = p.iter().map(Vec::len).sum();
            for t in tensors {
                let v = Vec::<u8>::from(t.data);
                if kept + v.len() <= total {
                    kept += v.len();
                    p.push(v);
                }
            }
        });
        let inner = self.inner.clone();
        let handle = rt.handle().clone();
        let (h, mut sink) = py
            .detach(|| {
                rt.block_on(async move {
                    inner
                        .save_stream(&handle, step, specs, metadata, Some(recycle))
                        .await
                })
            })
            .map_err(to_py)?;
        // Copy every tensor into staging memory (on all cores), then hand them to the writer. Not pushed one by
        // one while copying: on a few cores the writer (hashing, writing) would take CPU from the copy, the
        // only part the caller waits for (measured: first save 1.1 s vs 0.65 s for 2 GiB on two cores).
        if sink.wanted() {
            let bufs: Vec<&pyo3::buffer::PyBuffer<u8>> = tensors.iter().map(|t| &t.3).collect();
            for v in stage_parallel(py, &self.pool, &bufs)? {
                sink.push(bytes::Bytes::from(v)).map_err(to_py)?;
            }
        }
        Ok(SaveHandle { inner: h, rt })
    }

    /// Wait for every background save.
    fn flush(&self, py: Python<'_>) -> PyResult<()> {
        let (rt, _) = proc()?;
        let inner = self.inner.clone();
        py.detach(|| rt.block_on(async move { inner.flush().await }));
        Ok(())
    }

    /// Committed steps, newest first.
    fn steps(&self, py: Python<'_>) -> PyResult<Vec<u64>> {
        let (rt, _) = proc()?;
        let inner = self.inner.clone();
        let c = py
            .detach(|| rt.block_on(async move { inner.committed().await }))
            .map_err(to_py)?;
        Ok(c.into_iter().map(|(s, _)| s).collect())
    }

    /// The local shard of `step` (`None`: the newest committed), verified (blake3) and its header parsed, for
    /// Python to map: `(step, path, tensors, metadata, identity)`, or `None` when the local tier has no
    /// verified copy (then use `load`).
    #[pyo3(signature = (step=None))]
    #[allow(clippy::type_complexity)]
    fn local_verified(
        &self,
        py: Python<'_>,
        step: Option<u64>,
    ) -> PyResult<
        Option<(
            u64,
            std::path::PathBuf,
            Vec<(String, String, Vec<u64>, usize, usize)>,
            std::collections::BTreeMap<String, String>,
            (u64, u64, u64, i64),
        )>,
    > {
        let (rt, _) = proc()?;
        let inner = self.inner.clone();
        let m = py
            .detach(|| rt.block_on(async { inner.manifest(step).await }))
            .map_err(to_py)?;
        let Some(m) = m else { return Ok(None) };
        let Some((path, rec)) = self.inner.local_shard(&m) else {
            return Ok(None);
        };
        match py
            .detach(|| strata_ckpt::verify::verify_local(&path, &rec))
            .map_err(to_py)?
        {
            Some(v) => Ok(Some((
                m.step,
                path,
                tuples(v.entries),
                v.metadata,
                v.identity,
            ))),
            None => {
                if path.exists() {
                    py_warn(
                        py,
                        &format!(
                            "local shard {} does not verify; trying the other tiers",
                            path.display()
                        ),
                    );
                }
                Ok(None)
            }
        }
    }

    /// This rank's tensors of `step` (`None`: the newest loadable checkpoint), as
    /// `(step, [(name, dtype, shape, offset, length)], metadata, buffer)`: every tensor is a slice of one
    /// bytearray; `None` when there is no checkpoint. A verified local shard is read straight into the
    /// bytearray (hashed while it is read, no other copy); otherwise the tiers are tried in order.
    #[pyo3(signature = (step=None))]
    fn load<'py>(&self, py: Python<'py>, step: Option<u64>) -> PyResult<Option<Loaded<'py>>> {
        let (rt, _) = proc()?;
        let inner = self.inner.clone();
        let m = py
            .detach(|| rt.block_on(async { inner.manifest(step).await }))
            .map_err(to_py)?;
        if let Some(m) = m
            && let Some((path, rec)) = self.inner.local_shard(&m)
        {
            match read_verified(py, &path, &rec) {
                Ok(Some((entries, md, buf))) => return Ok(Some((m.step, entries, md, buf))),
                Ok(None) => {}
                Err(e) => py_warn(
                    py,
                    &format!(
                        "local shard {}: {e}; trying the other tiers",
                        path.display()
                    ),
                ),
            }
        }
        let inner = self.inner.clone();
        let r = py
            .detach(|| {
                rt.block_on(async move {
                    match step {
                        Some(s) => inner.load(s).await.map(|(t, m)| Some((s, t, m))),
                        None => inner.load_latest().await,
                    }
                })
            })
            .map_err(to_py)?;
        let Some((s, tensors, md)) = r else {
            return Ok(None);
        };
        let total: usize = tensors.iter().map(|t| t.data.len()).sum();
        let mut entries = Vec::with_capacity(tensors.len());
        let mut off = 0usize;
        for t in &tensors {
            entries.push((
                t.name.clone(),
                t.dtype.clone(),
                t.shape.clone(),
                off,
                t.data.len(),
            ));
            off += t.data.len();
        }
        let buf = pyo3::types::PyByteArray::new_with(py, total, |b| {
            let mut off = 0usize;
            for t in &tensors {
                b[off..off + t.data.len()].copy_from_slice(&t.data);
                off += t.data.len();
            }
            Ok(())
        })?;
        Ok(Some((s, entries, md, buf)))
    }

    /// Delete a checkpoint from every tier.
    fn delete(&self, py: Python<'_>, step: u64) -> PyResult<()> {
        let (rt, _) = proc()?;
        let inner = self.inner.clone();
        py.detach(|| rt.block_on(async move { inner.delete(step).await }))
            .map_err(to_py)
    }
}
