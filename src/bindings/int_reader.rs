//! Token ids read straight out of CPython `int` objects.
//!
//! A prompt usually arrives as a `list` of Python ints. Converting each through PyO3
//! (a new reference, a type check, `PyLong_AsLongLong`, an error check, a release)
//! costs about 5 ns per token, which is most of hashing 1,200 tokens with xxh3 and a
//! third of it with SHA-256. This module reads the items in place instead: a borrowed
//! pointer from the list's item array, one comparison with `PyLong_Type`, and the
//! value from the object's digits, about 1.1 ns per token.
//!
//! One of the crate's nine modules with `unsafe` code (with `array_reader.rs`,
//! `bytes_reader.rs`, `recycled_ids.rs`, `block_view.rs`, `zmq_sink.rs`, `pool/stream_copy.rs`,
//! `pool/meta_store.rs` and `pool/hashing/sha_ni.rs`; `[lints.rust]
//! unsafe_code = "deny"` everywhere else). It depends on CPython's object layout, so
//! it is compiled only where that layout is fixed and known:
//!
//! - a version-specific build (not the stable ABI, which hides the layout), on CPython
//!   (not PyPy or GraalPy), with the GIL (a free-threaded build lets another thread
//!   resize a list while it is read);
//! - `int` objects as CPython 3.10 and 3.11 lay them out (a signed digit count in
//!   `ob_size`, then 30-bit digits) or as 3.12 and later do (`lv_tag`: the digit
//!   count shifted by 3, the sign in the low 2 bits, then the digits);
//! - checked once per process at run time ([`usable`]): `sys.int_info` must report
//!   30-bit digits in 4-byte words, and the reader must read known values (0, ±1, the
//!   one-digit limits, two-digit values) exactly as `PyLong_AsLongLong` does. If
//!   either check fails, every call takes the generic path.
//!
//! Anything the fast path does not read (another type, a subclass of `int` such as
//! `bool`, more than two digits) goes through the caller's generic conversion, one
//! item at a time, so errors and edge cases behave exactly as before and the cost of
//! an odd item is that item's own.

#![allow(unsafe_code)]

use pyo3::prelude::*;
use pyo3::types::{PyList, PyTuple};

/// Appends the values of `list`'s items to `out`: plain ints of up to two digits are
/// read in place, any other item goes through `slow` (which may run Python code).
pub fn extend_from_list(
    list: &Bound<'_, PyList>,
    out: &mut Vec<i64>,
    mut slow: impl FnMut(&Bound<'_, PyAny>) -> PyResult<i64>,
) -> PyResult<()> {
    #[cfg(fast_ints)]
    if usable(list.py()) {
        return fast::extend_from_list(list, out, slow);
    }
    out.reserve(list.len());
    for item in list.iter() {
        out.push(slow(&item)?);
    }
    Ok(())
}

/// [`extend_from_list`] for a tuple.
pub fn extend_from_tuple(
    tuple: &Bound<'_, PyTuple>,
    out: &mut Vec<i64>,
    mut slow: impl FnMut(&Bound<'_, PyAny>) -> PyResult<i64>,
) -> PyResult<()> {
    #[cfg(fast_ints)]
    if usable(tuple.py()) {
        return fast::extend_from_tuple(tuple, out, slow);
    }
    out.reserve(tuple.len());
    for item in tuple.iter() {
        out.push(slow(&item)?);
    }
    Ok(())
}

/// A list's tokens for the block hasher, read in place a block at a time while it
/// hashes (`hashing::TokenSource`), so reading the ints overlaps with SHA-256's
/// rounds. `None` from [`ListTokens::new`] where the in-place reader is not
/// available; a block with an item it cannot read stops the hasher, and the caller
/// converts the list the general way.
///
/// Holding a `Bound` proves the GIL is held; nothing here runs Python code, so the
/// list cannot change while it is read.
pub struct ListTokens<'a, 'py> {
    #[cfg_attr(not(fast_ints), allow(dead_code))]
    list: &'a Bound<'py, PyList>,
    #[cfg_attr(not(fast_ints), allow(dead_code))]
    block: Vec<i64>,
}

impl<'a, 'py> ListTokens<'a, 'py> {
    /// A source over `list`, if ints can be read in place in this process.
    pub fn new(list: &'a Bound<'py, PyList>) -> Option<Self> {
        enabled(list.py()).then(|| Self {
            list,
            block: Vec::new(),
        })
    }
}

impl crate::pool::hashing::TokenSource for ListTokens<'_, '_> {
    fn len(&self) -> usize {
        #[cfg(fast_ints)]
        return self.list.len();
        #[cfg(not(fast_ints))]
        0
    }

    fn tokens(&mut self, start: usize, n: usize) -> Option<&[i64]> {
        #[cfg(fast_ints)]
        return fast::read_range(self.list, start, n, &mut self.block).then_some(&self.block[..]);
        #[cfg(not(fast_ints))]
        {
            let _ = (start, n);
            None
        }
    }

    #[inline(always)]
    fn for_each(&mut self, start: usize, n: usize, f: impl FnMut(i64)) -> bool {
        #[cfg(fast_ints)]
        return fast::for_each_in_range(self.list, start, n, f);
        #[cfg(not(fast_ints))]
        {
            let _ = (start, n, f);
            false
        }
    }

    #[inline(always)]
    fn for_each_i32(&mut self, start: usize, n: usize, f: impl FnMut(i32)) -> bool {
        #[cfg(fast_ints)]
        return fast::for_each_i32_in_range(self.list, start, n, f);
        #[cfg(not(fast_ints))]
        {
            let _ = (start, n, f);
            false
        }
    }
}

/// Whether the in-place reader is compiled in and passed its check in this process.
pub fn enabled(py: Python<'_>) -> bool {
    #[cfg(fast_ints)]
    return usable(py);
    #[cfg(not(fast_ints))]
    {
        let _ = py;
        false
    }
}

/// The run-time check, done once: 30-bit digits and known values read right.
#[cfg(fast_ints)]
fn usable(py: Python<'_>) -> bool {
    use pyo3::sync::PyOnceLock;
    static USABLE: PyOnceLock<bool> = PyOnceLock::new();
    super::locking::init_once(py, &USABLE, || Ok(fast::self_check(py).unwrap_or(false)))
        .is_ok_and(|usable| *usable)
}

#[cfg(fast_ints)]
mod fast {
    use pyo3::ffi;
    use pyo3::prelude::*;
    use pyo3::types::{PyInt, PyList, PyTuple};

    /// Bits per digit of CPython's ints on every 64-bit platform it ships for.
    const SHIFT: u32 = 30;

    /// The start of an `int` object: the object header, then the field that holds
    /// the digit count and sign, then the first digit (always allocated, though its
    /// value is undefined when the int has no digits).
    #[repr(C)]
    struct IntHead {
        ob_base: ffi::PyObject,
        /// 3.10, 3.11: `ob_size`, the digit count with the value's sign.
        /// 3.12 and later: `lv_tag`, the digit count << 3 | the sign (0 positive, 1
        /// zero, 2 negative).
        size_or_tag: isize,
        digit0: u32,
    }

    /// The value of `obj` if it is a plain `int` of at most two digits.
    ///
    /// # Safety
    /// `obj` must point to a live Python object, and the GIL must be held.
    #[inline(always)]
    unsafe fn read(obj: *mut ffi::PyObject) -> Option<i64> {
        // SAFETY: `obj` is a live object (the caller's contract), so its header is
        // readable; past the header only an exact `int` is read, whose layout is
        // `IntHead` followed by its digits, at least one of them allocated.
        unsafe {
            if ffi::Py_TYPE(obj) != &raw mut ffi::PyLong_Type {
                return None;
            }
            let head = obj as *const IntHead;
            let (negative, digits) = sign_and_digits((*head).size_or_tag);
            let magnitude = match digits {
                0 => return Some(0),
                1 => i64::from((*head).digit0),
                2 => {
                    // A two-digit int has its second digit allocated right after the
                    // first.
                    let d1 = *(&raw const (*head).digit0).add(1);
                    i64::from((*head).digit0) | (i64::from(d1) << SHIFT)
                }
                _ => return None,
            };
            Some(if negative { -magnitude } else { magnitude })
        }
    }

    /// `ob_size` / `lv_tag` of a positive int of one digit.
    #[cfg(not(Py_3_12))]
    const ONE_DIGIT: isize = 1;
    #[cfg(Py_3_12)]
    const ONE_DIGIT: isize = 1 << 3;

    /// (is negative, number of digits) from `ob_size`.
    #[cfg(not(Py_3_12))]
    #[inline(always)]
    fn sign_and_digits(size: isize) -> (bool, usize) {
        (size < 0, size.unsigned_abs())
    }

    /// (is negative, number of digits) from `lv_tag`.
    #[cfg(Py_3_12)]
    #[inline(always)]
    fn sign_and_digits(tag: isize) -> (bool, usize) {
        let tag = tag as usize;
        (tag & 3 == 2, tag >> 3)
    }

    pub fn extend_from_list(
        list: &Bound<'_, PyList>,
        out: &mut Vec<i64>,
        mut slow: impl FnMut(&Bound<'_, PyAny>) -> PyResult<i64>,
    ) -> PyResult<()> {
        let ptr = list.as_ptr();
        // SAFETY: `ptr` is a live list and the GIL is held (the `Bound`).
        let initial = unsafe { ffi::PyList_GET_SIZE(ptr) };
        out.reserve(initial as usize);
        let mut i = 0;
        // As PyO3's list iterator: items up to the list's length when the call began,
        // or its current length if that is less. The length is read again on every
        // step: `slow` may run Python code that changes the list; nothing else can
        // while this thread holds the GIL.
        // SAFETY: `i` is below the list's current length, so the item is a live
        // object the list holds a reference to.
        while i < initial.min(unsafe { ffi::PyList_GET_SIZE(ptr) }) {
            let item = unsafe { ffi::PyList_GET_ITEM(ptr, i) };
            match unsafe { read(item) } {
                Some(v) => out.push(v),
                None => {
                    // SAFETY: `item` is live (above); the new reference keeps it so
                    // while `slow` runs.
                    let item = unsafe { Bound::from_borrowed_ptr(list.py(), item) };
                    out.push(slow(&item)?);
                }
            }
            i += 1;
        }
        Ok(())
    }

    /// Calls `f` on the values of items `start..start + n` of `list`; false (having
    /// called it on the items before) at the first that is not a plain int of at
    /// most two digits, or when the range is past the list's end.
    #[inline(always)]
    pub fn for_each_in_range(
        list: &Bound<'_, PyList>,
        start: usize,
        n: usize,
        f: impl FnMut(i64),
    ) -> bool {
        for_each_value(list, start, n, f, i64::from, Some)
    }

    /// [`for_each_in_range`] for values in `i32`: false also at the first outside it.
    /// A positive int of one digit (below 2^30) fits unchecked.
    #[inline(always)]
    pub fn for_each_i32_in_range(
        list: &Bound<'_, PyList>,
        start: usize,
        n: usize,
        f: impl FnMut(i32),
    ) -> bool {
        for_each_value(
            list,
            start,
            n,
            f,
            |digit| digit as i32,
            |v| i32::try_from(v).ok(),
        )
    }

    /// The walk of both: `one_digit` takes a positive int of one digit's digit,
    /// `other` any other plain int's value (`None`: stop).
    #[inline(always)]
    fn for_each_value<T>(
        list: &Bound<'_, PyList>,
        start: usize,
        n: usize,
        mut f: impl FnMut(T),
        one_digit: impl Fn(u32) -> T,
        other: impl Fn(i64) -> Option<T>,
    ) -> bool {
        let ptr = list.as_ptr();
        // SAFETY: `ptr` is a live list and the GIL is held (the `Bound`).
        let len = unsafe { ffi::PyList_GET_SIZE(ptr) } as usize;
        if start.checked_add(n).is_none_or(|end| end > len) {
            return false;
        }
        if n == 0 {
            return true; // (an empty list's item array may be null)
        }
        // SAFETY: `start + n` is within the list's length, read above, and `n > 0`, so
        // the item array is allocated. No Python code runs while it is read: `f` comes
        // from the pyo3-free core (`TokenSource::for_each` is called only by
        // `pool::hashing`), which cannot call into Python, so nothing can change the
        // list and the array holds these live objects throughout.
        let items = unsafe {
            let list = ptr as *mut ffi::PyListObject;
            std::slice::from_raw_parts((*list).ob_item.add(start), n)
        };
        let long_type = &raw mut ffi::PyLong_Type;
        for &item in items {
            let head = item as *const IntHead;
            // SAFETY: `item` is a live object, so its header is readable; past the
            // header only an exact int is read (its digit count and first digit).
            let value = unsafe {
                if (*head).ob_base.ob_type == long_type && (*head).size_or_tag == ONE_DIGIT {
                    // The common token: a positive int of one digit.
                    Some(one_digit((*head).digit0))
                } else {
                    read(item).and_then(&other)
                }
            };
            match value {
                Some(v) => f(v),
                None => return false,
            }
        }
        true
    }

    /// Items `start..start + n` of `list` into `out` (replacing its contents);
    /// false when the range is past the list's end or an item is not a plain int of
    /// at most two digits.
    pub fn read_range(
        list: &Bound<'_, PyList>,
        start: usize,
        n: usize,
        out: &mut Vec<i64>,
    ) -> bool {
        let ptr = list.as_ptr();
        // SAFETY: `ptr` is a live list and the GIL is held (the `Bound`).
        let len = unsafe { ffi::PyList_GET_SIZE(ptr) } as usize;
        if start.checked_add(n).is_none_or(|end| end > len) {
            return false;
        }
        // Every slot is written below; a reused buffer of the right length is not
        // cleared first.
        if out.len() != n {
            out.resize(n, 0);
        }
        if n == 0 {
            return true; // (an empty list's item array may be null)
        }
        // SAFETY: `start + n` is within the list's length, read above with no Python
        // code run since (none runs here), and `n > 0`, so the item array is allocated
        // and holds `len` live objects.
        let items = unsafe {
            let list = ptr as *mut ffi::PyListObject;
            std::slice::from_raw_parts((*list).ob_item.add(start), n)
        };
        let long_type = &raw mut ffi::PyLong_Type;
        for (slot, &item) in out.iter_mut().zip(items) {
            let head = item as *const IntHead;
            // SAFETY: `item` is a live object, so its header is readable; past the
            // header only an exact int is read (its digit count and first digit).
            let value = unsafe {
                if (*head).ob_base.ob_type == long_type && (*head).size_or_tag == ONE_DIGIT {
                    // The common token: a positive int of one digit.
                    Some(i64::from((*head).digit0))
                } else {
                    read(item)
                }
            };
            match value {
                Some(v) => *slot = v,
                None => return false,
            }
        }
        true
    }

    pub fn extend_from_tuple(
        tuple: &Bound<'_, PyTuple>,
        out: &mut Vec<i64>,
        mut slow: impl FnMut(&Bound<'_, PyAny>) -> PyResult<i64>,
    ) -> PyResult<()> {
        let n = tuple.len();
        out.reserve(n);
        let ptr = tuple.as_ptr();
        for i in 0..n {
            // SAFETY: a tuple never changes its items; `i` is below its length, the
            // GIL is held and the tuple holds a reference to each item.
            let item = unsafe { ffi::PyTuple_GET_ITEM(ptr, i as ffi::Py_ssize_t) };
            match unsafe { read(item) } {
                Some(v) => out.push(v),
                None => {
                    // SAFETY: as above; the new reference keeps it alive in `slow`.
                    let item = unsafe { Bound::from_borrowed_ptr(tuple.py(), item) };
                    out.push(slow(&item)?);
                }
            }
        }
        Ok(())
    }

    /// `sys.int_info` says 30-bit digits in 4-byte words, and values on both sides of
    /// every boundary the reader handles read as `PyLong_AsLongLong` reads them.
    pub fn self_check(py: Python<'_>) -> PyResult<bool> {
        let info = py.import("sys")?.getattr("int_info")?;
        let bits: u32 = info.getattr("bits_per_digit")?.extract()?;
        let size: u32 = info.getattr("sizeof_digit")?.extract()?;
        if bits != SHIFT || size != 4 {
            return Ok(false);
        }
        let limit = 1i64 << SHIFT;
        let probes = [
            0,
            1,
            -1,
            255,
            256,
            65_535,
            65_536,
            limit - 1,
            -(limit - 1),
            limit,
            -limit,
            limit + 12_345,
            (1i64 << (2 * SHIFT)) - 1,
            -((1i64 << (2 * SHIFT)) - 1),
        ];
        for v in probes {
            let obj = PyInt::new(py, v);
            // SAFETY: `obj` is a live int held by this frame, the GIL is held.
            if unsafe { read(obj.as_ptr()) } != Some(v) {
                return Ok(false);
            }
        }
        // Three digits are left to the generic path, as are other types.
        let big = PyInt::new(py, 1i64 << (2 * SHIFT));
        let not_int = pyo3::types::PyFloat::new(py, 1.0);
        // SAFETY: as above.
        Ok(unsafe { read(big.as_ptr()).is_none() && read(not_int.as_ptr()).is_none() })
    }
}
