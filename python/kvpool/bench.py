"""The ``kvpool bench`` workloads, each run through ``kvpool`` and ``kvpool.reference``.

The workload definitions are fixed so that figures compare across tools: they are W1..W4 of
the vLLM peer benchmark (``vllm_blockpool_peer.py``), measured the same way: every figure is the
median of ``reps`` timed runs after one untimed warm-up run, each run on fresh state built by a
setup function outside the clock, with ``gc.collect()`` before it (:class:`Runner`).

* ``serve-random`` (W1): caching off, block size 16, pool 32,768 blocks; 100 requests of 700
  prompt + 1 output tokens (44 blocks). ``pool-per-request``: allocate 44, free them reversed,
  request by request. ``pool-batch``: all allocated, then all freed. ``pool-many``: the same
  through ``get_new_blocks_many`` / ``free_blocks_many`` (kvpool's batch API). Metric: µs per
  request.
* ``prefix-warmup`` (W2): caching on, block size 16, pool 32,768; 32 requests of 1,000 shared +
  200 unique tokens (75 full blocks). ``pass1-pool-only``: on a cold pool, allocate 75 and cache
  them per request, all held, then all freed reversed. ``pass2``: on the warmed pool, longest
  cache hit capped at ``num_tokens - 1`` tokens, touch, all freed. Hashes are precomputed
  (:func:`_python_block_hashes`). Metric: µs per request per phase.
* ``churn`` (W3): caching on, pool 100,000 blocks: allocate 64, cache them under 64 new hashes,
  free reversed; a first cycle through the pool (no evictions), then a second (every allocation
  evicts). Metric: ns per block. The evicting cycle is repeated with other key shapes
  (:data:`CH_KEY_SHAPES`: SHA-256 digests, 32-byte big- and little-endian integers, one key
  under every block), each as a list of ``bytes`` for both implementations.
* ``trace-replay`` (W4): a Mooncake trace (the seeded synthetic one by default), block size 512,
  pool 20,000 blocks, replayed as in :mod:`kvpool.simulate`. Metrics: total seconds,
  requests per second, block hit ratio.

Rows that need an API kvpool does not have yet (block hashing, ``KVCacheManager``) are listed
in :data:`OPTIONAL_VARIANTS` and skipped while the API is missing; they are never faked.
"""

from __future__ import annotations

import gc
import hashlib
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cache
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt

from kvpool.simulate import HashInput, Impl, PoolLike, prepare_hashes, replay, truncate
from kvpool.traces import Trace

__all__ = [
    "DEFAULT_REPS",
    "OPTIONAL_VARIANTS",
    "WORKLOADS",
    "OptionalVariant",
    "Row",
    "Runner",
    "Sample",
    "WorkloadResult",
    "format_table",
    "resolve_names",
    "run_bench",
]

DEFAULT_REPS = 5
"""Timed runs per figure (the vLLM peer's default): ``kvpool bench`` then takes about 8 s on a
2-core machine, leaving room under its one-minute budget for the hashing and manager rows."""

WORKLOADS = ("serve-random", "prefix-warmup", "churn", "trace-replay")
ALIASES = {"w1": "serve-random", "w2": "prefix-warmup", "w3": "churn", "w4": "trace-replay"}

METRIC_LABELS = {
    "us_per_req": "µs/request",
    "ns_per_block": "ns/block",
    "total_s": "s total",
    "requests_per_s": "requests/s",
    "hit_ratio": "hit ratio",
}

S = TypeVar("S")


# --------------------------------------------------------------------------------------------
# Measuring.
# --------------------------------------------------------------------------------------------


class Runner:
    """Median ns of ``run(setup())`` over ``reps`` timed runs, after one untimed warm-up."""

    def __init__(self, reps: int) -> None:
        """Take ``reps`` (>= 1) timed runs per figure."""
        if reps < 1:
            raise ValueError(f"reps must be >= 1, got {reps}")
        self.reps = reps

    def measure(self, run: Callable[[S], object], setup: Callable[[], S]) -> float:
        """Median wall time of ``run(state)`` in ns; ``setup`` builds each run's state untimed."""
        times = []
        for _ in range(self.reps + 1):
            state = setup()
            gc.collect()
            t0 = time.perf_counter_ns()
            run(state)
            times.append(time.perf_counter_ns() - t0)
        return statistics.median(times[1:])  # times[0] is the warm-up


@dataclass(frozen=True)
class Sample:
    """One figure of one implementation. ``kind``: "time" (lower is better), "rate", "value"."""

    variant: str
    metric: str
    kind: str
    value: float


@dataclass
class Row:
    """One figure of a workload for every implementation that ran it."""

    variant: str
    metric: str
    kind: str
    values: dict[str, float] = field(default_factory=dict)

    def ratio(self) -> float | None:
        """How many times faster kvpool is than the reference (``None`` if not comparable)."""
        kv, ref = self.values.get("kvpool"), self.values.get("reference")
        if kv is None or ref is None or self.kind == "value" or kv <= 0 or ref <= 0:
            return None
        return ref / kv if self.kind == "time" else kv / ref


@dataclass
class WorkloadResult:
    """All rows of one workload, its fixed parameters, and the rows it skipped (with why)."""

    workload: str
    params: dict[str, Any]
    rows: list[Row] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)

    def add(self, impl: str, samples: Sequence[Sample]) -> None:
        """Merge ``impl``'s samples into the rows, keeping first-seen row order."""
        for s in samples:
            row = next((r for r in self.rows if (r.variant, r.metric) == (s.variant, s.metric)), None)
            if row is None:
                row = Row(s.variant, s.metric, s.kind)
                self.rows.append(row)
            row.values[impl] = s.value

    def to_dict(self, reps: int) -> dict[str, Any]:
        """The JSON object printed by ``kvpool bench --json`` for this workload."""
        results = []
        for row in self.rows:
            ratio = row.ratio()
            results.append(
                {
                    "variant": row.variant,
                    "metric": row.metric,
                    "kvpool": _round(row.values.get("kvpool")),
                    "reference": _round(row.values.get("reference")),
                    "ratio": _round(ratio),
                }
            )
        return {"workload": self.workload, "params": self.params, "reps": reps, "results": results,
                "skipped": self.skipped}


def _round(value: float | None) -> float | None:
    """``value`` to 6 significant digits (``None`` stays ``None``)."""
    return None if value is None else float(f"{value:.6g}")


# --------------------------------------------------------------------------------------------
# The hook for rows whose API does not exist yet.
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class OptionalVariant:
    """A row that needs ``requires`` on the implementation's module; skipped while it is missing.

    ``measure`` is ``None`` until the row is wired in; it then returns the row's samples.
    """

    requires: str
    measure: Callable[[Runner, Impl], list[Sample]] | None = None


# Rows that need an API beyond BlockPool; each is skipped (never faked) for an implementation
# whose module lacks it. Their `measure` functions are defined with the workloads below.
OPTIONAL_VARIANTS: dict[str, dict[str, OptionalVariant]] = {}


def _run_optional(workload: str, runner: Runner, impl: Impl, skipped: Skipped) -> list[Sample]:
    """The samples of ``workload``'s wired-in optional rows; notes the others in ``skipped``."""
    samples: list[Sample] = []
    for variant, optional in OPTIONAL_VARIANTS.get(workload, {}).items():
        if not impl.has(optional.requires):
            reason = f"no {optional.requires} in"
        elif optional.measure is None:
            reason = f"{optional.requires} not wired into kvpool.bench yet, for"
        else:
            samples += optional.measure(runner, impl)
            continue
        variants, modules = skipped.setdefault(reason, ([], []))
        variants += [variant] if variant not in variants else []
        modules += [impl.module.__name__] if impl.module.__name__ not in modules else []
    return samples


Skipped = dict[str, tuple[list[str], list[str]]]
"""Skipped optional rows: reason -> (variants, implementation modules)."""


def _skipped_notes(skipped: Skipped) -> list[str]:
    """One line per reason: the variants skipped and for which implementations."""
    return [f"{', '.join(variants)} ({reason} {', '.join(modules)})" for reason, (variants, modules) in skipped.items()]


# --------------------------------------------------------------------------------------------
# The workloads.
# --------------------------------------------------------------------------------------------

SR_REQUESTS, SR_TOKENS, SR_BLOCK_SIZE, SR_POOL = 100, 701, 16, 32_768
SR_BLOCKS = -(-SR_TOKENS // SR_BLOCK_SIZE)  # 44


def serve_random(runner: Runner, impl: Impl) -> list[Sample]:
    """W1: allocate and free 44-block requests with caching off (µs per request)."""
    pool = impl.pool_cls(SR_POOL, enable_caching=False, block_size=SR_BLOCK_SIZE)
    counts = np.full(SR_REQUESTS, SR_BLOCKS, dtype=np.int64)

    def per_request(p: PoolLike) -> None:
        for _ in range(SR_REQUESTS):
            blocks = p.get_new_blocks(SR_BLOCKS)
            p.free_blocks(blocks[::-1])  # the tail blocks first, as vLLM frees

    def batch(p: PoolLike) -> None:
        held = [p.get_new_blocks(SR_BLOCKS) for _ in range(SR_REQUESTS)]
        for blocks in held:
            p.free_blocks(blocks[::-1])

    def many(p: PoolLike) -> None:
        ids, offsets = p.get_new_blocks_many(counts)
        p.free_blocks_many(ids, offsets, reverse=True)

    variants = [("pool-per-request", per_request), ("pool-batch", batch), ("pool-many", many)]
    return [
        Sample(name, "us_per_req", "time", runner.measure(run, lambda: pool) / 1e3 / SR_REQUESTS)
        for name, run in variants
    ]


PW_REQUESTS, PW_SHARED, PW_UNIQUE, PW_BLOCK_SIZE, PW_POOL = 32, 1_000, 200, 16, 32_768
PW_BLOCKS = (PW_SHARED + PW_UNIQUE) // PW_BLOCK_SIZE  # 75
PW_MAX_HIT = (PW_SHARED + PW_UNIQUE - 1) // PW_BLOCK_SIZE  # hit capped at num_tokens - 1: 74


@cache
def _prefix_warmup_prompts() -> tuple[list[int], ...]:
    """The 32 prompts: the peer's 1,000 shared tokens, then 200 unique ones each."""
    prefix = [(t * 31 + 7) % 32_000 for t in range(PW_SHARED)]
    return tuple(prefix + [4001 + i * PW_UNIQUE + t for t in range(PW_UNIQUE)] for i in range(PW_REQUESTS))


@cache
def _prefix_warmup_hashes() -> tuple[list[bytes], ...]:
    """The 32 requests' vLLM ``sha256`` block hashes (75 each), computed once by kvpool."""
    from kvpool import BlockHasher

    hasher = BlockHasher(PW_BLOCK_SIZE, hash_algo="sha256")
    return tuple(hasher.hash_tokens(p).to_list() for p in _prefix_warmup_prompts())


def prefix_warmup(runner: Runner, impl: Impl) -> list[Sample]:
    """W2: cache a shared prefix on a cold pool, then hit it (µs per request per phase)."""
    hashes = [list(h) for h in _prefix_warmup_hashes()]

    def new_pool() -> PoolLike:
        return impl.pool_cls(PW_POOL, enable_caching=True, block_size=PW_BLOCK_SIZE)

    def pass1(pool: PoolLike) -> PoolLike:
        held = []
        for h in hashes:
            blocks = pool.get_new_blocks(PW_BLOCKS)
            pool.cache_full_blocks(blocks, h, 0, PW_BLOCKS)
            held.append(blocks)
        for blocks in held:
            pool.free_blocks(blocks[::-1])
        return pool

    def pass2(pool: PoolLike) -> None:
        held = []
        for h in hashes:
            hits = pool.find_longest_cache_hit(h, max_blocks=PW_MAX_HIT)
            pool.touch(hits)
            held.append(hits)
        for blocks in held:
            pool.free_blocks(blocks[::-1])

    return [
        Sample("pass1-pool-only", "us_per_req", "time", runner.measure(pass1, new_pool) / 1e3 / PW_REQUESTS),
        Sample("pass2", "us_per_req", "time", runner.measure(pass2, lambda: pass1(new_pool())) / 1e3 / PW_REQUESTS),
    ]


CH_POOL, CH_BATCH, CH_BLOCK_SIZE = 100_000, 64, 16
CH_CYCLE = (CH_POOL - 1) // CH_BATCH  # batches that use every free block once: 1562


def churn(runner: Runner, impl: Impl) -> list[Sample]:
    """W3: allocate 64, cache, free reversed; a filling cycle and an evicting one (ns per block)."""
    ids = np.arange(2 * CH_CYCLE * CH_BATCH, dtype=np.uint64).reshape(2 * CH_CYCLE, CH_BATCH)
    batches = [impl.hashes(row) for row in ids]

    def run(pool: PoolLike, part: Sequence[HashInput]) -> PoolLike:
        for h in part:
            blocks = pool.get_new_blocks(CH_BATCH)
            pool.cache_full_blocks(blocks, h, 0, CH_BATCH)
            pool.free_blocks(blocks[::-1])
        return pool

    def new_pool() -> PoolLike:
        return impl.pool_cls(CH_POOL, enable_caching=True, block_size=CH_BLOCK_SIZE)

    first, second = batches[:CH_CYCLE], batches[CH_CYCLE:]
    n = CH_CYCLE * CH_BATCH
    fill = runner.measure(lambda pool: run(pool, first), new_pool)
    evict = runner.measure(lambda pool: run(pool, second), lambda: run(new_pool(), first))
    samples = [
        Sample("first-cycle", "ns_per_block", "time", fill / n),
        Sample("evicting-cycle", "ns_per_block", "time", evict / n),
    ]
    # The evicting cycle again under key shapes that a weak table hash turns into one long
    # probe sequence (integers in wide keys) or a long duplicate chain (one key).
    shape_runner = Runner(max(1, runner.reps // 2))
    for shape in CH_KEY_SHAPES:
        keys = [churn_keys(shape, row) for row in ids]
        evict = shape_runner.measure(lambda pool: run(pool, keys[CH_CYCLE:]),
                                     lambda: run(new_pool(), keys[:CH_CYCLE]))
        samples.append(Sample(f"evicting-{shape}", "ns_per_block", "time", evict / n))
    return samples


CH_KEY_SHAPES = ("sha256", "int32-be", "int32-le", "one-key")
"""Key shapes of the churn's extra rows (the default rows use 8-byte integer ids)."""


def churn_keys(shape: str, ids: npt.NDArray[Any]) -> list[bytes]:
    """One batch's keys of ``shape`` for the integer ``ids``: SHA-256 digests of them, 32-byte
    big- or little-endian integers, or one fixed key for every block."""
    if shape == "sha256":
        return [hashlib.sha256(int(i).to_bytes(8, "little")).digest() for i in ids]
    if shape == "int32-be":
        return [int(i).to_bytes(32, "big") for i in ids]
    if shape == "int32-le":
        return [int(i).to_bytes(32, "little") for i in ids]
    if shape == "one-key":
        return [b"\x5a" * 32] * len(ids)
    raise ValueError(f"unknown key shape {shape!r}")


TR_POOL, TR_BLOCK_SIZE = 20_000, 512


def trace_replay(trace: Trace) -> Callable[[Runner, Impl], list[Sample]]:
    """W4 on ``trace``: replay it in a 20,000-block pool (total s, requests/s, hit ratio)."""

    def run(runner: Runner, impl: Impl) -> list[Sample]:
        hashes = truncate(prepare_hashes(trace, impl), TR_POOL - 1)
        hits: list[int] = []

        def go(pool: PoolLike) -> None:
            hits[:] = replay(pool, hashes)

        ns = runner.measure(go, lambda: impl.pool_cls(TR_POOL, enable_caching=True, block_size=TR_BLOCK_SIZE))
        seconds = ns / 1e9
        return [
            Sample("replay", "total_s", "time", seconds),
            Sample("replay", "requests_per_s", "rate", trace.num_requests / seconds),
            Sample("replay", "hit_ratio", "value", sum(hits) / max(trace.num_blocks, 1)),
        ]

    return run


# --------------------------------------------------------------------------------------------
# Rows through the hasher and the manager (skipped for an implementation without them).
# --------------------------------------------------------------------------------------------

HASH_ALGOS = ("sha256", "sha256_cbor", "xxhash", "xxhash_cbor")


def _tokens_for(impl: Impl, prompts: Sequence[list[int]]) -> list[Any]:
    """Prompts in the implementation's native form: int64 arrays for kvpool, lists otherwise."""
    if impl.name == "kvpool":
        return [np.asarray(p, dtype=np.int64) for p in prompts]
    return [list(p) for p in prompts]


def prefix_warmup_hashing(runner: Runner, impl: Impl) -> list[Sample]:
    """Hashing the 32 prompts (1,200 tokens, 75 blocks each) per algorithm, and pass 1 with it."""
    prompts = _tokens_for(impl, _prefix_warmup_prompts())
    samples = []
    for algo in HASH_ALGOS:
        try:
            hasher = impl.module.BlockHasher(PW_BLOCK_SIZE, hash_algo=algo)
        except ImportError:  # the reference's xxhash rows need the xxhash package
            continue
        ns = runner.measure(lambda h: [h.hash_tokens(p) for p in prompts], lambda: hasher)
        samples.append(Sample(f"hash-{algo}", "us_per_req", "time", ns / 1e3 / PW_REQUESTS))
    hasher = impl.module.BlockHasher(PW_BLOCK_SIZE, hash_algo="sha256_cbor")

    def pass1(pool: PoolLike) -> None:
        held = []
        for p in prompts:
            hashes = hasher.hash_tokens(p)
            blocks = pool.get_new_blocks(PW_BLOCKS)
            pool.cache_full_blocks(blocks, hashes, 0, PW_BLOCKS)
            held.append(blocks)
        for blocks in held:
            pool.free_blocks(blocks[::-1])

    ns = runner.measure(pass1, lambda: impl.pool_cls(PW_POOL, enable_caching=True, block_size=PW_BLOCK_SIZE))
    samples.append(Sample("pass1-with-sha256_cbor", "us_per_req", "time", ns / 1e3 / PW_REQUESTS))
    return samples


def _manager_with(impl: Impl, ids: Sequence[str], prompts: Sequence[Any], *, caching: bool, pool: int,
                  block_size: int, hash_algo: str = "sha256_cbor") -> Any:
    """A manager with the requests added (their prompts hashed) outside any clock."""
    mgr = impl.module.KVCacheManager(pool, block_size, enable_caching=caching, hash_algo=hash_algo)
    for rid, p in zip(ids, prompts):
        mgr.add_request(rid, p)
    return mgr


def serve_random_manager(runner: Runner, impl: Impl) -> list[Sample]:
    """W1 through the manager: prefill all, one decode token each, free all (µs per request).

    ``manager-per-request`` makes the calls vLLM's scheduler makes, one request at a time;
    ``manager-step`` hands each phase over in one batched call.
    """
    ids = [f"w1-{i}" for i in range(SR_REQUESTS)]
    prompts = _tokens_for(impl, [[(i * 7919 + t) % 32_000 for t in range(SR_TOKENS - 1)] for i in range(SR_REQUESTS)])
    ones = np.ones(SR_REQUESTS, dtype=np.int64)

    def setup() -> Any:
        return _manager_with(impl, ids, prompts, caching=False, pool=SR_POOL, block_size=SR_BLOCK_SIZE)

    def per_request(mgr: Any) -> None:
        for rid in ids:
            mgr.allocate_slots(rid, SR_TOKENS - 1)
        for rid in ids:
            mgr.append_token_ids(rid, [1])
            mgr.allocate_slots(rid, 1)
        for rid in ids:
            mgr.free(rid)

    def step(mgr: Any) -> None:
        mgr.schedule_step(ids, SR_TOKENS - 1)
        mgr.append_token_ids_many(ids, ones)
        mgr.schedule_step(ids, 1)
        mgr.free_many(ids)

    return [
        Sample("manager-per-request", "us_per_req", "time", runner.measure(per_request, setup) / 1e3 / SR_REQUESTS),
        Sample("manager-step", "us_per_req", "time", runner.measure(step, setup) / 1e3 / SR_REQUESTS),
    ]


def prefix_warmup_manager(runner: Runner, impl: Impl) -> list[Sample]:
    """W2 through the manager, as a scheduler calls it (µs per request), prompts hashed at add.

    Cold: a fresh cache, requests one by one (request 2 on hits what request 1 cached); warm:
    the same requests again after a cold pass. Then all are freed.
    """
    ids = [f"w2-{i}" for i in range(PW_REQUESTS)]
    prompts = _tokens_for(impl, _prefix_warmup_prompts())
    num_tokens = PW_SHARED + PW_UNIQUE

    def schedule(mgr: Any) -> Any:
        for rid in ids:
            hits, n_hit = mgr.get_computed_blocks(rid)
            mgr.allocate_slots(rid, num_tokens - n_hit, num_new_computed_tokens=n_hit, new_computed_blocks=hits)
        for rid in ids:
            mgr.free(rid)
        return mgr

    def cold() -> Any:
        return _manager_with(impl, ids, prompts, caching=True, pool=PW_POOL, block_size=PW_BLOCK_SIZE)

    def warm() -> Any:
        mgr = schedule(cold())
        for rid, p in zip(ids, prompts):
            mgr.add_request(rid, p)
        return mgr

    def step(mgr: Any) -> None:
        mgr.schedule_step(ids, num_tokens)
        mgr.free_many(ids)

    return [
        Sample("manager-cold", "us_per_req", "time", runner.measure(schedule, cold) / 1e3 / PW_REQUESTS),
        Sample("manager-warm", "us_per_req", "time", runner.measure(schedule, warm) / 1e3 / PW_REQUESTS),
        Sample("manager-step-warm", "us_per_req", "time", runner.measure(step, warm) / 1e3 / PW_REQUESTS),
    ]


OPTIONAL_VARIANTS.update({
    "serve-random": {"manager": OptionalVariant("KVCacheManager", serve_random_manager)},
    "prefix-warmup": {
        "hashing": OptionalVariant("BlockHasher", prefix_warmup_hashing),
        "manager": OptionalVariant("KVCacheManager", prefix_warmup_manager),
    },
})


# --------------------------------------------------------------------------------------------
# Running and printing.
# --------------------------------------------------------------------------------------------


def resolve_names(text: str | None) -> list[str]:
    """Workload names from a comma list (names or W1..W4, any case); all when ``None``.

    Raises ``ValueError`` naming the unknown entries.
    """
    if text is None:
        return list(WORKLOADS)
    wanted = [t.strip().lower() for t in text.split(",") if t.strip()]
    names = [ALIASES.get(t, t) for t in wanted]
    unknown = [t for t, n in zip(wanted, names) if n not in WORKLOADS]
    if unknown or not names:
        raise ValueError(
            f"unknown workload {', '.join(map(repr, unknown)) or '(none given)'}; "
            f"choose from {', '.join(WORKLOADS)} (or W1..W4)"
        )
    return [w for w in WORKLOADS if w in names]


def _params(name: str, trace: Trace) -> dict[str, Any]:
    """The fixed parameters of workload ``name``, for the JSON output."""
    if name == "serve-random":
        return {"requests": SR_REQUESTS, "blocks_per_req": SR_BLOCKS, "block_size": SR_BLOCK_SIZE,
                "pool_blocks": SR_POOL, "caching": False}
    if name == "prefix-warmup":
        return {"requests": PW_REQUESTS, "blocks_per_req": PW_BLOCKS, "block_size": PW_BLOCK_SIZE,
                "pool_blocks": PW_POOL, "max_hit_blocks": PW_MAX_HIT,
                "hashes": "sha256, precomputed for the pool-only rows"}
    if name == "churn":
        return {"pool_blocks": CH_POOL, "batch": CH_BATCH, "blocks_per_cycle": CH_CYCLE * CH_BATCH,
                "block_size": CH_BLOCK_SIZE}
    return {"trace": trace.name, "requests": trace.num_requests, "blocks": trace.num_blocks,
            "pool_blocks": TR_POOL, "block_size": TR_BLOCK_SIZE}


def run_bench(
    names: Sequence[str],
    impls: Sequence[Impl],
    *,
    reps: int = DEFAULT_REPS,
    trace: Trace,
    log: Callable[[str], None] | None = None,
) -> list[WorkloadResult]:
    """Run the named workloads through each implementation; ``log`` hears what starts."""
    runner = Runner(reps)
    runs: dict[str, Callable[[Runner, Impl], list[Sample]]] = {
        "serve-random": serve_random, "prefix-warmup": prefix_warmup, "churn": churn,
        "trace-replay": trace_replay(trace),
    }
    results = []
    for name in names:
        result = WorkloadResult(name, _params(name, trace))
        skipped: Skipped = {}
        for impl in impls:
            if log is not None:
                log(f"{name}: {impl.name}")
            result.add(impl.name, runs[name](runner, impl) + _run_optional(name, runner, impl, skipped))
        result.skipped = _skipped_notes(skipped)
        if name in ("churn", "trace-replay"):
            result.params["hash_input"] = {i.name: "uint64 array" if i.int_hashes else "8-byte bytes list" for i in impls}
        results.append(result)
    return results


def _fmt(value: float | None) -> str:
    """A figure with about four significant digits, ``-`` for none."""
    if value is None:
        return "-"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    if abs(value) >= 100:
        return f"{value:.1f}"
    if abs(value) >= 10:
        return f"{value:.2f}"
    return f"{value:.3f}" if abs(value) >= 1 else f"{value:.4f}"


def _ratio_text(row: Row) -> str:
    """The ratio column: ``12.3x`` faster, ``same``/``DIFFERS`` for plain values, else ``-``."""
    ratio = row.ratio()
    if ratio is not None:
        return f"{ratio:.1f}x"
    if row.kind == "value" and len(row.values) == 2:
        a, b = row.values.values()
        return "same" if abs(a - b) < 1e-12 else "DIFFERS"
    return "-"


def format_table(results: Sequence[WorkloadResult]) -> str:
    """The results as a text table; ratio = how many times faster kvpool is than the reference."""
    header = ("workload", "variant", "metric", "kvpool", "reference", "ratio")
    lines = [header]
    for result in results:
        for row in result.rows:
            lines.append((result.workload, row.variant, METRIC_LABELS.get(row.metric, row.metric),
                          _fmt(row.values.get("kvpool")), _fmt(row.values.get("reference")), _ratio_text(row)))
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    out = []
    for line in lines:
        cells = [c.ljust(w) if i < 3 else c.rjust(w) for i, (c, w) in enumerate(zip(line, widths))]
        out.append("  ".join(cells).rstrip())
    out.insert(1, "-" * len(out[0]))
    for result in results:
        out += [f"skipped in {result.workload}: {note}" for note in result.skipped]
    return "\n".join(out)
