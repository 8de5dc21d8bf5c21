"""vLLM 0.33's request block hasher against kvpool's (``kvpool.vllm.get_request_block_hasher``),
on vLLM's own ``Request`` objects, in one process, runs interleaved.

What vLLM's engine core does with it, timed as it happens there:

- ``prompt``: make 100 ``Request``s of a 700-token prompt (43 full blocks of 16 tokens each
  hashed when the request is made); per request, the whole ``Request`` construction counted.
- ``decode``: 100 requests decode 64 tokens one at a time (``append_output_token_ids``, which
  calls the hasher every time; one call in 16 fills a block); per request.
- ``prompt-extras``: ``prompt`` with a LoRA adapter, a cache salt and four images per request.

Every algorithm (``--algos``). Each round runs vLLM's hasher, kvpool's and none (the
``Request``s' own cost), in rotating order; the figures are medians of ``--rounds``. The
ratio is the median of each round's own ratio, with its quartiles; "hashing alone" subtracts
each round's run without a hasher from its two runs and gives the median of the rounds'
ratios ("n/a" when most rounds leave kvpool's hashing within the noise of that baseline).
Each run checks that both hashers gave the same hashes.

    VLLM_TARGET_DEVICE=cpu python benches/vllm_hashing.py [--rounds 9] [--algos sha256,xxhash]
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import statistics
import time
from collections.abc import Callable
from typing import Any

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from vllm.lora.request import LoRARequest  # noqa: E402
from vllm.multimodal.inputs import MultiModalFeatureSpec, MultiModalKwargsItem, PlaceholderRange  # noqa: E402
from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.utils.hashing import get_hash_fn_by_name  # noqa: E402
from vllm.v1.core.kv_cache_utils import init_none_hash  # noqa: E402
from vllm.v1.request import Request  # noqa: E402

from kvpool.vllm import hashing  # noqa: E402

BLOCK_SIZE, N_REQUESTS, PROMPT, DECODE = 16, 100, 700, 64


def params() -> SamplingParams:
    p = SamplingParams(max_tokens=DECODE + 1, ignore_eos=True)
    p.update_from_generation_config({}, eos_token_id=None)
    return p


def make(rid: str, prompt: list[int], hasher: Any, extras: bool) -> Request:
    kwargs: dict[str, Any] = {}
    if extras:
        kwargs = dict(
            lora_request=LoRARequest(lora_name="adapter", lora_int_id=1, lora_path="/adapters/adapter"),
            cache_salt="tenant-a",
            mm_features=[MultiModalFeatureSpec(data=MultiModalKwargsItem.dummy(),
                                               mm_position=PlaceholderRange(40 + 150 * j, 100),
                                               identifier=f"image-{j}", modality="image") for j in range(4)])
    return Request(request_id=rid, prompt_token_ids=prompt, sampling_params=params(), pooling_params=None,
                   block_hasher=hasher, **kwargs)


def workloads(algo: str) -> dict[str, dict[str, tuple[Callable[[Any], Any], Callable[[], Any]]]]:
    hash_fn = get_hash_fn_by_name(algo)
    init_none_hash(hash_fn)
    rng = random.Random(0)
    prompts = [[rng.randrange(1, 150_000) for _ in range(PROMPT)] for _ in range(N_REQUESTS)]
    hashers = {"vllm": hashing.vllm_get_request_block_hasher(BLOCK_SIZE, hash_fn),
               "kvpool": hashing.get_request_block_hasher(BLOCK_SIZE, hash_fn),
               "none": None}
    out: dict[str, dict[str, tuple[Callable[[Any], Any], Callable[[], Any]]]] = {}
    for name, extras in (("prompt", False), ("prompt-extras", True)):
        out[name] = {side: (lambda _, h=h, x=extras: [make(f"r{i}", list(p), h, x) for i, p in enumerate(prompts)],
                            lambda: None) for side, h in hashers.items()}

    def decode(reqs: list[Request]) -> list[Request]:
        for t in range(DECODE):
            for r in reqs:
                r.append_output_token_ids(t + 7)
        return reqs

    out["decode"] = {side: (decode, lambda h=h: [make(f"d{i}", list(p), h, False) for i, p in enumerate(prompts)])
                     for side, h in hashers.items()}
    return out


def race(runs: dict[str, tuple[Callable[[Any], Any], Callable[[], Any]]], rounds: int) -> tuple[dict[str, float], list[float]]:
    times: dict[str, list[float]] = {side: [] for side in runs}
    results: dict[str, Any] = {}
    for r in range(rounds + 1):
        order = list(runs)
        for side in order[r % len(order):] + order[:r % len(order)]:
            run, setup = runs[side]
            state = setup()
            gc.collect()
            t0 = time.perf_counter_ns()
            result = run(state)
            elapsed = (time.perf_counter_ns() - t0) / N_REQUESTS / 1e3
            results[side] = [req.block_hashes for req in result]
            if side == "none":
                results.pop(side)
            if r:
                times[side].append(elapsed)
        if results["vllm"] != results["kvpool"]:
            raise SystemExit("the two hashers disagree")
    ratios = [v / k for v, k in zip(times["vllm"], times["kvpool"])]
    return {side: statistics.median(t) for side, t in times.items()}, ratios, times


def hashing_alone(times: dict[str, list[float]]) -> str:
    """The ratio of the two hashers' own cost: each round's run less that round's run without
    a hasher, the median of the rounds' ratios; "n/a" unless most rounds leave both costs
    above the noise (kvpool's is a few µs beside a baseline of tens)."""
    ratios = [(v - n) / (k - n) for v, k, n in zip(times["vllm"], times["kvpool"], times["none"])
              if v > n and k > n]
    if 2 * len(ratios) <= len(times["none"]):
        return f"{'n/a':>12} "
    return f"{statistics.median(ratios):12.1f}x"



def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--algos", default="sha256,sha256_cbor,xxhash,xxhash_cbor")
    args = ap.parse_args()
    print(f"{'workload':<14} {'algo':<12} {'no hasher':>10} {'vLLM':>9} {'kvpool':>9} {'ratio':>7}  "
          f"{'quartiles':<11} {'hashing alone':>13}   (µs per request)")
    for algo in args.algos.split(","):
        for name, runs in workloads(algo).items():
            med, ratios, times = race(runs, args.rounds)
            q = statistics.quantiles(ratios, n=4) if len(ratios) >= 4 else [min(ratios), 0, max(ratios)]
            print(f"{name:<14} {algo:<12} {med['none']:10.2f} {med['vllm']:9.2f} {med['kvpool']:9.2f} "
                  f"{statistics.median(ratios):6.1f}x  {q[0]:4.1f}-{q[2]:4.1f}x {hashing_alone(times)}", flush=True)


if __name__ == "__main__":
    main()
