"""``kvpool.ReplayRing``, the publisher's replay buffer: bounds, order, payloads copied into
the ring (of every size, unaligned) and held whole (larger than the ring), and bad input."""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest

import kvpool

BIG = 70_001  # odd, so that payloads start at every alignment in the ring


def payload(seq: int, size: int) -> bytes:
    return np.random.default_rng(seq).integers(0, 256, size, dtype=np.uint8).tobytes()


def test_holds_the_newest_batches_within_both_bounds_oldest_first() -> None:
    ring = kvpool.ReplayRing(4, 3 * BIG + 10)
    sizes = [BIG, 100, BIG, BIG, 5, BIG, BIG, 200, BIG]
    for seq, size in enumerate(sizes):
        ring.append(seq, payload(seq, size))
        assert ring.drain(5.0)
        held = ring.batches_from(0)
        assert held[-1][0] == seq
        assert len(held) <= 4 and sum(len(b) for _, b in held) <= 3 * BIG + 10
        assert [s for s, _ in held] == list(range(held[0][0], seq + 1))
        assert all(b == payload(s, sizes[s]) for s, b in held)
        assert (len(ring), ring.num_bytes) == (len(held), sum(len(b) for _, b in held))
    assert [s for s, _ in ring.batches_from(7)] == [7, 8]
    assert ring.batches_from(100) == []
    ring.close()


def test_a_reader_sees_every_batch_whole_while_batches_are_appended() -> None:
    ring = kvpool.ReplayRing(1_000, 40 * BIG)
    errors: list[str] = []

    def read() -> None:
        for _ in range(200):
            held = ring.batches_from(0)
            for seq, data in held:
                if data != payload(seq, BIG + seq % 7):
                    errors.append(f"batch {seq} torn")
            if [s for s, _ in held] != sorted(s for s, _ in held):
                errors.append("out of order")

    reader = threading.Thread(target=read)
    reader.start()
    for seq in range(300):
        ring.append(seq, payload(seq, BIG + seq % 7))
    reader.join()
    assert errors == []
    assert ring.drain(5.0)
    assert ring.batches_from(299)[0][1] == payload(299, BIG + 299 % 7)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
# Python 3.12+ warns when a process with threads forks (earlier tests' threads, or a
# library's); this child only touches its copy of the ring and exits.
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_a_forked_child_keeps_using_its_copy_of_the_ring() -> None:
    # The ring has no thread of its own (its first design had a copier thread, which a
    # forked child would lack): a child appends and reads its copy, the parent's is as it was.
    ring = kvpool.ReplayRing(10, 10 * BIG)
    ring.append(0, payload(0, BIG))
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            ring.append(1, payload(1, BIG))
            held = ring.batches_from(0)
            # Held once append returns: nothing waits for a thread the child lacks.
            drained = ring.drain(0.5)
            code = 0 if drained and held == [(0, payload(0, BIG)), (1, payload(1, BIG))] else 1
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert ring.batches_from(0) == [(0, payload(0, BIG))]
    ring.append(1, payload(2, 10))
    assert [s for s, _ in ring.batches_from(0)] == [0, 1]


def test_bad_input_and_closing() -> None:
    with pytest.raises(kvpool.InvalidArgumentError):
        kvpool.ReplayRing(0, 100)
    with pytest.raises(kvpool.InvalidArgumentError):
        kvpool.ReplayRing(10, -1)
    with pytest.raises(kvpool.OutOfMemoryError):
        kvpool.ReplayRing(10, 2**62)  # reserved up front: refused, not an abort later
    ring = kvpool.ReplayRing(10, 1_000)
    with pytest.raises(kvpool.DtypeError):
        ring.append(0, bytearray(b"abc"))
    with pytest.raises(kvpool.InvalidArgumentError):
        ring.append(-1, b"abc")
    with pytest.raises(kvpool.InvalidArgumentError):
        ring.drain(-1.0)
    assert len(ring) == 0
    ring.append(0, b"abc")
    with pytest.raises(kvpool.InvalidArgumentError):  # numbers must increase
        ring.append(0, b"again")
    assert ring.batches_from(0) == [(0, b"abc")]
    ring.close()
    ring.close()  # idempotent
    with pytest.raises(RuntimeError):
        ring.append(1, b"def")
    assert ring.batches_from(0) == [(0, b"abc")]
    assert "1 batches" in repr(ring)


def test_threads_share_a_ring_without_deadlock() -> None:
    # Two appenders (their numbers drawn under one Python lock, as the publisher does),
    # readers, counters and drains, all at once: every call finishes, and every batch read
    # is whole.
    ring = kvpool.ReplayRing(200, 30 * BIG)
    order = threading.Lock()
    counter = iter(range(10**9))
    sizes: dict[int, int] = {}
    errors: list[str] = []
    stop = threading.Event()

    def append(k: int) -> None:
        for i in range(150):
            size = BIG if (i + k) % 3 else 1_000
            with order:
                seq = next(counter)
                sizes[seq] = size
                ring.append(seq, payload(seq, size))

    def read() -> None:
        while not stop.is_set():
            for seq, data in ring.batches_from(0):
                if data != payload(seq, sizes[seq]):
                    errors.append(f"batch {seq} torn")
            len(ring), ring.num_bytes, repr(ring)
            ring.drain(0.01)

    threads = [threading.Thread(target=append, args=(k,)) for k in range(2)]
    readers = [threading.Thread(target=read) for _ in range(2)]
    for t in threads + readers:
        t.start()
    for t in threads:
        t.join(60)
    stop.set()
    for t in readers:
        t.join(60)
    assert not any(t.is_alive() for t in threads + readers), "a thread is stuck"
    assert errors == []
    assert ring.drain(5.0)
    held = ring.batches_from(0)
    assert held[-1][0] == 299 and len(held) <= 200
    ring.close()


def test_threads_encode_a_shared_managers_events_into_one_ring() -> None:
    # Two threads serve requests on one manager and take its events straight into one ring
    # (numbers drawn under one Python lock, as the publisher does) while two readers copy
    # batches out: the manager's lock, the ring's locks and the GIL are taken in every
    # order, every call finishes, and every block stored is in exactly one held batch.
    pytest.importorskip("msgspec")
    from kvpool import wire

    manager = kvpool.KVCacheManager(20_000, 4, enable_events=True)
    ring = kvpool.ReplayRing(10_000, 64 << 20)
    order = threading.Lock()
    next_seq = [0]
    errors: list[str] = []
    stop = threading.Event()

    def serve(k: int) -> None:
        try:
            for i in range(200):
                rid = f"t{k}-{i}"
                prompt = np.arange(10**6 * (2 * i + k), 10**6 * (2 * i + k) + 32, dtype=np.int64)
                manager.add_request(rid, prompt)
                manager.schedule_step([rid], 32)
                manager.free_many([rid])
                with order:
                    # The other thread may have taken this request's events already: an
                    # empty batch is held nowhere and uses no number, as in the publisher.
                    seq = next_seq[0]
                    payload = manager.take_events_msgpack(float(seq), replay=ring, seq=seq)
                    if wire.decode_batch(payload).events:
                        next_seq[0] += 1
        except Exception as e:  # noqa: BLE001
            errors.append(f"{type(e).__name__}: {e}")

    def read() -> None:
        while not stop.is_set():
            for _, data in ring.batches_from(0):
                wire.decode_batch(data)
            ring.drain(0.01)

    threads = [threading.Thread(target=serve, args=(k,)) for k in range(2)]
    readers = [threading.Thread(target=read) for _ in range(2)]
    for t in threads + readers:
        t.start()
    for t in threads:
        t.join(120)
    stop.set()
    for t in readers:
        t.join(60)
    assert not any(t.is_alive() for t in threads + readers), "a thread is stuck"
    assert errors == []
    assert ring.drain(5.0)
    held = ring.batches_from(0)
    assert [seq for seq, _ in held] == list(range(next_seq[0])) and next_seq[0] > 0
    blocks = sum(len(e.block_hashes) for _, data in held for e in wire.decode_batch(data).events
                 if isinstance(e, wire.BlockStored))
    assert blocks == 400 * 8  # 400 requests of 32 fresh tokens in 4-token blocks
    ring.close()


def test_a_prefaulted_ring_keeps_and_replays_the_same() -> None:
    """``prefault=True`` writes the ring's room when it is built; what it holds and
    replays is the same as without."""
    rings = [kvpool.ReplayRing(4, 1 << 16, prefault=p) for p in (False, True)]
    for seq in range(10):
        payload = bytes([seq]) * (5_000 + 700 * seq)
        for ring in rings:
            ring.append(seq, payload)
    plain, prefaulted = rings
    assert prefaulted.batches_from(0) == plain.batches_from(0) and len(prefaulted) == 4
    assert prefaulted.num_bytes == plain.num_bytes and prefaulted.last_seq == 9
    with pytest.raises(kvpool.DtypeError):
        kvpool.ReplayRing(4, 1 << 16, prefault="yes")  # type: ignore[arg-type]
