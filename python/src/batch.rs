//! A batch as a Python mapping from tensor name to numpy array.
//!
//! Each array views the batch's own bytes: nothing is copied. The array's
//! `base` is the [`Batch`] object, so the batch (and its buffer, which goes
//! back to the loader's pool when the batch is dropped) lives as long as
//! any array, slice of one, or tensor made from one without a copy
//! (`torch.from_numpy`, `torch.from_dlpack`). Python code can therefore
//! never read a buffer the loader has reused.
//!
//! An assembled batch's arrays are writable (the buffer is the batch's
//! alone). A batch that is one run of one chunk (the block shuffle, or an
//! unshuffled plan, inside one chunk: [`granary_client::Batch::is_view`])
//! views the node's chunk memory, mapped read-only and shared with every
//! rank on the host: its arrays are read-only.
//!
//! A jagged tensor (a list or byte column) is a `granary.Jagged`: a values
//! array and an int64 row offsets array (rows + 1, rebased to the batch's
//! first value), both views of the batch like any other array.
//!
//! dtypes: f32 f64 f16 i64 i32 i16 i8 u8 and bool map to numpy's own; bf16,
//! which numpy lacks, is exposed as uint16 holding the same bits
//! (`granary.torch` reinterprets it as `torch.bfloat16` without a copy).

use granary_proto::DType;
use numpy::npyffi::{self, NPY_ARRAY_CARRAY, NPY_ARRAY_CARRAY_RO, NpyTypes, PY_ARRAY_API, npy_intp};
use numpy::{PyArrayDescr, PyArrayDescrMethods, dtype};
use pyo3::exceptions::PyKeyError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyTuple};
use std::ffi::c_int;

/// One batch: a read-only mapping from tensor name to a numpy array that
/// views the batch's buffer (``batch["dense"]``: float32, shape
/// ``(rows, 150)``). The arrays keep the batch alive; its buffer goes back
/// to the loader only when no array (or tensor made from one) refers to it.
/// bf16 tensors are uint16 arrays of the same bits.
#[pyclass(frozen, weakref, module = "granary._granary")]
pub struct Batch {
    inner: granary_client::Batch,
}

impl Batch {
    pub(crate) fn new(inner: granary_client::Batch) -> Self {
        Self { inner }
    }

    fn index(&self, name: &str) -> Option<usize> {
        self.inner.layouts().iter().position(|l| l.name == name)
    }

    fn names(&self) -> impl Iterator<Item = &str> {
        self.inner.layouts().iter().map(|l| l.name.as_str())
    }
}

/// numpy's dtype for `d` (bf16 as uint16).
fn descr(py: Python<'_>, d: DType) -> PyResult<Bound<'_, PyArrayDescr>> {
    Ok(match d {
        DType::F32 => dtype::<f32>(py),
        DType::F64 => dtype::<f64>(py),
        DType::F16 => PyArrayDescr::new(py, "float16")?,
        DType::BF16 => dtype::<u16>(py),
        DType::I64 => dtype::<i64>(py),
        DType::I32 => dtype::<i32>(py),
        DType::I16 => dtype::<i16>(py),
        DType::I8 => dtype::<i8>(py),
        DType::U8 => dtype::<u8>(py),
        DType::Bool => dtype::<bool>(py),
    })
}

/// A numpy array over tensor `i` of `batch`, whose base is `batch`; of a
/// jagged tensor, a `granary.Jagged` of its values and row offsets.
fn array<'py>(batch: &Bound<'py, Batch>, i: usize) -> PyResult<Bound<'py, PyAny>> {
    let py = batch.py();
    let b = &batch.get().inner;
    let layout = &b.layouts()[i];
    let bytes = b.tensor_bytes(i);
    let Some(offsets) = b.row_offsets(i) else {
        let dims = std::iter::once(b.rows()).chain(layout.shape.iter().map(|&d| d as usize));
        return view(batch, bytes, dims.collect(), descr(py, layout.dtype)?);
    };
    let count = bytes.len() / layout.row_bytes().max(1);
    let dims = std::iter::once(count).chain(layout.shape.iter().map(|&d| d as usize));
    let values = view(batch, bytes, dims.collect(), descr(py, layout.dtype)?)?;
    // Offsets are u64s below 2^63 (they count values in memory): int64,
    // the type numpy and torch index with.
    let offsets = view(batch, bytemuck::cast_slice(offsets), vec![offsets.len()], dtype::<i64>(py))?;
    py.import("granary")?.getattr("Jagged")?.call1((values, offsets))
}

/// A numpy array of `dims` over `bytes` of `batch`, whose base is `batch`.
fn view<'py>(
    batch: &Bound<'py, Batch>,
    bytes: &[u8],
    dims: Vec<usize>,
    descr: Bound<'py, PyArrayDescr>,
) -> PyResult<Bound<'py, PyAny>> {
    let py = batch.py();
    let mut dims: Vec<npy_intp> = dims.into_iter().map(|d| d as npy_intp).collect();
    let flags = if batch.get().inner.is_view() { NPY_ARRAY_CARRAY_RO } else { NPY_ARRAY_CARRAY };
    let descr = descr.into_dtype_ptr();
    // SAFETY: `bytes` holds the product of `dims` elements of this dtype, C
    // order, aligned to at least the element size (batch buffers, chunk
    // tensors and row offsets are 64-byte aligned, rows and values a
    // multiple of the element size), and stays valid and unmoved while
    // `batch` lives: the array's base is `batch` (SetBaseObject steals the
    // reference we pass), so numpy keeps it alive as long as the array or
    // any view of it. NewFromDescr steals `descr`.
    unsafe {
        let arr = PY_ARRAY_API.PyArray_NewFromDescr(
            py,
            npyffi::get_type_object(py, NpyTypes::PyArray_Type),
            descr,
            dims.len() as c_int,
            dims.as_mut_ptr(),
            std::ptr::null_mut(),
            bytes.as_ptr() as *mut std::ffi::c_void,
            flags,
            std::ptr::null_mut(),
        );
        if arr.is_null() {
            return Err(PyErr::fetch(py));
        }
        let arr = Bound::from_owned_ptr(py, arr);
        let base = batch.clone().into_any().into_ptr();
        if PY_ARRAY_API.PyArray_SetBaseObject(py, arr.as_ptr() as *mut npyffi::PyArrayObject, base) < 0 {
            return Err(PyErr::fetch(py));
        }
        Ok(arr)
    }
}

#[pymethods]
impl Batch {
    /// The array of tensor `name` (a view of the batch's bytes).
    fn __getitem__<'py>(slf: &Bound<'py, Self>, name: &str) -> PyResult<Bound<'py, PyAny>> {
        match slf.get().index(name) {
            Some(i) => array(slf, i),
            None => Err(PyKeyError::new_err(format!(
                "no tensor {name:?} in this batch (tensors: {})",
                slf.get().names().collect::<Vec<_>>().join(", ")
            ))),
        }
    }

    /// The array of tensor `name`, or `default` (for a name that is not a
    /// tensor's, whatever its type, as a mapping does).
    #[pyo3(signature = (name, default=None))]
    fn get<'py>(
        slf: &Bound<'py, Self>,
        name: &Bound<'py, PyAny>,
        default: Option<Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        match name.extract::<String>().ok().and_then(|n| slf.get().index(&n)) {
            Some(i) => array(slf, i),
            None => Ok(default.unwrap_or_else(|| slf.py().None().into_bound(slf.py()))),
        }
    }

    fn __contains__(&self, name: &Bound<'_, PyAny>) -> bool {
        name.extract::<String>().ok().and_then(|n| self.index(&n)).is_some()
    }

    /// Each tensor's Granary dtype name (`f32` ... `bool`, and `bf16`,
    /// whose arrays are uint16).
    #[getter]
    fn dtypes<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        for l in self.inner.layouts() {
            d.set_item(&l.name, l.dtype.name())?;
        }
        Ok(d)
    }

    /// Number of tensors.
    fn __len__(&self) -> usize {
        self.inner.layouts().len()
    }

    fn __iter__<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        Ok(PyList::new(slf.py(), slf.get().names())?.into_any().try_iter()?.into_any())
    }

    /// Tensor names, in the view's order.
    fn keys<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyList>> {
        PyList::new(slf.py(), slf.get().names())
    }

    /// The arrays, in the view's order.
    fn values<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyList>> {
        let arrays = (0..slf.get().inner.layouts().len()).map(|i| array(slf, i)).collect::<PyResult<Vec<_>>>()?;
        PyList::new(slf.py(), arrays)
    }

    /// (name, array) pairs, in the view's order.
    fn items<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyList>> {
        let py = slf.py();
        let pairs = slf
            .get()
            .names()
            .enumerate()
            .map(|(i, n)| PyTuple::new(py, [n.into_pyobject(py)?.into_any(), array(slf, i)?]))
            .collect::<PyResult<Vec<_>>>()?;
        PyList::new(py, pairs)
    }

    /// A plain dict of name to array (the arrays still view the batch).
    fn numpy<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(slf.py());
        for (i, n) in slf.get().names().enumerate() {
            d.set_item(n, array(slf, i)?)?;
        }
        Ok(d)
    }

    /// Rows in the batch.
    #[getter]
    fn rows(&self) -> usize {
        self.inner.rows()
    }

    /// The epoch this batch belongs to.
    #[getter]
    fn epoch(&self) -> u64 {
        self.inner.position().epoch
    }

    /// Its index within the epoch.
    #[getter]
    fn index_in_epoch(&self) -> u64 {
        self.inner.position().batch
    }

    /// True when the arrays view the node's chunk memory in place (read
    /// only); false when the batch was assembled into a buffer of its own.
    #[getter]
    fn is_view(&self) -> bool {
        self.inner.is_view()
    }

    /// Bytes of every tensor together (a jagged tensor's row offsets
    /// included).
    #[getter]
    fn nbytes(&self) -> usize {
        self.inner.byte_len()
    }

    /// The names of the jagged tensors (list and byte columns), in the
    /// view's order: their items are `granary.Jagged`.
    #[getter]
    fn jagged<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        PyList::new(py, self.inner.layouts().iter().filter(|l| l.jagged).map(|l| l.name.as_str()))
    }

    /// The address of tensor `name`'s first byte (of a jagged tensor, its
    /// first value's): what the arrays (and tensors made from them without
    /// a copy) point at.
    fn data_ptr(&self, name: &str) -> PyResult<usize> {
        match self.index(name) {
            Some(i) => Ok(self.inner.tensor_bytes(i).as_ptr() as usize),
            None => Err(PyKeyError::new_err(format!("no tensor {name:?} in this batch"))),
        }
    }

    /// xxh3-64 over every tensor's bytes in order (a jagged tensor's row
    /// offsets, then its values): the checksum the Rust client gives the
    /// same batch.
    fn checksum(&self) -> u64 {
        self.inner.checksum()
    }

    /// One xxh3-64 per row over its bytes of every tensor: which rows the
    /// batch holds, in order, however the batch was cut (the Rust client's
    /// `Batch::row_digests`).
    fn row_digests(&self) -> Vec<u64> {
        self.inner.row_digests()
    }

    fn __repr__(&self) -> String {
        let p = self.inner.position();
        let tensors: Vec<String> = self
            .inner
            .layouts()
            .iter()
            .map(|l| {
                let mut shape = vec![self.inner.rows().to_string()];
                if l.jagged {
                    shape.push("*".into());
                }
                shape.extend(l.shape.iter().map(|d| d.to_string()));
                format!("{} {}[{}]", l.name, l.dtype.name(), shape.join(", "))
            })
            .collect();
        format!("<granary.Batch epoch {} batch {}: {}>", p.epoch, p.batch, tensors.join(", "))
    }
}
