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
use strata_loader::shm::{Handle, SharedRegion};
use strata_loader::source::{LocalCacheOptions, dataset_url};
use strata_loader::{
    AgentSource, DatasetIndex, Loader, LoaderOptions, LocalSource, Partition, SampleStream,
    Shuffle, Source, TailPolicy, Value,
};
use strata_telemetry::Telemetry;
use strata_types::{Error, ErrorKind, IoContext};

pyo3::create_exception!(
    strata._native,
    StrataError,
    PyException,
    "Base class of Strata's errors. `kind` names the error kind (as in the Rust core and the agent's wire), \
     `retryable` says whether the same call may succeed if tried again."
);

/// An exception class of one error kind: `(name, parent, kind, retryable by default, doc)`.
macro_rules! kind_exceptions {
    ($(($name:ident, $parent:ident, $kind:ident, $doc:literal)),* $(,)?) => {
        $(pyo3::create_exception!(strata._native, $name, $parent, $doc);)*

        /// The Python exception for `e`, with `kind` and `retryable` set on it.
        fn to_py(e: Error) -> PyErr {
            let msg = e.to_string();
            let err = match e.kind() {
                $(ErrorKind::$kind => $name::new_err(msg),)*
                _ => InternalError::new_err(msg),
            };
            Python::attach(|py| {
                let v = err.value(py);
                let _ = v.setattr("kind", e.kind().as_str());
                let _ = v.setattr("retryable", e.is_retryable());
            });
            err
        }

        /// Register every class, each with its kind and default retryability as class attributes (so that
        /// an instance raised from Python, `InvalidInputError("...")`, has them too).
        fn add_exceptions(m: &Bound<'_, PyModule>) -> PyResult<()> {
            let py = m.py();
            let base = py.get_type::<StrataError>();
            base.setattr("kind", ErrorKind::Internal.as_str())?;
            base.setattr("retryable", false)?;
            m.add("StrataError", base)?;
            $(
                let t = py.get_type::<$name>();
                t.setattr("kind", ErrorKind::$kind.as_str())?;
                t.setattr("retryable", ErrorKind::$kind.default_retryable())?;
                m.add(stringify!($name), t)?;
            )*
            Ok(())
        }
    };
}

kind_exceptions! {
    (NotFoundError, StrataError, NotFound, "A dataset, shard, checkpoint or object does not exist."),
    (AlreadyExistsError, StrataError, AlreadyExists, "A create-only write found something already there."),
    (ChangedError, StrataError, PreconditionFailed,
        "An object changed after the index was built (or a condition on its version did not hold)."),
    (InvalidInputError, StrataError, InvalidInput, "An argument is invalid."),
    (ConfigError, InvalidInputError, Config, "A configuration value is invalid."),
    (InvalidRangeError, InvalidInputError, InvalidRange, "A byte range the object cannot satisfy."),
    (PermissionDeniedError, StrataError, PermissionDenied, "The credentials may not do this."),
    (UnauthenticatedError, StrataError, Unauthenticated, "Credentials are missing or invalid (STRATA_TOKEN)."),
    (UnavailableError, StrataError, Unavailable, "The storage or agent could not be reached (retryable)."),
    (TimedOutError, UnavailableError, Timeout, "The storage or agent took too long (retryable)."),
    (StorageIOError, StrataError, Io, "A local I/O error."),
    (NoSpaceError, StorageIOError, NoSpace, "A local device is full."),
    (CorruptDataError, StrataError, Corrupt,
        "Bytes failed verification: a shard, index, manifest or checkpoint is malformed, truncated or corrupt."),
    (UnsupportedError, StrataError, Unsupported, "The storage does not support this operation."),
    (OperationCancelledError, StrataError, Cancelled, "The operation was cancelled (usually by shutdown)."),
    (ResourceExhaustedError, StrataError, ResourceExhausted,
        "A bounded resource is exhausted: a quota, a budget, a queue."),
    (InternalError, StrataError, Internal, "A bug or an unexpected state in Strata; the message has details."),
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
    let forked = g.take().map(std::mem::forget).is_some();
    // A forked process is a DataLoader worker: the DataLoader runs several side by side, so each gets one I/O
    // thread (more only multiply the wake-ups between them on the cores they share).
    let threads = std::env::var("STRATA_LOADER_THREADS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| {
            if forked {
                1
            } else {
                std::thread::available_parallelism().map_or(2, |n| n.get().min(4))
            }
        });
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
struct SampleIter {
    stream: Mutex<Option<SampleStream>>,
    _rt: Arc<tokio::runtime::Runtime>,
    zero_copy: bool,
    /// A DataLoader worker's copying iterator: each sample comes with the shared-memory Buffers its bytes
    /// fields were copied from (see `shared_copies`).
    shared_copies: bool,
}

fn value_to_py<'py>(
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

/// Read-only bytes of a sample, shared with Strata's buffers instead of copied (`zero_copy=True`).
///
/// Supports the buffer protocol (`memoryview`, `numpy.frombuffer`, `io.BytesIO`, `torch.frombuffer`, `hashlib`,
/// `pickle.loads`), `len()`, `bytes()`, `decode()`, indexing and slicing (a slice shares the memory too),
/// comparison with bytes-like objects; `pickle` writes it as `bytes`.
/// Made by a DataLoader worker, it lives in a shared-memory region of the process that opened the dataset,
/// and crosses multiprocessing queues as a small handle to it (no copy); elsewhere it crosses as bytes. It
/// keeps the memory it shares alive: in-process that can be a whole cache block, so copy (`bytes(x)`) what
/// you keep for long.
#[pyclass(module = "strata._native", name = "Buffer", frozen)]
struct Buffer {
    data: bytes::Bytes,
}

#[pymethods]
#[allow(unsafe_code)] // the buffer protocol is a C interface; see SAFETY
impl Buffer {
    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut pyo3::ffi::Py_buffer,
        flags: std::ffi::c_int,
    ) -> PyResult<()> {
        let data = &slf.get().data;
        // SAFETY: `view` is the caller's Py_buffer to fill (checked non-null by CPython). PyBuffer_FillInfo
        // stores a new reference to `slf` in it, so the `Bytes` (immutable, never moved: it is a field of a
        // frozen object) outlives every view; the memory is exported read-only and a writable request fails
        // with BufferError. Nothing is allocated, so there is no __releasebuffer__.
        let rc = unsafe {
            pyo3::ffi::PyBuffer_FillInfo(
                view,
                slf.as_ptr(),
                data.as_ptr() as *mut std::ffi::c_void,
                data.len() as pyo3::ffi::Py_ssize_t,
                1,
                flags,
            )
        };
        if rc != 0 {
            return Err(PyErr::fetch(slf.py()));
        }
        Ok(())
    }

    fn __len__(&self) -> usize {
        self.data.len()
    }

    /// `b[i]` is an int, `b[a:b]` a Buffer over the same memory (a step other than 1 gives bytes).
    fn __getitem__<'py>(
        &self,
        py: Python<'py>,
        key: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let n = self.data.len() as isize;
        if let Ok(slice) = key.cast::<pyo3::types::PySlice>() {
            let ind = slice.indices(n)?;
            let (start, stop, step) = (ind.start, ind.stop, ind.step);
            if step == 1 {
                let (a, b) = (start.max(0) as usize, stop.max(start).max(0) as usize);
                return Ok(Bound::new(
                    py,
                    Buffer {
                        data: self.data.slice(a..b),
                    },
                )?
                .into_any());
            }
            let picked: Vec<u8> = (0..ind.slicelength as isize)
                .map(|k| self.data[(start + k * step) as usize])
                .collect();
            return Ok(PyBytes::new(py, &picked).into_any());
        }
        let i: isize = key.extract().map_err(|_| {
            pyo3::exceptions::PyTypeError::new_err("Buffer indices must be integers or slices")
        })?;
        let j = if i < 0 { i + n } else { i };
        if !(0..n).contains(&j) {
            return Err(pyo3::exceptions::PyIndexError::new_err(
                "Buffer index out of range",
            ));
        }
        Ok(self.data[j as usize].into_pyobject(py)?.into_any())
    }

    /// The bytes decoded as text, as `bytes.decode`.
    #[pyo3(signature = (encoding="utf-8", errors="strict"))]
    fn decode<'py>(
        &self,
        py: Python<'py>,
        encoding: &str,
        errors: &str,
    ) -> PyResult<Bound<'py, PyAny>> {
        if matches!(encoding, "utf-8" | "utf8" | "UTF-8")
            && let Ok(s) = std::str::from_utf8(&self.data)
        {
            return Ok(pyo3::types::PyString::new(py, s).into_any());
        }
        PyBytes::new(py, &self.data).call_method1("decode", (encoding, errors))
    }

    fn __bytes__<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.data)
    }

    /// A copy as `bytes`.
    fn tobytes<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.data)
    }

    fn __eq__(&self, other: &Bound<'_, PyAny>) -> bool {
        if let Ok(b) = other.cast::<Buffer>() {
            return b.get().data == self.data;
        }
        if let Ok(b) = other.cast::<PyBytes>() {
            return b.as_bytes() == self.data.as_ref();
        }
        match pyo3::buffer::PyBuffer::<u8>::get(other) {
            Ok(buf) => buf
                .to_vec(other.py())
                .is_ok_and(|v| v == self.data.as_ref()),
            Err(_) => false,
        }
    }

    fn __repr__(&self) -> String {
        format!("strata.Buffer(<{} bytes>)", self.data.len())
    }

    /// A handle `(token, offset, length, slot)` to this buffer's bytes when they are in a shared sample
    /// region, taking a reference for the message that carries it; `None` otherwise. For the multiprocessing
    /// pickler only: every handle must be adopted exactly once.
    fn _share(&self) -> Option<(u64, u64, u64, u32, u32, bool)> {
        SharedRegion::share(&self.data)
            .map(|h| (h.token, h.offset, h.len, h.slot, h.generation, h.adopted))
    }

    /// The buffer a handle from `_share` names, in a process that maps the same region.
    #[staticmethod]
    fn _adopt(
        token: u64,
        offset: u64,
        length: u64,
        slot: u32,
        generation: u32,
        adopted: bool,
    ) -> PyResult<Self> {
        let data = SharedRegion::adopt(Handle {
            token,
            offset,
            len: length,
            slot,
            generation,
            adopted,
        })
        .map_err(to_py)?;
        Ok(Self { data })
    }

    /// Pickled as the bytes it holds.
    fn __reduce__<'py>(
        &self,
        py: Python<'py>,
    ) -> PyResult<(Bound<'py, PyAny>, (Bound<'py, PyBytes>,))> {
        Ok((
            py.get_type::<PyBytes>().into_any(),
            (PyBytes::new(py, &self.data),),
        ))
    }
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

/// Where a save stands (native). `strata.SaveHandle` wraps it.
#[pyclass(module = "strata._native", frozen)]
struct SaveHandle {
    inner: strata_ckpt::SaveHandle,
    rt: Arc<tokio::runtime::Runtime>,
}

fn state_name(s: &strata_ckpt::SaveState) -> &'static str {
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

/// A Python `RuntimeWarning` (shown once per place by Python's warning filters).
fn py_warn(py: Python<'_>, msg: &str) {
    let category = py.get_type::<pyo3::exceptions::PyRuntimeWarning>();
    let _ = PyErr::warn(
        py,
        category.as_any(),
        &std::ffi::CString::new(msg).unwrap_or_default(),
        1,
    );
}

/// Read a local shard straight into a new bytearray, hashing it on a second thread as it is read. `Ok(None)`
/// when the file is missing or does not match its record (the caller tries the other tiers).
#[allow(clippy::type_complexity)]
fn read_verified<'py>(
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
    use std::io::Read;
    let Ok(mut f) = std::fs::File::open(path) else {
        return Ok(None);
    };
    match f.metadata() {
        Ok(md) if md.len() == rec.size => {}
        _ => return Ok(None),
    }
    let size = usize::try_from(rec.size).map_err(|_| StrataError::new_err("shard too large"))?;
    let mut verdict: Option<Result<(Vec<_>, std::collections::BTreeMap<String, String>), String>> =
        None;
    let buf = pyo3::types::PyByteArray::new_with(py, size, |b| {
        let read = std::thread::scope(|s| {
            let (tx, rx) = std::sync::mpsc::sync_channel::<&[u8]>(4);
            let hasher = s.spawn(move || {
                let mut h = blake3::Hasher::new();
                for chunk in rx {
                    h.update(chunk);
                }
                h.finalize().to_hex().to_string()
            });
            let mut result = Ok(());
            for chunk in b.chunks_mut(8 << 20) {
                if let Err(e) = f.read_exact(chunk) {
                    result = Err(e.to_string());
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
        });
        verdict = Some(match read {
            Err(e) => Err(e),
            Ok(sum) if sum != rec.blake3 => Err("checksum mismatch".to_string()),
            Ok(_) => strata_ckpt::format::parse(&rec.file, b)
                .map(|(entries, md)| {
                    (
                        entries
                            .into_iter()
                            .map(|e| (e.name, e.dtype, e.shape, e.range.start, e.range.len()))
                            .collect(),
                        md,
                    )
                })
                .map_err(|e| e.to_string()),
        });
        Ok(())
    })?;
    match verdict {
        Some(Ok((entries, md))) => Ok(Some((entries, md, buf))),
        Some(Err(e)) => Err(StrataError::new_err(e)),
        None => Ok(None),
    }
}

/// What Python needs to map a verified local shard: tensors (name, dtype, shape, offset, length), metadata,
/// and the file's identity (device, inode, size, mtime ns) to check that it maps the file that was hashed.
type LocalPlan = (
    Vec<(String, String, Vec<u64>, usize, usize)>,
    std::collections::BTreeMap<String, String>,
    (u64, u64, u64, i64),
);

/// Hash a local shard (reading on one thread, hashing on another) and parse its header. `Ok(None)` when it
/// is missing, of another size or does not match its record.
fn verify_local(
    path: &std::path::Path,
    rec: &strata_ckpt::ShardRecord,
) -> Result<Option<LocalPlan>, Error> {
    use std::io::Read;
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
    const CHUNK: usize = 8 << 20;
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
    let (entries, meta) = strata_ckpt::format::parse_header(&rec.file, &head, rec.size)?;
    Ok(Some((
        entries
            .into_iter()
            .map(|e| (e.name, e.dtype, e.shape, e.range.start, e.range.len()))
            .collect(),
        meta,
        (
            md.dev(),
            md.ino(),
            md.len(),
            md.mtime() * 1_000_000_000 + md.mtime_nsec(),
        ),
    )))
}

/// A rank's checkpointer (native). `strata.Checkpointer` wraps it.
#[pyclass(module = "strata._native", frozen)]
struct Checkpointer {
    inner: strata_ckpt::Checkpointer,
    /// Staging buffers of finished saves, reused by the next one: copying into memory that is already
    /// mapped costs a memcpy, not a page fault per 4 KiB. Holds at most the size of the last save.
    pool: Arc<Mutex<Vec<Vec<u8>>>>,
}

/// A staging buffer of exactly `len` bytes: the smallest pooled one that fits, or a new one.
fn staging(pool: &Mutex<Vec<Vec<u8>>>, len: usize) -> Vec<u8> {
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
const STAGE_GROUP_BYTES: usize = 64 << 20;

/// The bytes of a C-contiguous buffer, readable from any thread while `buf` is alive and the GIL is held.
#[allow(unsafe_code)] // reading an exported buffer's memory from several threads at once; see SAFETY
fn contiguous_bytes<'a>(_py: Python<'a>, buf: &'a pyo3::buffer::PyBuffer<u8>) -> Option<&'a [u8]> {
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
fn stage_parallel(
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
        match py.detach(|| verify_local(&path, &rec)).map_err(to_py)? {
            Some((entries, meta, ident)) => Ok(Some((m.step, path, entries, meta, ident))),
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
    m.add_class::<Buffer>()?;
    m.add_class::<Checkpointer>()?;
    m.add_class::<SaveHandle>()?;
    m.add_function(wrap_pyfunction!(index_dataset, m)?)?;
    m.add_function(wrap_pyfunction!(metrics_text, m)?)?;
    add_exceptions(m)?;
    Ok(())
}
