//! The per-process Tokio runtime and telemetry, recreated after a fork (a DataLoader worker).

use std::sync::Arc;

use parking_lot::Mutex;
use pyo3::prelude::*;
use strata_telemetry::Telemetry;

use crate::errors::StrataError;

/// Per-process runtime and telemetry (recreated after a fork).
pub(crate) struct Proc {
    pid: u32,
    rt: Arc<tokio::runtime::Runtime>,
    telemetry: Arc<Telemetry>,
}

pub(crate) static PROC: Mutex<Option<Proc>> = Mutex::new(None);

pub(crate) fn proc() -> PyResult<(Arc<tokio::runtime::Runtime>, Arc<Telemetry>)> {
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
