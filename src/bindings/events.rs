//! Core events to the dataclasses of `kvpool.events`.

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBytes, PyList, PyString, PyTuple};

use super::locking::init_once;
use crate::pool::{EventExtraKey, PoolEvent, StoredBlocks, TakenEvents};

static EVENTS_MODULE: PyOnceLock<Py<PyModule>> = PyOnceLock::new();

/// A `BlockStored`'s per-block extra keys as vLLM's event holds them: a list with, per
/// block, `None` or a tuple of `str` (LoRA name, cache salt), `(identifier, offset)` and
/// `bytes` (prompt-embeddings digest).
fn extra_keys_to_py<'py>(
    py: Python<'py>,
    blocks: &[Option<Vec<EventExtraKey>>],
) -> PyResult<Bound<'py, PyList>> {
    let list = PyList::empty(py);
    for keys in blocks {
        match keys {
            None => list.append(py.None())?,
            Some(keys) => {
                let items = keys
                    .iter()
                    .map(|key| -> PyResult<Bound<'py, PyAny>> {
                        Ok(match key {
                            EventExtraKey::Text(s) => PyString::new(py, s).into_any(),
                            EventExtraKey::Mm(identifier, offset) => {
                                (identifier.as_str(), *offset).into_pyobject(py)?.into_any()
                            }
                            EventExtraKey::Digest(d) => PyBytes::new(py, d).into_any(),
                        })
                    })
                    .collect::<PyResult<Vec<_>>>()?;
                list.append(PyTuple::new(py, items)?)?;
            }
        }
    }
    Ok(list)
}

/// Converts queued events, oldest first, into a Python list of event objects.
pub fn events_to_py<'py>(py: Python<'py>, events: Vec<PoolEvent>) -> PyResult<Bound<'py, PyList>> {
    let module = init_once(py, &EVENTS_MODULE, || {
        py.import("kvpool.events").map(Bound::unbind)
    })?
    .bind(py);
    let list = PyList::empty(py);
    for event in events {
        let obj = match event {
            PoolEvent::BlockStored(stored) => {
                let StoredBlocks {
                    block_hashes,
                    parent_block_hash,
                    token_ids,
                    block_size,
                    lora_id,
                    lora_name,
                    group_idx,
                    extra_keys,
                } = *stored;
                let extra_keys = extra_keys
                    .map(|blocks| extra_keys_to_py(py, &blocks))
                    .transpose()?;
                let hashes = PyList::new(
                    py,
                    block_hashes.iter().map(|h| PyBytes::new(py, h.as_bytes())),
                )?;
                let parent = parent_block_hash.map(|h| PyBytes::new(py, h.as_bytes()));
                module.getattr("BlockStored")?.call1((
                    hashes,
                    parent,
                    PyList::new(py, token_ids)?,
                    block_size,
                    lora_id,
                    "GPU",
                    lora_name,
                    group_idx,
                    extra_keys,
                ))?
            }
            PoolEvent::BlockRemoved {
                block_hash,
                group_idx,
            } => {
                let hashes = PyList::new(py, [PyBytes::new(py, block_hash.as_bytes())])?;
                module
                    .getattr("BlockRemoved")?
                    .call1((hashes, "GPU", group_idx))?
            }
            PoolEvent::AllBlocksCleared => module.getattr("AllBlocksCleared")?.call0()?,
        };
        list.append(obj)?;
    }
    Ok(list)
}

/// `take_events_msgpack`'s arguments, converted: the batch's timestamp (now when not given),
/// rank, medium and per-group spec labels.
pub struct WireArgs {
    ts: f64,
    rank: Option<i64>,
    medium: String,
    specs: Vec<(u32, Option<String>, Option<i64>)>,
}

impl WireArgs {
    /// Reads the Python arguments: ``group_specs`` maps a group index to
    /// ``(kv_cache_spec_kind, kv_cache_spec_sliding_window)``.
    pub fn from_py(
        py: Python<'_>,
        ts: Option<&Bound<'_, PyAny>>,
        data_parallel_rank: Option<&Bound<'_, PyAny>>,
        group_specs: Option<&Bound<'_, PyAny>>,
        medium: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let dtype =
            |what: &str| super::errors::error(py, super::errors::ErrorKind::Dtype, what.to_owned());
        let ts = match ts.filter(|o| !o.is_none()) {
            Some(o) => o
                .extract::<f64>()
                .map_err(|_| dtype("ts must be a float"))?,
            None => std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64()),
        };
        let rank = super::convert::opt_int_arg(
            data_parallel_rank,
            "data_parallel_rank",
            i64::MIN,
            i64::MAX,
        )?;
        let medium =
            super::convert::opt_str_arg(medium, "medium")?.unwrap_or_else(|| "GPU".to_owned());
        let mut specs = Vec::new();
        if let Some(map) = group_specs.filter(|o| !o.is_none()) {
            let dict = map.cast::<pyo3::types::PyDict>().map_err(|_| {
                dtype("group_specs must be a dict of group index -> (kind, sliding_window)")
            })?;
            for (k, v) in dict.iter() {
                let g = super::convert::int_arg(&k, "a group index", 0, u32::MAX as i64)? as u32;
                let (kind, window): (Option<String>, Option<i64>) = v.extract().map_err(|_| {
                    dtype("a group spec must be (kind: str | None, sliding_window: int | None)")
                })?;
                specs.push((g, kind, window));
            }
        }
        Ok(Self {
            ts,
            rank,
            medium,
            specs,
        })
    }

    /// The events' msgpack as a `bytes`, encoded without the GIL into a buffer this
    /// thread reuses (so that a step's payload does not grow a fresh buffer by doubling).
    pub fn encode<'py>(&self, py: Python<'py>, events: &[PoolEvent]) -> Bound<'py, PyBytes> {
        encode_with(py, move |buf| self.encode_into(events, buf))
    }

    /// Appends `events`' batch payload to `buf` (no Python involved).
    pub fn encode_into(&self, events: &[PoolEvent], buf: &mut Vec<u8>) {
        let specs: Vec<(u32, Option<&str>, Option<i64>)> = self
            .specs
            .iter()
            .map(|(g, k, w)| (*g, k.as_deref(), *w))
            .collect();
        let batch = crate::pool::WireBatch {
            ts: self.ts,
            data_parallel_rank: self.rank,
            medium: &self.medium,
            group_specs: &specs,
        };
        crate::pool::encode_event_batch(events, &batch, buf);
    }
}

/// `take_events_msgpack` of a pool, manager or group manager: the arguments read,
/// then `take` called for the events. With `replay` (a `ReplayRing`) and `seq`, a
/// batch that has events is also held in the ring as batch `seq`, copied there from
/// the encoding buffer while it is still in cache. The ring's refusal (closed, or
/// `seq` not above its last batch) is checked before any event is taken, so a refused
/// call changes nothing; if the ring refuses the batch after that (another thread
/// closed it or held a later batch meanwhile), the events go back to the queue, in
/// front. Taken events go back through `give_back`.
#[allow(clippy::too_many_arguments)]
pub fn take_encoded<'py>(
    py: Python<'py>,
    ts: Option<&Bound<'py, PyAny>>,
    data_parallel_rank: Option<&Bound<'py, PyAny>>,
    group_specs: Option<&Bound<'py, PyAny>>,
    medium: Option<&Bound<'py, PyAny>>,
    replay: Option<&Bound<'py, PyAny>>,
    seq: Option<&Bound<'py, PyAny>>,
    take: impl FnOnce() -> Vec<PoolEvent>,
    give_back: impl FnOnce(TakenEvents),
) -> PyResult<Bound<'py, PyBytes>> {
    let args = WireArgs::from_py(py, ts, data_parallel_rank, group_specs, medium)?;
    let keep = replay_target(py, replay, seq)?;
    if let Some((ring, seq)) = keep {
        ring.check_next(py, seq)?;
    }
    let mut events = take();
    let encoded = match keep {
        Some((ring, seq)) if !events.is_empty() => {
            ring.hold_written(py, seq, |buf| args.encode_into(&events, buf))
        }
        _ => Ok(args.encode(py, &events)),
    };
    if encoded.is_err() {
        give_back(TakenEvents::Refused(events));
        return encoded;
    }
    // The events are dropped here, outside the owner's lock; their room goes back.
    events.clear();
    give_back(TakenEvents::Consumed(events));
    encoded
}

/// `send_events` of a pool, manager or group manager: the arguments read, then `take`
/// called for the events; a batch that has events is encoded (the GIL released) into a
/// buffer ZeroMQ gets back to, held in `replay` (if given) as batch `seq`, and sent on
/// `sink` with the payload lent. Returns the payload's length, 0 when there were no
/// events (nothing held or sent). The sink's and the ring's refusals are checked before
/// any event is taken, and a ring that refuses the batch after that (closed or moved
/// past `seq` by another thread meanwhile) gets the events back to the queue, in front;
/// a send that fails after the batch is held raises ``TransportError`` with the batch
/// held.
#[allow(clippy::too_many_arguments)]
pub fn take_sent(
    py: Python<'_>,
    sink: &Bound<'_, PyAny>,
    seq: &Bound<'_, PyAny>,
    ts: Option<&Bound<'_, PyAny>>,
    data_parallel_rank: Option<&Bound<'_, PyAny>>,
    group_specs: Option<&Bound<'_, PyAny>>,
    medium: Option<&Bound<'_, PyAny>>,
    replay: Option<&Bound<'_, PyAny>>,
    take: impl FnOnce() -> Vec<PoolEvent>,
    give_back: impl FnOnce(TakenEvents),
) -> PyResult<usize> {
    let args = WireArgs::from_py(py, ts, data_parallel_rank, group_specs, medium)?;
    let sink = kvpool_object::<super::zmq_sink::PyZmqSink>(sink, "sink", "ZmqSink")?;
    let seq = super::convert::int_arg(seq, "seq", 0, i64::MAX)? as u64;
    let ring = replay_ring_arg(replay)?;
    sink.check_open(py)?;
    if let Some(ring) = ring {
        ring.check_next(py, seq)?;
    }
    let mut events = take();
    if events.is_empty() {
        give_back(TakenEvents::Consumed(events));
        return Ok(0);
    }
    let mut payload = super::zmq_sink::spare_buffer();
    py.detach(|| args.encode_into(&events, &mut payload));
    if let Some(ring) = ring {
        if let Err(refused) = ring.hold(py, seq, &payload) {
            give_back(TakenEvents::Refused(events));
            return Err(refused);
        }
    }
    events.clear();
    give_back(TakenEvents::Consumed(events));
    let len = payload.len();
    sink.send_batch(py, seq, payload)?;
    Ok(len)
}

/// `take_events_msgpack`'s ``replay`` and ``seq``: both or neither.
fn replay_target<'a, 'py>(
    py: Python<'py>,
    replay: Option<&'a Bound<'py, PyAny>>,
    seq: Option<&Bound<'py, PyAny>>,
) -> PyResult<Option<(&'a super::replay_ring::PyReplayRing, u64)>> {
    let invalid = |what: &str| {
        super::errors::error(
            py,
            super::errors::ErrorKind::InvalidArgument,
            what.to_owned(),
        )
    };
    let seq = super::convert::opt_int_arg(seq, "seq", 0, i64::MAX)?;
    match (replay_ring_arg(replay)?, seq) {
        (None, None) => Ok(None),
        (None, Some(_)) => Err(invalid(
            "seq is the batch number in replay; give it with replay",
        )),
        (Some(_), None) => Err(invalid("replay needs seq, the batch's number")),
        (Some(ring), Some(seq)) => Ok(Some((ring, seq as u64))),
    }
}

/// A ``replay`` argument: ``None`` or a ``kvpool.ReplayRing``.
fn replay_ring_arg<'a, 'py>(
    replay: Option<&'a Bound<'py, PyAny>>,
) -> PyResult<Option<&'a super::replay_ring::PyReplayRing>> {
    let Some(ring) = replay.filter(|r| !r.is_none()) else {
        return Ok(None);
    };
    kvpool_object::<super::replay_ring::PyReplayRing>(ring, "replay", "ReplayRing").map(Some)
}

/// The kvpool object `obj` (argument `what`) as its class `T` (``kvpool.<class>``);
/// anything else is a ``DtypeError``.
fn kvpool_object<'a, T>(obj: &'a Bound<'_, PyAny>, what: &str, class: &str) -> PyResult<&'a T>
where
    T: pyo3::PyClass<Frozen = pyo3::pyclass::boolean_struct::True> + Sync,
{
    super::convert::typed_arg::<T>(obj, what, &format!("a kvpool.{class}")).map(|b| b.get())
}

/// The bytes `write` appends to an empty buffer (run with the GIL released), through
/// this thread's reused encoding buffer.
pub fn encode_with<'py>(
    py: Python<'py>,
    write: impl FnOnce(&mut Vec<u8>) + Send,
) -> Bound<'py, PyBytes> {
    let mut buf = WIRE_SCRATCH.take();
    buf.clear();
    let buf = py.detach(move || {
        write(&mut buf);
        buf
    });
    let bytes = PyBytes::new(py, &buf);
    if buf.capacity() <= 1 << 26 {
        WIRE_SCRATCH.set(buf);
    }
    bytes
}

thread_local! {
    /// The encoding buffer of `take_events_msgpack`, kept per thread between calls.
    static WIRE_SCRATCH: std::cell::Cell<Vec<u8>> = const { std::cell::Cell::new(Vec::new()) };
}
