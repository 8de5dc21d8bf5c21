"""vLLM's ``zmq`` KV-event publisher on kvpool's :class:`kvpool.publisher.ZmqPublisher`.

vLLM's scheduler builds its publisher through ``EventPublisherFactory`` from
``--kv-events-config``; :func:`kvpool.vllm.install` maps the factory's ``"zmq"`` to
:class:`KvpoolEventPublisher`, so an engine on ``kvpool.vllm`` publishes
through kvpool with no change to its configuration. The wire is vLLM's, frame for frame: the
same endpoints (offset by the data-parallel rank, wildcards bound and other endpoints connected,
as vLLM does), topic, sequence numbers from 0, ``EventBatch`` payloads encoded by msgspec as
vLLM encodes them, the replay ROUTER and its end marker, ``buffer_steps`` batches kept for
replay (0: none), every batch sent, empty ones too. The differences:

- the batch is encoded and handed to ZeroMQ in ``publish``, on the scheduler's thread, not
  queued for a second Python thread that would take the GIL from the scheduler at random
  points; ZeroMQ's own I/O thread does the sending. ``max_queue_size`` is accepted and unused
  (nothing is queued). A batch that fails to encode or send is logged and dropped, as vLLM's
  thread does, without using up a sequence number (vLLM's leaves a gap);
- replay keeps the last ``buffer_steps`` batches within a bound on their bytes,
  ``$KVPOOL_EVENTS_BUFFER_BYTES`` (default 256 MiB: about 500-1,000 serving steps of 4,000
  stored blocks; vLLM's deque has no byte bound), since kvpool's replay ring reserves its
  room up front. Raise it for a subscriber that may lag further.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import msgspec
from vllm.config.kv_events import KVEventsConfig
from vllm.distributed.kv_events import EventBatch, EventPublisher, EventPublisherFactory, ZmqEventPublisher
from vllm.utils.network_utils import get_ip, get_tcp_uri

import kvpool
from kvpool.publisher import DEFAULT_BUFFER_BYTES, PublisherStats, ZmqPublisher

__all__ = ["KvpoolEventPublisher", "register"]

_LOG = logging.getLogger(__name__)


def _buffer_bytes() -> int:
    """The replay buffer's byte bound: ``$KVPOOL_EVENTS_BUFFER_BYTES``, else 256 MiB."""
    value = os.environ.get("KVPOOL_EVENTS_BUFFER_BYTES")
    if value is None:
        return DEFAULT_BUFFER_BYTES
    try:
        return max(int(value), 0)
    except ValueError:
        raise ValueError(f"KVPOOL_EVENTS_BUFFER_BYTES must be an integer, got {value!r}") from None


class KvpoolEventPublisher(EventPublisher):  # type: ignore[misc]
    """vLLM's ``ZmqEventPublisher`` interface and wire, published by kvpool (see the module
    docstring)."""

    def __init__(
        self,
        data_parallel_rank: int,
        endpoint: str = "tcp://*:5557",
        replay_endpoint: str | None = None,
        buffer_steps: int = 10_000,
        hwm: int = 100_000,
        max_queue_size: int = 100_000,
        topic: str = "",
    ) -> None:
        super().__init__(data_parallel_rank)
        endpoint = ZmqEventPublisher.offset_endpoint_port(endpoint, data_parallel_rank)
        replay_endpoint = ZmqEventPublisher.offset_endpoint_port(replay_endpoint, data_parallel_rank)
        bind = ZmqEventPublisher._is_bind_endpoint(endpoint)
        self._publisher = ZmqPublisher(
            _node_endpoint(endpoint) if bind else endpoint,
            None if replay_endpoint is None else _node_endpoint(replay_endpoint),
            topic=topic,
            data_parallel_rank=data_parallel_rank,
            buffer_steps=buffer_steps,
            buffer_bytes=_buffer_bytes(),
            hwm=hwm,
            bind=bind,
        )
        self._encoder = msgspec.msgpack.Encoder()
        self._config = KVEventsConfig(
            enable_kv_cache_events=True,
            publisher="zmq",
            endpoint=self._publisher.endpoint if endpoint == "tcp://*:0" else endpoint,
            replay_endpoint=(self._publisher.replay_endpoint if replay_endpoint == "tcp://*:0"
                             else replay_endpoint),
            buffer_steps=buffer_steps,
            hwm=hwm,
            max_queue_size=max_queue_size,
            topic=topic,
        )

    def publish(self, events: EventBatch) -> None:
        """Encode the batch as vLLM does and send it (with the next sequence number). A batch
        that cannot be encoded or sent is logged and dropped, as vLLM's publisher thread
        does, so that publishing never fails the engine's step."""
        if self._publisher.closed:
            raise kvpool.TransportError("the publisher is closed")  # a RuntimeError, as vLLM's
        if events.data_parallel_rank is None:
            events.data_parallel_rank = self._data_parallel_rank
        try:
            self._publisher.publish(self._encoder.encode(events), send_empty=True)
        except Exception as exc:  # noqa: BLE001 - vLLM's publisher logs and goes on
            _LOG.exception("kvpool: publishing a KV-event batch failed: %s", exc)

    def shutdown(self) -> None:
        """Stop serving replays and close the sockets."""
        self._publisher.close()

    def get_publisher_config(self) -> KVEventsConfig:
        """The configuration with the endpoints as bound."""
        return self._config

    def stats(self) -> PublisherStats:
        """Batches sent and held for replay, replays served."""
        return self._publisher.stats()


def _node_endpoint(endpoint: str) -> str:
    """Where to bind ``endpoint``: vLLM binds ``tcp://*:0`` on the node's IP, which must be
    one (not a wildcard address); an IPv6 one is bracketed (``ZmqPublisher`` then enables
    IPv6 on the socket)."""
    if endpoint != "tcp://*:0":
        return endpoint
    ip = get_ip()
    if ip in ("0.0.0.0", "::"):
        raise ValueError("tcp://*:0 needs a node IP; set VLLM_HOST_IP")
    return str(get_tcp_uri(ip, 0))


def register() -> None:
    """Make vLLM's publisher factory build :class:`KvpoolEventPublisher` for ``"zmq"``
    (``KVEventsConfig`` accepts no other name, and ``register_publisher`` refuses to replace
    one, so it is set in the factory's registry directly)."""
    registry: dict[str, Any] = EventPublisherFactory._registry
    registry["zmq"] = KvpoolEventPublisher
