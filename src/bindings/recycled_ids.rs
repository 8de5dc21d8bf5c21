//! Id arrays handed out again once nobody else holds them.
//!
//! Making a numpy array and releasing it costs more than the core's work for a typical
//! call: under callgrind, 577 instructions to make the `int32` array `get_new_blocks`
//! returns and about 250 to release it, against 532 for the core to allocate 44 blocks.
//! Engines call it with the same few lengths over and over (one block per request per
//! decode step; a prompt's blocks at admission). So a pool keeps the last few arrays it
//! returned ([`RecycledIds`]); when one of the right length is held by nothing but the
//! ring (its reference count is the ring's own 1), no Python code can reach it, and the
//! next call writes the new ids into it and returns it instead of making another.
//!
//! One of the crate's modules with `unsafe` code (see `array_reader.rs` for the list).
//! Reusing an array is sound, and unobservable, because:
//! - the GIL is held (a `Python` token) for every check and the write, and no Python
//!   code runs in between, so no reference can appear meanwhile;
//! - a reference count of 1 is the ring's own: every view (`ids[::-1]`), buffer export
//!   (`memoryview`, `np.frombuffer`) or array built on it holds a reference to it, so
//!   none exists; an array with a weak reference (`weakreflist` set) is never reused;
//! - the array is still exactly as it was made, checked field by field: one dimension
//!   of the wanted length, stride 4 (unless empty), no base, owning its memory,
//!   writeable, aligned, C-contiguous, and the `int32` dtype it was made with (a holder
//!   may have reshaped it, changed its dtype or flags, or resized it before letting go;
//!   then it is dropped instead);
//! - on a free-threaded build a count read by one thread does not exclude others, so
//!   there the ring is off and every call makes a fresh array.

#![allow(unsafe_code)]

use std::sync::Mutex;

use numpy::npyffi::{
    self, NPY_ARRAY_ALIGNED, NPY_ARRAY_C_CONTIGUOUS, NPY_ARRAY_OWNDATA, NPY_ARRAY_WRITEABLE,
};
use numpy::{PyArray1, PyArrayDescrMethods, PyUntypedArrayMethods};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;

use super::convert::ids_to_numpy;
use super::locking::init_once;

/// How many arrays a ring keeps.
const SLOTS: usize = 4;

/// Longest array kept for reuse (16 KiB of ids): a ring never holds more than
/// `SLOTS` such arrays alive beyond their last user.
pub const MAX_RECYCLED_LEN: usize = 4096;

/// The flags an array must still have to be written again.
const REQUIRED_FLAGS: i32 =
    NPY_ARRAY_OWNDATA | NPY_ARRAY_WRITEABLE | NPY_ARRAY_ALIGNED | NPY_ARRAY_C_CONTIGUOUS;

#[derive(Default)]
struct Ring {
    slots: [Option<Py<PyArray1<i32>>>; SLOTS],
    /// The slot the next fresh array replaces when every slot is still in use.
    next: usize,
}

/// Address of numpy's built-in `int32` dtype, which every array here is made with
/// ([`ids_to_numpy`]) and which lives as long as numpy. Looked up (and with it numpy's
/// C API) when the module is imported, so that no call waits on numpy's first lookup.
///
/// Kept in a `PyOnceLock` filled by [`init_once`], not a `std` `OnceLock`: numpy's first
/// lookup releases the GIL (it waits on numpy's own once-cell detached), and a second
/// thread waiting on a `std` cell with the GIL held then deadlocked with it.
pub fn int32_descr(py: Python<'_>) -> usize {
    static DESCR: PyOnceLock<usize> = PyOnceLock::new();
    let look_up = || numpy::dtype::<i32>(py).as_dtype_ptr() as usize;
    // `init_once` fails only if its (infallible) `init` does.
    init_once(py, &DESCR, || Ok(look_up())).map_or_else(|_| look_up(), |descr| *descr)
}

/// The last few id arrays a pool returned, reused once only the ring holds them (see
/// the module notes). Touched only with the GIL held; its lock is only ever tried, so
/// a call that finds it taken makes a fresh array.
#[derive(Default)]
pub struct RecycledIds {
    ring: Mutex<Ring>,
}

impl RecycledIds {
    /// `ids` as an `int32` array: a recycled one of the same length when one is free,
    /// else a fresh one, which the ring then keeps.
    pub fn to_numpy<'py>(&self, py: Python<'py>, ids: &[u32]) -> Bound<'py, PyArray1<i32>> {
        if cfg!(Py_GIL_DISABLED) || ids.len() > MAX_RECYCLED_LEN {
            return ids_to_numpy(py, ids);
        }
        if let Ok(ring) = self.ring.try_lock() {
            let descr = int32_descr(py);
            for slot in ring.slots.iter().flatten() {
                let array = slot.bind(py);
                if let Some(data) = writable_data(array, ids.len(), descr) {
                    // SAFETY: `writable_data` checked that only the ring holds the array
                    // and that it owns `ids.len()` contiguous, aligned, writeable `int32`s
                    // at `data`; the GIL is held and no Python code runs until we return.
                    unsafe { std::ptr::copy_nonoverlapping(ids.as_ptr(), data, ids.len()) };
                    return array.clone();
                }
            }
        }
        // A fresh array, made with the ring's lock not held (making an object is Python
        // code by the locking rules), then kept in place of another.
        let fresh = ids_to_numpy(py, ids);
        let Ok(mut ring) = self.ring.try_lock() else {
            return fresh;
        };
        // An empty slot, else one whose array its caller still holds (letting go of it
        // costs nothing), else the next in turn: an array only the ring holds is kept
        // for a later call of its length as long as possible.
        let victim = ring
            .slots
            .iter()
            .position(Option::is_none)
            .or_else(|| {
                (0..SLOTS).map(|k| (ring.next + k) % SLOTS).find(|&i| {
                    ring.slots[i]
                        .as_ref()
                        .is_some_and(|a| ref_count(a.bind(py)) > 1)
                })
            })
            .unwrap_or(ring.next);
        ring.next = (victim + 1) % SLOTS;
        let replaced = ring.slots[victim].replace(fresh.clone().unbind());
        // Releasing the replaced array can run Python code (a finalizer through the
        // garbage collector): after the lock is given back.
        drop(ring);
        drop(replaced);
        fresh
    }
}

/// References to `array`.
fn ref_count(array: &Bound<'_, PyArray1<i32>>) -> isize {
    // SAFETY: reading a live object's reference count, with the GIL held.
    unsafe { pyo3::ffi::Py_REFCNT(array.as_ptr()) }
}

/// The data pointer of `array` if it can be written with `len` new ids unobserved:
/// the ring's reference is its only one and it is still a plain owned `int32` array of
/// `len` elements with the dtype `descr` (see the module notes).
fn writable_data(array: &Bound<'_, PyArray1<i32>>, len: usize, descr: usize) -> Option<*mut u32> {
    if ref_count(array) != 1 {
        return None;
    }
    // SAFETY: reading the fields of a live array object, with the GIL held.
    let fields = unsafe { &*npyffi::_PyArray_GET_ITEM_DATA(array.as_array_ptr()) };
    let plain = fields.nd == 1
        && fields.base.is_null()
        && fields.weakreflist.is_null()
        && fields.flags & REQUIRED_FLAGS == REQUIRED_FLAGS
        && fields.descr as usize == descr
        // SAFETY: a one-dimensional array has one dimension and one stride. (An empty
        // array's stride is whatever numpy chose; nothing is written into it.)
        && unsafe { *fields.dimensions == len as isize && (len == 0 || *fields.strides == 4) };
    plain.then_some(fields.data.cast::<u32>())
}
