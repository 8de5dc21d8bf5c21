"""``kvpool.vllm.events``: with kvpool.vllm installed, vLLM's ``zmq`` event publisher is kvpool's,
and its frames (live and replayed) are the bytes vLLM's own publisher sends."""

from __future__ import annotations

import dataclasses
import importlib.util
import socket
import time
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed")


def batches() -> list[Any]:
    from vllm.distributed.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch

    out = []
    for i in range(5):
        stored = BlockStored(block_hashes=[1000 + i, 2000 + i], parent_block_hash=None if i == 0 else 999,
                             token_ids=list(range(32)), block_size=16, lora_id=None, medium="GPU",
                             lora_name=None, extra_keys=None, group_idx=0)
        out.append(KVEventBatch(ts=1700000000.0 + i, events=[stored, BlockRemoved(block_hashes=[7], medium="GPU")]))
    out.append(KVEventBatch(ts=1700000010.0, events=[AllBlocksCleared()]))
    return out


def receive(endpoint: str, replay: str, publish: Any) -> tuple[list[list[bytes]], list[list[bytes]]]:
    """What a subscriber reads live while ``publish()`` runs, then a replay from sequence 0."""
    import zmq

    ctx = zmq.Context.instance()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(endpoint)
    time.sleep(0.3)  # the subscription reaches the publisher
    n = publish()
    live = [sub.recv_multipart() for _ in range(n)]
    req = ctx.socket(zmq.DEALER)
    req.connect(replay)
    req.send_multipart((b"", (0).to_bytes(8, "big")))
    replayed = []
    while req.poll(5000):
        frames = req.recv_multipart()
        replayed.append(frames)
        if frames[2] == (-1).to_bytes(8, "big", signed=True):
            break
    sub.close(linger=0)
    req.close(linger=0)
    return live, replayed


def free_port() -> int:
    """A TCP port free now, with the two above it (rank 2 offsets the port by 2)."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port < 65000:
            return port


def run(cls: Any, rank: int, sent: list[Any] | None = None, buffer_steps: int = 4
        ) -> tuple[Any, int, tuple[list[list[bytes]], list[list[bytes]]]]:
    """Publish ``sent`` (default :func:`batches`) through ``cls`` at data-parallel rank ``rank``
    (vLLM offsets the ports by the rank) and read them as a subscriber."""
    port, replay_port = free_port(), free_port()
    publisher = cls(data_parallel_rank=rank, endpoint=f"tcp://*:{port}", replay_endpoint=f"tcp://*:{replay_port}",
                    topic="kv", buffer_steps=buffer_steps)
    sent = batches() if sent is None else sent

    def publish() -> int:
        for batch in sent:
            publisher.publish(batch)
        return len(sent)

    try:
        return publisher, port, receive(f"tcp://127.0.0.1:{port + rank}", f"tcp://127.0.0.1:{replay_port + rank}",
                                        publish)
    finally:
        publisher.shutdown()


@pytest.mark.parametrize("rank", [0, 2])
def test_frames_equal_vllms_publisher(rank: int) -> None:
    from vllm.distributed.kv_events import ZmqEventPublisher

    from kvpool.vllm.events import KvpoolEventPublisher

    ours, port, (live, replayed) = run(KvpoolEventPublisher, rank)
    theirs, _, (vllm_live, vllm_replayed) = run(ZmqEventPublisher, rank)
    assert live == vllm_live and len(live) == 6
    assert [f[0] for f in live] == [b"kv"] * 6 and [int.from_bytes(f[1], "big") for f in live] == list(range(6))
    assert replayed == vllm_replayed and len(replayed) == 5  # the last 4 batches, then the end marker
    mine, vllms = ours.get_publisher_config(), theirs.get_publisher_config()
    assert mine.endpoint == f"tcp://*:{port + rank}"  # offset by the rank, as vLLM reports it
    assert dataclasses.replace(mine, endpoint="", replay_endpoint="") == dataclasses.replace(vllms, endpoint="", replay_endpoint="")


def test_install_makes_the_factory_build_kvpools_publisher(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import vllm.v1.core.kv_cache_manager as kv_cache_manager
    import vllm.v1.core.kv_cache_utils as kv_cache_utils
    import vllm.v1.core.sched.scheduler as scheduler
    import vllm.v1.engine.core as engine_core
    from vllm.config.kv_events import KVEventsConfig
    from vllm.distributed.kv_events import EventPublisherFactory

    from kvpool.vllm import install
    from kvpool.vllm.events import KvpoolEventPublisher

    # Everything install() points at kvpool goes back to vLLM's after the test, so that
    # later tests comparing with vLLM's own classes get vLLM's.
    for module, name in ((scheduler, "KVCacheManager"), (kv_cache_manager, "KVCacheManager"),
                         (kv_cache_utils, "get_request_block_hasher"), (engine_core, "get_request_block_hasher")):
        monkeypatch.setattr(module, name, getattr(module, name))
    monkeypatch.setitem(EventPublisherFactory._registry, "zmq", EventPublisherFactory._registry["zmq"])
    install()
    for kind in ("zmq",):
        config = KVEventsConfig(enable_kv_cache_events=True, publisher=kind, endpoint=f"ipc://{tmp_path}/{kind}",
                                replay_endpoint=f"ipc://{tmp_path}/{kind}-replay")
        publisher = EventPublisherFactory.create(config, data_parallel_rank=0)
        assert isinstance(publisher, KvpoolEventPublisher)
        publisher.shutdown()


@pytest.mark.parametrize("buffer_steps", [0, 3])
def test_empty_batches_and_no_replay_buffer_as_vllms(buffer_steps: int) -> None:
    """vLLM's publisher sends an empty batch like any other (it takes a sequence number), and
    with ``buffer_steps=0`` keeps nothing for replay; kvpool's skipped empty batches and refused
    ``buffer_steps=0`` at the engine's start."""
    from vllm.distributed.kv_events import KVEventBatch, ZmqEventPublisher

    from kvpool.vllm.events import KvpoolEventPublisher

    sent = batches()[:2] + [KVEventBatch(ts=1700000020.0, events=[])] + batches()[2:4]
    _, _, ours = run(KvpoolEventPublisher, 0, sent, buffer_steps)
    _, _, theirs = run(ZmqEventPublisher, 0, sent, buffer_steps)
    assert ours == theirs and len(ours[0]) == 5 and len(ours[1]) == buffer_steps + 1


def test_a_batch_that_fails_to_encode_is_logged_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    """As vLLM's publisher thread, a batch that cannot be encoded is logged and dropped: the
    engine's step goes on (kvpool's used to raise into it). Unlike vLLM's, it takes no sequence
    number, so subscribers see no gap. After shutdown, publishing raises a RuntimeError, as
    vLLM's does."""
    import numpy as np
    from vllm.distributed.kv_events import BlockStored, KVEventBatch

    import kvpool
    from kvpool.vllm.events import KvpoolEventPublisher

    bad = BlockStored(block_hashes=[1], parent_block_hash=None, token_ids=[np.int64(3)], block_size=16,
                      lora_id=None, medium="GPU", lora_name=None, extra_keys=None, group_idx=0)
    port, replay_port = free_port(), free_port()
    publisher = KvpoolEventPublisher(data_parallel_rank=0, endpoint=f"tcp://*:{port}",
                                     replay_endpoint=f"tcp://*:{replay_port}", topic="kv", buffer_steps=4)
    try:
        with caplog.at_level("ERROR", logger="kvpool.vllm.events"):
            for batch in batches()[:1] + [KVEventBatch(ts=1.0, events=[bad])] + batches()[1:2]:
                publisher.publish(batch)
        assert "publishing a KV-event batch failed" in caplog.text
        assert publisher.stats().sent == 2  # sequence numbers 0 and 1: no gap
    finally:
        publisher.shutdown()
    with pytest.raises(RuntimeError):
        publisher.publish(batches()[0])
    assert isinstance(kvpool.TransportError("x"), RuntimeError)
