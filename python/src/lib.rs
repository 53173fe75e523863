//! `strata._native`: the Rust side of the `strata` Python package.
//!
//! The Python layer (`pysrc/strata`) adds the PyTorch integration (IterableDataset, worker detection,
//! torch.distributed environment) and the resumable state; everything that moves or decodes bytes is here and
//! runs with the GIL released.
//!
//! Fork safety: PyTorch's DataLoader forks worker processes. A tokio runtime or an open cache does not survive
//! a fork, so both are created per process (keyed by pid) on first use; the dataset index, plain data, is
//! inherited by the workers as it is.
//!
//! One module per concern: [`errors`] (an exception class per error kind), [`runtime`] (the per-process
//! runtime), [`dataset`] (the loader), [`buffers`] (zero-copy sample bytes), [`checkpoint`] (saves and
//! restores).

mod buffers;
mod checkpoint;
mod dataset;
mod errors;
mod runtime;

use pyo3::prelude::*;
use strata_loader::LocalSource;
use strata_loader::source::{LocalCacheOptions, dataset_url};
use strata_types::IoContext;

use crate::buffers::Buffer;
use crate::checkpoint::{Checkpointer, SaveHandle};
use crate::dataset::{Dataset, SampleIter};
use crate::errors::{add_exceptions, to_py};
use crate::runtime::proc;

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
