#!/usr/bin/env python3
"""kvpool against vLLM 0.33's own classes, in one process, runs interleaved.

vLLM's ``BlockPool``, ``KVCacheManager`` and block hasher are loaded unchanged from the
vLLM wheel by the shared peer benchmark (``vllm_blockpool_peer.py``, which needs no torch);
each workload then runs vLLM and kvpool in alternating order, ``--rounds`` times, every run
on fresh state built outside the clock, with ``gc.collect()`` before it. The figures are the
medians per side; the ratio (how many times faster kvpool is) is the median of each round's
own ratio, with its quartiles. Machines are noisy: interleaving puts both sides under the same
noise, and pairing each round's two runs keeps a machine that speeds up or slows down between
rounds (these share their cores with others) from moving the ratio.

Workloads (``--only`` takes their names):

* ``alloc``: 100 requests of 44 blocks, caching off, pool 32,768: allocate, free tail first.
  kvpool with the caller's ``ids[::-1]``, with ``free_blocks(ids, reverse=True)``, and a step
  of 100 requests in one ``get_new_blocks_many`` / ``free_blocks_many`` call each (against
  vLLM's 100 calls each).
* ``churn``: 100,000-block pool, allocate 64, cache them under 64 new keys, free reversed;
  a first cycle over the pool, then an evicting one. Key shapes: SHA-256 digests, 32-byte
  big- and little-endian integers, 8-byte integers (a numpy ``uint64`` array for kvpool,
  8-byte big-endian bytes for vLLM), and one key under every block.
* ``replay``: the Mooncake conversation trace, 20,000 blocks of 512 tokens, keys
  ``h.to_bytes(32, "big")``.
* ``manager``: 100 requests of 700 prompt tokens + 1 decoded, caching off: vLLM's manager
  (allocate_slots for each prefill, one decode token each, free) against kvpool's manager with
  ``add_request`` counted: the prompt as a list (copied as it is read; with caching off kvpool
  neither hashes nor type-checks its items), one call per request and with ``schedule_step``,
  and as an int64 array (only measured).
* ``hash``: 32 prompts of 1,200 tokens (75 blocks) from lists, every hash algorithm: kvpool
  returning vLLM's output, a list of ``bytes`` (``hash_blocks_from``, checked equal to vLLM's
  hashes), and keeping the hashes in Rust (``hash_tokens``'s ``BlockHashList``, what kvpool's
  own manager uses).

The short workloads (alloc, manager, hash) time 10 passes back to back per run, each on fresh
state, after one untimed pass, so that they measure steady state rather than the caches
``gc.collect()`` left cold (see ``Race.run``; ``--cold`` drops the untimed pass); churn and
replay are long enough alone.

Usage: ``python benches/vs_vllm.py [--rounds 7] [--only alloc,churn] [--cold] [--json]``; the wheel is
``--wheel``, else ``$VLLM_WHEEL``, else downloaded by the peer into its cache.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

# numpy's OpenBLAS threads can spin on a core (nothing here calls BLAS); on a two-core
# machine they compete with the timed thread. Set before numpy is imported.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402

import kvpool  # noqa: E402
from kvpool.bench import churn_keys as bench_churn_keys  # noqa: E402
from kvpool.simulate import replay as kvpool_replay  # noqa: E402
from module_files import load_module  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_PEER = ROOT.parent / "shared" / "peers" / "vllm_blockpool_peer.py"
DEFAULT_TRACE = ROOT.parent / "shared" / "traces" / "conversation_trace.jsonl"
WORKLOADS = ("alloc", "churn", "replay", "manager", "hash")
REPEAT = 10
"""Passes per timed run of the short workloads (alloc, manager, hash): see :meth:`Race.run`."""


def load_peer(path: Path) -> Any:
    """The shared peer benchmark as a module (it holds the vLLM loader)."""
    return load_module("vllm_blockpool_peer", path)


def quartiles(values: list[float]) -> tuple[float, float]:
    """The first and third quartiles of ``values`` (its ends when there are fewer than 4)."""
    if len(values) < 4:
        return min(values), max(values)
    q = statistics.quantiles(values, n=4)
    return q[0], q[2]


class Race:
    """Interleaved timing: each round runs every contestant once, the order alternating."""

    def __init__(self, rounds: int, warm: bool = True) -> None:
        self.rounds = rounds
        self.warm = warm
        self.rows: list[dict[str, Any]] = []

    def run(self, workload: str, variant: str, unit: str, per: float,
            contestants: dict[str, tuple[Callable[[Any], object], Callable[[], Any]]],
            baseline: str = "vllm", repeat: int = 1) -> None:
        """Time ``run(state)`` over ``repeat`` states from ``setup()``, back to back, for each
        contestant; record medians in ``unit`` (ns / (per * repeat)).

        ``repeat`` > 1 measures a short workload in steady state: one pass alone would mostly
        time cold caches, and unevenly, since vLLM's passes evict kvpool's data (thousands of
        Python objects) while kvpool's leave vLLM's in place. For the same reason such a run
        starts with one untimed pass on a state of its own, unless the race is not ``warm``:
        ``gc.collect()`` walks every Python object and leaves a kvpool step's few hundred kB
        of pool state out of cache (a 12 µs step then times 15-20 µs), which vLLM's 900 µs
        step hardly notices.
        """
        names = list(contestants)
        times: dict[str, list[float]] = {n: [] for n in names}
        for r in range(self.rounds + 1):  # round 0 warms up and is dropped
            order = names if r % 2 == 0 else names[::-1]
            for name in order:
                run, setup = contestants[name]
                states = [setup() for _ in range(repeat)]
                gc.collect()
                if repeat > 1 and self.warm:
                    run(setup())
                t0 = time.perf_counter_ns()
                for state in states:
                    run(state)
                elapsed = time.perf_counter_ns() - t0
                if r:
                    times[name].append(elapsed / per / repeat)
        medians = {n: statistics.median(t) for n, t in times.items()}
        for name in names:
            if name == baseline:
                continue
            # The ratio is the median of each round's ratio: both runs of a round are
            # back to back, so a machine that speeds up or slows down between rounds
            # (these share their cores) moves both alike.
            ratios = sorted(b / k for b, k in zip(times[baseline], times[name]))
            self.rows.append(dict(
                workload=workload, variant=f"{variant}: {name}" if len(names) > 2 else variant,
                unit=unit, vllm=round(medians[baseline], 3), kvpool=round(medians[name], 3),
                ratio=round(statistics.median(ratios), 2),
                ratio_quartiles=[round(q, 2) for q in quartiles(ratios)],
                rounds=self.rounds, repeat=repeat))

    def table(self) -> str:
        """The rows as an aligned text table."""
        head = ("workload", "variant", "unit", "vLLM 0.33", "kvpool", "ratio", "quartiles")
        lines = [head] + [(r["workload"], r["variant"], r["unit"], f"{r['vllm']:,.3f}",
                           f"{r['kvpool']:,.3f}", f"{r['ratio']:.1f}x",
                           "{:.1f}-{:.1f}x".format(*r["ratio_quartiles"])) for r in self.rows]
        widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
        out = ["  ".join(c.ljust(w) if i < 3 else c.rjust(w)
                         for i, (c, w) in enumerate(zip(line, widths))) for line in lines]
        out.insert(1, "-" * len(out[0]))
        return "\n".join(out)


# ------------------------------------------------------------------------------- workloads


def race_alloc(v: Any, race: Race) -> None:
    n_req, per_req, pool_blocks = 100, 44, 32_768
    vpool = v.BlockPool(pool_blocks, enable_caching=False, hash_block_size=16)
    kpool = kvpool.BlockPool(pool_blocks, enable_caching=False, block_size=16)
    counts = np.full(n_req, per_req, dtype=np.int64)

    def vllm_per_request(_: Any) -> None:
        for _ in range(n_req):
            blocks = vpool.get_new_blocks(per_req)
            vpool.free_blocks(reversed(blocks))

    def vllm_step(_: Any) -> None:
        held = [vpool.get_new_blocks(per_req) for _ in range(n_req)]
        for blocks in held:
            vpool.free_blocks(reversed(blocks))

    def kv_view(_: Any) -> None:
        for _ in range(n_req):
            ids = kpool.get_new_blocks(per_req)
            kpool.free_blocks(ids[::-1])

    def kv_reverse(_: Any) -> None:
        for _ in range(n_req):
            kpool.free_blocks(kpool.get_new_blocks(per_req), reverse=True)

    def kv_step(_: Any) -> None:
        ids, offsets = kpool.get_new_blocks_many(counts)
        kpool.free_blocks_many(ids, offsets, reverse=True)

    none = lambda: None  # noqa: E731
    race.run("alloc 44 + free", "per request", "µs/request", n_req * 1e3, {
        "vllm": (vllm_per_request, none), "free_blocks(ids[::-1])": (kv_view, none),
        "free_blocks(ids, reverse=True)": (kv_reverse, none)}, repeat=REPEAT)
    race.run("alloc 44 + free", "step of 100 requests, one call each", "µs/request", n_req * 1e3,
             {"vllm": (vllm_step, none), "kvpool": (kv_step, none)}, repeat=REPEAT)


KEY_SHAPES = ("sha256", "int32-be", "int32-le", "int8", "one-key")
"""``kvpool bench``'s churn key shapes and 8-byte integer ids."""


def churn_keys(shape: str, n: int) -> tuple[list[Any], list[Any]]:
    """``n`` keys of ``shape``, as vLLM and as kvpool take them (one list per 64-block batch).

    The shapes are ``kvpool bench``'s (:func:`kvpool.bench.churn_keys`), plus ``int8``: integer
    ids, a numpy ``uint64`` array for kvpool (each id its 8-byte big-endian form) and those
    8-byte ``bytes`` for vLLM."""
    batches = [np.arange(i, min(i + 64, n), dtype=np.uint64) for i in range(0, n, 64)]
    if shape == "int8":
        return [[int(i).to_bytes(8, "big") for i in b] for b in batches], batches
    keys = [bench_churn_keys(shape, b) for b in batches]
    return keys, keys


def check_churn_alike(v: Any, shape: str, pool_blocks: int = 2_001, batch: int = 64) -> None:
    """The churn on a small pool, untimed: both pools hand out the same blocks in the same
    order, every batch, and end with the same free and cached counts."""
    cycle = (pool_blocks - 1) // batch
    vkeys, kkeys = churn_keys(shape, 3 * cycle * batch)
    vpool = v.BlockPool(pool_blocks, enable_caching=True, hash_block_size=16)
    kpool = kvpool.BlockPool(pool_blocks, enable_caching=True, block_size=16)
    for vk, kk in zip(vkeys, kkeys):
        vblocks = vpool.get_new_blocks(batch)
        kblocks = kpool.get_new_blocks(batch)
        if [b.block_id for b in vblocks] != kblocks.tolist():
            raise SystemExit(f"churn, {shape} keys: kvpool handed out other blocks than vLLM")
        vpool.cache_full_blocks(v.peer.hashes_only(vk), vblocks, 0, batch, 16, 0)
        kpool.cache_full_blocks(kblocks, kk, 0, batch)
        vpool.free_blocks(reversed(vblocks))
        kpool.free_blocks(kblocks, reverse=True)
    if vpool.get_num_free_blocks() != kpool.get_num_free_blocks():
        raise SystemExit(f"churn, {shape} keys: the free counts differ")


def race_churn(v: Any, race: Race, shapes: tuple[str, ...] = KEY_SHAPES) -> None:
    pool_blocks, batch, block_size = 100_000, 64, 16
    cycle = (pool_blocks - 1) // batch
    n = cycle * batch
    for shape in shapes:
        check_churn_alike(v, shape)
        vkeys, kkeys = churn_keys(shape, 2 * n)
        vreqs = [v.peer.hashes_only(k) for k in vkeys]

        def vllm_churn(state: tuple[Any, list[Any]]) -> None:
            pool, reqs = state
            for req in reqs:
                blocks = pool.get_new_blocks(batch)
                pool.cache_full_blocks(req, blocks, 0, batch, block_size, 0)
                pool.free_blocks(reversed(blocks))

        def kv_churn(state: tuple[Any, list[Any]]) -> None:
            pool, keys = state
            for k in keys:
                blocks = pool.get_new_blocks(batch)
                pool.cache_full_blocks(blocks, k, 0, batch)
                pool.free_blocks(blocks, reverse=True)

        def vnew() -> Any:
            return v.BlockPool(pool_blocks, enable_caching=True, hash_block_size=block_size)

        def knew() -> Any:
            return kvpool.BlockPool(pool_blocks, enable_caching=True, block_size=block_size)

        def vfilled() -> tuple[Any, list[Any]]:
            pool = vnew()
            vllm_churn((pool, vreqs[:cycle]))
            return pool, vreqs[cycle:]

        def kfilled() -> tuple[Any, list[Any]]:
            pool = knew()
            kv_churn((pool, kkeys[:cycle]))
            return pool, kkeys[cycle:]

        race.run(f"churn, {shape} keys", "first cycle", "ns/block", n, {
            "vllm": (vllm_churn, lambda: (vnew(), vreqs[:cycle])),
            "kvpool": (kv_churn, lambda: (knew(), kkeys[:cycle]))})
        race.run(f"churn, {shape} keys", "evicting cycle", "ns/block", n, {
            "vllm": (vllm_churn, vfilled), "kvpool": (kv_churn, kfilled)})


def race_replay(v: Any, race: Race, trace_path: Path) -> None:
    if not trace_path.exists():
        print(f"replay: no trace at {trace_path}, skipped", file=sys.stderr)
        return
    pool_blocks, block_size = 20_000, 512
    with open(trace_path) as f:
        ids = [json.loads(line)["hash_ids"] for line in f if line.strip()]
    keys = [[h.to_bytes(32, "big") for h in req][: pool_blocks - 1] for req in ids]
    vreqs = [v.peer.hashes_only(k) for k in keys]
    spec = v.peer.attention_spec(v, block_size)
    hits: dict[str, int] = {}

    def vllm_replay(pool: Any) -> None:
        total = 0
        for req in vreqs:
            n = len(req.block_hashes)
            cached = v.peer.longest_hit(v, spec, pool, req.block_hashes, n * block_size)
            pool.touch(cached)
            blocks = cached + pool.get_new_blocks(n - len(cached))
            pool.cache_full_blocks(req, blocks, len(cached), n, block_size, 0)
            pool.free_blocks(reversed(blocks))
            total += len(cached)
        hits["vllm"] = total

    def kv_replay(pool: Any) -> None:
        hits["kvpool"] = sum(kvpool_replay(pool, keys))

    race.run("replay conversation trace, 32-byte big-endian keys", "20,000 blocks", "s", 1e9, {
        "vllm": (vllm_replay, lambda: v.BlockPool(pool_blocks, enable_caching=True,
                                                  hash_block_size=block_size)),
        "kvpool": (kv_replay, lambda: kvpool.BlockPool(pool_blocks, enable_caching=True,
                                                       block_size=block_size))})
    if hits["vllm"] != hits["kvpool"]:
        raise SystemExit(f"replay hit counts differ: {hits}")


def manager_requests(mgr: Any, rids: list[str], prompts: list[Any]) -> None:
    """kvpool's side of the manager row: each request added and its prompt allocated, then one
    decode token each (appended, then allocated), then each freed; the calls vLLM's scheduler
    makes, one request at a time (``benches/instructions.py manager`` counts the same)."""
    for rid, p in zip(rids, prompts):
        mgr.add_request(rid, p)
        mgr.allocate_slots(rid, len(p))
    for rid in rids:
        mgr.append_token_ids(rid, [1])
        mgr.allocate_slots(rid, 1)
    for rid in rids:
        mgr.free(rid)


def race_manager(v: Any, race: Race) -> None:
    n_req, n_tokens, block_size, pool_blocks = 100, 701, 16, 32_768
    prompts = [[(i * 7919 + t) % 32_000 for t in range(n_tokens - 1)] for i in range(n_req)]
    rids = [f"w1-{i}" for i in range(n_req)]
    ones = np.ones(n_req, dtype=np.int64)

    def vsetup() -> Any:
        mgr = v.peer.make_manager(v, pool_blocks, block_size, caching=False)
        return mgr, [v.peer.make_request(v, rid, p) for rid, p in zip(rids, prompts)]

    def vllm_run(state: Any) -> None:
        mgr, reqs = state
        for req in reqs:
            mgr.allocate_slots(req, req.num_tokens)
        for req in reqs:
            req.num_computed_tokens = req.num_tokens
            req.append_output_token_ids(1)
            mgr.allocate_slots(req, 1)
        for req in reqs:
            mgr.free(req)

    def ksetup() -> Any:
        return kvpool.KVCacheManager(pool_blocks, block_size, enable_caching=False)

    def kv_per_request(prompt_forms: list[Any]) -> Callable[[Any], None]:
        """The scheduler's calls one request at a time, the prompts given as ``prompt_forms``."""
        return lambda mgr: manager_requests(mgr, rids, prompt_forms)

    arrays = [np.asarray(p, dtype=np.int64) for p in prompts]

    def kv_step(mgr: Any) -> None:
        for rid, p in zip(rids, prompts):
            mgr.add_request(rid, p)
        mgr.schedule_step(rids, n_tokens - 1)
        mgr.append_token_ids_many(rids, ones)
        mgr.schedule_step(rids, 1)
        mgr.free_many(rids)

    race.run("manager, 700-token requests, add_request counted", "prefill, decode, free",
             "µs/request", n_req * 1e3, {
                 "vllm": (vllm_run, vsetup), "one call per request": (kv_per_request(prompts), ksetup),
                 "schedule_step": (kv_step, ksetup),
                 "one call per request, prompts as int64 arrays": (kv_per_request(arrays), ksetup)},
             repeat=REPEAT)


def race_hash(v: Any, race: Race) -> None:
    block_size, n_req = 16, 32
    prefix = [(t * 31 + 7) % 32_000 for t in range(1000)]
    prompts = [prefix + [4001 + i * 200 + t for t in range(200)] for i in range(n_req)]
    for algo in ("sha256", "sha256_cbor", "xxhash", "xxhash_cbor"):
        if algo.startswith("xxhash") and v.hashing._xxhash is None:
            continue
        hash_fn = v.hashing.get_hash_fn_by_name(algo)
        v.utils.init_none_hash(hash_fn)
        vhasher = v.utils.get_request_block_hasher(block_size, hash_fn)
        khasher = kvpool.BlockHasher(block_size, hash_algo=algo)
        none_hash = bytes(v.utils.NONE_HASH)

        def vrun(reqs: list[Any]) -> None:
            for req in reqs:
                vhasher(req)

        def krun_list(_: Any) -> None:
            for p in prompts:
                khasher.hash_blocks_from(none_hash, p, 0)

        def krun_kept(_: Any) -> None:
            for p in prompts:
                khasher.hash_tokens(p)

        # Both sides make the same hashes (checked untimed; vLLM's first parent is its
        # NONE_HASH, random per process for the xxhash algorithms, given to kvpool as is).
        expected = [bytes(h) for h in vhasher(v.peer.make_request(v, "check", prompts[0]))]
        if khasher.hash_blocks_from(none_hash, prompts[0], 0) != expected:
            raise SystemExit(f"{algo}: kvpool's block hashes differ from vLLM's")
        race.run("hash 1,200 tokens from a list", algo, "µs/request", n_req * 1e3, {
            "vllm": (vrun, lambda: [v.peer.make_request(v, f"h{i}", p) for i, p in enumerate(prompts)]),
            "list of bytes, as vLLM's": (krun_list, lambda: None),
            "kept in Rust (BlockHashList)": (krun_kept, lambda: None)}, repeat=REPEAT)


def check_prerequisites(args: argparse.Namespace) -> None:
    """Say what is missing before anything runs: the peer's ``msgspec``, the peer file, and the
    wheel (a 336 MB download when neither ``--wheel`` nor ``$VLLM_WHEEL`` nor the cache has it)."""
    try:
        importlib.import_module("msgspec")
    except ImportError:
        raise SystemExit("the vLLM peer needs msgspec: pip install msgspec (or pip install 'kvpool[wire]')") from None
    if not args.peer.is_file():
        raise SystemExit(f"the vLLM peer benchmark {args.peer} is missing (set --peer or $KVPOOL_VLLM_PEER)")
    wheel = args.wheel or os.environ.get("VLLM_WHEEL")
    if wheel:
        if not Path(wheel).is_file():
            raise SystemExit(f"vLLM wheel {wheel} does not exist")
        return
    cache = Path(os.environ.get("VLLM_PEER_CACHE", Path(tempfile.gettempdir()) / "vllm_peer_cache"))
    if list(cache.glob("vllm-0.33.0-*.whl")):
        return
    if args.no_download:
        raise SystemExit(f"no vLLM 0.33.0 wheel: pass --wheel, set $VLLM_WHEEL, or drop --no-download to fetch it into {cache}")
    print(f"no --wheel or $VLLM_WHEEL: downloading the vLLM 0.33.0 wheel (336 MB) into {cache}; "
          "later runs reuse it", file=sys.stderr)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--peer", type=Path, default=Path(os.environ.get("KVPOOL_VLLM_PEER", DEFAULT_PEER)),
                    help="the shared vLLM peer benchmark (default: %(default)s)")
    ap.add_argument("--wheel", help="vLLM 0.33.0 wheel (default: $VLLM_WHEEL, else the peer downloads it)")
    ap.add_argument("--rounds", type=int, default=7, help="interleaved timed rounds per figure")
    ap.add_argument("--only", default=",".join(WORKLOADS), help="comma list of workloads")
    ap.add_argument("--shapes", default=",".join(KEY_SHAPES), help="key shapes for churn")
    ap.add_argument("--trace", type=Path, default=DEFAULT_TRACE, help="Mooncake trace for replay")
    ap.add_argument("--json", action="store_true", help="one JSON object per row")
    ap.add_argument("--cold", action="store_true",
                    help="no untimed pass before the short workloads' runs (see Race.run)")
    ap.add_argument("--no-download", action="store_true",
                    help="fail instead of downloading the vLLM wheel when none is given or cached")
    args = ap.parse_args()
    check_prerequisites(args)
    peer = load_peer(args.peer)
    v, _digests = peer.load_vllm(peer.find_wheel(args.wheel))
    v.peer = peer
    race = Race(args.rounds, warm=not args.cold)
    chosen = [w.strip() for w in args.only.split(",") if w.strip()]
    for name in chosen:
        if name not in WORKLOADS:
            raise SystemExit(f"unknown workload {name!r}; choose from {', '.join(WORKLOADS)}")
    print(f"vLLM {peer.VLLM_VERSION} and kvpool {kvpool.__version__}, Python {sys.version.split()[0]}, "
          f"{args.rounds} interleaved rounds", file=sys.stderr)
    for name in chosen:
        print(f"{name} ...", file=sys.stderr, flush=True)
        if name == "alloc":
            race_alloc(v, race)
        elif name == "churn":
            race_churn(v, race, tuple(s.strip() for s in args.shapes.split(",")))
        elif name == "replay":
            race_replay(v, race, args.trace)
        elif name == "manager":
            race_manager(v, race)
        else:
            race_hash(v, race)
    if args.json:
        for row in race.rows:
            print(json.dumps(row))
    else:
        print(race.table())


if __name__ == "__main__":
    main()
