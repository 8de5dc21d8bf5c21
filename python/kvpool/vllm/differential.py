"""vLLM 0.33's real scheduler driven with its own manager and with kvpool's, step by step.

``python -m kvpool.vllm.differential --workloads 200`` (from a folder holding vLLM's
``tests`` package, for ``tests.v1.core.utils.create_scheduler``): each random workload
(pool size, block size, token budget, prefix caching on or off, arrivals with shared
prefixes, chunked prefill, decode, preemption under a small pool, aborts, prefix-cache
resets) runs on two schedulers built alike, one with vLLM's ``KVCacheManager`` and one with
``kvpool.vllm.KVCacheManager``. After every step the scheduler outputs (new and cached
requests with their block ids and computed tokens, scheduled tokens, preemptions, finished
requests), the engine outputs of ``update_from_output``, the KV events and the free-block
counts must be equal. Exits non-zero at the first difference, printing it.
"""

from __future__ import annotations

import argparse
import random
import sys
from typing import Any

import numpy as np


def _outputs(out: Any) -> Any:
    cached = out.scheduled_cached_reqs
    return (
        [(r.req_id, r.block_ids, r.num_computed_tokens) for r in out.scheduled_new_reqs],
        (list(cached.req_ids), sorted(cached.resumed_req_ids), [None if b is None else list(map(list, b))
                                                                 for b in cached.new_block_ids],
         list(cached.num_computed_tokens), list(cached.num_output_tokens)),
        dict(out.num_scheduled_tokens),
        out.total_num_scheduled_tokens,
        sorted(out.finished_req_ids),
        sorted(out.preempted_req_ids or ()),
    )


def _events(events: list[Any]) -> list[Any]:
    return [repr(e) for e in events]


#: What the workloads exercised: steps, prefix-hit tokens, preemptions, aborts, resets.
SEEN = {"steps": 0, "hit_tokens": 0, "preemptions": 0, "aborts": 0, "resets": 0}


def run_workload(seed: int, create_scheduler: Any, make_request: Any) -> int:
    """Runs workload ``seed`` on both schedulers; returns the number of steps compared."""
    import vllm.v1.core.sched.scheduler as sched_module
    from vllm.v1.outputs import ModelRunnerOutput
    from vllm.v1.request import RequestStatus

    import kvpool.vllm
    from kvpool.vllm._manager import VllmKVCacheManager

    rng = random.Random(seed)
    block_size = rng.choice([4, 8, 16])
    config = dict(
        num_blocks=rng.randint(8, 80),
        block_size=block_size,
        max_num_batched_tokens=rng.choice([32, 64, 128, 512]),
        max_num_seqs=rng.choice([2, 4, 16]),
        enable_prefix_caching=rng.random() < 0.8,
        max_model_len=rng.choice([256, 1024]),
    )
    ours = create_scheduler(scheduler_cls=kvpool.vllm.Scheduler, **config)
    sched_module.KVCacheManager = VllmKVCacheManager
    theirs = create_scheduler(**config)
    kvpool.vllm.install()
    assert type(ours.kv_cache_manager).__module__ == "kvpool.vllm._manager", type(ours.kv_cache_manager)
    assert type(theirs.kv_cache_manager) is VllmKVCacheManager
    prefixes = [[rng.randrange(1000) for _ in range(rng.randint(0, 3 * block_size))] for _ in range(3)]
    next_id, live = 0, []
    steps = rng.randint(10, 60)
    for step in range(steps):
        for _ in range(rng.choice([0, 0, 1, 1, 2, 3])):
            prompt = rng.choice(prefixes) + [rng.randrange(1000) for _ in range(rng.randint(1, 4 * block_size))]
            max_tokens = rng.randint(1, 24)
            rid = f"r{next_id}"
            next_id += 1
            for s in (ours, theirs):
                s.add_request(make_request(rid, prompt, max_tokens, block_size))
            live.append(rid)
        if live and rng.random() < 0.05:
            rid = rng.choice(live)
            for s in (ours, theirs):
                s.finish_requests(rid, RequestStatus.FINISHED_ABORTED)
            SEEN["aborts"] += 1
        if rng.random() < 0.03:
            a, b = ours.reset_prefix_cache(), theirs.reset_prefix_cache()
            assert a == b, f"seed {seed} step {step}: reset_prefix_cache {a} != {b}"
            SEEN["resets"] += a
        out_a, out_b = ours.schedule(), theirs.schedule()
        got, want = _outputs(out_a), _outputs(out_b)
        assert got == want, f"seed {seed} step {step}: scheduler outputs differ\nkvpool: {got}\nvLLM:   {want}"
        SEEN["steps"] += 1
        SEEN["hit_tokens"] += sum(r.num_computed_tokens for r in out_b.scheduled_new_reqs)
        SEEN["preemptions"] += len(out_b.preempted_req_ids or ())
        req_ids = list(out_a.num_scheduled_tokens)
        sampled = [[(hash((rid, step)) % 900) + 1] for rid in req_ids]
        results = []
        for s, out in ((ours, out_a), (theirs, out_b)):
            mro = ModelRunnerOutput(
                req_ids=req_ids,
                req_id_to_index={r: i for i, r in enumerate(req_ids)},
                sampled_token_ids=[list(t) for t in sampled],
                logprobs=None,
                prompt_logprobs_dict={},
                pooler_output=[],
            )
            engine = s.update_from_output(out, mro)
            results.append(sorted((k, [(o.request_id, list(o.new_token_ids), o.finish_reason) for o in v.outputs])
                                  for k, v in engine.items()))
        assert results[0] == results[1], f"seed {seed} step {step}: engine outputs differ\n{results}"
        a_free = ours.kv_cache_manager.block_pool.get_num_free_blocks()
        b_free = theirs.kv_cache_manager.block_pool.get_num_free_blocks()
        assert a_free == b_free, f"seed {seed} step {step}: free blocks {a_free} != {b_free}"
        ea, eb = _events(ours.kv_cache_manager.take_events()), _events(theirs.kv_cache_manager.take_events())
        assert ea == eb, f"seed {seed} step {step}: events differ\n{ea}\n{eb}"
        ours.kv_cache_manager._tables.check_invariants()  # the pool's, and its tables'
    return steps


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workloads", type=int, default=200)
    parser.add_argument("--first-seed", type=int, default=0)
    args = parser.parse_args(argv)
    sys.path.insert(0, ".")
    from tests.v1.core.utils import create_scheduler  # type: ignore[import-not-found]  # vLLM test helper
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.request import Request

    init_none_hash(sha256)
    hashers: dict[int, Any] = {}

    def make_request(rid: str, prompt: list[int], max_tokens: int, block_size: int) -> Request:
        hasher = hashers.setdefault(block_size, get_request_block_hasher(block_size, sha256))
        params = SamplingParams(ignore_eos=True, max_tokens=max_tokens)
        params.update_from_generation_config({}, 0)
        return Request(request_id=rid, prompt_token_ids=list(prompt), sampling_params=params,
                       pooling_params=None, block_hasher=hasher)

    total = 0
    for seed in range(args.first_seed, args.first_seed + args.workloads):
        np.random.seed(seed)
        total += run_workload(seed, create_scheduler, make_request)
    print(f"kvpool.vllm differential: {args.workloads} workloads, {total} steps, every step equal; "
          f"exercised {SEEN['hit_tokens']} prefix-hit tokens, {SEEN['preemptions']} preemptions, "
          f"{SEEN['aborts']} aborts, {SEEN['resets']} prefix-cache resets")
    return 0


if __name__ == "__main__":
    sys.exit(main())
