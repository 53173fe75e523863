//! `Buffer`: read-only bytes of a sample shared with Strata's buffers (the buffer protocol), not copied.

use pyo3::prelude::*;
use pyo3::types::PyBytes;
use strata_loader::shm::{Handle, SharedRegion};

use crate::errors::to_py;

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
pub(crate) struct Buffer {
    pub(crate) data: bytes::Bytes,
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
