//! Python exceptions of Strata's errors: one class per error kind, each with `kind` and `retryable`.

use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use strata_types::{Error, ErrorKind};

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
        pub(crate) fn to_py(e: Error) -> PyErr {
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
        pub(crate) fn add_exceptions(m: &Bound<'_, PyModule>) -> PyResult<()> {
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

/// A Python `RuntimeWarning` (shown once per place by Python's warning filters).
pub(crate) fn py_warn(py: Python<'_>, msg: &str) {
    let category = py.get_type::<pyo3::exceptions::PyRuntimeWarning>();
    let _ = PyErr::warn(
        py,
        category.as_any(),
        &std::ffi::CString::new(msg).unwrap_or_default(),
        1,
    );
}
