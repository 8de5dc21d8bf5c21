"""Replay a Mooncake trace through a ``BlockPool`` and report its prefix-cache behaviour.

Semantics (what ``kvpool simulate`` and the ``trace-replay`` benchmark do):

* Requests run one at a time, in file order. Each hash id is one cacheable block.
* A request hits the longest prefix of its ids that is cached when it arrives
  (``find_longest_cache_hit``, uncapped); it takes those blocks (``touch``), allocates the
  rest, caches them under their ids, and then releases all its blocks tail-first (reverse
  order), so they stay cached, most recently used last.
* When the pool is full, allocating evicts a cached free block chosen by the pool's eviction
  policy (``policy``, default ``"lru"``: the least recently used one; see ``docs/eviction.md``).
  :mod:`kvpool.simulate_belady` replays the same semantics under Belady's MIN, the offline bound.
* A pool of capacity ``C`` has ``C`` usable blocks (``BlockPool(C + 1)``: block 0 is the null
  block). A request with more than ``C`` blocks keeps only its first ``C``; the rest count as
  misses.
* Unbounded mode uses a pool that never evicts: as many usable blocks as distinct ids when the
  trace is prefix-consistent (every well-formed Mooncake trace is), else as many as the trace
  has blocks in total.

Reported per capacity (:class:`ReplayResult`): ``hit_blocks`` and ``block_hit_ratio`` over all
blocks of the trace; ``token_hit_ratio`` = hit tokens / input tokens, where a request with ``h``
hit blocks hits ``min(h * block_tokens, input_length)`` tokens (every block counts
``block_tokens`` except the last, which counts ``input_length - (n - 1) * block_tokens``; the
``min`` clips lines whose length and ids disagree); ``evictions`` = cached blocks dropped to make
room, exactly ``newly cached - cached at the end`` since the pool starts empty; ``seconds`` =
time of the replay loop, whose body is only the pool calls (ids are converted beforehand).

Hash ids reach each pool in its preferred form, prepared before any clock starts
(:class:`Impl`): a ``np.uint64`` array for the Rust pool when it accepts one, else a list of
8-byte big-endian ``bytes`` (always for the plain-Python reference).
"""

from __future__ import annotations

import gc
import importlib
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from kvpool.capacity import CapacityUnits
from kvpool.reference.eviction import EVICTION_POLICIES, MAX_ADAPTIVE_HORIZON, default_adaptive_horizon
from kvpool.traces import MOONCAKE_BLOCK_TOKENS, HashIds, Trace, is_prefix_consistent

__all__ = [
    "CHUNK",
    "IMPL_NAMES",
    "HashInput",
    "Impl",
    "PlotUnavailableError",
    "PoolLike",
    "ProgressFn",
    "ReplayResult",
    "default_sweep",
    "check_replay_args",
    "get_impl",
    "hit_ratios",
    "horizon_in_force",
    "load_pyplot",
    "plot_path_problem",
    "finish_plot",
    "prepare_hashes",
    "replay",
    "replay_pool",
    "replay_result",
    "save_plot",
    "simulate",
    "simulate_one",
    "truncate",
    "unbounded_capacity",
]

IMPL_NAMES = ("kvpool", "reference")

HashInput = npt.NDArray[np.uint64] | list[bytes]
"""One request's block hashes in the form a pool takes: uint64 ids or 8-byte big-endian bytes."""

ProgressFn = Callable[[int], None]
"""Called with the number of requests replayed so far."""

CHUNK = 1024
"""Requests replayed between two progress reports (the clock stops in between)."""


class PoolLike(Protocol):
    """The ``BlockPool`` methods a replay or a benchmark calls (both implementations have them)."""

    def get_new_blocks(self, num_blocks: int) -> npt.NDArray[Any]: ...
    def get_new_blocks_many(self, counts: Any) -> tuple[npt.NDArray[Any], npt.NDArray[Any]]: ...
    def free_blocks(self, block_ids: Any) -> None: ...
    def free_blocks_many(self, blocks: Any, offsets: Any = None, *, reverse: bool = False) -> None: ...
    def touch(self, block_ids: Any) -> None: ...
    def cache_full_blocks(
        self, block_ids: Any, block_hashes: Any, num_cached_blocks: int, num_full_blocks: int
    ) -> None: ...
    def find_longest_cache_hit(self, block_hashes: Any, *, max_blocks: int | None = None) -> npt.NDArray[Any]: ...
    def get_num_cached_blocks(self) -> int: ...


PoolFactory = Callable[..., PoolLike]


# --------------------------------------------------------------------------------------------
# Implementations and their preferred hash form.
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Impl:
    """A ``BlockPool`` implementation: its name, module, class and preferred hash form."""

    name: str
    module: ModuleType
    pool_cls: PoolFactory
    int_hashes: bool  # takes hash ids as a np.uint64 array (else: a list of 8-byte bytes)

    def hashes(self, ids: HashIds) -> HashInput:
        """``ids`` in this implementation's preferred form (call outside any timed region)."""
        if self.int_hashes:
            return ids
        raw = ids.astype(">u8").tobytes()
        return [raw[i : i + 8] for i in range(0, len(raw), 8)]

    def has(self, api: str) -> bool:
        """Whether this implementation's module offers ``api`` (e.g. ``"KVCacheManager"``)."""
        return hasattr(self.module, api)


def get_impl(name: str) -> Impl:
    """The implementation called ``name``: ``"kvpool"`` (Rust) or ``"reference"`` (plain Python)."""
    if name == "kvpool":
        module = importlib.import_module("kvpool")
        return Impl(name, module, module.BlockPool, _accepts_int_hashes(module.BlockPool))
    if name == "reference":
        # The reference's native form is bytes: giving it ints would time a conversion.
        module = importlib.import_module("kvpool.reference")
        return Impl(name, module, module.BlockPool, False)
    raise ValueError(f"unknown implementation {name!r} (choose from {', '.join(IMPL_NAMES)})")


def _accepts_int_hashes(pool_cls: PoolFactory) -> bool:
    """Whether ``pool_cls`` takes block hashes as a ``np.uint64`` array (older builds do not)."""
    try:
        pool_cls(2).find_longest_cache_hit(np.zeros(1, dtype=np.uint64))
    except (TypeError, ValueError):
        return False
    return True


def prepare_hashes(trace: Trace, impl: Impl) -> list[HashInput]:
    """Every request's hashes in ``impl``'s preferred form (once per trace, untimed)."""
    return [impl.hashes(ids) for ids in trace.hash_ids]


def truncate(hashes: Sequence[HashInput], capacity: int) -> list[HashInput]:
    """Each request's first ``capacity`` blocks (slices are views for arrays)."""
    return [h[:capacity] if len(h) > capacity else h for h in hashes]


# --------------------------------------------------------------------------------------------
# The replay.
# --------------------------------------------------------------------------------------------


def replay(pool: PoolLike, hashes: Sequence[HashInput]) -> list[int]:
    """Run the requests through ``pool`` in order; return each request's number of hit blocks.

    Per request: longest cache hit, touch the hits, allocate the rest, cache the new blocks,
    free all blocks tail-first. The body is pool calls only, so the caller can time the loop.
    Every request must fit (``len(h) <= usable blocks``).
    """
    find, touch = pool.find_longest_cache_hit, pool.touch
    allocate, cache, free_many = pool.get_new_blocks, pool.cache_full_blocks, pool.free_blocks_many
    hits: list[int] = []
    for h in hashes:
        hit = find(h)
        k = len(hit)
        touch(hit)
        new = allocate(len(h) - k)
        cache(new, h[k:], 0, len(h) - k)
        free_many([new, hit], reverse=True)  # the new blocks are the tail: they go first
        hits.append(k)
    return hits


def serve_one(pool: PoolLike, h: HashInput) -> int:
    """One request of :func:`replay` (hit, allocate the rest, cache, free tail first); returns
    its hit blocks. For callers that route requests between pools one at a time."""
    return replay(pool, [h])[0]


def _timed_replay(
    pool: PoolLike, hashes: Sequence[HashInput], progress: ProgressFn | None
) -> tuple[list[int], float]:
    """:func:`replay` in chunks of :data:`CHUNK` requests, timed; the progress report is not."""
    hits: list[int] = []
    seconds = 0.0
    gc.collect()
    for start in range(0, len(hashes), CHUNK):
        part = hashes[start : start + CHUNK]
        t0 = time.perf_counter()
        hits += replay(pool, part)
        seconds += time.perf_counter() - t0
        if progress is not None:
            progress(start + len(part))
    return hits, seconds


@dataclass(frozen=True)
class ReplayResult:
    """The prefix-cache behaviour of one replay (one capacity); see the module docstring."""

    trace: str
    capacity_blocks: int | None  # None: unbounded
    requests: int
    blocks: int
    hit_blocks: int
    block_hit_ratio: float
    token_hit_ratio: float
    evictions: int
    seconds: float
    policy: str = "lru"  # the pool's eviction policy, or "belady" (kvpool.simulate_belady)
    adaptive_horizon: int | None = None  # the adaptive policy's horizon in force (it fades with the pool's size)

    def to_dict(self) -> dict[str, Any]:
        """The fields as a JSON-ready dict (ratios and seconds rounded to 6 digits)."""
        out = asdict(self)
        for key in ("block_hit_ratio", "token_hit_ratio", "seconds"):
            out[key] = round(out[key], 6)
        return out


def unbounded_capacity(trace: Trace) -> int:
    """Usable blocks of a pool that never evicts while replaying ``trace`` (at least 1).

    Distinct ids suffice when the trace is prefix-consistent: each id is then cached once and
    hit ever after. Otherwise a request may cache an id again, and only the total number of
    blocks is a safe bound.
    """
    need = trace.distinct_ids() if is_prefix_consistent(trace) else trace.num_blocks
    return max(need, 1)


def _token_hits(trace: Trace, hits: Sequence[int], block_tokens: int) -> int:
    """Sum over requests of ``min(hit_blocks * block_tokens, input_length)``."""
    hit_tokens = np.asarray(hits, dtype=np.int64) * block_tokens
    return int(np.minimum(hit_tokens, np.asarray(trace.input_lengths, dtype=np.int64)).sum())


def hit_ratios(trace: Trace, hits: Sequence[int], block_tokens: int) -> tuple[int, float, float]:
    """``(hit_blocks, block_hit_ratio, token_hit_ratio)`` of a replay whose requests hit
    ``hits`` blocks each (see the module docstring)."""
    hit_blocks = int(sum(hits))
    blocks, input_tokens = trace.num_blocks, sum(trace.input_lengths)
    return (
        hit_blocks,
        hit_blocks / blocks if blocks else 0.0,
        _token_hits(trace, hits, block_tokens) / input_tokens if input_tokens else 0.0,
    )


def check_replay_args(capacity: int | None, block_tokens: int) -> None:
    """``ValueError`` for a capacity under one block or ``block_tokens`` under 1."""
    if capacity is not None and capacity < 1:
        raise ValueError(f"capacity must be >= 1 block, got {capacity}")
    if block_tokens < 1:
        raise ValueError(f"block_tokens must be >= 1, got {block_tokens}")


def policy_args(policy: str) -> dict[str, Any]:
    """A pool's eviction arguments for a policy name: ``"lru"``, ``"priority"``,
    ``"adaptive"``, or ``"adaptive:H"`` for the adaptive policy with a horizon of ``H`` blocks
    freed (``adaptive_horizon=H``), so that a simulation can compare horizons side by side."""
    name, sep, horizon = policy.partition(":")
    if name not in EVICTION_POLICIES or (sep and name != "adaptive"):
        raise ValueError(f"unknown eviction policy {policy!r}: expected one of {', '.join(EVICTION_POLICIES)}, "
                         "or adaptive:HORIZON")
    if not sep:
        return {"eviction": name}
    if not horizon.isdigit() or int(horizon) > MAX_ADAPTIVE_HORIZON:
        raise ValueError(f"adaptive:HORIZON needs a number of blocks from 0 to 2**40, got {policy!r}")
    return {"eviction": name, "adaptive_horizon": int(horizon)}


def horizon_in_force(policy: str, usable: int) -> int | None:
    """The adaptive horizon of a replay's pool of ``usable`` blocks under ``policy`` (``None`` for
    the other policies): the one the policy names, else the default for that size. Callers pass
    the capacity asked for, not the pool a replay builds, which is clamped to what the trace can
    fill (where it never evicts, so the counts are the same)."""
    args = policy_args(policy)
    if args["eviction"] != "adaptive":
        return None
    if "adaptive_horizon" in args:
        return int(args["adaptive_horizon"])
    return default_adaptive_horizon(usable + 1)  # and the null block, as replay_pool builds it


def replay_pool(impl: Impl, usable: int, block_tokens: int, policy: str) -> PoolLike:
    """A fresh caching pool of ``usable`` blocks (and the null block) evicting by ``policy``
    (a name :func:`policy_args` takes)."""
    args = policy_args(policy)
    if args == {"eviction": "lru"}:  # the call as it always was: builds without the eviction argument work too
        return impl.pool_cls(usable + 1, enable_caching=True, block_size=block_tokens)
    return impl.pool_cls(usable + 1, enable_caching=True, block_size=block_tokens, **args)


def simulate_one(
    trace: Trace,
    capacity: int | None,
    *,
    block_tokens: int = MOONCAKE_BLOCK_TOKENS,
    impl: Impl | None = None,
    hashes: Sequence[HashInput] | None = None,
    progress: ProgressFn | None = None,
    policy: str = "lru",
) -> ReplayResult:
    """Replay ``trace`` in a fresh pool of ``capacity`` usable blocks (``None``: unbounded).

    ``impl`` defaults to the Rust pool; ``hashes`` (from :func:`prepare_hashes` with the same
    ``impl``) can be passed to convert a trace once for several capacities. ``policy`` is the
    pool's eviction policy (``"lru"``, ``"priority"``, ``"adaptive"``).
    """
    check_replay_args(capacity, block_tokens)
    impl = impl or get_impl("kvpool")
    # A capacity beyond what the trace can fill replays like the unbounded pool: clamped,
    # the counts are the same and the pool is no larger than the trace needs.
    usable = unbounded_capacity(trace) if capacity is None else min(capacity, unbounded_capacity(trace))
    requests = truncate(prepare_hashes(trace, impl) if hashes is None else hashes, usable)
    pool = replay_pool(impl, usable, block_tokens, policy)
    hits, seconds = _timed_replay(pool, requests, progress)
    newly_cached = sum(len(h) for h in requests) - sum(hits)
    horizon = horizon_in_force(policy, usable if capacity is None else capacity)
    return replay_result(trace, capacity, hits, block_tokens=block_tokens,
                         evictions=newly_cached - pool.get_num_cached_blocks(), seconds=seconds, policy=policy,
                         adaptive_horizon=horizon)


def replay_result(
    trace: Trace,
    capacity: int | None,
    hits: Sequence[int],
    *,
    block_tokens: int,
    evictions: int,
    seconds: float,
    policy: str,
    adaptive_horizon: int | None = None,
) -> ReplayResult:
    """The :class:`ReplayResult` of a replay of ``trace`` whose requests hit ``hits`` blocks each."""
    hit_blocks, block_ratio, token_ratio = hit_ratios(trace, hits, block_tokens)
    return ReplayResult(
        trace=trace.name,
        capacity_blocks=capacity,
        requests=trace.num_requests,
        blocks=trace.num_blocks,
        hit_blocks=hit_blocks,
        block_hit_ratio=block_ratio,
        token_hit_ratio=token_ratio,
        evictions=evictions,
        seconds=seconds,
        policy=policy,
        adaptive_horizon=adaptive_horizon,
    )


def simulate(
    trace: Trace,
    capacities: Sequence[int | None],
    *,
    block_tokens: int = MOONCAKE_BLOCK_TOKENS,
    impl: Impl | None = None,
    progress: Callable[[int | None], ProgressFn | None] | None = None,
    policy: str = "lru",
) -> list[ReplayResult]:
    """:func:`simulate_one` for each capacity in order (``None``: unbounded), under ``policy``.

    ``progress(capacity)``, if given, returns the progress callback for that capacity's run.
    """
    impl = impl or get_impl("kvpool")
    hashes = prepare_hashes(trace, impl)
    return [
        simulate_one(
            trace,
            capacity,
            block_tokens=block_tokens,
            impl=impl,
            hashes=hashes,
            progress=None if progress is None else progress(capacity),
            policy=policy,
        )
        for capacity in capacities
    ]


def default_sweep(trace: Trace, points: int = 8) -> list[int]:
    """``points`` capacities spaced geometrically from 1/64 of the unbounded pool up to all of it."""
    top = unbounded_capacity(trace)
    fractions = [64 ** (-(points - 1 - i) / max(points - 1, 1)) for i in range(points)]
    return sorted({max(1, math.ceil(top * f)) for f in fractions})


# --------------------------------------------------------------------------------------------
# The plot (optional: needs matplotlib, ``pip install 'kvpool[plot]'``).
# --------------------------------------------------------------------------------------------


class PlotUnavailableError(RuntimeError):
    """``--plot`` was asked for but matplotlib is not installed."""


def load_pyplot() -> ModuleType:
    """``matplotlib.pyplot`` on the file-only Agg backend, or :class:`PlotUnavailableError`."""
    try:
        matplotlib = importlib.import_module("matplotlib")
    except ImportError:
        raise PlotUnavailableError(
            "--plot needs matplotlib, which is not installed: pip install 'kvpool[plot]'"
        ) from None
    matplotlib.use("Agg")
    return importlib.import_module("matplotlib.pyplot")


def plot_path_problem(path: str) -> str | None:
    """Why a plot cannot be written to ``path`` (an unknown image format, a missing or read-only
    directory), checked before any replay runs; ``None`` when it can (needs matplotlib)."""
    from matplotlib.backend_bases import FigureCanvasBase

    suffix = Path(path).suffix.lstrip(".").lower()
    formats = FigureCanvasBase.get_supported_filetypes()
    if suffix not in formats:
        return f"{path!r}: the file name must end in an image format ({', '.join('.' + f for f in sorted(formats))})"
    if Path(path).exists() and not Path(path).is_file():
        return f"{path!r} exists and is not a file"
    parent = Path(path).resolve().parent
    if not parent.is_dir():
        return f"{path!r}: directory {str(parent)!r} does not exist"
    if not os.access(parent, os.W_OK):
        return f"{path!r}: directory {str(parent)!r} is not writable"
    return None


def save_plot(results: Sequence[Any], path: str, *, units: CapacityUnits | None = None) -> None:
    """Write a PNG of token hit ratio against capacity (in GiB when ``units`` knows the model's
    bytes per token, else in tokens): one curve per eviction policy and replay mode (sequential
    :class:`ReplayResult` or timed ``TimedResult``), Belady's MIN dashed, the unbounded ceiling
    dotted. With timed results a second panel shows their 99th-percentile queueing delay, where
    a capacity too small for the load shows."""
    plt = load_pyplot()
    units = units or CapacityUnits(MOONCAKE_BLOCK_TOKENS)
    bounded = [r for r in results if r.capacity_blocks is not None]
    timed = [r for r in bounded if getattr(r, "mode", "sequential") == "timed"]
    if timed:
        fig, (ax, wait_ax) = plt.subplots(2, 1, figsize=(7, 7), sharex=True, height_ratios=(3, 2))
    else:
        fig, ax = plt.subplots(figsize=(7, 4.5))
    curves = list(dict.fromkeys((getattr(r, "mode", "sequential"), r.policy) for r in bounded))
    several_modes = len({m for m, _ in curves}) > 1
    for mode, policy in curves:
        mine = sorted((r for r in bounded if (getattr(r, "mode", "sequential"), r.policy) == (mode, policy)),
                      key=lambda r: r.capacity_blocks)
        label = "Belady's MIN (offline bound)" if policy == "belady" else policy
        if several_modes:
            label += f" ({mode})"
        xs = [units.axis(r.capacity_blocks) for r in mine]
        style = "k--" if policy == "belady" else ("s--" if mode == "timed" and several_modes else "o-")
        lines = ax.plot(xs, [r.token_hit_ratio for r in mine], style, label=label)
        if mode == "timed":
            wait_ax.plot(xs, [r.p99_wait_s for r in mine], "s-", color=lines[0].get_color(), label=label)
    ceiling = next((r for r in results if r.capacity_blocks is None), None)
    if ceiling is not None:
        ax.axhline(ceiling.token_hit_ratio, color="grey", linestyle=":", label="unbounded cache")
    xs = [units.axis(r.capacity_blocks) for r in bounded]
    title = f"prefix-cache hit ratio: {results[0].trace}" if results else "prefix-cache hit ratio"
    if timed:
        wait_ax.set_yscale("symlog", linthresh=1.0)
        wait_ax.set_ylim(bottom=0)
        wait_ax.set_ylabel("p99 queueing delay (s)")
        wait_ax.grid(True, alpha=0.3)
        ax.set_xlabel("")
    top = max([r.token_hit_ratio for r in results] or [0.0])
    finish_plot(plt, fig, wait_ax if timed else ax, xs, "token hit ratio", title, path,
                xlabel=units.axis_label, ratio_ax=ax, ratio_top=min(1.0, max(0.1, 1.15 * top)))


def finish_plot(
    plt: Any, fig: Any, ax: Any, xs: Sequence[float], ylabel: str, title: str, path: str,
    *, xlabel: str = "capacity (blocks)", ratio_ax: Any = None, ratio_top: float = 1.0,
) -> None:
    """The axes every hit-ratio plot shares (capacity on ``ax``, log-scaled over a decade or
    more; a ``0..ratio_top`` ratio on ``ratio_ax``, default ``ax``), then write ``path`` and
    close the figure."""
    ratio_ax = ax if ratio_ax is None else ratio_ax
    if len(xs) > 1 and min(xs) > 0 and max(xs) / min(xs) >= 10:
        ax.set_xscale("log")
    ax.set_xlabel(xlabel)
    ratio_ax.set_ylabel(ylabel)
    ratio_ax.set_ylim(0, ratio_top)
    ratio_ax.set_title(title)
    ratio_ax.grid(True, alpha=0.3)
    ratio_ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
