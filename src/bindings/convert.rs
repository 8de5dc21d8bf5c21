//! Conversions at the Python boundary: block ids in (numpy arrays of any integer
//! dtype, or sequences of ints), block ids out (numpy `int32`), hashes in (sequences
//! of `bytes`), and validated scalar arguments. Bad input becomes a `KVPoolError`
//! subclass, never a bare `TypeError` from deep inside PyO3.

use numpy::{
    PyArray1, PyArrayDescrMethods, PyArrayDyn, PyArrayMethods, PyUntypedArray,
    PyUntypedArrayMethods,
};
use pyo3::exceptions::PyOverflowError;
use pyo3::prelude::*;
use pyo3::type_object::PyTypeCheck;
use pyo3::types::{
    PyBool, PyByteArray, PyBytes, PyDict, PyFloat, PyFrozenSet, PyInt, PyList, PyMemoryView, PySet,
    PyString, PyTuple,
};
use pyo3::PyTypeInfo;

use super::array_reader::{self, Ids};
use super::errors::{error, ErrorKind};
use super::int_reader;
use super::locking::with_lock;
use crate::pool::{KnowsHashes, RequestKey, MAX_HASH_WIDTH};

/// True for Python's `bool` and numpy's bool scalar (which numpy before 2.3 lets pass
/// as an index, with a warning): flags, never ids or counts. A plain `int` is settled
/// first, so the common case costs one type check.
pub fn is_bool_like(obj: &Bound<'_, PyAny>) -> bool {
    if obj.is_exact_instance_of::<PyInt>() {
        return false;
    }
    obj.is_instance_of::<PyBool>()
        || obj.get_type().fully_qualified_name().is_ok_and(|name| {
            name.to_str()
                .is_ok_and(|n| n == "numpy.bool" || n == "numpy.bool_")
        })
}

/// `obj` as a Python int in `min..=max`; a non-int is a `DtypeError`, out of range an
/// `InvalidArgumentError` naming `what`.
pub fn int_arg(obj: &Bound<'_, PyAny>, what: &str, min: i64, max: i64) -> PyResult<i64> {
    let py = obj.py();
    if is_bool_like(obj) {
        return Err(error(
            py,
            ErrorKind::Dtype,
            format!("{what} must be an int, got bool"),
        ));
    }
    match obj.extract::<i64>() {
        Ok(v) if (min..=max).contains(&v) => Ok(v),
        Ok(v) => Err(error(
            py,
            ErrorKind::InvalidArgument,
            format!("{what} must be {}, got {v}", range_text(min, max)),
        )),
        Err(e) if e.is_instance_of::<PyOverflowError>(py) => Err(error(
            py,
            ErrorKind::InvalidArgument,
            format!(
                "{what} must be {}{}, got {}",
                range_text(min, max),
                if (min, max) == (i64::MIN, i64::MAX) {
                    ""
                } else {
                    " (an int64)"
                },
                obj.str().map(|s| s.to_string()).unwrap_or_default()
            ),
        )),
        Err(_) => Err(error(
            py,
            ErrorKind::Dtype,
            format!("{what} must be an int, got {}", type_name(obj)),
        )),
    }
}

/// The range `min..=max` in words: ">= 0", "an int64", "between 1 and 100".
pub fn range_text(min: i64, max: i64) -> String {
    match (min, max) {
        (i64::MIN, i64::MAX) => "an int64".to_owned(),
        (min, i64::MAX) => format!(">= {min}"),
        (min, max) => format!("between {min} and {max}"),
    }
}

/// Like [`int_arg`] but `None` is allowed.
pub fn opt_int_arg(
    obj: Option<&Bound<'_, PyAny>>,
    what: &str,
    min: i64,
    max: i64,
) -> PyResult<Option<i64>> {
    match obj {
        None => Ok(None),
        Some(o) if o.is_none() => Ok(None),
        Some(o) => int_arg(o, what, min, max).map(Some),
    }
}

/// `obj`'s type name, for messages.
pub fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "?".into())
}

fn dtype_error(obj: &Bound<'_, PyAny>, what: &str) -> PyErr {
    // An array is described by its shape and dtype, the rest by their type.
    let got = match obj.cast::<PyUntypedArray>() {
        Ok(arr) => format!(
            "a {}-D {} array",
            arr.ndim(),
            arr.dtype().str().map(|s| s.to_string()).unwrap_or_default()
        ),
        Err(_) => type_name(obj),
    };
    error(
        obj.py(),
        ErrorKind::Dtype,
        format!("{what} must be a 1-D numpy integer array or a sequence of ints, got {got}"),
    )
}

/// Appends a 1-D array's elements to `out` in logical order: one copy (a
/// contiguous array is copied as a slice, a strided view through an owned copy),
/// without rust-numpy's borrow tracking, which takes a global lock and allocates
/// on every call. The copy happens under the GIL, so nothing writes the array
/// meanwhile.
fn append_array<T: numpy::Element + Copy>(arr: &Bound<'_, PyArray1<T>>, out: &mut Vec<T>) {
    match arr.to_vec() {
        Ok(v) if out.is_empty() => *out = v,
        Ok(v) => out.extend_from_slice(&v),
        Err(_) => out.extend(arr.to_owned_array().iter().copied()),
    }
}

/// Integers of any width from `obj` (a 1-D numpy integer array or a sequence of
/// ints), appended to `out` as `i64`.
pub fn extract_i64s(obj: &Bound<'_, PyAny>, what: &str, out: &mut Vec<i64>) -> PyResult<()> {
    if let Some(copy) = aligned_copy(obj, what)? {
        return extract_i64s(&copy, what, out);
    }
    if let Ok(arr) = obj.cast::<PyArray1<i64>>() {
        append_array(arr, out);
        return Ok(());
    }
    if let Ok(arr) = obj.cast::<PyArray1<i32>>() {
        match arr.to_vec() {
            Ok(v) => out.extend(v.iter().map(|&v| i64::from(v))),
            Err(_) => out.extend(arr.to_owned_array().iter().map(|&v| i64::from(v))),
        }
        return Ok(());
    }
    if let Ok(arr) = obj.cast::<PyUntypedArray>() {
        let kind = arr.dtype().kind();
        if arr.ndim() != 1 || !(kind == b'i' || kind == b'u') {
            return Err(dtype_error(obj, what));
        }
        // Other integer widths: let numpy widen them, then check the unsigned ones fit.
        if kind == b'u' {
            let wide = plain_astype(arr, "uint64")?;
            let wide = wide
                .cast::<PyArray1<u64>>()
                .map_err(|_| dtype_error(obj, what))?;
            let ro = wide.try_readonly().map_err(|_| dtype_error(obj, what))?;
            for &v in ro.as_array().iter() {
                let v = i64::try_from(v).map_err(|_| {
                    error(
                        obj.py(),
                        ErrorKind::InvalidArgument,
                        format!("{what} holds integers beyond int64"),
                    )
                })?;
                out.push(v);
            }
            return Ok(());
        }
        let as_i64 = plain_astype(arr, "int64").map_err(|_| dtype_error(obj, what))?;
        return extract_i64s(&as_i64, what, out);
    }
    if not_a_sequence_of_ints(obj) {
        return Err(dtype_error(obj, what));
    }
    // Lists and tuples of plain ints are read in place where the interpreter allows
    // it (`int_reader`); every other item is converted one by one.
    let item =
        |item: &Bound<'_, PyAny>| plain_int(item).map_or_else(|| item_i64(item, obj, what), Ok);
    if let Ok(list) = obj.cast::<PyList>() {
        return int_reader::extend_from_list(list, out, item);
    }
    if let Ok(tuple) = obj.cast::<PyTuple>() {
        return int_reader::extend_from_tuple(tuple, out, item);
    }
    if obj.cast::<PyArrayDyn<f64>>().is_ok() {
        return Err(dtype_error(obj, what));
    }
    let iter = obj.try_iter().map_err(|_| dtype_error(obj, what))?;
    for item in iter {
        out.push(item_i64(&item?, obj, what)?);
    }
    Ok(())
}

/// True for objects that iterate but are not an ordered sequence of ints: `str`,
/// the bytes-like types (whose items are bytes, not ids), and the unordered `dict`
/// and `set` types.
fn not_a_sequence_of_ints(obj: &Bound<'_, PyAny>) -> bool {
    obj.is_instance_of::<PyString>()
        || obj.is_instance_of::<PyBytes>()
        || obj.is_instance_of::<PyByteArray>()
        || obj.is_instance_of::<PyMemoryView>()
        || obj.is_instance_of::<PyDict>()
        || obj.is_instance_of::<PySet>()
        || obj.is_instance_of::<PyFrozenSet>()
}

/// True when `obj`'s type is exactly `numpy.ndarray` (not a subclass such as a
/// masked array): one pointer comparison with numpy's own type object.
fn is_plain_ndarray(obj: &Bound<'_, PyAny>) -> bool {
    obj.is_exact_instance_of::<PyUntypedArray>()
}

/// `obj` as a `T` (a kvpool class, a tuple, bytes), or a `DtypeError` naming the argument
/// and what was expected (`expected`, in words: `a kvpool.BlockPool`, `a tuple`, `bytes`).
pub fn typed_arg<'a, 'py, T: PyTypeCheck>(
    obj: &'a Bound<'py, PyAny>,
    what: &str,
    expected: &str,
) -> PyResult<&'a Bound<'py, T>> {
    obj.cast::<T>().map_err(|_| {
        error(
            obj.py(),
            ErrorKind::Dtype,
            format!("{what} must be {expected}, got {}", type_name(obj)),
        )
    })
}

/// [`typed_arg`], as an owned reference (for a value a binding object keeps).
pub fn owned_arg<T: PyTypeCheck>(
    obj: &Bound<'_, PyAny>,
    what: &str,
    expected: &str,
) -> PyResult<Py<T>> {
    Ok(typed_arg::<T>(obj, what, expected)?.clone().unbind())
}

/// vLLM's `skip_zeroing_group_ids`: group indices (ints >= 0), empty for `None`.
pub fn group_index_list(obj: Option<&Bound<'_, PyAny>>, what: &str) -> PyResult<Vec<usize>> {
    let Some(obj) = obj.filter(|o| !o.is_none()) else {
        return Ok(Vec::new());
    };
    let mut ids = Vec::new();
    extract_i64s(obj, what, &mut ids)?;
    ids.into_iter()
        .map(|g| {
            usize::try_from(g).map_err(|_| {
                error(
                    obj.py(),
                    ErrorKind::InvalidArgument,
                    format!("{what} must hold group indices >= 0, got {g}"),
                )
            })
        })
        .collect()
}

/// `arr` cast to `dtype` by `numpy.ndarray.astype` itself, as a plain ndarray: a
/// subclass's own `astype` is not called (one that returned its input would make the
/// conversions that recurse on the cast never end).
fn plain_astype<'py>(
    arr: &Bound<'py, PyAny>,
    dtype: impl IntoPyObject<'py>,
) -> PyResult<Bound<'py, PyAny>> {
    let py = arr.py();
    let kwargs = PyDict::new(py);
    kwargs.set_item(pyo3::intern!(py, "subok"), false)?;
    PyUntypedArray::type_object(py).call_method(
        pyo3::intern!(py, "astype"),
        (arr, dtype),
        Some(&kwargs),
    )
}

/// Checks the numpy arrays that cannot be read in place: a masked array is a
/// `DtypeError` (its mask would be ignored); a misaligned or byte-swapped one is
/// copied by numpy into an aligned, native one, which is returned. `None` for
/// every other object, plain aligned arrays included (one type check).
pub fn aligned_copy<'py>(
    obj: &Bound<'py, PyAny>,
    what: &str,
) -> PyResult<Option<Bound<'py, PyAny>>> {
    let py = obj.py();
    let exact = is_plain_ndarray(obj);
    let arr = match obj.cast::<PyUntypedArray>() {
        Ok(arr) => arr,
        Err(_) => return Ok(None),
    };
    if !exact && obj.hasattr(pyo3::intern!(py, "mask"))? {
        return Err(error(
            py,
            ErrorKind::Dtype,
            format!(
                "{what} must not be a masked array (its mask would be ignored); pass .compressed() or .filled()"
            ),
        ));
    }
    if arr.is_aligned() && arr.dtype().is_native_byteorder() != Some(false) {
        return Ok(None);
    }
    let native = arr
        .dtype()
        .call_method1(pyo3::intern!(py, "newbyteorder"), ("=",))?;
    let copy = plain_astype(arr, native)?;
    Ok(Some(copy))
}

/// The value of a plain `int` that fits in 64 bits: the token-id fast path, one
/// type check and one conversion. Anything else is left to [`item_i64`].
#[inline(always)]
fn plain_int(item: &Bound<'_, PyAny>) -> Option<i64> {
    if item.is_exact_instance_of::<PyInt>() {
        item.extract::<i64>().ok()
    } else {
        None
    }
}

#[cold]
#[inline(never)]
fn item_i64(item: &Bound<'_, PyAny>, container: &Bound<'_, PyAny>, what: &str) -> PyResult<i64> {
    // Plain ints (and numpy ints, via __index__) succeed at once; bools are ints to
    // Python but never ids or counts; floats and str have no __index__, so they fail
    // and are classified below.
    if is_bool_like(item) {
        return Err(dtype_error(container, what));
    }
    match item.extract::<i64>() {
        Ok(v) => Ok(v),
        Err(_) if item.is_instance_of::<PyFloat>() || item.is_instance_of::<PyString>() => {
            Err(dtype_error(container, what))
        }
        Err(_) if item.is_instance_of::<pyo3::types::PyInt>() => Err(error(
            item.py(),
            ErrorKind::InvalidArgument,
            format!("{what} holds an integer beyond int64"),
        )),
        Err(_) => Err(dtype_error(container, what)),
    }
}

/// Block ids from `obj`, appended to `out`; a negative or too large id is an
/// `InvalidBlockIdError` (the pool checks the upper bound of its own range).
///
/// Plain integer arrays (the int32 arrays kvpool hands out, and views of them such
/// as `ids[::-1]`) are read once, in place, and checked as they are read
/// (`array_reader`); other inputs go through [`extract_i64s`].
pub fn extract_block_ids(
    obj: &Bound<'_, PyAny>,
    num_blocks: u32,
    out: &mut Vec<u32>,
) -> PyResult<()> {
    if is_plain_ndarray(obj) {
        if let Ok(array) = obj.cast::<PyUntypedArray>() {
            match array_reader::append_ids(array, num_blocks, out) {
                Ids::Read => return Ok(()),
                Ids::OutOfRange(id) => return Err(invalid_id(obj.py(), id, num_blocks)),
                Ids::NotPlain => {}
            }
        }
    }
    let mut wide = Vec::new();
    extract_i64s(obj, "block ids", &mut wide)?;
    out.reserve(wide.len());
    for v in wide {
        if v < 0 || v >= num_blocks as i64 {
            return Err(invalid_id(obj.py(), v, num_blocks));
        }
        out.push(v as u32);
    }
    Ok(())
}

/// `obj`'s block ids lent in place when it is a contiguous `int32`/`uint32` array or
/// a reversed view of one (see [`array_reader::borrow_ids`]: values unchecked, and
/// the GIL must stay held, with no Python code run, while they are in use).
pub fn borrow_block_ids<'a>(obj: &'a Bound<'_, PyAny>) -> Option<array_reader::BorrowedIds<'a>> {
    if !is_plain_ndarray(obj) {
        return None;
    }
    array_reader::borrow_ids(obj.cast::<PyUntypedArray>().ok()?)
}

fn invalid_id(py: Python<'_>, id: i64, num_blocks: u32) -> PyErr {
    error(
        py,
        ErrorKind::InvalidBlockId,
        format!("block id {id} is out of range for a pool of {num_blocks} blocks"),
    )
}

thread_local! {
    /// A per-thread buffer for block ids on their way out, so a call allocates only
    /// the numpy array it returns.
    static SCRATCH: std::cell::Cell<Vec<u32>> = const { std::cell::Cell::new(Vec::new()) };
}

/// Calls `f` with an empty id buffer reused across calls on this thread. Re-entrant:
/// a nested call (from code `f` runs) gets a buffer of its own.
pub fn with_scratch<R>(f: impl FnOnce(&mut Vec<u32>) -> R) -> R {
    let mut buf = SCRATCH.take();
    buf.clear();
    let result = f(&mut buf);
    if buf.capacity() <= 1 << 16 {
        SCRATCH.set(buf);
    }
    result
}

/// Block ids out: a fresh numpy `int32` array, one memcpy (ids are below 2^31).
pub fn ids_to_numpy<'py>(py: Python<'py>, ids: &[u32]) -> Bound<'py, PyArray1<i32>> {
    PyArray1::from_slice(py, bytemuck::cast_slice::<u32, i32>(ids))
}

/// Hashes from a `BlockHashList`, a sequence of `bytes` of one width, or a numpy
/// integer array (each id standing for its 8-byte big-endian form), copied back to
/// back into `flat`; returns the width (0 when there are none).
pub fn extract_hashes(obj: &Bound<'_, PyAny>, flat: &mut Vec<u8>) -> PyResult<usize> {
    let py = obj.py();
    let mut width = 0usize;
    // A list's leading plain `bytes` of one width, read in place; the general path
    // below takes any item after them (and reports what is wrong with it).
    let list = obj.cast::<PyList>().ok();
    let read_in_place = list.map_or(0, |list| {
        super::bytes_reader::extend_hashes(list, &mut width, crate::pool::MAX_HASH_WIDTH, flat)
    });
    // `count` is the number of hashes in the sequence: room for all of them is
    // reserved once the first fixes the width.
    let mut push = |item: &Bound<'_, PyAny>, count: usize| -> PyResult<()> {
        let bytes = item.cast::<PyBytes>().map_err(|_| {
            error(
                py,
                ErrorKind::Dtype,
                format!("block hashes must be bytes, got {}", type_name(item)),
            )
        })?;
        let b = bytes.as_bytes();
        if width == 0 {
            if b.is_empty() || b.len() > crate::pool::MAX_HASH_WIDTH {
                return Err(error(
                    py,
                    ErrorKind::HashWidth,
                    format!(
                        "block hash is {} bytes wide; a hash must have 1 to 32 bytes",
                        b.len()
                    ),
                ));
            }
            width = b.len();
            flat.reserve(width.saturating_mul(count));
        } else if b.len() != width {
            return Err(error(
                py,
                ErrorKind::HashWidth,
                format!(
                    "block hashes of different widths in one call: {} and {width} bytes",
                    b.len()
                ),
            ));
        }
        flat.extend_from_slice(b);
        Ok(())
    };
    if let Ok(list) = obj.cast::<super::hashing::PyBlockHashList>() {
        let list = list.get();
        list.copy_into(flat);
        return Ok(if flat.is_empty() { 0 } else { list.width() });
    }
    if obj.is_instance_of::<PyUntypedArray>() {
        // Integer hash ids (e.g. a trace's hash_ids): each is the 8-byte big-endian
        // hash whose int form vLLM's event wire format would carry.
        let mut ids = Vec::new();
        extract_u64s(obj, "block hashes", &mut ids)?;
        flat.reserve(ids.len() * 8);
        for id in ids {
            flat.extend_from_slice(&id.to_be_bytes());
        }
        return Ok(if flat.is_empty() { 0 } else { 8 });
    }
    if let Some(list) = list {
        for i in read_in_place..list.len() {
            push(&list.get_item(i)?, list.len())?;
        }
    } else if let Ok(tuple) = obj.cast::<PyTuple>() {
        for item in tuple.iter() {
            push(&item, tuple.len())?;
        }
    } else if obj.is_instance_of::<PyBytes>() || obj.is_instance_of::<PyString>() {
        return Err(error(
            py,
            ErrorKind::Dtype,
            "block hashes must be a sequence of bytes, not a single bytes or str",
        ));
    } else {
        let iter = obj.try_iter().map_err(|_| {
            error(
                py,
                ErrorKind::Dtype,
                format!(
                    "block hashes must be a sequence of bytes, got {}",
                    type_name(obj)
                ),
            )
        })?;
        for item in iter {
            push(&item?, 0)?;
        }
    }
    Ok(width)
}

/// Like [`extract_hashes`], leaving out the first `skip` hashes of a `list` or
/// `tuple` (a caller that already has them); other inputs are converted whole.
/// Returns `(from, width)`: the index of the first hash copied, and the width.
pub fn extract_hashes_after(
    obj: &Bound<'_, PyAny>,
    skip: usize,
    flat: &mut Vec<u8>,
) -> PyResult<(usize, usize)> {
    let len = if let Ok(list) = obj.cast_exact::<PyList>() {
        Some(list.len())
    } else if let Ok(tuple) = obj.cast_exact::<PyTuple>() {
        Some(tuple.len())
    } else {
        None
    };
    if len == Some(skip) {
        return Ok((skip, 0)); // nothing new: no copy at all
    }
    let tail = match (obj.cast_exact::<PyList>(), obj.cast_exact::<PyTuple>()) {
        (Ok(list), _) if skip < list.len() => Some(list.get_slice(skip, list.len()).into_any()),
        (_, Ok(tuple)) if skip < tuple.len() => Some(tuple.get_slice(skip, tuple.len()).into_any()),
        _ => None,
    };
    match tail {
        Some(tail) => Ok((skip, extract_hashes(&tail, flat)?)),
        None => Ok((0, extract_hashes(obj, flat)?)),
    }
}

/// How many of a request's hashes the tables knew (`known`, the last of them
/// `last`) still hold for `obj`, its current hashes: `known` when the list still has
/// that hash at that index, else the index of the first hash that differs, found in
/// `all` (every known hash, back to back, `width` bytes each; read only then). vLLM's
/// streaming sessions cut a request's hashes back and grow them again with other
/// tokens; hashes are a chain, so once one matches every one before it does. Only
/// lists and tuples of `bytes` are compared (anything else is taken as it is).
pub fn hashes_still_known(
    obj: &Bound<'_, PyAny>,
    known: usize,
    last: &[u8],
    all: impl FnOnce() -> (Vec<u8>, usize),
) -> usize {
    let (list, tuple) = (
        obj.cast_exact::<PyList>().ok(),
        obj.cast_exact::<PyTuple>().ok(),
    );
    if known == 0 || (list.is_none() && tuple.is_none()) {
        return known;
    }
    // Item `i` is `hash` (false past the end, or for an item that is not `bytes`).
    let same = |i: usize, hash: &[u8]| {
        let item = match (&list, &tuple) {
            (Some(list), _) => list.get_item(i).ok(),
            (_, Some(tuple)) => tuple.get_item(i).ok(),
            _ => None,
        };
        item.and_then(|h| h.cast_exact::<PyBytes>().ok().map(|b| b.as_bytes() == hash))
            .unwrap_or(false)
    };
    if same(known - 1, last) {
        return known;
    }
    // The first index that differs: a binary search over the chain.
    let (bytes, width) = all();
    let hash = |i: usize| &bytes[i * width..(i + 1) * width];
    let (mut lo, mut hi) = (0, known.min(bytes.len() / width.max(1)));
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if same(mid, hash(mid)) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    lo
}

/// How many of request `id`'s hashes `tables` know that still hold for `obj`, its
/// current hashes (see [`hashes_still_known`]); those that no longer hold are
/// forgotten, so the caller sends `obj[n..]`. The tables are locked only to read and
/// to forget, never while `obj` is read.
pub fn sync_known_hashes<T: KnowsHashes + Send>(
    py: Python<'_>,
    tables: &std::sync::Mutex<T>,
    id: RequestKey<'_>,
    obj: &Bound<'_, PyAny>,
) -> usize {
    let mut last = [0u8; MAX_HASH_WIDTH];
    let (known, width) = with_lock(py, tables, |t| {
        t.known_hashes_of(id).map_or((0, 0), |h| {
            let tail = h.last().unwrap_or(&[]);
            last[..tail.len()].copy_from_slice(tail);
            (h.len(), tail.len())
        })
    });
    let still = hashes_still_known(obj, known, &last[..width], || {
        with_lock(py, tables, |t| {
            t.known_hashes_of(id)
                .map_or((Vec::new(), 0), |h| (h.as_bytes().to_vec(), h.width()))
        })
    });
    if still < known {
        with_lock(py, tables, |t| t.forget_known_hashes_from(id, still));
    }
    still
}

/// A bool argument: a `bool` or `numpy.bool_`; anything else is a `DtypeError`.
pub fn bool_arg(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<bool> {
    if let Ok(b) = obj.cast::<PyBool>() {
        return Ok(b.is_true());
    }
    if type_name(obj) == "bool" || type_name(obj) == "bool_" {
        return obj.is_truthy();
    }
    Err(error(
        obj.py(),
        ErrorKind::Dtype,
        format!("{what} must be a bool, got {}", type_name(obj)),
    ))
}

/// Unsigned 64-bit ints from a 1-D numpy integer array (signed ones must be >= 0).
pub fn extract_u64s(obj: &Bound<'_, PyAny>, what: &str, out: &mut Vec<u64>) -> PyResult<()> {
    if let Some(copy) = aligned_copy(obj, what)? {
        return extract_u64s(&copy, what, out);
    }
    if let Ok(arr) = obj.cast::<PyArray1<u64>>() {
        append_array(arr, out);
        return Ok(());
    }
    let mut wide = Vec::new();
    extract_i64s(obj, what, &mut wide)?;
    out.reserve(wide.len());
    for v in wide {
        let v = u64::try_from(v).map_err(|_| {
            error(
                obj.py(),
                ErrorKind::InvalidArgument,
                format!("{what} as integers must be >= 0, got {v}"),
            )
        })?;
        out.push(v);
    }
    Ok(())
}

/// An optional bool argument: `None` (or absent) gives `default`.
pub fn opt_bool_arg(obj: Option<&Bound<'_, PyAny>>, what: &str, default: bool) -> PyResult<bool> {
    match obj {
        Some(o) if !o.is_none() => bool_arg(o, what),
        _ => Ok(default),
    }
}

/// Calls `f` with `obj`'s integers as `i64`s: borrowed in place from a contiguous
/// `int64` numpy array (no copy), else converted by [`extract_i64s`]. The GIL stays
/// held while `f` runs, so the array cannot change under it: `f` must not give the GIL
/// up (a lock it may have to wait for is taken with `locking::lock_if_free`, else
/// waited for with a copy).
pub fn with_i64s<R>(
    obj: &Bound<'_, PyAny>,
    what: &str,
    f: impl FnOnce(&[i64]) -> R,
) -> PyResult<R> {
    let plain = is_plain_ndarray(obj);
    if let Some(arr) = obj
        .cast::<PyArray1<i64>>()
        .ok()
        .filter(|a| plain && a.is_aligned() && a.dtype().is_native_byteorder() != Some(false))
    {
        if let Ok(ro) = arr.try_readonly() {
            if let Ok(slice) = ro.as_slice() {
                return Ok(f(slice));
            }
        }
    }
    let mut owned = Vec::new();
    extract_i64s(obj, what, &mut owned)?;
    Ok(f(&owned))
}

/// How many token ids `obj` holds, for a caller that reads no values (a manager
/// without prefix caching). Nothing reads the values, so none is inspected: a
/// 1-D numpy integer array is measured (its dtype checked), a list or tuple only
/// counted, in O(1). Touching 700 `int` objects to type-check them costs about
/// 0.9 µs per prompt, most of the manager's time per request, for values the
/// manager never reads (vLLM does not inspect them either). Anything else
/// (iterables, buffers) is converted, and so checked, by [`extract_i64s`].
pub fn count_tokens(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<usize> {
    if let Some(copy) = aligned_copy(obj, what)? {
        return count_tokens(&copy, what);
    }
    if let Ok(arr) = obj.cast::<PyUntypedArray>() {
        let kind = arr.dtype().kind();
        if arr.ndim() == 1 && kind == b'u' && arr.dtype().itemsize() == 8 {
            // The one integer dtype with values past int64: those are refused, as
            // converting them would (a pass over the array, for this dtype only).
            if let Ok(values) = arr.cast::<PyArray1<u64>>() {
                if let Ok(ro) = values.try_readonly() {
                    if ro.as_array().iter().any(|&v| v > i64::MAX as u64) {
                        return Err(error(
                            obj.py(),
                            ErrorKind::InvalidArgument,
                            format!("{what} holds integers beyond int64"),
                        ));
                    }
                    return Ok(arr.len());
                }
            }
        }
        if arr.ndim() == 1 && (kind == b'i' || kind == b'u') {
            return Ok(arr.len());
        }
        return Err(dtype_error(obj, what));
    }
    if let Ok(list) = obj.cast::<PyList>() {
        return Ok(list.len());
    }
    if let Ok(tuple) = obj.cast::<PyTuple>() {
        return Ok(tuple.len());
    }
    let mut values = Vec::new();
    extract_i64s(obj, what, &mut values)?;
    Ok(values.len())
}

/// A `bytes` argument (`what` names it); anything else is a `DtypeError`.
pub fn bytes_arg<'a, 'py>(
    obj: &'a Bound<'py, PyAny>,
    what: &str,
) -> PyResult<&'a Bound<'py, PyBytes>> {
    typed_arg(obj, what, "bytes")
}

/// An optional `str` argument; anything but `str` or `None` is a `DtypeError`.
pub fn opt_str_arg(obj: Option<&Bound<'_, PyAny>>, what: &str) -> PyResult<Option<String>> {
    obj.filter(|o| !o.is_none())
        .map(|o| str_arg(o, what))
        .transpose()
}

/// A `str` argument, owned: anything else is a `DtypeError`, a `str` UTF-8 cannot
/// hold an `InvalidArgumentError`.
pub fn str_arg(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<String> {
    let s = obj.cast::<PyString>().map_err(|_| {
        error(
            obj.py(),
            ErrorKind::Dtype,
            format!("{what} must be a str, got {}", type_name(obj)),
        )
    })?;
    Ok(utf8_str(s, what)?.to_owned())
}

/// A `str`'s UTF-8 form; a `str` with lone surrogates (which UTF-8 cannot encode) is
/// an `InvalidArgumentError` naming `what`.
pub fn utf8_str<'a>(s: &'a Bound<'_, PyString>, what: &str) -> PyResult<&'a str> {
    s.to_str().map_err(|_| {
        error(
            s.py(),
            ErrorKind::InvalidArgument,
            format!("{what} is not encodable as UTF-8 (it holds a lone surrogate)"),
        )
    })
}

/// A call's token ids for `BlockStored` events, converted into `buf` only when the pool
/// emits events (and the caller gave some): whether it did.
pub fn event_token_ids(
    obj: Option<&Bound<'_, PyAny>>,
    events_on: bool,
    buf: &mut Vec<i64>,
) -> PyResult<bool> {
    match obj.filter(|o| !o.is_none()) {
        Some(o) if events_on => {
            extract_i64s(o, "token_ids", buf)?;
            Ok(true)
        }
        _ => Ok(false),
    }
}
