//! `granary._granary`: the Python binding of `granary-client`.
//!
//! What Python sees is in `python/granary/` (the package, its docstrings
//! and type stubs); this crate is the native half:
//! - `loader` — [`loader::Loader`] and the epoch iterator: the plan, the
//!   resume state as a plain dict, the GIL released while a batch is
//!   awaited, and a guard against use in a forked child.
//! - `batch` — [`batch::Batch`], a mapping from tensor name to a numpy
//!   array that views the batch's own buffer (no copy); the arrays keep
//!   the batch alive, so a buffer goes back to the loader's pool only when
//!   no array references it.
//! - `errors` — the client's errors as the `granary.errors` exceptions.
//!
//! It depends on `granary-client` alone (no runtime, no Arrow), as any
//! trainer does.

mod batch;
mod errors;
mod loader;

use pyo3::prelude::*;

/// The native module; `granary/__init__.py` re-exports what users need.
#[pymodule]
fn _granary(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<loader::Loader>()?;
    m.add_class::<loader::Epoch>()?;
    m.add_class::<batch::Batch>()?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
