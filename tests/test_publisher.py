"""``kvpool.publisher``: vLLM 0.33's ZeroMQ framing, replay for late joiners and gaps, and a
``publish`` that never blocks. Runs on loopback TCP."""

from __future__ import annotations

import time

import pytest

zmq = pytest.importorskip("zmq")

import kvpool  # noqa: E402
from kvpool import wire  # noqa: E402
from kvpool.publisher import END_SEQ, EventListener, ZmqPublisher  # noqa: E402


def pool_events(pool: kvpool.BlockPool, i: int) -> list[object]:
    ids = pool.get_new_blocks(1)
    pool.cache_full_blocks(ids, [i.to_bytes(32, "big")], 0, 1, token_ids=[i, i + 1])
    pool.free_blocks(ids)
    return pool.take_events()


def drain(listener: EventListener, n: int, publisher: ZmqPublisher | None = None,
          timeout: float = 20.0) -> list[tuple[int, wire.EventBatch]]:
    """The first ``n`` batches. A gap at the very end shows only when a later batch arrives
    (as in a live stream), so with ``publisher`` a batch follows each quiet 200 ms."""
    got: list[tuple[int, wire.EventBatch]] = []
    deadline = time.monotonic() + timeout
    while len(got) < n and time.monotonic() < deadline:
        item = listener.poll(200)
        if item is not None:
            got.append(item)
        elif publisher is not None:
            publisher.publish([wire.AllBlocksCleared()])
    return got[:n]


def test_frames_are_vllms() -> None:
    with ZmqPublisher("tcp://127.0.0.1:*", "tcp://127.0.0.1:*", topic="kv", data_parallel_rank=2) as pub:
        sub = zmq.Context.instance().socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.connect(pub.endpoint)
        time.sleep(0.2)  # the slow joiner
        pool = kvpool.BlockPool(8, block_size=2, enable_events=True)
        events = pool_events(pool, 5)
        assert pub.publish(events, ts=1.25)
        assert sub.poll(5000)
        topic, seq, payload = sub.recv_multipart()
        assert (topic, seq) == (b"kv", (0).to_bytes(8, "big"))
        assert payload == wire.encode_batch(wire.from_pool_events(events), 1.25, 2)
        req = zmq.Context.instance().socket(zmq.DEALER)
        req.connect(pub.replay_endpoint)
        req.send_multipart((b"", (0).to_bytes(8, "big")))
        assert req.poll(5000)
        assert req.recv_multipart() == [b"", b"kv", seq, payload]
        assert req.recv_multipart() == [b"", b"", END_SEQ, b""]
        for s in (sub, req):
            s.close(linger=0)
        assert pub.stats().replays == 1


def test_a_late_joiner_and_gaps_are_filled_by_replay() -> None:
    pool = kvpool.BlockPool(64, block_size=2, enable_events=True)
    with ZmqPublisher("tcp://127.0.0.1:*", "tcp://127.0.0.1:*", buffer_steps=20_000, hwm=16) as pub:
        sent = [pool_events(pool, i) for i in range(300)]
        for events in sent:
            pub.publish(events)
        assert pub.flush()
        # A small receive queue that overflows while nobody reads: gaps the listener must fill.
        listener = EventListener(pub.endpoint, pub.replay_endpoint, receive_hwm=16)
        time.sleep(0.2)
        more = [pool_events(pool, 300 + i) for i in range(5_000)]
        for events in more:
            assert pub.publish(events)
        assert pub.flush()
        got = drain(listener, len(sent) + len(more), pub)
        assert [seq for seq, _ in got] == list(range(len(sent) + len(more)))
        expected = [wire.from_pool_events(e) for e in sent + more]
        assert [b.events for _, b in got] == expected
        assert listener.gaps >= 2  # the late join, and the overflow
        stats = pub.stats()
        assert stats.sent == stats.buffered >= 5_300
        listener.close()


def replay(pub: ZmqPublisher, first: int) -> list[tuple[int, bytes]]:
    """What ``pub``'s replay socket answers a request from ``first``."""
    req = zmq.Context.instance().socket(zmq.DEALER)
    req.connect(pub.replay_endpoint)
    req.send_multipart((b"", first.to_bytes(8, "big")))
    got = []
    while True:
        assert req.poll(5000)
        _, _, seq, payload = req.recv_multipart()
        if seq == END_SEQ:
            break
        got.append((int.from_bytes(seq, "big"), payload))
    req.close(linger=0)
    return got


def test_the_replay_buffer_is_bounded_by_bytes_as_well_as_batches() -> None:
    pool = kvpool.BlockPool(64, block_size=2, enable_events=True)
    payloads = []
    for i in range(10):
        ids = pool.get_new_blocks(1)
        pool.cache_full_blocks(ids, [(1000 + i).to_bytes(32, "big")], 0, 1, token_ids=[i, i])
        payloads.append(pool.take_events_msgpack(float(i)))
        pool.free_blocks(ids)
    size = len(payloads[0])
    assert all(len(p) == size for p in payloads)
    with ZmqPublisher("tcp://127.0.0.1:*", "tcp://127.0.0.1:*", buffer_steps=8,
                      buffer_bytes=3 * size + 1) as pub:
        for p in payloads:
            pub.publish(p)
        stats = pub.stats()
        assert (stats.sent, stats.buffered, stats.buffered_bytes) == (10, 3, 3 * size)
        # A request from before the oldest batch held gets what is left, from the oldest.
        assert replay(pub, 2) == [(7, payloads[7]), (8, payloads[8]), (9, payloads[9])]
    # A batch larger than the whole bound is still kept: the newest batch always is.
    with ZmqPublisher("tcp://127.0.0.1:*", buffer_steps=8, buffer_bytes=0) as pub:
        pub.publish(payloads[0])
        pub.publish(payloads[1])
        assert (pub.stats().buffered, pub.stats().buffered_bytes) == (1, size)
    # The batch bound drops the oldest too, and the byte count follows.
    with ZmqPublisher("tcp://127.0.0.1:*", buffer_steps=2) as pub:
        for p in payloads:
            pub.publish(p)
        assert (pub.stats().buffered, pub.stats().buffered_bytes) == (2, 2 * size)
    with pytest.raises(kvpool.InvalidArgumentError):
        ZmqPublisher("tcp://127.0.0.1:*", buffer_bytes=-1)


def test_large_payloads_are_replayed_from_the_ring() -> None:
    import numpy as np

    # 70 kB payloads in the replay ring; replay serves them whole and in order (exactly
    # the last ten that fit).
    payloads = [np.random.default_rng(i).integers(0, 256, 70_000, dtype=np.uint8).tobytes()
                for i in range(30)]
    with ZmqPublisher("tcp://127.0.0.1:*", "tcp://127.0.0.1:*", buffer_bytes=10 * 70_000) as pub:
        for p in payloads:
            pub.publish(p)
        assert pub.flush()
        assert replay(pub, 0) == [(i, payloads[i]) for i in range(20, 30)]
        assert (pub.stats().buffered, pub.stats().buffered_bytes) == (10, 10 * 70_000)


def test_publish_takes_payloads_and_refuses_after_close() -> None:
    pool = kvpool.BlockPool(8, block_size=2, enable_events=True)
    pub = ZmqPublisher("tcp://127.0.0.1:*")
    pool_events(pool, 1)
    ids = pool.get_new_blocks(1)
    pool.cache_full_blocks(ids, [bytes(32)], 0, 1, token_ids=[1, 2])
    assert pub.publish(pool.take_events_msgpack(1.0))
    assert pub.publish(pool.take_events_msgpack(2.0))  # no events: not sent
    assert pub.publish([])
    assert pub.stats().sent == 1
    pub.close()
    with pytest.raises(RuntimeError):
        pub.publish([])
    assert pub.closed
    with pytest.raises(ValueError):
        ZmqPublisher("tcp://127.0.0.1:*", buffer_steps=-1)


def test_empty_batches_on_request_and_no_replay_buffer() -> None:
    """``send_empty=True`` sends an empty batch (vLLM's publisher sends every batch), and
    ``buffer_steps=0`` keeps nothing for replay (vLLM's deque of length 0)."""
    pool = kvpool.BlockPool(8, block_size=2, enable_events=True)
    with ZmqPublisher("tcp://127.0.0.1:*", "tcp://127.0.0.1:*", buffer_steps=0) as pub:
        assert pub.publish(pool.take_events_msgpack(1.0), send_empty=True)
        assert pub.publish([], send_empty=True)
        assert pub.publish(pool_events(pool, 3))
        assert pub.stats().sent == 3 and pub.stats().buffered == 0
        assert replay(pub, 0) == []


def test_a_listener_without_replay_starts_where_the_stream_is_and_counts_what_it_missed() -> None:
    """Without a replay endpoint the first batch received starts the stream (it raised that
    batches 0..n were missed); a later gap that replay cannot fill is counted in ``missed``
    (it was counted as filled). ``replay_from`` past the last batch still skips earlier ones."""
    pool = kvpool.BlockPool(64, block_size=2, enable_events=True)
    with ZmqPublisher("tcp://127.0.0.1:*", "tcp://127.0.0.1:*", buffer_steps=2) as pub:
        for i in range(3):
            pub.publish(pool_events(pool, i))
        plain = EventListener(pub.endpoint)
        late = EventListener(pub.endpoint, pub.replay_endpoint)
        ahead = EventListener(pub.endpoint, pub.replay_endpoint)
        assert ahead.replay_from(100) == 0
        time.sleep(0.3)
        pub.publish(pool_events(pool, 3))
        seq, _ = plain.poll(5000)
        assert seq == 3 and (plain.gaps, plain.missed) == (0, 0)
        # Batches 0-2 went before it joined; replay holds the last two, 2 and 3.
        assert [s for s, _ in drain(late, 2)] == [2, 3]
        assert (late.gaps, late.missed) == (1, 2)
        pub.lose_on_the_wire.add(5)
        for i in range(4, 8):
            pub.publish(pool_events(pool, i))
        assert [s for s, _ in drain(plain, 3)] == [4, 6, 7]
        assert (plain.gaps, plain.missed) == (1, 1)
        assert ahead.poll(300) is None
        for listener in (plain, late, ahead):
            listener.close()


def test_events_listen_records_and_stats_summarises(tmp_path: object) -> None:
    import json
    import subprocess
    import sys

    pool = kvpool.BlockPool(64, block_size=2, enable_events=True)
    with ZmqPublisher("tcp://127.0.0.1:*", "tcp://127.0.0.1:*") as pub:
        for i in range(30):
            pub.publish(pool_events(pool, i))
        assert pub.flush()
        run = subprocess.run([sys.executable, "-m", "kvpool", "events", "listen", pub.endpoint, "--replay",
                              pub.replay_endpoint, "--json", "--count", "30", "--seconds", "20", "--from", "0"],
                             capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert [json.loads(line)["seq"] for line in lines] == list(range(30))
    path = f"{tmp_path}/rec.jsonl"
    with open(path, "w") as f:
        f.write(run.stdout)
    stats = subprocess.run([sys.executable, "-m", "kvpool", "events", "stats", path],
                           capture_output=True, text=True, check=True).stdout
    assert "batches: 30" in stats and "blocks_stored: 30" in stats and "sequence_gaps: 0" in stats
    bad = subprocess.run([sys.executable, "-m", "kvpool", "events", "stats", f"{tmp_path}/none"],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "cannot read" in bad.stderr


def test_events_stats_reads_bytes_hashes_and_keeps_tiers_apart(tmp_path: object) -> None:
    """A stream of ``bytes`` hashes is recorded as base64 strings, which ``stats`` reads; a
    block stored on the GPU and on the CPU, then removed from the CPU, is still cached."""
    import json

    from kvpool.events_cli import record_problem, summarise

    records = [
        {"seq": 0, "events": [{"type": "BlockStored", "block_hashes": ["AAECAw=="], "medium": "GPU"},
                              {"type": "BlockStored", "block_hashes": ["AAECAw=="], "medium": "CPU"}]},
        {"seq": 1, "events": [{"type": "BlockRemoved", "block_hashes": ["AAECAw=="], "medium": "CPU"}]},
    ]
    assert all(record_problem(json.loads(json.dumps(r))) is None for r in records)
    assert summarise(records)["cached_at_end"] == 1
    assert summarise(records)["cached_at_end_by_medium"] == {"GPU": 1}
    both = records + [{"seq": 2, "events": [{"type": "BlockStored", "block_hashes": [5, 6], "medium": "CPU"}]}]
    assert summarise(both)["cached_at_end_by_medium"] == {"CPU": 2, "GPU": 1}
    cleared = records + [{"seq": 2, "events": [{"type": "AllBlocksCleared", "medium": "GPU"}]}]
    assert summarise(cleared)["cached_at_end"] == 0


def serve_request(manager: kvpool.KVCacheManager, rid: str, first_token: int, n: int) -> None:
    """A request of ``n`` fresh tokens through ``manager``: scheduled, computed, freed."""
    import numpy as np

    prompt = np.arange(first_token, first_token + n, dtype=np.int64)
    manager.add_request(rid, prompt)
    manager.schedule_step([rid], n)
    manager.free_many([rid])


@pytest.mark.parametrize("tokens", [48, 8_000])  # one payload of a few hundred bytes, one of several hundred kB
def test_publish_from_holds_what_it_sends_encoded_into_the_replay_buffer(tokens: int) -> None:
    manager = kvpool.KVCacheManager(4_096, 4, enable_events=True)
    with ZmqPublisher("tcp://127.0.0.1:*", "tcp://127.0.0.1:*", data_parallel_rank=3,
                      group_specs={0: ("full_attention", None)}) as pub:
        sub = zmq.Context.instance().socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.connect(pub.endpoint)
        time.sleep(0.2)
        sent = []
        for i in range(3):
            serve_request(manager, f"r{i}", 100_000 * i, tokens)
            assert pub.publish_from(manager, ts=float(i))
            assert sub.poll(5000)
            _, seq, payload = sub.recv_multipart()
            assert int.from_bytes(seq, "big") == i
            sent.append(payload)
        assert pub.publish_from(manager)  # nothing queued: nothing sent, no number used
        assert pub.flush()
        assert pub.stats().sent == 3
        assert replay(pub, 0) == list(enumerate(sent))
        # The same bytes as the copying path: vLLM's batch, this publisher's rank.
        again = kvpool.KVCacheManager(4_096, 4, enable_events=True)
        serve_request(again, "r0", 0, tokens)
        assert sent[0] == again.take_events_msgpack(0.0, data_parallel_rank=3,
                                                     group_specs={0: ("full_attention", None)})
        batch = wire.decode_batch(sent[0])
        assert batch.data_parallel_rank == 3 and len(batch.events) >= 1
        sub.close(linger=0)


@pytest.mark.parametrize("owner", ["pool", "manager"])
def test_take_events_msgpack_into_a_ring_checks_it_before_taking_anything(owner: str) -> None:
    if owner == "pool":
        source = kvpool.BlockPool(64, block_size=2, enable_events=True)
        pool_events(source, 7)  # taken as objects, then one more batch queued
        ids = source.get_new_blocks(1)
        source.cache_full_blocks(ids, [bytes(31) + b"\x09"], 0, 1, token_ids=[1, 2])
    else:
        source = kvpool.KVCacheManager(64, 2, enable_events=True)
        serve_request(source, "r", 1, 6)
    pending = source.num_pending_events
    ring = kvpool.ReplayRing(8, 1 << 20)
    ring.append(5, b"x")
    for bad, error in [
        (dict(replay=ring, seq=5), kvpool.InvalidArgumentError),  # not above the last batch
        (dict(replay=ring), kvpool.InvalidArgumentError),  # no batch number
        (dict(seq=6), kvpool.InvalidArgumentError),  # a number without a ring
        (dict(replay=object(), seq=6), kvpool.DtypeError),
        (dict(replay=ring, seq=-1), kvpool.InvalidArgumentError),
    ]:
        with pytest.raises(error):
            source.take_events_msgpack(1.0, **bad)
        assert source.num_pending_events == pending  # nothing taken
    payload = source.take_events_msgpack(1.0, replay=ring, seq=6)
    assert source.num_pending_events == 0
    assert ring.batches_from(6) == [(6, payload)]
    # No events: the empty batch is returned and nothing is held.
    empty = source.take_events_msgpack(2.0, replay=ring, seq=7)
    assert wire.decode_batch(empty).events == [] and len(ring) == 2
    ring.close()
    with pytest.raises(RuntimeError):
        source.take_events_msgpack(3.0, replay=ring, seq=8)


def test_a_bad_replay_request_does_not_stop_the_replay_service() -> None:
    with ZmqPublisher("tcp://127.0.0.1:*", replay_endpoint="tcp://127.0.0.1:*") as pub:
        pool = kvpool.BlockPool(8, block_size=4, enable_events=True)
        pool.reset_prefix_cache()
        pub.publish_from(pool)
        # A start past the buffer's signed 64-bit sequence numbers gets the end marker alone.
        assert replay(pub, 2**63) == []
        assert [seq for seq, _ in replay(pub, 0)] == [0]


def test_a_late_joiner_skips_many_batches_seen_through_replay() -> None:
    """``poll`` skips live batches that replay already gave in a loop, not a recursion (a
    late joiner after more batches than Python's recursion limit)."""
    with ZmqPublisher("tcp://127.0.0.1:*", replay_endpoint="tcp://127.0.0.1:*") as pub:
        listener = EventListener(pub.endpoint, pub.replay_endpoint, receive_hwm=100_000)
        time.sleep(0.3)  # the subscription reaches the publisher
        pool = kvpool.BlockPool(8, block_size=1, enable_events=True)
        n = 1_500
        for _ in range(n):
            pool.reset_prefix_cache()
            pub.publish_from(pool)
        time.sleep(0.3)
        assert listener.replay_from(0) == n
        seen = 0
        while listener.poll(500) is not None:
            seen += 1
        assert seen == n
        listener.close()
