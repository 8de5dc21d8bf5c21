//! `kvpool.ReplayRing`: an event publisher's replay buffer (see `pool/replay_ring.rs`).

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyTuple};

use super::convert::{bytes_arg, int_arg};
use super::errors::{error, ErrorKind};
use super::eviction_args::opt_seconds_arg;
use crate::pool::{AppendError, ReplayRing};

/// The last ``max_batches`` event payloads within ``max_bytes`` (the newest always
/// held), for replay to subscribers that missed them.
///
/// ``append`` copies a payload into the ring, with stores that go straight to memory
/// (the ring is written once a step and read only for a replay, so its lines are not
/// worth a place in the publishing core's cache). Oldest batches go first, once more
/// than ``max_batches`` are held or a new one needs their bytes; a payload larger than
/// the ring is held alone.
///
/// The ring's room is reserved, not written, so that memory is used only as batches
/// fill it; ``prefault=True`` writes it all once here instead, so that no append faults
/// a page in (the first lap otherwise does, on the appending thread).
///
/// The ring's lock is held for a few pointer moves or one batch's copy, and every call
/// takes it with the GIL released.
#[pyclass(frozen, module = "kvpool", name = "ReplayRing")]
pub struct PyReplayRing {
    ring: ReplayRing,
}

impl PyReplayRing {
    /// Raises what ``append`` would raise for batch `seq` now, holding nothing.
    pub(crate) fn check_next(&self, py: Python<'_>, seq: u64) -> PyResult<()> {
        py.detach(|| self.ring.check_next(seq))
            .map_err(|e| append_error(py, e, seq))
    }

    /// Holds as batch `seq` the payload `write` puts into an empty buffer (with the GIL
    /// released), and returns it as `bytes`.
    pub(crate) fn hold_written<'py>(
        &self,
        py: Python<'py>,
        seq: u64,
        write: impl FnOnce(&mut Vec<u8>) + Send,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let bytes = super::events::encode_with(py, write);
        self.hold(py, seq, bytes.as_bytes())?;
        Ok(bytes)
    }

    /// Holds a copy of `payload` as batch `seq` (with the GIL released).
    pub(crate) fn hold(&self, py: Python<'_>, seq: u64, payload: &[u8]) -> PyResult<()> {
        py.detach(|| self.ring.append(seq, payload))
            .map_err(|e| append_error(py, e, seq))
    }
}

/// The Python error of a refused append.
fn append_error(py: Python<'_>, e: AppendError, seq: u64) -> PyErr {
    match e {
        AppendError::Closed => error(py, ErrorKind::Transport, "the replay ring is closed"),
        AppendError::OutOfOrder { last } => error(
            py,
            ErrorKind::InvalidArgument,
            format!("batch numbers must increase: got {seq} after {last}"),
        ),
    }
}

#[pymethods]
impl PyReplayRing {
    #[new]
    #[pyo3(signature = (max_batches, max_bytes, *, prefault=None))]
    fn new(
        max_batches: &Bound<'_, PyAny>,
        max_bytes: &Bound<'_, PyAny>,
        prefault: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let py = max_batches.py();
        let batches = int_arg(max_batches, "max_batches", 1, i64::MAX)? as usize;
        let bytes = int_arg(max_bytes, "max_bytes", 0, isize::MAX as i64)? as usize;
        let prefault = super::convert::opt_bool_arg(prefault, "prefault", false)?;
        let ring = ReplayRing::new(batches, bytes).map_err(|e| {
            error(
                py,
                ErrorKind::OutOfMemory,
                format!("cannot start the replay ring: {e}"),
            )
        })?;
        if prefault {
            py.detach(|| ring.prefault());
        }
        Ok(Self { ring })
    }

    /// Holds ``payload`` (``bytes``) as batch ``seq``. Numbers must increase from call
    /// to call (``InvalidArgumentError`` otherwise, holding nothing); raises
    /// ``TransportError`` (a ``RuntimeError``) once closed.
    fn append(
        &self,
        py: Python<'_>,
        seq: &Bound<'_, PyAny>,
        payload: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let seq = int_arg(seq, "seq", 0, i64::MAX)? as u64;
        // Copied with the GIL released (the ring's lock may be held by a thread that
        // released it too); `payload` keeps the immutable object alive meanwhile.
        self.hold(py, seq, bytes_arg(payload, "payload")?.as_bytes())
    }

    /// The held batches numbered ``first`` or later, oldest first, as ``(seq, bytes)``.
    fn batches_from<'py>(
        &self,
        py: Python<'py>,
        first: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyList>> {
        let first = int_arg(first, "first", 0, i64::MAX)? as u64;
        let held = py.detach(|| self.ring.batches_from(first));
        let items = held
            .into_iter()
            .map(|(seq, bytes)| {
                PyTuple::new(
                    py,
                    [
                        seq.into_pyobject(py)?.into_any(),
                        PyBytes::new(py, &bytes).into_any(),
                    ],
                )
            })
            .collect::<PyResult<Vec<_>>>()?;
        PyList::new(py, items)
    }

    /// The number of the last batch appended (held, or let go since), or ``None``.
    #[getter]
    fn last_seq(&self, py: Python<'_>) -> Option<u64> {
        py.detach(|| self.ring.last_seq())
    }

    /// Batches held.
    fn __len__(&self, py: Python<'_>) -> usize {
        py.detach(|| self.ring.len())
    }

    /// Payload bytes held.
    #[getter]
    fn num_bytes(&self, py: Python<'_>) -> usize {
        py.detach(|| self.ring.num_bytes())
    }

    /// True: every batch is held once ``append`` returns. Kept from the ring's first
    /// design, which copied on a thread of its own (``timeout`` is still checked).
    fn drain(&self, py: Python<'_>, timeout: &Bound<'_, PyAny>) -> PyResult<bool> {
        match opt_seconds_arg(Some(timeout), "timeout")? {
            Some(seconds) if seconds >= 0.0 => Ok(true),
            seconds => Err(error(
                py,
                ErrorKind::InvalidArgument,
                format!(
                    "timeout must be >= 0 seconds, got {}",
                    seconds.map_or("None".into(), |s| s.to_string())
                ),
            )),
        }
    }

    /// Later appends raise; what is held stays readable.
    fn close(&self, py: Python<'_>) {
        py.detach(|| self.ring.close());
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        let (n, b) = py.detach(|| (self.ring.len(), self.ring.num_bytes()));
        format!("ReplayRing({n} batches, {b} bytes)")
    }
}
