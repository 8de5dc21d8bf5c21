"""The timed replay: requests arrive at their timestamps, overlap, and hold their blocks while
they run, as in a serving engine (``kvpool simulate --timed``).

The model (every rate is a flag, defaults in :class:`ServiceModel`):

* Requests arrive at ``timestamp`` (milliseconds, sorted; ties keep file order) and wait in
  one FCFS queue. The head is admitted when fewer than ``max_running`` requests run and the
  pool can hold its prompt: it hits the longest cached prefix of its ids, takes those blocks
  (``touch``), allocates the rest and caches them under their ids at once (vLLM caches blocks
  when it schedules them). A head that does not fit blocks the queue until blocks are freed
  (vLLM's waiting queue stops at the first request that does not fit).
* A request's prefill takes ``max(input_length - hit_tokens, 1) / prefill_tokens_per_s``
  seconds; then it decodes ``output_length`` tokens at ``decode_tokens_per_s`` each (its first
  token at the end of the prefill). Each output token but the last (whose KV is never
  computed: the request ends when it is sampled) that starts a new block allocates one
  uncached block then; when none is free, the newest running request is preempted (vLLM's FCFS
  rule; possibly the request itself): its blocks are freed and it goes back to the head of the
  queue, to restart its prefill and decode when admitted again. As in vLLM's scheduler, a step
  that preempts admits nothing: admission is tried again at the next event (an arrival,
  another request's prefill end, output block or finish).
* A finished request frees its blocks tail first, so its prompt stays cached, most recently
  used last; a full pool evicts by the pool's eviction policy (default LRU).
* A request whose prompt and output blocks exceed the capacity can never run: it is counted in
  ``rejected`` and its blocks as misses. Hits count at a request's first admission.

Reported (:class:`TimedResult`): the hit ratios as the sequential replay reports them, the
peak of blocks held by running requests (cached free blocks do not count) and of running
requests, how many requests waited, waited because the pool could not hold them, or were
preempted, the queueing delay (mean and 99th percentile, first admission minus arrival), and
the time the last request finished.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from kvpool.simulate import (
    Impl,
    check_replay_args,
    get_impl,
    hit_ratios,
    horizon_in_force,
    prepare_hashes,
    replay_pool,
    unbounded_capacity,
)
from kvpool.traces import MOONCAKE_BLOCK_TOKENS, Trace

__all__ = ["ServiceModel", "TimedResult", "simulate_timed"]

_PREFILL_DONE, _GROW, _FINISH = 0, 1, 2


@dataclass(frozen=True)
class ServiceModel:
    """How fast requests run: prefill throughput, per-request decode speed, and how many run at once."""

    prefill_tokens_per_s: float = 10_000.0
    decode_tokens_per_s: float = 50.0
    max_running: int = 64

    def __post_init__(self) -> None:
        for name in ("prefill_tokens_per_s", "decode_tokens_per_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a finite number > 0, got {value}")
        if self.max_running < 1:
            raise ValueError(f"max_running must be >= 1, got {self.max_running}")


@dataclass(frozen=True)
class TimedResult:
    """The outcome of one timed replay (one capacity and policy); see the module docstring."""

    trace: str
    capacity_blocks: int | None  # None: unbounded
    requests: int
    blocks: int
    hit_blocks: int
    block_hit_ratio: float
    token_hit_ratio: float
    rejected: int
    peak_blocks_in_use: int
    peak_running: int
    waited: int
    waited_for_blocks: int
    preemptions: int
    preempted_requests: int
    mean_wait_s: float
    p99_wait_s: float
    makespan_s: float
    prefill_tokens_per_s: float
    decode_tokens_per_s: float
    max_running: int
    policy: str = "lru"
    adaptive_horizon: int | None = None  # the adaptive policy's horizon in force
    mode: str = "timed"

    def to_dict(self) -> dict[str, Any]:
        """The fields as a JSON-ready dict (floats rounded to 6 digits)."""
        return {k: round(v, 6) if isinstance(v, float) else v for k, v in asdict(self).items()}


@dataclass
class _Running:
    """A request holding blocks: its table (hits, then new prompt blocks, then output blocks)."""

    blocks: list[Any]
    gen: int
    start: float  # end of its prefill: its first output token
    next_block: int  # index of the next output block it needs


def output_blocks(input_length: int, output_length: int, block_tokens: int) -> int:
    """Blocks the output adds beyond the prompt's last (partial) block. The last output token
    takes no slot: the request ends when it is sampled, before its KV is computed (vLLM
    allocates ``input_length + output_length - 1`` slots at most)."""
    slots = max(input_length + output_length - 1, input_length)
    return -(-slots // block_tokens) - -(-input_length // block_tokens)


def simulate_timed(
    trace: Trace,
    capacity: int | None,
    *,
    block_tokens: int = MOONCAKE_BLOCK_TOKENS,
    service: ServiceModel | None = None,
    policy: str = "lru",
    impl: Impl | None = None,
    progress: Callable[[int], None] | None = None,
) -> TimedResult:
    """Replay ``trace`` by arrival time in a pool of ``capacity`` usable blocks (``None``: room
    for everything) under ``service``; ``progress(n)`` is called as requests finish."""
    check_replay_args(capacity, block_tokens)
    service = service or ServiceModel()
    impl = impl or get_impl("kvpool")
    n = trace.num_requests
    extra = [output_blocks(i, o, block_tokens) for i, o in zip(trace.input_lengths, trace.output_lengths)]
    bound = unbounded_capacity(trace) + sum(extra)
    usable = bound if capacity is None else min(capacity, bound)
    pool = replay_pool(impl, usable, block_tokens, policy)
    hashes = prepare_hashes(trace, impl)
    sim = _Simulation(trace, pool, hashes, extra, usable, block_tokens, service)
    sim.run(progress)
    waits = np.asarray([w for w in sim.wait if w is not None], dtype=np.float64)
    hit_blocks, block_ratio, token_ratio = hit_ratios(trace, sim.hits, block_tokens)
    return TimedResult(
        trace=trace.name,
        capacity_blocks=capacity,
        requests=n,
        blocks=trace.num_blocks,
        hit_blocks=hit_blocks,
        block_hit_ratio=block_ratio,
        token_hit_ratio=token_ratio,
        rejected=sim.rejected,
        peak_blocks_in_use=sim.peak_in_use,
        peak_running=sim.peak_running,
        waited=int(np.count_nonzero(waits > 0)),
        waited_for_blocks=len(sim.blocked),
        preemptions=sim.preemptions,
        preempted_requests=len(sim.preempted),
        mean_wait_s=float(waits.mean()) if waits.size else 0.0,
        p99_wait_s=float(np.quantile(waits, 0.99)) if waits.size else 0.0,
        makespan_s=sim.last_finish,
        prefill_tokens_per_s=service.prefill_tokens_per_s,
        decode_tokens_per_s=service.decode_tokens_per_s,
        max_running=service.max_running,
        policy=policy,
        adaptive_horizon=horizon_in_force(policy, usable if capacity is None else capacity),
    )


class _Simulation:
    """The event loop of :func:`simulate_timed`: arrivals in time order, then a heap of prefill
    ends, output-block needs and finishes; admission tried after every event."""

    def __init__(
        self,
        trace: Trace,
        pool: Any,
        hashes: list[Any],
        extra: list[int],
        usable: int,
        block_tokens: int,
        service: ServiceModel,
    ) -> None:
        self.trace, self.pool, self.hashes, self.extra = trace, pool, hashes, extra
        self.usable, self.bt, self.service = usable, block_tokens, service
        n = trace.num_requests
        self.order = sorted(range(n), key=lambda i: trace.timestamps[i])
        # Seconds since the first arrival: epoch timestamps (1.7e18 ns) as floats would round
        # prefill and decode times away.
        first = min(trace.timestamps, default=0)
        self.arrival = [(trace.timestamps[i] - first) / 1000.0 for i in range(n)]
        self.hits = [0] * n
        self.wait: list[float | None] = [None] * n
        self.gen = [0] * n
        self.queue: deque[int] = deque()
        self.running: dict[int, _Running] = {}  # in admission order: the last is the newest
        self.events: list[tuple[float, int, int, int, int]] = []
        self.seq = 0
        self.now = 0.0
        self.last_finish = 0.0  # when the last request finished (not a later rejected arrival)
        self.rejected = self.preemptions = self.peak_in_use = self.peak_running = 0
        self.blocked: set[int] = set()
        self.preempted: set[int] = set()
        # Whether the event being handled preempted a request: as in vLLM's scheduler, a step
        # that preempts admits nothing (else a request that preempted itself would be taken
        # back at once, its prompt still cached, and preempt itself again without end).
        self.preempted_now = False

    def run(self, progress: Callable[[int], None] | None) -> None:
        arrivals, done = 0, 0
        n = len(self.order)
        while arrivals < n or self.events:
            if arrivals < n and (not self.events or self.arrival[self.order[arrivals]] <= self.events[0][0]):
                i = self.order[arrivals]
                arrivals += 1
                self.now = max(self.now, self.arrival[i])
                if len(self.hashes[i]) + self.extra[i] > self.usable:
                    self.rejected += 1
                    done += 1
                else:
                    self.queue.append(i)
            else:
                t, _, kind, i, gen = heapq.heappop(self.events)
                self.now = t
                self.preempted_now = False
                if gen != self.gen[i]:
                    continue  # cancelled by a preemption
                if kind == _FINISH:
                    self._finish(i)
                    done += 1
                    if progress is not None and done % 1024 == 0:
                        progress(done)
                else:
                    self._next_output_block(i, allocate=kind == _GROW)
                if self.preempted_now and self.running:
                    continue  # the requests still running go on; admission waits for them
            self._admit()
        if progress is not None:
            progress(done)

    def _push(self, t: float, kind: int, i: int) -> None:
        self.seq += 1
        heapq.heappush(self.events, (t, self.seq, kind, i, self.gen[i]))

    def _admit(self) -> None:
        pool = self.pool
        while self.queue and len(self.running) < self.service.max_running:
            i = self.queue[0]
            h = self.hashes[i]
            hit = pool.find_longest_cache_hit(h)
            k = len(hit)
            # Hits no running request holds leave the free queue when touched.
            need = len(h) - k + int(np.count_nonzero(np.asarray(pool.ref_counts_of(hit)) == 0)) if k else len(h)
            if need > pool.get_num_free_blocks():
                self.blocked.add(i)
                return
            self.queue.popleft()
            pool.touch(hit)
            new = pool.get_new_blocks(len(h) - k)
            pool.cache_full_blocks(new, h[k:], 0, len(h) - k)
            if self.wait[i] is None:
                self.wait[i] = self.now - self.arrival[i]
                self.hits[i] = k
            uncached = max(self.trace.input_lengths[i] - k * self.bt, 1)
            end = self.now + uncached / self.service.prefill_tokens_per_s
            self.running[i] = _Running([*hit.tolist(), *new.tolist()], self.gen[i], end, 0)
            self._push(end, _PREFILL_DONE, i)
            self._peaks()

    def _next_output_block(self, i: int, *, allocate: bool) -> None:
        """At the prefill end (``allocate`` false) or when an output block is due: take it (by
        preemption if need be), then schedule the next need or the finish."""
        if allocate and not self._grow(i):
            return  # preempted itself
        r = self.running[i]
        length, out = self.trace.input_lengths[i], self.trace.output_lengths[i]
        rate = self.service.decode_tokens_per_s
        if r.next_block < self.extra[i]:
            first_block_tokens = -(-length // self.bt) * self.bt
            token = first_block_tokens + r.next_block * self.bt - length + 1  # 1-based output token
            self._push(r.start + (token - 1) / rate, _GROW, i)
        else:
            self._push(r.start + max(out - 1, 0) / rate, _FINISH, i)

    def _grow(self, i: int) -> bool:
        """One more block for ``i``, preempting the newest running requests until one is free;
        ``False`` when ``i`` itself had to go."""
        pool = self.pool
        while pool.get_num_free_blocks() == 0:
            victim = next(reversed(self.running))
            self._preempt(victim)
            if victim == i:
                return False
        r = self.running[i]
        r.blocks.extend(pool.get_new_blocks(1).tolist())
        r.next_block += 1
        self._peaks()
        return True

    def _preempt(self, i: int) -> None:
        r = self.running.pop(i)
        self.pool.free_blocks(r.blocks[::-1])
        self.gen[i] += 1
        self.queue.appendleft(i)
        self.preemptions += 1
        self.preempted.add(i)
        self.preempted_now = True

    def _finish(self, i: int) -> None:
        self.last_finish = self.now
        r = self.running.pop(i)
        self.pool.free_blocks(r.blocks[::-1])

    def _peaks(self) -> None:
        self.peak_in_use = max(self.peak_in_use, self.usable - self.pool.get_num_free_blocks())
        self.peak_running = max(self.peak_running, len(self.running))
