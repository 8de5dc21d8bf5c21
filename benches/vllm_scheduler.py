"""vLLM 0.33's real scheduler on CPU, with vLLM's KV-cache manager and with kvpool's.

Drives ``Scheduler.schedule()`` and ``update_from_output()`` with fake model outputs (one
sampled token per request whose prefill is done), as vLLM's own tests do, on:

- serving: N requests of 700 random tokens, 1 output token, prefix caching off, token
  budgets 2,048 and 8,192 (the workload where the block pool was measured at 51-62% of the
  scheduler loop), at N = 100 and 1,000;
- warm-up: 100 requests sharing a 624-token prefix plus 16-64 unique tokens, prefix caching
  on, budget 2,048, 200 output tokens each (a chunked, prefix-sharing warm-up batch).

Runs alternate between the two managers (interleaved, one process). Each run freezes the
garbage collector's heap once its scheduler is built, as vLLM's ``EngineCore`` does at
startup, so that collections during the steps do not walk torch's and vLLM's startup
objects. Plain rounds time the
whole step; instrumented rounds also time every outermost call into the manager (and its
block pool), less the timer's own cost per call, which gives the share of the step spent in
KV-cache management. Prints scheduler µs per step
and that share, each way, and the ratio.

    cd ../shared/vllm-tests && VLLM_TARGET_DEVICE=cpu HF_HOME=$PWD/hf_home HF_HUB_OFFLINE=1 \\
        python /path/to/kvpool/benches/vllm_scheduler.py [--rounds 5] [--quick]

(needs vLLM's ``tests`` package on the path for its ``create_scheduler`` helper).
"""

from __future__ import annotations

import argparse
import functools
import gc
import random
import statistics
import sys
import time
from typing import Any


def make_workload(kind: str, n: int, seed: int = 0) -> list[tuple[str, list[int], int]]:
    rng = random.Random(seed)
    if kind == "serving":
        return [(f"r{i}", [rng.randrange(1, 50_000) for _ in range(700)], 1) for i in range(n)]
    prefix = [rng.randrange(1, 50_000) for _ in range(624)]
    return [(f"r{i}", prefix + [rng.randrange(1, 50_000) for _ in range(rng.randint(16, 64))], 200)
            for i in range(n)]


class Timed:
    """Wraps the manager's (and its block pool's) methods to add their time to ``total``;
    only the outermost call is counted, so a pool call made by the manager is not counted
    twice. ``overhead`` adds up what the wrapper itself put inside each timed interval
    (``OVERHEAD_NS``, by the call's number of keyword arguments), to be subtracted."""

    def __init__(self, overhead_ns: list[float] | None = None) -> None:
        self.total = 0
        self.overhead = 0.0
        self.depth = 0
        self.calls = 0
        #: per method name: [calls, ns, overhead ns]
        self.by_name: dict[str, list[float]] = {}
        self._overhead_ns = overhead_ns if overhead_ns is not None else OVERHEAD_NS

    def wrap(self, obj: Any) -> None:
        for name in dir(type(obj)):
            if name.startswith("_"):
                continue
            attr = getattr(type(obj), name, None)
            if callable(attr) and not isinstance(attr, type):
                setattr(obj, name, self._timed(getattr(obj, name), name))

    def _timed(self, fn: Any, name: str) -> Any:
        clock = time.perf_counter_ns
        slot = self.by_name.setdefault(name, [0, 0, 0.0])
        overhead_ns = self._overhead_ns
        last = len(overhead_ns) - 1
        shadow = "".format

        @functools.wraps(fn)
        def call(*args: Any, **kwargs: Any) -> Any:
            if self.depth:
                return fn(*args, **kwargs)
            self.depth += 1
            self.calls += 1
            if IN_SITU:
                # The wrapper's cost here and now: the same interval around a no-op
                # called alike, in the caches the real call meets.
                t = clock()
                shadow(*args, **kwargs)
                over = clock() - t
            else:
                over = overhead_ns[min(len(kwargs), last)]
            t = clock()
            try:
                return fn(*args, **kwargs)
            finally:
                dt = clock() - t
                self.total += dt
                self.overhead += over
                slot[0] += 1
                slot[1] += dt
                slot[2] += over
                self.depth -= 1

        return call


def timer_overhead_ns(max_kwargs: int = 14) -> list[float]:
    """What one timed call adds to its own interval, by its number of keyword arguments:
    the interval measured around ``"".format``, a C function that takes any arguments and
    does next to nothing, wrapped and called as the scheduler calls the manager (one
    positional argument and k keywords). Forwarding keywords through the wrapper costs
    more than the clock itself, so a single figure would count the wrapper's cost as KV
    time on the calls with many keywords."""
    names = [f"k{i}" for i in range(max_kwargs + 1)]
    table = []
    for k in range(max_kwargs + 1):
        kwargs = {n: 0 for n in names[:k]}
        meter = Timed([0.0])
        holder = type("Holder", (), {"noop": staticmethod("".format)})()
        holder.noop = meter._timed("".format, "noop")
        best = float("inf")
        for _ in range(5):
            meter.total, meter.calls = 0, 0
            for _ in range(4_000):
                holder.noop(1, **kwargs)
            best = min(best, meter.total / meter.calls)
        table.append(best)
    return table


def run(kind: str, n: int, budget: int, which: str, timed: bool,
        breakdown: dict[str, list[float]] | None = None) -> tuple[float, float, int]:
    """One run; returns (scheduler ns per step, manager ns per step, steps). With
    ``breakdown``, adds each method's [calls, ns] per step (timer cost subtracted) to it."""
    import vllm.v1.core.sched.scheduler as sched_module
    from tests.v1.core.utils import create_scheduler
    from vllm.sampling_params import SamplingParams
    from vllm.utils.gc_utils import freeze_gc_heap
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import init_none_hash
    from vllm.v1.outputs import ModelRunnerOutput
    from vllm.v1.request import Request

    import kvpool.vllm
    import kvpool.vllm.hashing as kvpool_hashing
    from kvpool.vllm._manager import VllmKVCacheManager
    from kvpool.vllm.hashing import vllm_get_request_block_hasher

    caching = kind == "warmup"
    groups = LAYOUTS[LAYOUT]
    num_blocks = (20_000 if n > 100 else 5_000) * len(groups)
    config = dict(num_blocks=num_blocks, block_size=16, max_num_batched_tokens=budget,
                  max_num_seqs=256, enable_prefix_caching=caching, max_model_len=2048)
    if which == "kvpool":
        scheduler = create_scheduler(scheduler_cls=kvpool.vllm.Scheduler, **config)
    else:
        sched_module.KVCacheManager = VllmKVCacheManager
        scheduler = create_scheduler(**config)
    if len(groups) > 1:
        scheduler = with_groups(scheduler, groups, num_blocks)
    init_none_hash(sha256)
    # Each side hashes request blocks as vLLM does with its own manager or with kvpool's
    # (kvpool.vllm.install() makes the engine core build kvpool's hasher).
    factory = kvpool_hashing.get_request_block_hasher if which == "kvpool" else vllm_get_request_block_hasher
    hasher = factory(16, sha256)
    # As vLLM's EngineCore does once the engine is built: the startup heap is frozen so
    # that collections during serving skip it (vllm/v1/engine/core.py, freeze_gc_heap).
    freeze_gc_heap()
    for rid, prompt, max_tokens in make_workload(kind, n):
        params = SamplingParams(ignore_eos=True, max_tokens=max_tokens)
        params.update_from_generation_config({}, 0)
        scheduler.add_request(Request(request_id=rid, prompt_token_ids=prompt, sampling_params=params,
                                      pooling_params=None, block_hasher=hasher))
    meter = Timed()
    if timed:
        meter.wrap(scheduler.kv_cache_manager)
        meter.wrap(scheduler.kv_cache_manager.block_pool)
    steps, elapsed = 0, 0
    clock = time.perf_counter_ns
    while scheduler.requests:
        t = clock()
        out = scheduler.schedule()
        ids = list(out.num_scheduled_tokens)
        reqs = scheduler.requests
        sampled = [[7] if reqs[r].num_computed_tokens >= reqs[r].num_prompt_tokens else [] for r in ids]
        mro = ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                                sampled_token_ids=sampled, logprobs=None, prompt_logprobs_dict={},
                                pooler_output=[])
        scheduler.update_from_output(out, mro)
        elapsed += clock() - t
        steps += 1
        if steps > 100_000:
            raise RuntimeError("the workload does not finish")
    gc.unfreeze()
    kv = max(meter.total - meter.overhead, 0)
    if breakdown is not None:
        for name, (calls, ns, over) in meter.by_name.items():
            if calls:
                slot = breakdown.setdefault(name, [0.0, 0.0])
                slot[0] += calls / steps
                slot[1] += (ns - over) / steps
    return elapsed / steps, kv / steps, steps


#: KV-cache layouts: each group's attention ("full", or a sliding window in tokens).
LAYOUTS: dict[str, list[Any]] = {
    "full": ["full"],
    "gpt-oss": [128, "full"],  # alternating 128-token windows and full attention: one group each
    "gemma": [1024] * 5 + ["full"],  # 5:1 sliding (1,024 tokens) to full: six equal groups
}
LAYOUT = "full"


def with_groups(scheduler: Any, groups: list[Any], num_blocks: int) -> Any:
    """The same scheduler class and configuration as ``scheduler``, over KV-cache groups
    ``groups`` (vLLM's test helper builds one full-attention group only)."""
    import torch
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, SlidingWindowSpec
    from vllm.v1.structured_output import StructuredOutputManager

    common = dict(block_size=16, num_kv_heads=1, head_size=1, dtype=torch.float32)
    specs = [FullAttentionSpec(**common) if g == "full" else SlidingWindowSpec(**common, sliding_window=g)
             for g in groups]
    config = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[],
                           kv_cache_groups=[KVCacheGroupSpec([f"layer{i}"], s) for i, s in enumerate(specs)])
    vllm_config = scheduler.vllm_config
    built = type(scheduler)(vllm_config=vllm_config, kv_cache_config=config, block_size=16, log_stats=True,
                            structured_output_manager=StructuredOutputManager(vllm_config))
    built.use_v2_model_runner = scheduler.use_v2_model_runner
    return built


#: Measure the wrapper's cost at each call (a no-op timed alike just before it) instead
#: of subtracting the calibrated figure.
IN_SITU = False
#: The wrapper's cost per timed call, by its number of keyword arguments (calibrated at start).
OVERHEAD_NS: list[float] = [0.0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="only the 100-request workloads, 2 rounds")
    parser.add_argument("--workload", choices=["serving", "warmup"], help="only this workload")
    parser.add_argument("--in-situ-overhead", action="store_true",
                        help="measure the timing wrapper's cost at every call (a no-op timed alike just "
                             "before it) instead of subtracting the figure calibrated in a warm loop")
    parser.add_argument("--layout", choices=sorted(LAYOUTS), default="full",
                        help="KV-cache groups: one full-attention group (default), gpt-oss-style "
                             "128-token windows beside full attention, Gemma-style 5 x 1,024-token windows "
                             "beside full attention")
    parser.add_argument("--breakdown", action="store_true",
                        help="also print each manager method's calls and µs per step")
    args = parser.parse_args(argv)
    sys.path.insert(0, ".")
    global OVERHEAD_NS, IN_SITU, LAYOUT
    OVERHEAD_NS = timer_overhead_ns()
    IN_SITU = args.in_situ_overhead
    LAYOUT = args.layout
    print(f"timer overhead per timed call (subtracted): {OVERHEAD_NS[0]:.0f} ns with no keyword argument, "
          f"{OVERHEAD_NS[6]:.0f} ns with 6, {OVERHEAD_NS[12]:.0f} ns with 12")
    cases = [("serving", 100, 2048), ("serving", 100, 8192), ("serving", 1000, 2048), ("serving", 1000, 8192),
             ("warmup", 100, 2048)]
    if args.workload:
        cases = [c for c in cases if c[0] == args.workload]
    if args.quick:
        cases = [c for c in cases if c[1] == 100]
        args.rounds = min(args.rounds, 2)
    print(f"{'workload':<26} {'manager':<7} {'step µs':>9} {'KV µs':>8} {'KV share':>8} {'steps':>6}")
    for kind, n, budget in cases:
        plain: dict[str, list[float]] = {"vllm": [], "kvpool": []}
        kv: dict[str, list[float]] = {"vllm": [], "kvpool": []}
        inst: dict[str, list[float]] = {"vllm": [], "kvpool": []}
        nsteps = {}
        per_method: dict[str, dict[str, list[float]]] = {"vllm": {}, "kvpool": {}}
        for _ in range(args.rounds):
            for which in ("vllm", "kvpool"):
                step_ns, _, nsteps[which] = run(kind, n, budget, which, timed=False)
                plain[which].append(step_ns)
                step_ns, kv_ns, _ = run(kind, n, budget, which, timed=True,
                                        breakdown=per_method[which] if args.breakdown else None)
                inst[which].append(step_ns)
                kv[which].append(kv_ns)
        label = f"{kind} n={n} budget={budget}"
        med = {w: statistics.median(plain[w]) / 1e3 for w in plain}
        kvm = {w: statistics.median(kv[w]) / 1e3 for w in kv}
        share = {w: statistics.median(k / s for k, s in zip(kv[w], inst[w])) for w in kv}
        for which in ("vllm", "kvpool"):
            print(f"{label:<26} {which:<7} {med[which]:9.1f} {kvm[which]:8.1f} {share[which]:8.0%} {nsteps[which]:6d}")
        saved, kv_gone = med["vllm"] - med["kvpool"], kvm["vllm"]
        print(f"{'':<26} ratio   step {med['vllm'] / med['kvpool']:.2f}x, KV {kvm['vllm'] / max(kvm['kvpool'], 1e-9):.1f}x, "
              f"step time saved {saved:.1f} µs = {saved / kv_gone:.0%} of vLLM's KV time")
        if args.breakdown:
            names = sorted(set(per_method["vllm"]) | set(per_method["kvpool"]),
                           key=lambda m: -per_method["vllm"].get(m, [0, 0])[1])
            print(f"{'':<26} {'method':<34} {'calls/step':>10} {'vLLM µs':>8} {'kvpool µs':>9}")
            for m in names:
                v, k = per_method["vllm"].get(m, [0.0, 0.0]), per_method["kvpool"].get(m, [0.0, 0.0])
                print(f"{'':<26} {m:<34} {v[0] / args.rounds:10.2f} {v[1] / args.rounds / 1e3:8.2f} "
                      f"{k[1] / args.rounds / 1e3:9.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
