//! Block hashes read straight out of a list of CPython `bytes` objects.
//!
//! Block hashes usually arrive as a `list` of `bytes` (vLLM's `request.block_hashes`, a
//! router's keys). Converting each through PyO3 (a new reference, a type check,
//! `PyBytes_AsString` and `PyBytes_Size` through the C API, a copy of unknown length, a
//! release) costs about 165 instructions a hash, more than the pool's own work on an
//! evicting allocation. This module reads the items in place instead: a borrowed pointer
//! from the list's item array, one comparison with `PyBytes_Type`, the length from the
//! object's header and the bytes from its inline buffer.
//!
//! One of the crate's nine modules with `unsafe` code (with `int_reader.rs`,
//! `array_reader.rs`, `recycled_ids.rs`, `block_view.rs`, `zmq_sink.rs`, `pool/stream_copy.rs`,
//! `pool/meta_store.rs` and `pool/hashing/sha_ni.rs`;
//! `[lints.rust] unsafe_code = "deny"` everywhere else). It depends on CPython's object
//! layout, so it is compiled only where `int_reader.rs` is (the `fast_ints` cfg of
//! `build.rs`: a version-specific 64-bit CPython build with the GIL): there a `bytes`
//! object is a `PyBytesObject`, its size in `ob_size` and its bytes inline in `ob_sval`
//! (the same in every CPython 3.x).
//!
//! The reader only takes the leading items that are exact `bytes` of one accepted width;
//! the caller converts the rest the general way, one item at a time, so every error and
//! edge case (another type, a subclass, a different width) behaves exactly as before.

#![allow(unsafe_code)]

use pyo3::prelude::*;
use pyo3::types::PyList;

/// Appends the bytes of `list`'s leading items to `flat` while each is an exact `bytes`
/// of `*width` bytes; returns how many it read. With `*width == 0` the first item sets
/// it (1 to `max_width` bytes) and room for the whole list is reserved. Returns 0 where
/// the in-place reader is not compiled in, or at the first item it cannot take.
pub fn extend_hashes(
    list: &Bound<'_, PyList>,
    width: &mut usize,
    max_width: usize,
    flat: &mut Vec<u8>,
) -> usize {
    #[cfg(not(fast_ints))]
    {
        let _ = (list, width, max_width, flat);
        0
    }
    #[cfg(fast_ints)]
    {
        let ptr = list.as_ptr();
        // SAFETY: `ptr` is a live list and the GIL is held (the `Bound`); nothing below
        // runs Python code, so the list and its items stay as they are.
        let len = unsafe { pyo3::ffi::PyList_GET_SIZE(ptr) } as usize;
        let item = |i: usize| {
            // SAFETY: `i` is below the list's length, so the item is a live object the
            // list holds a reference to; no Python code runs while its bytes are read.
            unsafe { fast::bytes_of(pyo3::ffi::PyList_GET_ITEM(ptr, i as pyo3::ffi::Py_ssize_t)) }
        };
        if *width == 0 {
            match (len > 0).then(|| item(0)).flatten() {
                Some(first) if (1..=max_width).contains(&first.len()) => {
                    *width = first.len();
                    flat.reserve(len * first.len());
                }
                _ => return 0,
            }
        }
        let w = *width;
        let mut read = 0;
        while read < len {
            match item(read) {
                // The common width as a fixed-size copy (no call).
                Some(b) if b.len() == 32 && w == 32 => {
                    flat.extend_from_slice(&<[u8; 32]>::try_from(b).unwrap_or([0; 32]))
                }
                Some(b) if b.len() == w => flat.extend_from_slice(b),
                _ => break,
            }
            read += 1;
        }
        read
    }
}

#[cfg(fast_ints)]
mod fast {
    use pyo3::ffi;

    /// The bytes of `obj` if it is an exact `bytes` object.
    ///
    /// # Safety
    /// `obj` must point to a live Python object, the GIL must be held, and nothing may
    /// run Python code while the slice is alive.
    #[inline(always)]
    pub unsafe fn bytes_of<'a>(obj: *mut ffi::PyObject) -> Option<&'a [u8]> {
        // SAFETY: `obj` is a live object (the caller's contract), so its header is
        // readable; only an exact `bytes` is read further, whose layout is
        // `PyBytesObject` with `ob_size` bytes inline from `ob_sval` (and a NUL after
        // them). The object outlives the slice: the caller holds the list, which
        // holds the object, and runs no Python code meanwhile.
        unsafe {
            if ffi::Py_TYPE(obj) != &raw mut ffi::PyBytes_Type {
                return None;
            }
            let bytes = obj as *const ffi::PyBytesObject;
            let len = (*bytes).ob_base.ob_size as usize;
            let data = (&raw const (*bytes).ob_sval).cast::<u8>();
            Some(std::slice::from_raw_parts(data, len))
        }
    }
}
