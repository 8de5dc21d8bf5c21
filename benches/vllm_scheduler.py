"""vLLM 0.33's real scheduler on CPU, with vLLM's KV-cache manager and with kvpool's.

Drives ``Scheduler.schedule()`` and ``update_from_output()`` with fake model outputs (one
sampled token per request whose prefill is done), as vLLM's own tests do, on:

- serving: N requests of 700 random tokens, 1 output token, prefix caching off, token
  budgets 2,048 and 8,192 (the workload where the block pool was measured at 51-62% of the
  scheduler loop), at N = 100 and 1,000;
- warm-up: 100 requests sharing a 624-token prefix plus 16-64 unique tokens, prefix caching
  on, budget 2,048, 200 output tokens each (a chunked, prefix-sharing warm-up batch).

Runs alternate between the two managers (interleaved, one process). Plain rounds time the
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
    twice."""

    def __init__(self) -> None:
        self.total = 0
        self.depth = 0
        self.calls = 0

    def wrap(self, obj: Any) -> None:
        for name in dir(type(obj)):
            if name.startswith("_"):
                continue
            attr = getattr(type(obj), name, None)
            if callable(attr) and not isinstance(attr, type):
                setattr(obj, name, self._timed(getattr(obj, name)))

    def _timed(self, fn: Any) -> Any:
        clock = time.perf_counter_ns

        @functools.wraps(fn)
        def call(*args: Any, **kwargs: Any) -> Any:
            if self.depth:
                return fn(*args, **kwargs)
            self.depth += 1
            self.calls += 1
            t = clock()
            try:
                return fn(*args, **kwargs)
            finally:
                self.total += clock() - t
                self.depth -= 1

        return call


def timer_overhead_ns() -> float:
    """What one timed call adds to the measured time (a wrapped no-op, timed the same way),
    subtracted per call so that the wrapper's own cost is not counted as KV time."""
    meter = Timed()

    class Empty:
        def noop(self) -> None:
            return None

    obj = Empty()
    meter.wrap(obj)
    for _ in range(20_000):
        obj.noop()
    return meter.total / meter.calls


def run(kind: str, n: int, budget: int, which: str, timed: bool) -> tuple[float, float, int]:
    """One run; returns (scheduler ns per step, manager ns per step, steps)."""
    import vllm.v1.core.sched.scheduler as sched_module
    from tests.v1.core.utils import create_scheduler
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.outputs import ModelRunnerOutput
    from vllm.v1.request import Request

    import kvpool.vllm
    from kvpool.vllm._manager import VllmKVCacheManager

    caching = kind == "warmup"
    config = dict(num_blocks=20_000 if n > 100 else 5_000, block_size=16, max_num_batched_tokens=budget,
                  max_num_seqs=256, enable_prefix_caching=caching, max_model_len=2048)
    if which == "kvpool":
        scheduler = create_scheduler(scheduler_cls=kvpool.vllm.Scheduler, **config)
    else:
        sched_module.KVCacheManager = VllmKVCacheManager
        scheduler = create_scheduler(**config)
    init_none_hash(sha256)
    hasher = get_request_block_hasher(16, sha256)
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
    kv = max(meter.total - meter.calls * OVERHEAD_NS, 0)
    return elapsed / steps, kv / steps, steps


OVERHEAD_NS = 0.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="only the 100-request workloads, 2 rounds")
    parser.add_argument("--workload", choices=["serving", "warmup"], help="only this workload")
    args = parser.parse_args(argv)
    sys.path.insert(0, ".")
    global OVERHEAD_NS
    OVERHEAD_NS = timer_overhead_ns()
    print(f"timer overhead {OVERHEAD_NS:.0f} ns per timed call (subtracted)")
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
        for _ in range(args.rounds):
            for which in ("vllm", "kvpool"):
                step_ns, _, nsteps[which] = run(kind, n, budget, which, timed=False)
                plain[which].append(step_ns)
                step_ns, kv_ns, _ = run(kind, n, budget, which, timed=True)
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
