//! The client's errors as Python exceptions. The classes live in
//! `granary/errors.py` (a hierarchy with Python's own bases, which native
//! exception types cannot have); this file picks the class, the message
//! (the client's, which names the file, row group, column, shard or node)
//! and the attributes a caller can act on: `retryable` on every one, and
//! the dataset, version or field where there is one.

use granary_client::ClientError;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyList};

/// The `granary.errors` class for `e`.
fn class_of(e: &ClientError) -> &'static str {
    match e {
        ClientError::Connect { .. } | ClientError::Io(_) | ClientError::NodeGone { .. } => "NodeUnavailableError",
        ClientError::Node { .. } => "NodeError",
        ClientError::Chunk { .. } => "CorruptChunkError",
        ClientError::Protocol(_) | ClientError::Version { .. } => "ProtocolError",
        ClientError::Plan(_) => "PlanError",
        ClientError::UnknownDataset { .. } => "UnknownDatasetError",
        ClientError::VersionGone { .. } => "VersionGoneError",
        ClientError::ResumeMismatch(_) => "ResumeMismatchError",
        ClientError::PositionPastEnd { .. } => "PositionPastEndError",
        _ => "GranaryError",
    }
}

/// Builds the exception `class` of `granary.errors` with `message`, then
/// sets `attrs` on it.
pub(crate) fn raise(py: Python<'_>, class: &str, message: String, attrs: &[(&str, Bound<'_, PyAny>)]) -> PyErr {
    let built = (|| -> PyResult<PyErr> {
        let cls = py.import("granary.errors")?.getattr(class)?;
        let exc = cls.call1((message.clone(),))?;
        for (k, v) in attrs {
            exc.setattr(*k, v)?;
        }
        Ok(PyErr::from_value(exc))
    })();
    // Without the package (the module imported on its own), a plain
    // RuntimeError that still carries the message.
    built.unwrap_or_else(|_| pyo3::exceptions::PyRuntimeError::new_err(message))
}

/// `e` as the matching `granary.errors` exception.
pub(crate) fn to_py(py: Python<'_>, e: ClientError) -> PyErr {
    let retryable = PyBool::new(py, e.is_retryable()).to_owned().into_any();
    let mut attrs: Vec<(&str, Bound<'_, PyAny>)> = vec![("retryable", retryable)];
    let s = |v: &str| v.into_pyobject(py).map(Bound::into_any).ok();
    match &e {
        ClientError::UnknownDataset { dataset, served } => {
            attrs.extend(s(dataset).map(|v| ("dataset", v)));
            if let Ok(l) = PyList::new(py, served) {
                attrs.push(("served", l.into_any()));
            }
        }
        ClientError::VersionGone { dataset, version, current } => {
            attrs.extend(s(dataset).map(|v| ("dataset", v)));
            attrs.extend(s(&version.to_hex()).map(|v| ("version", v)));
            if let Some(c) = current {
                attrs.extend(s(&c.to_hex()).map(|v| ("current", v)));
            }
        }
        ClientError::ResumeMismatch(m) => {
            attrs.extend(s(m.field).map(|v| ("field", v)));
            attrs.extend(s(&m.saved).map(|v| ("saved", v)));
            attrs.extend(s(&m.now).map(|v| ("now", v)));
        }
        _ => {}
    }
    raise(py, class_of(&e), e.to_string(), &attrs)
}

/// A usage error (an argument Granary cannot use) as
/// `granary.errors.ConfigError`, a `ValueError`.
pub(crate) fn value_error(py: Python<'_>, message: String) -> PyErr {
    raise(py, "ConfigError", message, &[("retryable", PyBool::new(py, false).to_owned().into_any())])
}
