//! `Dataset` and its sample iterator: the loader's index, order and sources, with the GIL released.

use std::sync::Arc;

use parking_lot::Mutex;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList};
use strata_loader::share::{ShareClient, ShareServer};
use strata_loader::shm::SharedRegion;
use strata_loader::source::{LocalCacheOptions, dataset_url};
use strata_loader::{
    AgentSource, DatasetIndex, Loader, LoaderOptions, LocalSource, Partition, SampleStream,
    Shuffle, Source, TailPolicy, Value,
};
use strata_telemetry::Telemetry;
use strata_types::{Error, IoContext};

use crate::buffers::Buffer;
use crate::errors::{InvalidInputError, StrataError, py_warn, to_py};
use crate::runtime::proc;

#[derive(Clone, Debug)]
pub(crate) struct SourceSpec {
    url: String,
    agent: Option<String>,
    cache: LocalCacheOptions,
}

impl SourceSpec {
    /// Open the source: the agent's cache, or an in-process cache (with its disk tier under
    /// `cache_dir/<tag>` when a cache dir is configured).
    fn open(&self, telemetry: Arc<Telemetry>, tag: &str) -> Result<Source, Error> {
        match &self.agent {
            Some(api) => {
                // The backend is opened too, only to list a dataset without an index.
                let lister = strata_object::Backend::open(
                    &self.url,
                    &strata_object::BackendOptions::default(),
                    strata_object::RetryPolicy::default(),
                    telemetry,
                )
                .ok();
                Ok(Source::Agent(AgentSource::new(api, &self.url, lister)?))
            }
            None => {
                let mut cache = self.cache.clone();
                cache.disk = cache.disk.map(|(dir, cap)| (dir.join(tag), cap));
                Ok(Source::Local(LocalSource::open(
                    &self.url, &cache, telemetry,
                )?))
            }
        }
    }
}

/// An opened dataset (native). Use `strata.StreamingDataset`, which wraps it.
#[pyclass(module = "strata._native", frozen)]
pub(crate) struct Dataset {
    spec: SourceSpec,
    opts: LoaderOptions,
    index: Arc<DatasetIndex>,
    ctx: IoContext,
    /// The source of this process, with the pid that opened it. In a forked DataLoader worker it is replaced
    /// (the inherited one is never dropped: its threads do not exist there) by a client of the opener's
    /// cache, or of the agent.
    source: Mutex<(u32, Option<Source>)>,
    /// The opener's cache served to its workers (in-process cache only).
    share: Option<ShareServer>,
    /// Where workers' `zero_copy` samples land, so that they cross to the opener without pickling.
    region: Option<Arc<SharedRegion>>,
    /// The process that opened the dataset (forked DataLoader workers differ).
    opener: u32,
}

impl Dataset {
    /// A loader on this process's source; in a forked DataLoader worker, its sample reads land in the shared
    /// region (samples then cross to the opener as handles, not pickled bytes). Only DataLoader workers: their
    /// handles are all adopted or dead with the iteration (see `strata_loader::shm`).
    fn loader(&self, dataloader_worker: bool) -> PyResult<(Arc<tokio::runtime::Runtime>, Loader)> {
        let (rt, telemetry) = proc()?;
        let pid = std::process::id();
        let mut g = self.source.lock();
        if g.0 != pid {
            std::mem::forget(g.1.take());
            let s = match &self.share {
                Some(share) => Source::Shared(ShareClient::new(share.path())),
                None => {
                    let _guard = rt.enter();
                    self.spec.open(telemetry.clone(), "").map_err(to_py)?
                }
            };
            *g = (pid, Some(s));
        }
        let mut src =
            g.1.clone()
                .ok_or_else(|| StrataError::new_err("dataset source missing"))?;
        if dataloader_worker && pid != self.opener {
            src = match src {
                Source::Shared(c) => Source::Shared(c.with_region(self.region.clone())),
                Source::Agent(a) => Source::Agent(a.with_region(self.region.clone())),
                other => other,
            };
        }
        Ok((
            rt,
            Loader::new(self.index.clone(), src, self.opts.clone(), telemetry),
        ))
    }
}

pub(crate) fn tail_of(s: &str) -> PyResult<TailPolicy> {
    s.parse().map_err(to_py)
}

#[pymethods]
impl Dataset {
    /// Open the dataset at `url` (`s3://bucket/prefix`, `file:///dir` or a local directory): its Strata
    /// manifest, else its MDS `index.json`, else a scan of its `.tar` shards.
    #[new]
    #[pyo3(signature = (url, *, agent=None, cache_bytes=None, cache_dir=None, cache_dir_bytes=0,
        cache_tag="rank-0".to_string(), block_size=8<<20, shuffle=false, seed=0, window=None, tail="drop", prefetch_bytes=64<<20,
        prefetch_samples=32, skip_corrupt=false, job=None, shared_memory_bytes=1<<30))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        url: &str,
        agent: Option<String>,
        cache_bytes: Option<u64>,
        cache_dir: Option<std::path::PathBuf>,
        cache_dir_bytes: u64,
        cache_tag: String,
        block_size: u64,
        shuffle: bool,
        seed: u64,
        window: Option<u32>,
        tail: &str,
        prefetch_bytes: u64,
        prefetch_samples: usize,
        skip_corrupt: bool,
        job: Option<String>,
        shared_memory_bytes: u64,
    ) -> PyResult<Self> {
        if window == Some(0) {
            return Err(InvalidInputError::new_err(
                "shuffle window must be at least 1 sample",
            ));
        }
        let url = dataset_url(url).map_err(to_py)?;
        let spec = SourceSpec {
            url,
            agent: agent.map(|a| {
                if a.contains("://") {
                    a
                } else {
                    format!("http://{a}")
                }
            }),
            cache: LocalCacheOptions {
                ram_bytes: cache_bytes.unwrap_or(64 << 20),
                disk: cache_dir.map(|d| (d, cache_dir_bytes.max(1 << 30))),
                block_size,
            },
        };
        let mut opts = LoaderOptions {
            shuffle: shuffle.then_some(Shuffle {
                seed,
                window: window.unwrap_or(1),
            }),
            tail: tail_of(tail)?,
            prefetch_bytes: prefetch_bytes.max(1),
            prefetch_samples: prefetch_samples.max(1),
            skip_corrupt,
        };
        let ctx = IoContext {
            job: job.map(Into::into),
            ..IoContext::default()
        };
        let (rt, telemetry) = proc()?;
        if cache_tag.is_empty() || cache_tag.contains(['/', '\\']) || cache_tag.contains("..") {
            return Err(InvalidInputError::new_err(format!(
                "cache_tag {cache_tag:?} must be a plain name"
            )));
        }
        // The index is read through a small RAM-only cache; the rank's cache is sized from the index.
        let probe = {
            let _guard = rt.enter();
            let mut probe_spec = spec.clone();
            probe_spec.cache.disk = None;
            probe_spec
                .open(telemetry.clone(), &cache_tag)
                .map_err(to_py)?
        };
        let index = Arc::new(
            py.detach(|| rt.block_on(DatasetIndex::open(&probe, &ctx, 8)))
                .map_err(to_py)?,
        );
        let avg = index.avg_sample_bytes();
        let window = window.unwrap_or_else(|| strata_loader::auto_window(avg));
        if let Some(s) = &mut opts.shuffle {
            s.window = window;
        }
        let mut spec = spec;
        spec.cache.ram_bytes =
            cache_bytes.unwrap_or_else(|| strata_loader::auto_cache_bytes(window, avg, block_size));
        let source = match probe {
            Source::Agent(a) => Source::Agent(a),
            _ => {
                let _guard = rt.enter();
                spec.open(telemetry, &cache_tag).map_err(to_py)?
            }
        };
        let share = match &source {
            Source::Local(_) => Some(
                ShareServer::start(rt.handle(), index.clone(), source.clone(), ctx.clone())
                    .map_err(to_py)?,
            ),
            _ => None,
        };
        // Reserved, not touched: resident memory grows with the samples in flight at once.
        let region = match shared_memory_bytes {
            0 => None,
            n => match SharedRegion::create(n) {
                Ok(r) => Some(r),
                Err(e) => {
                    py_warn(
                        py,
                        &format!(
                            "strata: no shared sample memory ({e}); DataLoader workers will pickle samples"
                        ),
                    );
                    None
                }
            },
        };
        Ok(Self {
            spec,
            opts,
            index,
            ctx,
            source: Mutex::new((std::process::id(), Some(source))),
            share,
            region,
            opener: std::process::id(),
        })
    }

    /// Bytes of the shared region DataLoader workers' `zero_copy` samples land in (0: none).
    #[getter]
    fn shared_memory_bytes(&self) -> u64 {
        self.region.as_ref().map_or(0, |r| r.capacity())
    }

    /// Bytes of that region in use now (samples held anywhere: workers, queues, the training loop), after
    /// reclaiming what DataLoader workers that are gone left behind.
    #[getter]
    fn shared_memory_in_use(&self) -> u64 {
        self.region.as_ref().map_or(0, |r| {
            r.reclaim();
            r.in_use()
        })
    }

    /// The slots of that region in use now, as `(bytes, producer pid, producer gone, producer references,
    /// adopted references)`: what holds the memory, for a person debugging a leak.
    fn _shared_memory_held(&self) -> Vec<(u64, u32, bool, u32, u32)> {
        self.region.as_ref().map_or_else(Vec::new, |r| {
            r.held()
                .into_iter()
                .map(|h| {
                    (
                        h.bytes,
                        h.producer,
                        h.producer_gone,
                        h.producer_refs,
                        h.adopted_refs,
                    )
                })
                .collect()
        })
    }

    /// Samples in the dataset.
    fn __len__(&self) -> usize {
        self.index.len() as usize
    }

    /// Number of shards.
    #[getter]
    fn num_shards(&self) -> usize {
        self.index.shards.len()
    }

    /// `"tar"` or `"mds"`.
    #[getter]
    fn format(&self) -> &'static str {
        match self.index.format {
            strata_loader::ShardFormat::Tar => "tar",
            strata_loader::ShardFormat::Mds => "mds",
        }
    }

    /// Where the index came from: `strata-manifest.json`, `index.json` or a scan.
    #[getter]
    fn index_origin(&self) -> String {
        self.index.origin.clone()
    }

    /// `"agent"` when bytes come through the node agent's cache, `"local"` for the in-process cache.
    #[getter]
    fn source_kind(&self) -> &'static str {
        match &self.spec.agent {
            Some(_) => "agent",
            None => "local",
        }
    }

    /// The dataset URL.
    #[getter]
    fn url(&self) -> String {
        self.spec.url.clone()
    }

    /// The shuffle window in samples (the one given, or the default derived from the sample size).
    #[getter]
    fn window(&self) -> Option<u32> {
        self.opts.shuffle.map(|s| s.window)
    }

    /// RAM of the in-process cache, in bytes (0 when reading through the agent).
    #[getter]
    fn cache_bytes(&self) -> u64 {
        match &self.spec.agent {
            Some(_) => 0,
            None => self.spec.cache.ram_bytes,
        }
    }

    /// Average bytes per sample.
    #[getter]
    fn avg_sample_bytes(&self) -> u64 {
        self.index.avg_sample_bytes()
    }

    /// Samples each rank gets in an epoch resumed at global position `start`, with `world` ranks.
    fn per_rank(&self, start: u64, world: u32) -> PyResult<u64> {
        let part = Partition {
            rank: 0,
            world,
            worker: 0,
            workers: 1,
            batch_size: 1,
        };
        part.validate().map_err(to_py)?;
        Ok(part.per_rank(self.index.len().saturating_sub(start), self.opts.tail))
    }

    /// `(shard key, sample index)` at global `position` of `epoch` (for inspection and tests).
    fn locate(&self, epoch: u64, position: u64) -> PyResult<(String, u64)> {
        let order = strata_loader::EpochOrder::new(&self.index.counts(), self.opts.shuffle, epoch);
        if position >= order.len() {
            return Err(InvalidInputError::new_err(format!(
                "position {position} is past the epoch's {} samples",
                order.len()
            )));
        }
        let (s, i) = order.locate(position);
        Ok((self.index.shards[s].key.clone(), i))
    }

    /// Stream this consumer's samples of `epoch` from global position `start`. With `zero_copy`, binary
    /// fields are `Buffer`s and aligned arrays share Strata's memory instead of copies.
    #[pyo3(signature = (epoch, start, rank, world, worker, workers, batch_size, zero_copy=false,
        dataloader_worker=false))]
    #[allow(clippy::too_many_arguments)]
    fn iter(
        &self,
        epoch: u64,
        start: u64,
        rank: u32,
        world: u32,
        worker: u32,
        workers: u32,
        batch_size: u32,
        zero_copy: bool,
        dataloader_worker: bool,
    ) -> PyResult<SampleIter> {
        let (rt, loader) = self.loader(dataloader_worker)?;
        let shared_copies = !zero_copy
            && dataloader_worker
            && std::process::id() != self.opener
            && self.region.is_some();
        let part = Partition {
            rank,
            world,
            worker,
            workers,
            batch_size,
        };
        let stream = loader
            .stream(rt.handle(), self.ctx.clone(), epoch, start, part)
            .map_err(to_py)?;
        Ok(SampleIter {
            stream: Mutex::new(Some(stream)),
            _rt: rt,
            zero_copy,
            shared_copies,
        })
    }
}

/// One consumer's samples (native iterator of dicts).
#[pyclass(module = "strata._native", frozen)]
pub(crate) struct SampleIter {
    stream: Mutex<Option<SampleStream>>,
    _rt: Arc<tokio::runtime::Runtime>,
    zero_copy: bool,
    /// A DataLoader worker's copying iterator: each sample comes with the shared-memory Buffers its bytes
    /// fields were copied from (see `shared_copies`).
    shared_copies: bool,
}

pub(crate) fn value_to_py<'py>(
    py: Python<'py>,
    v: Value,
    np: &mut Option<Bound<'py, PyModule>>,
    zero_copy: bool,
) -> PyResult<Bound<'py, PyAny>> {
    Ok(match v {
        Value::Bytes(b) if zero_copy => Bound::new(py, Buffer { data: b })?.into_any(),
        Value::Bytes(b) => PyBytes::new(py, &b).into_any(),
        Value::Str(s) => s.into_pyobject(py)?.into_any(),
        Value::Int(i) => i.into_pyobject(py)?.into_any(),
        Value::UInt(u) => u.into_pyobject(py)?.into_any(),
        Value::Float(f) => f.into_pyobject(py)?.into_any(),
        Value::Json(text) => py.import("json")?.call_method1("loads", (text,))?,
        Value::Array { dtype, shape, data } => {
            if np.is_none() {
                *np = Some(py.import("numpy")?);
            }
            let np = np.as_ref().expect("imported above");
            // frombuffer shares the buffer's memory. Zero-copy only where the values are aligned for any
            // dtype (numpy works on unaligned memory, but slowly, and some consumers refuse it); else one
            // copy into a bytes object, which is.
            let arr = if zero_copy && (data.as_ptr() as usize).is_multiple_of(16) {
                np.call_method1("frombuffer", (Buffer { data }, dtype))?
            } else {
                np.call_method1("frombuffer", (PyBytes::new(py, &data), dtype))?
            };
            arr.call_method1("reshape", (PyList::new(py, shape)?,))?
        }
    })
}

#[pymethods]
impl SampleIter {
    fn __iter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    /// The next sample as a dict; in a `shared_copies` iterator, `(dict, shared)` where `shared` maps each bytes
    /// field read into shared memory to `(the bytes object, the Buffer it was copied from)`.
    fn __next__<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        let next = py.detach(|| {
            let mut g = self.stream.lock();
            g.as_mut().and_then(|s| s.next_blocking())
        });
        let fetched = match next {
            None => return Ok(None),
            Some(Err(e)) => {
                *self.stream.lock() = None;
                return Err(to_py(e));
            }
            Some(Ok(f)) => f,
        };
        let d = PyDict::new(py);
        d.set_item("__key__", &fetched.sample.key)?;
        let mut np = None;
        let shared = self.shared_copies.then(|| PyDict::new(py));
        for (name, v) in fetched.sample.fields {
            if let (Some(shared), Value::Bytes(b)) = (&shared, &v)
                && SharedRegion::holds(b)
            {
                let copy = PyBytes::new(py, b);
                let buf = Bound::new(py, Buffer { data: b.clone() })?;
                shared.set_item(&name, (&copy, buf))?;
                d.set_item(name, copy)?;
                continue;
            }
            d.set_item(name, value_to_py(py, v, &mut np, self.zero_copy)?)?;
        }
        Ok(Some(match shared {
            Some(shared) => (d, shared).into_pyobject(py)?.into_any(),
            None => d.into_any(),
        }))
    }

    /// Whether samples come as `(dict, shared)` (a DataLoader worker's copying iterator over shared memory).
    #[getter]
    fn shared_copies(&self) -> bool {
        self.shared_copies
    }

    /// Counters of this stream: samples, bytes, stall_seconds (time waited for data), skipped.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        if let Some(s) = self.stream.lock().as_ref() {
            use std::sync::atomic::Ordering::Relaxed;
            let st = s.stats();
            d.set_item("samples", st.samples.load(Relaxed))?;
            d.set_item("bytes", st.bytes.load(Relaxed))?;
            d.set_item("stall_seconds", st.stall().as_secs_f64())?;
            d.set_item("skipped", st.skipped.load(Relaxed))?;
        }
        Ok(d)
    }

    /// Stop prefetching and release the window.
    fn close(&self) {
        *self.stream.lock() = None;
    }
}
