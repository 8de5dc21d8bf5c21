"""vLLM's ``zmq`` KV-event publisher on kvpool's :class:`kvpool.publisher.ZmqPublisher`.

vLLM's scheduler builds its publisher through ``EventPublisherFactory`` from
``--kv-events-config``; :func:`kvpool.vllm.install` maps the factory's ``"zmq"`` to
:class:`KvpoolEventPublisher`, so an engine on ``kvpool.vllm`` publishes
through kvpool with no change to its configuration. The wire is vLLM's, frame for frame: the
same endpoints (offset by the data-parallel rank, wildcards bound and other endpoints connected,
as vLLM does), topic, sequence numbers from 0, ``EventBatch`` payloads encoded by msgspec as
vLLM encodes them, the replay ROUTER and its end marker, ``buffer_steps`` batches kept for
replay. The difference: the batch is encoded and handed to ZeroMQ in ``publish``, on the
scheduler's thread, not queued for a second Python thread that would take the GIL from the
scheduler at random points; ZeroMQ's own I/O thread does the sending. ``max_queue_size`` is
accepted and unused (nothing is queued).
"""

from __future__ import annotations

from typing import Any

import msgspec
from vllm.config.kv_events import KVEventsConfig
from vllm.distributed.kv_events import EventBatch, EventPublisher, EventPublisherFactory, ZmqEventPublisher
from vllm.utils.network_utils import get_ip, get_tcp_uri

from kvpool.publisher import PublisherStats, ZmqPublisher

__all__ = ["KvpoolEventPublisher", "register"]


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
        """Encode the batch as vLLM does and send it (with the next sequence number)."""
        if events.data_parallel_rank is None:
            events.data_parallel_rank = self._data_parallel_rank
        self._publisher.publish(self._encoder.encode(events))

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
    """Where to bind ``endpoint``: vLLM binds ``tcp://*:0`` on the node's IP."""
    return get_tcp_uri(get_ip(), 0) if endpoint == "tcp://*:0" else endpoint


def register() -> None:
    """Make vLLM's publisher factory build :class:`KvpoolEventPublisher` for ``"zmq"``
    (``KVEventsConfig`` accepts no other name, and ``register_publisher`` refuses to replace
    one, so it is set in the factory's registry directly)."""
    registry: dict[str, Any] = EventPublisherFactory._registry
    registry["zmq"] = KvpoolEventPublisher
