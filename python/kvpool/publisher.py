"""Publishing KV-cache events over ZeroMQ exactly as vLLM 0.33's ``ZmqEventPublisher`` does,
for engines that run kvpool directly, so that KV-aware routers (Dynamo's indexer, llm-d's)
see them as they see vLLM's.

The wire: a PUB socket sends three frames per batch, the topic (may be empty), the batch's
sequence number as 8 bytes big-endian (from 0) and the msgpack payload (:mod:`kvpool.wire`).
A ROUTER socket serves replay: a request ``(identity, b"", start_seq)`` is answered with every
buffered batch from ``start_seq`` on, ``(identity, b"", topic, seq, payload)`` each, then the
end marker ``(identity, b"", b"", (-1).to_bytes(8, "big", signed=True), b"")``. The last
``buffer_steps`` batches are kept for replay, as in vLLM, and, unlike vLLM, at most
``buffer_bytes`` of payload (the newest batch always): vLLM's 10,000 batches of a step that
stores 4,000 blocks would hold 2.7 GB.

Unlike vLLM's publisher, there is no Python thread between the caller and the PUB socket:
``take_events_msgpack()`` encodes in Rust and ``publish`` hands the frames to ZeroMQ, whose
own I/O thread sends them (``publish_from`` sends them from Rust, the payload lent to ZeroMQ
rather than copied: :class:`kvpool.ZmqSink`); a Python thread would share the GIL with the scheduler and cost it
more (measured in ``benches/events_publish.py``). Needs ``pip install 'kvpool[wire]'``
(msgspec, pyzmq).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import zmq

import kvpool
from kvpool import wire

#: The replay end marker's sequence frame.
END_SEQ = (-1).to_bytes(8, "big", signed=True)
#: The largest sequence number (the replay buffer's are signed 64-bit).
_MAX_SEQ = (1 << 63) - 1
_LOG = logging.getLogger(__name__)

def _no_events(payload: bytes) -> bool:
    """Whether an encoded batch (``[ts: float64, events, rank?]``) holds no event."""
    return len(payload) > 10 and payload[0] == 0x93 and payload[1] == 0xCB and payload[10] == 0x90


def _allow_ipv6(socket: zmq.Socket[Any], endpoint: str) -> None:
    """Lets ``socket`` use IPv6 when ``endpoint`` names an IPv6 address (``tcp://[::1]:5557``),
    as vLLM's publisher does for a node IP that is one."""
    if endpoint.startswith("tcp://["):
        socket.setsockopt(zmq.IPV6, 1)


def _sink_for(socket: zmq.Socket[Any], topic: bytes) -> kvpool.ZmqSink | None:
    """A ``ZmqSink`` on ``socket``, or ``None`` where kvpool cannot reach pyzmq's libzmq
    (then ``publish_from`` sends through pyzmq)."""
    try:
        return kvpool.ZmqSink(socket, topic)
    except kvpool.TransportError:
        return None


#: The replay buffer's default bound on payload bytes.
DEFAULT_BUFFER_BYTES = 256 << 20


@dataclass(frozen=True)
class PublisherStats:
    """Counters since the publisher started, and what the replay buffer holds."""

    sent: int
    buffered: int
    replays: int
    buffered_bytes: int = 0


class ZmqPublisher:
    """PUB (and replay ROUTER) sockets with vLLM 0.33's framing.

    ``ZmqPublisher("tcp://*:5557", replay_endpoint="tcp://*:5558", topic="", data_parallel_rank=0)``;
    ``publish_from(manager)`` takes a kvpool manager's or pool's queued events and sends them
    (the fastest path: encoded in Rust into a buffer that is copied into the replay buffer
    while still in cache and then lent to ZeroMQ, with no Python object and no copy for the
    send; ``lend_payloads=False``, or a process where kvpool cannot reach the libzmq pyzmq
    loaded, sends through pyzmq instead, which copies). ``publish(events)`` takes the payload of ``take_events_msgpack()``, kvpool's
    events (``take_events()``) or :mod:`kvpool.wire` events (both encoded here first).
    ``group_specs`` maps a group index to its ``(kv_cache_spec_kind,
    kv_cache_spec_sliding_window)`` for event objects and for ``publish_from``.

    ``publish`` never waits on the network (its payload is lent to ZeroMQ as well, kept
    alive until ZeroMQ is done with it): a PUB socket hands the frames to ZeroMQ's own I/O
    thread and drops them for a subscriber ``hwm`` messages behind, which then asks the replay
    socket for them. A background thread serves replay requests; the replay buffer
    (:class:`kvpool.ReplayRing`) keeps each payload in one preallocated ring, written with
    stores that bypass the cache, so that keeping it costs a serving step that stores 4,000
    blocks about 1% (publishing as a whole with ``publish_from`` 1-3%, ``docs/events.md``).

    Replay serves the last ``buffer_steps`` batches that fit in ``buffer_bytes`` of payload
    (default 256 MiB; the newest batch is always kept); a request from an older sequence
    number gets what is left, from the oldest batch held. The buffer's memory is taken as
    batches fill it, which costs the steps of its first lap page faults (about +20% on a
    serving step while it lasts); ``prefault_buffer=True`` writes it all here instead.

    The PUB socket binds ``endpoint``, or connects to it with ``bind=False`` (vLLM connects
    to an endpoint without a wildcard); the replay socket always binds.
    """

    def __init__(
        self,
        endpoint: str = "tcp://*:5557",
        replay_endpoint: str | None = None,
        *,
        topic: str = "",
        data_parallel_rank: int = 0,
        buffer_steps: int = 10_000,
        buffer_bytes: int = DEFAULT_BUFFER_BYTES,
        hwm: int = 100_000,
        group_specs: Mapping[int, tuple[str | None, int | None]] | None = None,
        context: zmq.Context[Any] | None = None,
        bind: bool = True,
        lend_payloads: bool = True,
        prefault_buffer: bool = False,
    ) -> None:
        if buffer_steps < 0 or buffer_bytes < 0 or hwm < 0:
            raise kvpool.InvalidArgumentError("buffer_steps, buffer_bytes and hwm must be >= 0")
        self._topic = topic.encode("utf-8")
        self._rank = data_parallel_rank
        self._group_specs = dict(group_specs or {})
        # ``buffer_steps=0`` keeps nothing for replay (as vLLM's deque of length 0): a ring of
        # no bytes holds only the newest batch, which replay then leaves out.
        self._keep = buffer_steps > 0
        self._buffer = kvpool.ReplayRing(max(buffer_steps, 1), buffer_bytes if self._keep else 0,
                                         prefault=prefault_buffer)
        self._ctx = context or zmq.Context.instance()
        self._pub = self._ctx.socket(zmq.PUB)
        _allow_ipv6(self._pub, endpoint)
        self._pub.set_hwm(hwm)
        if bind:
            self._pub.bind(endpoint)
            self.endpoint = self._pub.getsockopt_string(zmq.LAST_ENDPOINT)
        else:
            self._pub.connect(endpoint)
            self.endpoint = endpoint
        #: ``publish_from``'s way to the PUB socket: from Rust, the payload lent to ZeroMQ
        #: (``kvpool.ZmqSink``), or ``None`` for pyzmq's copying send.
        self._sink = _sink_for(self._pub, self._topic) if lend_payloads else None
        self._replay: zmq.Socket[Any] | None = None
        self.replay_endpoint: str | None = None
        if replay_endpoint is not None:
            self._replay = self._ctx.socket(zmq.ROUTER)
            _allow_ipv6(self._replay, replay_endpoint)
            # A full replay plus its end marker must fit in the send queue.
            self._replay.setsockopt(zmq.SNDHWM, 2 * (buffer_steps + 1))
            self._replay.bind(replay_endpoint)
            self.replay_endpoint = self._replay.getsockopt_string(zmq.LAST_ENDPOINT)
        self._seq = 0
        #: Sequence numbers held back from the PUB socket (kept for replay), as a lossy
        #: network would lose them: for tests of a consumer's gap handling.
        self.lose_on_the_wire: set[int] = set()
        self._sent = self._replays = 0
        self._lock = threading.Lock()
        self._running = True
        self._thread: threading.Thread | None = None
        if self._replay is not None:
            self._thread = threading.Thread(target=self._serve, name="kvpool-zmq-replay", daemon=True)
            self._thread.start()

    def publish(self, events: Iterable[Any] | bytes, ts: float | None = None, *,
                send_empty: bool = False) -> bool:
        """Send one batch (never waits on the network); an empty batch is not sent unless
        ``send_empty`` (vLLM's publisher sends every batch it is given). Returns True. ``ts``
        (default now) labels event objects; a payload carries its own timestamp and rank
        (``take_events_msgpack(data_parallel_rank=...)``), which this publisher's
        ``data_parallel_rank`` does not change."""
        if not self._running:
            raise kvpool.TransportError("the publisher is closed")
        if isinstance(events, bytes):
            if not send_empty and _no_events(events):
                return True
            payload = events
        else:
            batch = list(events)
            if not batch and not send_empty:
                return True
            if not all(isinstance(e, wire.KVCacheEvent) for e in batch):
                batch = wire.from_pool_events(batch, group_specs=self._group_specs)
            payload = wire.encode_batch(batch, time.time() if ts is None else ts, self._rank)
        with self._lock:
            seq = self._seq
            self._buffer.append(seq, payload)
            self._send(seq, payload)
        return True

    def publish_from(self, source: Any, ts: float | None = None) -> bool:
        """Take the queued events of ``source`` (a ``KVCacheManager``, ``BlockPool`` or
        ``GroupManager``) as one batch and send it (never waits on the network); an empty
        batch is not sent. The batch is encoded in Rust and held for replay in the same
        call. ``ts`` defaults to now. Returns True."""
        if not self._running:
            raise kvpool.TransportError("the publisher is closed")
        with self._lock:
            seq = self._seq
            if self._sink is not None and seq not in self.lose_on_the_wire:
                try:
                    source.send_events(self._sink, seq, ts, data_parallel_rank=self._rank,
                                       group_specs=self._group_specs, replay=self._buffer)
                finally:
                    # Held for replay (sent, or the send failed after): the number is used.
                    if self._buffer.last_seq == seq:
                        self._seq = seq + 1
                        self._sent += 1
                return True
            payload = source.take_events_msgpack(ts, data_parallel_rank=self._rank,
                                                 group_specs=self._group_specs, replay=self._buffer, seq=seq)
            if not _no_events(payload):
                self._send(seq, payload)
        return True

    def _send(self, seq: int, payload: bytes) -> None:
        """Sends batch ``seq`` (already held for replay) on the PUB socket; under the lock."""
        self._seq = seq + 1
        if seq not in self.lose_on_the_wire:
            if self._sink is not None:
                self._sink.send(seq, payload)  # lent to ZeroMQ, not copied
            else:
                self._pub.send_multipart((self._topic, seq.to_bytes(8, "big"), payload))
        self._sent += 1

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called (publishing then raises ``TransportError``)."""
        return not self._running

    @property
    def lends_payloads(self) -> bool:
        """Whether ``publish_from`` sends from Rust with the payload lent to ZeroMQ (see
        ``lend_payloads``). Settable: False sends through pyzmq from the next batch on;
        True goes back to lending where kvpool can reach pyzmq's libzmq (the value read
        back says whether it could)."""
        return self._sink is not None

    @lends_payloads.setter
    def lends_payloads(self, lend: bool) -> None:
        with self._lock:
            if not self._running:
                raise kvpool.TransportError("the publisher is closed")
            self._sink = _sink_for(self._pub, self._topic) if lend else None

    def stats(self) -> PublisherStats:
        """Batches sent, batches and payload bytes held for replay, replays served."""
        with self._lock:
            if not self._keep:
                return PublisherStats(self._sent, 0, self._replays, 0)
            return PublisherStats(self._sent, len(self._buffer), self._replays, self._buffer.num_bytes)

    def flush(self, timeout: float = 5.0) -> bool:
        """True: every batch is held for replay and handed to ZeroMQ when ``publish``
        returns (kept for callers of the first design, whose replay buffer copied on a
        thread of its own)."""
        return self._buffer.drain(timeout)

    def close(self, timeout: float = 5.0) -> None:
        """Stop serving replays and close the sockets."""
        if not self._running:
            return
        self._running = False
        if self._thread is not None:
            self._thread.join(timeout)
        with self._lock:
            self._pub.close(linger=0)
        if self._replay is not None:
            self._replay.close(linger=0)
        self._buffer.close()

    def __enter__(self) -> ZmqPublisher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _serve(self) -> None:
        """The replay thread: answers each request with the buffered batches from its
        sequence number on, then the end marker."""
        assert self._replay is not None
        while self._running:
            if not self._replay.poll(50):
                continue
            frames = self._replay.recv_multipart()
            if len(frames) != 3:
                continue
            client, _, start = frames
            try:
                self._answer(client, start)
            except Exception:  # one bad request must not stop the replay service
                _LOG.exception("kvpool: a replay request from %r failed", client)

    def _answer(self, client: bytes, start: bytes) -> None:
        """Sends ``client`` the buffered batches from sequence number ``start`` (8 bytes,
        big-endian; any longer or larger start gets none) on, then the end marker."""
        assert self._replay is not None
        first = min(int.from_bytes(start, "big"), _MAX_SEQ)
        held = self._buffer.batches_from(first) if self._keep else []
        with self._lock:
            # Counted before the answer leaves: a client that has read the end marker
            # sees its replay in stats().
            self._replays += 1
        for seq, payload in held:
            self._replay.send_multipart((client, b"", self._topic, seq.to_bytes(8, "big"), payload))
        self._replay.send_multipart((client, b"", b"", END_SEQ, b""))


class EventListener:
    """A subscriber that sees every batch once, in order: it asks the replay socket for what it
    missed when it joins late or finds a gap in the sequence numbers.

    ``EventListener("tcp://host:5557", replay_endpoint="tcp://host:5558")``; ``poll(timeout)``
    returns the next ``(seq, EventBatch)`` or ``None``. ``gaps`` counts the gaps found in the
    sequence numbers after the first batch, ``missed`` the batches of those gaps that replay
    could not give (older than its buffer, or no replay endpoint). Without a replay endpoint
    the first batch received starts the stream, whatever its number.
    """

    def __init__(self, endpoint: str, replay_endpoint: str | None = None, *, topic: str = "",
                 receive_hwm: int | None = None, context: zmq.Context[Any] | None = None) -> None:
        self._ctx = context or zmq.Context.instance()
        self._sub = self._ctx.socket(zmq.SUB)
        if receive_hwm is not None:
            # Batches beyond this many unread are dropped by ZeroMQ; replay fills the gaps.
            self._sub.setsockopt(zmq.RCVHWM, receive_hwm)
        self._sub.setsockopt(zmq.SUBSCRIBE, topic.encode("utf-8"))
        self._sub.connect(endpoint)
        self._replay_endpoint = replay_endpoint
        self._next: int | None = None
        self._pending: deque[tuple[int, wire.EventBatch]] = deque()
        self.gaps = 0
        self.missed = 0

    def _fetch(self, start: int, until: int) -> int:
        """Replayed batches ``start <= seq < until`` into the pending queue; how many came
        (none without a replay endpoint)."""
        if self._replay_endpoint is None:
            return 0
        before = len(self._pending)
        req = self._ctx.socket(zmq.DEALER)
        try:
            req.connect(self._replay_endpoint)
            req.send_multipart((b"", start.to_bytes(8, "big")))
            while True:
                if not req.poll(5000):
                    raise TimeoutError("the replay socket did not answer")
                _, _, seq_bytes, payload = req.recv_multipart()
                if seq_bytes == END_SEQ:
                    return len(self._pending) - before
                seq = int.from_bytes(seq_bytes, "big")
                if start <= seq < until:
                    self._pending.append((seq, wire.decode_batch(payload)))
        finally:
            req.close(linger=0)

    def replay_from(self, start: int = 0) -> int:
        """Fetch every buffered batch from ``start`` on now (a late joiner's catch-up, before
        any new batch arrives); they come first from :meth:`poll`. Returns how many."""
        got = self._fetch(start, 2**63)
        # Later batches numbered below ``start`` are skipped, even if none was held.
        self._next = start
        return got

    def poll(self, timeout_ms: int = 1000) -> tuple[int, wire.EventBatch] | None:
        """The next batch in sequence, or ``None`` if none came within ``timeout_ms`` (of
        each wait: batches already seen through replay are skipped and the wait starts again)."""
        while True:
            while self._pending:
                item = self._pending.popleft()
                if self._next is None or item[0] >= self._next:
                    return self._take(item)
            if not self._sub.poll(timeout_ms):
                return None
            _, seq_bytes, payload = self._sub.recv_multipart()
            seq = int.from_bytes(seq_bytes, "big")
            if self._next is None and self._replay_endpoint is None:
                self._next = seq  # nothing to catch up with: the stream starts here
            expected = 0 if self._next is None else self._next
            if seq > expected:
                self.gaps += 1
                self.missed += seq - expected - self._fetch(expected, seq)
                self._pending.append((seq, wire.decode_batch(payload)))
                return self._take(self._pending.popleft())
            if seq == expected:
                return self._take((seq, wire.decode_batch(payload)))
            # seq < expected: already seen through replay.

    def _take(self, item: tuple[int, wire.EventBatch]) -> tuple[int, wire.EventBatch]:
        self._next = item[0] + 1
        return item

    def close(self) -> None:
        self._sub.close(linger=0)
