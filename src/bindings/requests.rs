//! Request ids from Python: `str` or `int`.

use pyo3::prelude::*;
use pyo3::types::{PyIterator, PyString};

use super::convert::{type_name, utf8_str};
use super::errors::{error, ErrorKind};
use crate::pool::{RequestId, RequestKey};

/// A request id: a `str` or an `int` (kept distinct).
pub fn request_id(obj: &Bound<'_, PyAny>) -> PyResult<RequestId> {
    request_key(obj).map(|key| RequestId::from(&key))
}

/// A request id borrowed from `obj` (a `str` is not copied), for lookups.
pub fn request_key<'a>(obj: &'a Bound<'_, PyAny>) -> PyResult<RequestKey<'a>> {
    if let Ok(s) = obj.cast::<PyString>() {
        return Ok(RequestKey::Str(utf8_str(s, "a request id")?));
    }
    if !super::convert::is_bool_like(obj) {
        match obj.extract::<i64>() {
            Ok(i) => return Ok(RequestKey::Int(i)),
            // An int, or an int-like (numpy scalar, `__index__`), past int64.
            Err(e) if e.is_instance_of::<pyo3::exceptions::PyOverflowError>(obj.py()) => {
                return Err(error(
                    obj.py(),
                    ErrorKind::InvalidArgument,
                    "an int request id must fit in int64",
                ));
            }
            Err(_) => {}
        }
    }
    Err(error(
        obj.py(),
        ErrorKind::Dtype,
        format!(
            "a request id must be a str or an int, got {}",
            type_name(obj)
        ),
    ))
}

/// The items of a sequence of request ids (a lone `str` is refused, not iterated).
fn id_sequence<'py>(obj: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyIterator>> {
    if obj.is_instance_of::<PyString>() {
        return Err(error(
            obj.py(),
            ErrorKind::Dtype,
            "request ids must be a sequence of ids, not one str",
        ));
    }
    obj.try_iter().map_err(|_| {
        error(
            obj.py(),
            ErrorKind::Dtype,
            format!("request ids must be a sequence, got {}", type_name(obj)),
        )
    })
}

/// Request ids from a sequence.
pub fn request_ids(obj: &Bound<'_, PyAny>) -> PyResult<Vec<RequestId>> {
    id_sequence(obj)?.map(|item| request_id(&item?)).collect()
}

/// Calls `f` with request ids borrowed from a sequence (a `str` id is not copied): for
/// calls that only look requests up, which then allocate nothing per id.
pub fn with_request_keys<R>(
    obj: &Bound<'_, PyAny>,
    f: impl FnOnce(&[RequestKey<'_>]) -> PyResult<R>,
) -> PyResult<R> {
    // The items are held, so the strings the keys borrow stay alive.
    let items = id_sequence(obj)?.collect::<PyResult<Vec<_>>>()?;
    let keys = items
        .iter()
        .map(request_key)
        .collect::<PyResult<Vec<_>>>()?;
    f(&keys)
}

/// The Python form of a request id.
pub fn request_id_to_py<'py>(py: Python<'py>, id: &RequestId) -> PyResult<Bound<'py, PyAny>> {
    Ok(match id {
        RequestId::Int(i) => i.into_pyobject(py)?.into_any(),
        RequestId::Str(s) => PyString::new(py, s).into_any(),
    })
}
