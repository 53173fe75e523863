//! `strata._native`: the Rust side of the `strata` Python package.
//!
//! The Python layer (`pysrc/strata`) adds the PyTorch integration (IterableDataset, worker detection,
//! torch.distributed environment) and the resumable state; everything that moves or decodes bytes is here and
//! runs with the GIL released.
//!
//! Fork safety: PyTorch's DataLoader forks worker processes. A tokio runtime or an open cache does not survive
//! a fork, so both are created per process (keyed by pid) on first use; the dataset index, plain data, is
//! inherited by the workers as it is.

use std::sync::Arc;

use parking_lot::Mutex;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList};
use strata_loader::share::{ShareClient, ShareServer};
use strata_loader::source::{LocalCacheOptions, dataset_url};
use strata_loader::{
    AgentSource, DatasetIndex, Loader, LoaderOptions, LocalSource, Partition, SampleStream,
    Shuffle, Source, TailPolicy, Value,
};
use strata_telemetry::Telemetry;
use strata_types::{Error, ErrorKind, IoContext};

pyo3::create_exception!(
    _native,
    StrataError,
    PyException,
    "Base class of Strata's errors."
);
pyo3::create_exception!(
    _native,
    NotFoundError,
    StrataError,
    "A dataset, shard or object does not exist."
);
pyo3::create_exception!(
    _native,
    CorruptDataError,
    StrataError,
    "A shard, index or manifest is malformed or truncated."
);
pyo3::create_exception!(
    _native,
    InvalidInputError,
    StrataError,
    "An argument is invalid."
);
pyo3::create_exception!(
    _native,
    ChangedError,
    StrataError,
    "An object changed after the index was built."
);
pyo3::create_exception!(
    _native,
    UnavailableError,
    StrataError,
    "The storage or agent could not be reached (retryable)."
);

fn to_py(e: Error) -> PyErr {
    let msg = e.to_string();
    match e.kind() {
        ErrorKind::NotFound => NotFoundError::new_err(msg),
        ErrorKind::Corrupt => CorruptDataError::new_err(msg),
        ErrorKind::InvalidInput | ErrorKind::Config => InvalidInputError::new_err(msg),
        ErrorKind::PreconditionFailed => ChangedError::new_err(msg),
        ErrorKind::Unavailable | ErrorKind::Timeout => UnavailableError::new_err(msg),
        _ => StrataError::new_err(msg),
    }
}

/// Per-process runtime and telemetry (recreated after a fork).
struct Proc {
    pid: u32,
    rt: Arc<tokio::runtime::Runtime>,
    telemetry: Arc<Telemetry>,
}

static PROC: Mutex<Option<Proc>> = Mutex::new(None);

fn proc() -> PyResult<(Arc<tokio::runtime::Runtime>, Arc<Telemetry>)> {
    let pid = std::process::id();
    let mut g = PROC.lock();
    if let Some(p) = g.as_ref()
        && p.pid == pid
    {
        return Ok((p.rt.clone(), p.telemetry.clone()));
    }
    // Inherited from the parent through fork: its threads do not exist here, so it must not be dropped
    // (dropping would wait for them).
    if let Some(old) = g.take() {
        std::mem::forget(old);
    }
    let threads = std::env::var("STRATA_LOADER_THREADS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(2, |n| n.get().min(4)));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .thread_name("strata-loader")
        .enable_all()
        .build()
        .map_err(|e| StrataError::new_err(format!("starting the I/O runtime: {e}")))?;
    let p = Proc {
        pid,
        rt: Arc::new(rt),
        telemetry: Telemetry::new(),
    };
    let out = (p.rt.clone(), p.telemetry.clone());
    *g = Some(p);
    Ok(out)
}

#[derive(Clone, Debug)]
struct SourceSpec {
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
struct Dataset {
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
}

impl Dataset {
    fn loader(&self) -> PyResult<(Arc<tokio::runtime::Runtime>, Loader)> {
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
        let src =
            g.1.clone()
                .ok_or_else(|| StrataError::new_err("dataset source missing"))?;
        Ok((
            rt,
            Loader::new(self.index.clone(), src, self.opts.clone(), telemetry),
        ))
    }
}

fn tail_of(s: &str) -> PyResult<TailPolicy> {
    s.parse().map_err(to_py)
}

#[pymethods]
impl Dataset {
    /// Open the dataset at `url` (`s3://bucket/prefix`, `file:///dir` or a local directory): its Strata
    /// manifest, else its MDS `index.json`, else a scan of its `.tar` shards.
    #[new]
    #[pyo3(signature = (url, *, agent=None, cache_bytes=None, cache_dir=None, cache_dir_bytes=0,
        cache_tag="rank-0".to_string(), block_size=8<<20, shuffle=false, seed=0, window=None, tail="drop", prefetch_bytes=64<<20,
        prefetch_samples=32, skip_corrupt=false, job=None))]
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
        Ok(Self {
            spec,
            opts,
            index,
            ctx,
            source: Mutex::new((std::process::id(), Some(source))),
            share,
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

    /// Stream this consumer's samples of `epoch` from global position `start`.
    #[pyo3(signature = (epoch, start, rank, world, worker, workers, batch_size))]
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
    ) -> PyResult<SampleIter> {
        let (rt, loader) = self.loader()?;
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
        })
    }
}

/// One consumer's samples (native iterator of dicts).
#[pyclass(module = "strata._native", frozen)]
struct SampleIter {
    stream: Mutex<Option<SampleStream>>,
    _rt: Arc<tokio::runtime::Runtime>,
}

fn value_to_py<'py>(
    py: Python<'py>,
    v: Value,
    np: &mut Option<Bound<'py, PyModule>>,
) -> PyResult<Bound<'py, PyAny>> {
    Ok(match v {
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
            let buf = PyBytes::new(py, &data);
            // frombuffer shares the bytes object's memory: one copy from Rust, none after.
            let arr = np.call_method1("frombuffer", (buf, dtype))?;
            arr.call_method1("reshape", (PyList::new(py, shape)?,))?
        }
    })
}

#[pymethods]
impl SampleIter {
    fn __iter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    fn __next__<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
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
        for (name, v) in fetched.sample.fields {
            d.set_item(name, value_to_py(py, v, &mut np)?)?;
        }
        Ok(Some(d))
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

/// Build the Strata manifest of the dataset at `url` (an MDS index or a scan of its `.tar` shards) and store it
/// as `strata-manifest.json` there. Returns the number of samples indexed.
#[pyfunction]
fn index_dataset(py: Python<'_>, url: &str) -> PyResult<u64> {
    let url = dataset_url(url).map_err(to_py)?;
    let (rt, telemetry) = proc()?;
    let src = {
        let _guard = rt.enter();
        LocalSource::open(&url, &LocalCacheOptions::default(), telemetry).map_err(to_py)?
    };
    let m = py
        .detach(|| {
            rt.block_on(strata_loader::dataset::write_manifest(
                &src,
                &IoContext::default(),
                8,
            ))
        })
        .map_err(to_py)?;
    Ok(m.shards.iter().map(|s| s.samples).sum())
}

/// This process's metrics in the Prometheus text format (loader samples and stall time by rank, I/O).
#[pyfunction]
fn metrics_text() -> PyResult<String> {
    Ok(proc()?.1.metrics().render())
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Dataset>()?;
    m.add_class::<SampleIter>()?;
    m.add_function(wrap_pyfunction!(index_dataset, m)?)?;
    m.add_function(wrap_pyfunction!(metrics_text, m)?)?;
    let py = m.py();
    m.add("StrataError", py.get_type::<StrataError>())?;
    m.add("NotFoundError", py.get_type::<NotFoundError>())?;
    m.add("CorruptDataError", py.get_type::<CorruptDataError>())?;
    m.add("InvalidInputError", py.get_type::<InvalidInputError>())?;
    m.add("ChangedError", py.get_type::<ChangedError>())?;
    m.add("UnavailableError", py.get_type::<UnavailableError>())?;
    Ok(())
}
