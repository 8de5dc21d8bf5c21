"""``kvpool.ZmqSink`` and ``send_events``: a batch sent from Rust on pyzmq's PUB socket, the
payload lent to ZeroMQ. The frames must be exactly what the copying path sends, every
refusal must come before any event is taken, and a lent payload must stay intact until
ZeroMQ is done with it. Runs on loopback TCP."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

zmq = pytest.importorskip("zmq")

import kvpool  # noqa: E402
from kvpool import wire  # noqa: E402
from kvpool.publisher import ZmqPublisher  # noqa: E402

SPECS = {0: ("full_attention", None)}


@pytest.fixture
def pub_sub() -> Iterator[tuple[Any, Any]]:
    ctx = zmq.Context.instance()
    pub = ctx.socket(zmq.PUB)
    pub.set_hwm(100_000)
    pub.bind("tcp://127.0.0.1:*")
    sub = ctx.socket(zmq.SUB)
    sub.set_hwm(100_000)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(pub.getsockopt_string(zmq.LAST_ENDPOINT))
    time.sleep(0.2)  # the slow joiner
    yield pub, sub
    sub.close(linger=0)
    if not pub.closed:
        pub.close(linger=0)


def with_events(owner: str, tokens: int = 40, first: int = 1) -> Any:
    """A pool, manager or group manager with a batch of events queued."""
    if owner == "pool":
        pool = kvpool.BlockPool(20_000, block_size=4, enable_events=True)
        n = tokens // 4
        ids = pool.get_new_blocks(n)
        hashes = [(first * 1_000 + i).to_bytes(32, "big") for i in range(n)]
        pool.cache_full_blocks(ids, hashes, 0, n, token_ids=list(range(first, first + 4 * n)))
        pool.free_blocks(ids)
        return pool
    if owner == "manager":
        source: Any = kvpool.KVCacheManager(20_000, 4, enable_events=True)
    else:
        source = kvpool.GroupManager(40_000, 4, ["full", ("sliding_window", 8)], enable_events=True)
    source.add_request("r", np.arange(first, first + tokens, dtype=np.int64))
    source.allocate_slots("r", tokens)
    source.free("r")
    return source


OWNERS = ["pool", "manager", "group_manager"]


@pytest.mark.parametrize("owner", OWNERS)
@pytest.mark.parametrize("tokens", [40, 40_000])  # a payload of a few hundred bytes, one of hundreds of kB
def test_sent_frames_equal_the_copying_path(owner: str, tokens: int, pub_sub: tuple[Any, Any]) -> None:
    pub, sub = pub_sub
    sink = kvpool.ZmqSink(pub, b"kv")
    assert sink.topic == b"kv" and sink.libzmq_version == zmq.zmq_version_info()
    ring = kvpool.ReplayRing(8, 1 << 24)
    sent_source, copied_source = with_events(owner, tokens), with_events(owner, tokens)
    n = sent_source.send_events(sink, 3, 1.5, data_parallel_rank=2, group_specs=SPECS, replay=ring)
    expected = copied_source.take_events_msgpack(1.5, data_parallel_rank=2, group_specs=SPECS)
    assert n == len(expected) and sent_source.num_pending_events == 0
    assert sub.poll(5000)
    assert sub.recv_multipart() == [b"kv", (3).to_bytes(8, "big"), expected]
    assert ring.batches_from(0) == [(3, expected)] and ring.last_seq == 3
    # Nothing queued: nothing taken, held or sent.
    assert sent_source.send_events(sink, 4, replay=ring) == 0
    assert len(ring) == 1 and ring.last_seq == 3 and not sub.poll(200)
    # Without a ring: sent, not held.
    more = with_events(owner, tokens, first=10_000)
    assert more.send_events(sink, 4) > 0 and len(ring) == 1
    assert sub.poll(5000) and sub.recv_multipart()[1] == (4).to_bytes(8, "big")


@pytest.mark.parametrize("owner", OWNERS)
def test_refusals_come_before_any_event_is_taken(owner: str, pub_sub: tuple[Any, Any]) -> None:
    pub, sub = pub_sub
    source = with_events(owner)
    pending = source.num_pending_events
    sink = kvpool.ZmqSink(pub)
    ring = kvpool.ReplayRing(8, 1 << 20)
    ring.append(5, b"x")
    closed_ring = kvpool.ReplayRing(8, 1 << 20)
    closed_ring.close()
    refusals: list[tuple[Callable[[], object], type[BaseException]]] = [
        (lambda: source.send_events(object(), 6), kvpool.DtypeError),
        (lambda: source.send_events(sink, 5, replay=ring), kvpool.InvalidArgumentError),  # not above 5
        (lambda: source.send_events(sink, -1), kvpool.InvalidArgumentError),
        (lambda: source.send_events(sink, 6, replay=object()), kvpool.DtypeError),
        (lambda: source.send_events(sink, 6, replay=closed_ring), RuntimeError),
        (lambda: source.send_events(sink, 6, "now"), kvpool.DtypeError),
    ]
    for call, error in refusals:
        with pytest.raises(error):
            call()
        assert source.num_pending_events == pending
    pub.close(linger=0)
    with pytest.raises(kvpool.TransportError, match="closed"):
        source.send_events(sink, 6, replay=ring)
    assert source.num_pending_events == pending and ring.last_seq == 5 and not sub.poll(100)


def test_a_sink_takes_only_an_open_pub_socket(pub_sub: tuple[Any, Any]) -> None:
    pub, sub = pub_sub
    with pytest.raises(kvpool.DtypeError):
        kvpool.ZmqSink(object())
    with pytest.raises(kvpool.DtypeError):
        kvpool.ZmqSink(pub, "kv")  # the topic is bytes
    with pytest.raises(kvpool.InvalidArgumentError, match="PUB"):
        kvpool.ZmqSink(sub)
    xpub = zmq.Context.instance().socket(zmq.XPUB)
    kvpool.ZmqSink(xpub)
    xpub.close(linger=0)
    with pytest.raises(kvpool.InvalidArgumentError, match="closed"):
        kvpool.ZmqSink(xpub)


def test_lent_payloads_stay_intact_until_zeromq_is_done_with_them(pub_sub: tuple[Any, Any]) -> None:
    """Many large batches sent faster than the subscriber reads them: each payload is lent to
    ZeroMQ's I/O thread and its buffer reused once given back, so a buffer given back early
    (or reused while still queued) would show as a payload that differs from its replay copy."""
    pub, sub = pub_sub
    sink = kvpool.ZmqSink(pub)
    ring = kvpool.ReplayRing(1_000, 1 << 28)
    manager = kvpool.KVCacheManager(60_000, 4, enable_events=True)
    batches = 300
    for seq in range(batches):
        prompt = np.arange(seq * 5_000 + 1, seq * 5_000 + 4_001, dtype=np.int64)
        manager.add_request("r", prompt)
        manager.allocate_slots("r", 4_000)
        manager.free("r")
        assert manager.send_events(sink, seq, float(seq), replay=ring) > 0
    held = dict(ring.batches_from(0))
    got = 0
    while sub.poll(5000):
        _, seq_frame, payload = sub.recv_multipart()
        seq = int.from_bytes(seq_frame, "big")
        assert payload == held[seq]
        assert wire.decode_batch(payload).ts == float(seq)
        got += 1
        if got == batches:
            break
    assert got == batches


@pytest.mark.parametrize("lend", [True, False])
def test_the_publisher_lends_payloads_unless_told_not_to(lend: bool) -> None:
    # One of the two also writes its (small) replay buffer when it is built.
    with ZmqPublisher("tcp://127.0.0.1:*", topic="t", lend_payloads=lend, group_specs=SPECS,
                      buffer_bytes=1 << 20, prefault_buffer=lend) as pub:
        assert pub.lends_payloads is lend
        sub = zmq.Context.instance().socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.connect(pub.endpoint)
        time.sleep(0.2)
        for seq, switch in enumerate([lend, not lend]):
            pub.lends_payloads = switch
            assert pub.lends_payloads is switch
            source, copy = with_events("manager", first=seq * 100 + 1), with_events("manager", first=seq * 100 + 1)
            assert pub.publish_from(source, ts=2.0)
            expected = copy.take_events_msgpack(2.0, data_parallel_rank=0, group_specs=SPECS)
            assert sub.poll(5000)
            assert sub.recv_multipart() == [b"t", seq.to_bytes(8, "big"), expected]
        assert pub.stats().sent == 2 and pub.stats().buffered == 2
        sub.close(linger=0)
    with pytest.raises(kvpool.TransportError):  # a RuntimeError too, as before
        pub.lends_payloads = True
    with pytest.raises(kvpool.TransportError):
        pub.publish_from(with_events("manager"))


def test_threads_publishing_from_their_own_managers_share_one_publisher() -> None:
    """Two threads ``publish_from`` their own managers on one publisher (the GIL released
    while each encodes): every batch arrives once, numbered without a gap, byte-equal to
    what replay holds for it."""
    import threading

    batches_per_thread = 150
    with ZmqPublisher("tcp://127.0.0.1:*", "tcp://127.0.0.1:*", hwm=0, group_specs=SPECS) as pub:
        assert pub.lends_payloads
        sub = zmq.Context.instance().socket(zmq.SUB)
        sub.set_hwm(0)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.connect(pub.endpoint)
        time.sleep(0.2)

        def publish(first: int) -> None:
            manager = kvpool.KVCacheManager(20_000, 4, enable_events=True)
            for i in range(batches_per_thread):
                start = first + i * 2_000
                manager.add_request("r", np.arange(start, start + 1_600, dtype=np.int64))
                manager.allocate_slots("r", 1_600)
                manager.free("r")
                pub.publish_from(manager, ts=float(first + i))

        threads = [threading.Thread(target=publish, args=(k * 10_000_000,)) for k in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        total = 2 * batches_per_thread
        assert pub.stats().sent == total
        got = []
        while len(got) < total and sub.poll(5000):
            _, seq, payload = sub.recv_multipart()
            got.append((int.from_bytes(seq, "big"), payload))
        assert [seq for seq, _ in got] == list(range(total))
        held = dict(pub._buffer.batches_from(0))  # the replay buffer (all of it fits)
        assert held == dict(got)
        sub.close(linger=0)


def test_lent_bytes_outlive_the_callers_reference(pub_sub: tuple[Any, Any]) -> None:
    """``ZmqSink.send`` lends a ``bytes`` payload to ZeroMQ: the caller drops its reference at
    once, more payloads follow faster than the subscriber reads, and each must still arrive
    whole (the sink keeps it alive until ZeroMQ is done, then lets it go)."""
    pub, sub = pub_sub
    sink = kvpool.ZmqSink(pub, b"t")
    n = 400
    for seq in range(n):
        sink.send(seq, bytes([seq % 251]) * (50_000 + seq))  # the only reference is the sink's
    for seq in range(n):
        assert sub.poll(5000)
        topic, seq_frame, payload = sub.recv_multipart()
        assert (topic, int.from_bytes(seq_frame, "big")) == (b"t", seq)
        assert payload == bytes([seq % 251]) * (50_000 + seq)
    with pytest.raises(kvpool.DtypeError):
        sink.send(n, bytearray(b"x"))  # type: ignore[arg-type]
    with pytest.raises(kvpool.InvalidArgumentError):
        sink.send(-1, b"x")
    pub.close(linger=0)
    with pytest.raises(kvpool.TransportError):
        sink.send(n, b"x")
