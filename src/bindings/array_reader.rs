//! Block ids read straight out of a numpy array's memory, at any stride.
//!
//! Block ids come back to kvpool as the `int32` arrays it handed out, or views of them
//! such as `ids[::-1]` (vLLM frees a request's blocks tail first). rust-numpy's safe
//! readers either track borrows (a global lock and an allocation per call) or copy a
//! strided view into an owned array first, which then has to be copied again. This
//! module copies the elements once, from the array's data pointer by its stride, after
//! checking through rust-numpy's safe accessors that the array is what it must be.
//! [`borrow_ids`] skips even that copy for the common case, a contiguous 4-byte array
//! or its reversed view, and lends the array's memory as a slice.
//!
//! One of the crate's nine modules with `unsafe` code (with `int_reader.rs`,
//! `bytes_reader.rs`, `recycled_ids.rs`, `block_view.rs`, `zmq_sink.rs`,
//! `pool/stream_copy.rs`, `pool/meta_store.rs` and `pool/hashing/sha_ni.rs`). The
//! reads are sound because:
//! - the object is exactly `numpy.ndarray` (not a subclass that could lie about its
//!   layout), one-dimensional, of a 4- or 8-byte integer dtype in native byte order
//!   and aligned, all read through rust-numpy's checked accessors;
//! - numpy guarantees `data + i * stride` is a valid, aligned element for
//!   `i < shape[0]` while the array is alive, which the caller's reference ensures;
//! - the GIL is held (the `Bound`) and no Python code runs while the elements are
//!   copied, or while a lent slice is in use (the GIL is not given up until it is
//!   dropped), so the array cannot be resized or freed meanwhile. A thread writing
//!   the array without the GIL could race the read, exactly as with rust-numpy's
//!   `to_vec`, which the bindings used before.

#![allow(unsafe_code)]

use numpy::{PyArrayDescrMethods, PyUntypedArray, PyUntypedArrayMethods};
use pyo3::prelude::*;

/// What [`append_ids`] found.
pub enum Ids {
    /// Every id was appended to `out`.
    Read,
    /// This value is not a block id below the bound; nothing was appended.
    OutOfRange(i64),
    /// Not an array this reader takes (the caller converts it the general way);
    /// nothing was appended.
    NotPlain,
}

/// What both readers need of a plain array: 1-D, aligned, of a native integer dtype
/// (checked through rust-numpy's accessors), with its first element's address.
struct Plain {
    /// The dtype's kind: `b'i'` or `b'u'`.
    kind: u8,
    itemsize: usize,
    len: usize,
    /// Bytes from one element to the next (negative for a reversed view).
    stride: isize,
    /// Element 0.
    data: *mut std::os::raw::c_char,
}

/// `array`'s [`Plain`] layout, or `None` when it is not such an array.
fn plain(array: &Bound<'_, PyUntypedArray>) -> Option<Plain> {
    if array.ndim() != 1 || !array.is_aligned() {
        return None;
    }
    let dtype = array.dtype();
    let kind = dtype.kind();
    if !(kind == b'i' || kind == b'u') || dtype.is_native_byteorder() == Some(false) {
        return None;
    }
    Some(Plain {
        kind,
        itemsize: dtype.itemsize(),
        len: array.shape()[0],
        stride: array.strides()[0],
        // SAFETY: reading the array object's own data pointer, with the GIL held.
        data: unsafe { (*numpy::npyffi::_PyArray_GET_ITEM_DATA(array.as_array_ptr())).data },
    })
}

/// A plain 1-D array of 4-byte integers laid out back to back, forwards or backwards
/// (`ids[::-1]` of a contiguous array), lent as its memory in address order, with
/// `reversed` set when the array's logical order is the other way. Values are not
/// checked: negative `int32` ids read as 2^31 and above.
pub struct BorrowedIds<'a> {
    /// The elements in memory order.
    pub ids: &'a [u32],
    /// True when element 0 of the array is the last of `ids`.
    pub reversed: bool,
}

/// Lends `array`'s elements in place when it is a plain, native, aligned 1-D array
/// of `int32` or `uint32` with stride 4 or -4 (see [`BorrowedIds`]); `None` for any
/// other array (the caller copies it with [`append_ids`]).
///
/// The slice lives as long as the borrow of `array`; the caller must not run Python
/// code or give up the GIL while using it (see the module notes).
pub fn borrow_ids<'a>(array: &'a Bound<'_, PyUntypedArray>) -> Option<BorrowedIds<'a>> {
    // SAFETY: `plain` read this array's layout and the slice borrows `array`, so it
    // lives no longer than the caller's reference (see `back_to_back`).
    unsafe { back_to_back(&plain(array)?) }
}

/// The elements of a [`Plain`] array of 4-byte integers with stride 4 or -4, as
/// [`BorrowedIds`]; `None` for any other layout.
///
/// # Safety
/// `layout` is what [`plain`] read from an array the caller holds a reference to for
/// `'a`, with the GIL held and no Python code run while the slice is in use.
unsafe fn back_to_back<'a>(layout: &Plain) -> Option<BorrowedIds<'a>> {
    let Plain {
        itemsize,
        len,
        stride,
        data,
        ..
    } = *layout;
    if itemsize != 4 {
        return None;
    }
    let reversed = match stride {
        _ if len <= 1 => false,
        4 => false,
        -4 => true,
        _ => return None,
    };
    if len == 0 {
        return Some(BorrowedIds { ids: &[], reversed });
    }
    // SAFETY: the array is 1-D and aligned with a native 4-byte integer dtype (checked
    // by `plain`), so `data` is its first element and `data + i * stride` is element
    // `i` for `i < len`; with a stride of -4 the lowest address is element `len - 1`.
    // Those `len` elements are back to back and stay valid and unchanged while the
    // caller holds the GIL without running Python code (this function's contract).
    let ids = unsafe {
        let lowest = if reversed {
            data.offset(-4 * (len as isize - 1))
        } else {
            data
        };
        std::slice::from_raw_parts(lowest as *const u32, len)
    };
    Some(BorrowedIds { ids, reversed })
}

/// Appends the elements of `array` to `out` as block ids, in logical order (a
/// reversed view reads its memory backwards), if `array` is a plain 1-D array of
/// 4- or 8-byte integers (see the module notes) and every element is in
/// `0..bound`.
pub fn append_ids(array: &Bound<'_, PyUntypedArray>, bound: u32, out: &mut Vec<u32>) -> Ids {
    let Some(layout) = plain(array) else {
        return Ids::NotPlain;
    };
    let Plain {
        kind,
        itemsize,
        len,
        stride,
        data,
    } = layout;
    // From here, `data + i * stride` is element `i` for `i < len` (see [`Plain`]).
    let start = out.len();
    out.reserve(len);
    // Negative ids (signed dtypes) wrap to 2^31 and above (4 bytes) or 2^63 and
    // above (8 bytes), so one unsigned bound below 2^31 rejects them too.
    let bound = bound.min(1 << 31);
    // The common case, the int32 arrays kvpool hands out and their reversed views:
    // one copy and one check of the largest id, both without a branch per element
    // (vectorised; the loop below, which stops at the first bad id, took a fifth of a
    // step of 100 x 44 blocks allocated and freed in one call each).
    // SAFETY: `layout` is `plain`'s reading of `array`, which the caller holds, and
    // the slice is dropped before this function returns, with no Python code run.
    if let Some(BorrowedIds { ids, reversed }) = unsafe { back_to_back(&layout) } {
        if reversed {
            out.extend(ids.iter().rev());
        } else {
            out.extend_from_slice(ids);
        }
        let appended = &out[start..];
        if appended.iter().fold(0, |most, &v| most.max(v)) < bound {
            return Ids::Read;
        }
        let v = appended
            .iter()
            .copied()
            .find(|&v| v >= bound)
            .unwrap_or(bound);
        out.truncate(start);
        return Ids::OutOfRange(if kind == b'i' {
            i64::from(v as i32)
        } else {
            i64::from(v)
        });
    }
    let mut bad = None;
    match itemsize {
        4 => {
            for i in 0..len {
                // SAFETY: `i < len` (see above); the element is 4 bytes and aligned.
                let v = unsafe { *(data.offset(i as isize * stride) as *const u32) };
                out.push(v);
                if v >= bound {
                    bad = Some(if kind == b'i' {
                        i64::from(v as i32)
                    } else {
                        i64::from(v)
                    });
                    break;
                }
            }
        }
        8 => {
            for i in 0..len {
                // SAFETY: as above, for an 8-byte element.
                let v = unsafe { *(data.offset(i as isize * stride) as *const u64) };
                out.push(v as u32);
                if v >= u64::from(bound) {
                    if kind == b'u' && i64::try_from(v).is_err() {
                        // Beyond int64: the general path says so, as it always has.
                        out.truncate(start);
                        return Ids::NotPlain;
                    }
                    bad = Some(v as i64);
                    break;
                }
            }
        }
        _ => return Ids::NotPlain,
    }
    match bad {
        Some(v) => {
            out.truncate(start);
            Ids::OutOfRange(v)
        }
        None => Ids::Read,
    }
}
