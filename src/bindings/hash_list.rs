//! `kvpool.BlockHashList`: a request's block hashes kept in Rust, handed to the pool
//! without one `bytes` object per block.

use std::sync::Mutex;

use numpy::PyArray1;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PySlice};

use super::convert::int_arg;
use crate::pool::hashing::HashAlgo;

/// A request's block hashes, kept in Rust: one flat buffer of equal-width digests.
///
/// Pass it straight to ``BlockPool.cache_full_blocks`` / ``find_longest_cache_hit``;
/// ``to_list()`` / indexing give ``bytes`` on request. It grows only by appending.
#[pyclass(frozen, module = "kvpool", name = "BlockHashList")]
pub struct PyBlockHashList {
    inner: Mutex<Vec<u8>>,
    width: usize,
    algo: HashAlgo,
}

impl PyBlockHashList {
    /// A list over `bytes` (a whole number of `algo` digests).
    pub fn new(bytes: Vec<u8>, algo: HashAlgo) -> Self {
        Self {
            inner: Mutex::new(bytes),
            width: algo.digest_len(),
            algo,
        }
    }

    /// Runs `f` on the flat digests under the list's lock. It is a leaf lock: its
    /// holders run no Python code and never release the GIL, so waiting for it is
    /// always short and may be done with the GIL held (`locking.rs`).
    pub fn with_bytes<R>(&self, f: impl FnOnce(&mut Vec<u8>) -> R) -> R {
        f(&mut self.inner.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// A copy of the flat digests, to build Python objects from after unlocking.
    fn snapshot(&self) -> Vec<u8> {
        self.with_bytes(|b| b.clone())
    }

    /// The algorithm that produced the hashes.
    pub fn algo(&self) -> HashAlgo {
        self.algo
    }

    /// Digest width in bytes.
    pub fn width(&self) -> usize {
        self.width
    }

    /// Copies the digests out as a core hash view's backing store.
    pub fn copy_into(&self, flat: &mut Vec<u8>) -> usize {
        self.with_bytes(|b| flat.extend_from_slice(b));
        self.width
    }

    fn len(&self) -> usize {
        self.with_bytes(|b| b.len()) / self.width
    }
}

#[pymethods]
impl PyBlockHashList {
    /// Digest width in bytes (32 for SHA-256, 16 for xxh3-128).
    #[getter(width)]
    fn py_width(&self) -> usize {
        self.width
    }

    /// Name of the algorithm that produced the hashes.
    #[getter]
    fn hash_algo(&self) -> &'static str {
        self.algo.name()
    }

    fn __len__(&self) -> usize {
        self.len()
    }

    fn __getitem__<'py>(
        &self,
        py: Python<'py>,
        index: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let len = self.len();
        if let Ok(slice) = index.cast::<PySlice>() {
            let ind = slice.indices(len as isize).map_err(|e| {
                super::errors::error(
                    py,
                    super::errors::ErrorKind::InvalidArgument,
                    e.value(py).to_string(),
                )
            })?;
            let out = self.with_bytes(|bytes| {
                let mut out = Vec::with_capacity(ind.slicelength * self.width);
                let mut i = ind.start;
                for _ in 0..ind.slicelength {
                    let i_u = i as usize;
                    out.extend_from_slice(&bytes[i_u * self.width..(i_u + 1) * self.width]);
                    i += ind.step;
                }
                out
            });
            return Ok(Bound::new(py, PyBlockHashList::new(out, self.algo))?.into_any());
        }
        let i = int_arg(index, "index", i64::MIN, i64::MAX)?;
        let j = if i < 0 { i + len as i64 } else { i };
        if j < 0 || j >= len as i64 {
            return Err(pyo3::exceptions::PyIndexError::new_err(format!(
                "block hash index {i} out of range for {len} hashes"
            )));
        }
        let j = j as usize;
        let hash = self.with_bytes(|b| b[j * self.width..(j + 1) * self.width].to_vec());
        Ok(PyBytes::new(py, &hash).into_any())
    }

    /// The hashes as a list of ``bytes``.
    fn to_list<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let bytes = self.snapshot();
        PyList::new(
            py,
            bytes.chunks_exact(self.width).map(|h| PyBytes::new(py, h)),
        )
    }

    /// All hashes back to back as one ``bytes`` object.
    fn to_bytes<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.snapshot())
    }

    /// The hashes as vLLM's KV-event wire format writes them: the last 8 bytes of
    /// each, big-endian, as ``uint64``.
    fn to_ints<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray1<u64>> {
        let bytes = self.snapshot();
        PyArray1::from_iter(
            py,
            bytes.chunks_exact(self.width).map(|h| {
                let mut last = [0u8; 8];
                last.copy_from_slice(&h[h.len() - 8..]);
                u64::from_be_bytes(last)
            }),
        )
    }

    fn __eq__(&self, other: &Bound<'_, PyAny>) -> bool {
        match other.cast::<PyBlockHashList>() {
            Ok(o) => {
                let o = o.get();
                if std::ptr::eq(self, o) {
                    return true;
                }
                // One lock at a time: two threads comparing a == b and b == a never deadlock.
                let theirs = o.snapshot();
                self.algo == o.algo && self.with_bytes(|b| *b == theirs)
            }
            Err(_) => match other.cast::<PyList>() {
                Ok(list) => {
                    let bytes = self.snapshot();
                    let len = bytes.len() / self.width;
                    list.len() == len
                        && list
                            .iter()
                            .zip(bytes.chunks_exact(self.width))
                            .all(|(item, h)| {
                                item.cast::<PyBytes>()
                                    .map(|b| b.as_bytes() == h)
                                    .unwrap_or(false)
                            })
                }
                Err(_) => false,
            },
        }
    }

    fn __repr__(&self) -> String {
        format!(
            "BlockHashList(hash_algo={:?}, len={})",
            self.algo.name(),
            self.len()
        )
    }
}
