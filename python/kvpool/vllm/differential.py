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

With ``--offload``, each workload instead runs both schedulers with vLLM's
``SimpleCPUOffloadConnector`` (eager or lazy, alternately; the helper
``tests.v1.kv_connector.unit.utils`` builds them) over a small GPU pool, with one
full-attention group or full attention beside sliding windows (kvpool's hybrid manager),
in turn (``OFFLOAD_LAYOUTS``), so that cached blocks are stored to the CPU pool, evicted
on the GPU and loaded back: a fake worker completes every store and load at once. The connector reads the GPU pool through
kvpool's views (``free_block_queue.iter_blocks_after``, ``block_hash_num_tokens``,
``cached_block_hashes_by_block``, ``touch``, ``free_blocks``). After every step the
scheduler outputs, the connector's metadata (the blocks it loads and stores), the engine
outputs, both pools' free counts and every CPU block's hash, token count and reference
count must be equal.
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


class _Arrivals:
    """The requests of one workload: arrivals with shared prefixes and aborts, each done on
    both schedulers alike."""

    def __init__(self, sides: tuple[Any, Any], make_request: Any, block_size: int) -> None:
        self.sides, self.make_request, self.block_size = sides, make_request, block_size
        self.next_id = 0
        self.live: list[str] = []

    def arrive(self, rng: random.Random, prefixes: list[list[int]], max_tail: int, max_tokens: int) -> None:
        """One request: a shared prefix, up to ``max_tail`` fresh tokens, up to ``max_tokens``
        to generate."""
        prompt = rng.choice(prefixes) + [rng.randrange(1000) for _ in range(rng.randint(1, max_tail))]
        tokens = rng.randint(1, max_tokens)
        rid = f"r{self.next_id}"
        self.next_id += 1
        for s in self.sides:
            s.add_request(self.make_request(rid, prompt, tokens, self.block_size))
        self.live.append(rid)

    def maybe_abort(self, rng: random.Random, probability: float) -> bool:
        """Abort a live request with ``probability``; whether one was."""
        from vllm.v1.request import RequestStatus

        if not (self.live and rng.random() < probability):
            return False
        rid = rng.choice(self.live)
        for s in self.sides:
            s.finish_requests(rid, RequestStatus.FINISHED_ABORTED)
        return True


def _update_both(sides: tuple[Any, Any], outs: tuple[Any, Any], step: int, label: str,
                 connector_output: Any = None) -> None:
    """Feed both schedulers the same model output for their step (one sampled token per
    scheduled request, and ``connector_output``) and compare the engine outputs."""
    from vllm.v1.outputs import ModelRunnerOutput

    req_ids = list(outs[0].num_scheduled_tokens)
    results = []
    for s, out in zip(sides, outs):
        mro = ModelRunnerOutput(
            req_ids=req_ids,
            req_id_to_index={r: i for i, r in enumerate(req_ids)},
            sampled_token_ids=[[(hash((rid, step)) % 900) + 1] for rid in req_ids],
            logprobs=None,
            prompt_logprobs_dict={},
            pooler_output=[],
            kv_connector_output=connector_output,
        )
        engine = s.update_from_output(out, mro)
        results.append(sorted((k, [(o.request_id, list(o.new_token_ids), o.finish_reason) for o in v.outputs])
                              for k, v in engine.items()))
    assert results[0] == results[1], f"{label} step {step}: engine outputs differ\n{results}"


#: What the workloads exercised: steps, prefix-hit tokens, preemptions, aborts, resets.
SEEN = {"steps": 0, "hit_tokens": 0, "preemptions": 0, "aborts": 0, "resets": 0}


def run_workload(seed: int, create_scheduler: Any, make_request: Any) -> int:
    """Runs workload ``seed`` on both schedulers; returns the number of steps compared."""
    import vllm.v1.core.sched.scheduler as sched_module

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
    assert type(ours.kv_cache_manager).__module__.startswith("kvpool.vllm."), type(ours.kv_cache_manager)
    assert type(theirs.kv_cache_manager) is VllmKVCacheManager
    prefixes = [[rng.randrange(1000) for _ in range(rng.randint(0, 3 * block_size))] for _ in range(3)]
    requests = _Arrivals((ours, theirs), make_request, block_size)
    steps = rng.randint(10, 60)
    for step in range(steps):
        for _ in range(rng.choice([0, 0, 1, 1, 2, 3])):
            requests.arrive(rng, prefixes, max_tail=4 * block_size, max_tokens=24)
        SEEN["aborts"] += requests.maybe_abort(rng, 0.05)
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
        _update_both((ours, theirs), (out_a, out_b), step, f"seed {seed}")
        a_free = ours.kv_cache_manager.block_pool.get_num_free_blocks()
        b_free = theirs.kv_cache_manager.block_pool.get_num_free_blocks()
        assert a_free == b_free, f"seed {seed} step {step}: free blocks {a_free} != {b_free}"
        ea, eb = _events(ours.kv_cache_manager.take_events()), _events(theirs.kv_cache_manager.take_events())
        assert ea == eb, f"seed {seed} step {step}: events differ\n{ea}\n{eb}"
        ours.kv_cache_manager._tables.check_invariants()  # the pool's, and its tables'
    return steps


#: What the offload workloads exercised: steps, blocks stored to and loaded from the CPU.
OFFLOAD_SEEN = {"steps": 0, "stored": 0, "loaded": 0, "preemptions": 0, "hybrid_stored": 0, "hybrid_loaded": 0}

#: The KV-cache groups of the offload workloads, in turn (two seeds each, eager and lazy):
#: each group a full-attention layer (None) or a sliding window of that many tokens.
OFFLOAD_LAYOUTS: list[list[int | None]] = [[None], [None, 32], [None, 16, 48]]


def _offload_meta(meta: Any) -> Any:
    return (meta.load_event, list(meta.load_gpu_blocks), list(meta.load_cpu_blocks),
            {k: list(v) for k, v in meta.load_event_to_reqs.items()}, meta.store_event,
            list(meta.store_gpu_blocks), list(meta.store_cpu_blocks), meta.need_flush)


def _cpu_pool(scheduler: Any) -> Any:
    pool = scheduler.connector.scheduler_manager.cpu_block_pool
    return [(b.block_hash, b.block_hash_num_tokens, b.ref_cnt) for b in pool.blocks]


def run_offload_workload(seed: int, create_vllm_config: Any, create_scheduler: Any, make_request: Any) -> int:
    """Runs offload workload ``seed`` (``--offload``) on both schedulers; returns its steps."""
    import torch
    import vllm.v1.core.sched.scheduler as sched_module
    from vllm.v1.kv_cache_interface import (
        FullAttentionSpec,
        KVCacheConfig,
        KVCacheGroupSpec,
        KVCacheTensor,
        SlidingWindowSpec,
    )
    from vllm.v1.outputs import KVConnectorOutput
    from vllm.v1.simple_kv_offload.metadata import SimpleCPUOffloadWorkerMetadata

    import kvpool.vllm
    from kvpool.vllm._manager import VllmKVCacheManager

    rng = random.Random(seed)
    block_size, lazy = 16, seed % 2 == 0
    layout = OFFLOAD_LAYOUTS[(seed // 2) % len(OFFLOAD_LAYOUTS)]
    num_blocks = rng.randint(12, 40) * len(layout)
    extra = {"num_cpu_blocks": rng.randint(8, 64) * len(layout), "lazy_offload": lazy}
    batch, max_seqs = rng.choice([32, 64, 128]), rng.choice([2, 4, 8])

    def build(ours: bool) -> Any:
        """A scheduler with the connector, on kvpool's manager or (``ours`` false) vLLM's."""
        config = create_vllm_config(kv_connector="SimpleCPUOffloadConnector", kv_role="kv_both",
                                    kv_connector_extra_config=extra, max_num_batched_tokens=batch,
                                    max_num_seqs=max_seqs, block_size=block_size)
        common = dict(block_size=block_size, num_kv_heads=1, head_size=1, dtype=torch.float32)
        specs = [FullAttentionSpec(**common) if window is None else SlidingWindowSpec(**common, sliding_window=window)
                 for window in layout]
        # One tensor per group's layer, as vLLM's worker lays out groups of equal page size.
        tensors = [KVCacheTensor(size=spec.page_size_bytes * num_blocks, layers=[f"layer{g}"],
                                 layer_stride=spec.page_size_bytes * num_blocks, block_stride=spec.page_size_bytes)
                   for g, spec in enumerate(specs)]
        kv_cache_config = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=tensors,
                                        kv_cache_groups=[KVCacheGroupSpec([f"layer{g}"], spec)
                                                         for g, spec in enumerate(specs)])
        kvpool.vllm.install()
        if not ours:
            sched_module.KVCacheManager = VllmKVCacheManager
        scheduler = create_scheduler(config, num_blocks=num_blocks, kv_cache_config=kv_cache_config)
        kvpool.vllm.install()
        return scheduler

    ours, theirs = build(True), build(False)
    assert type(ours.kv_cache_manager).__module__.startswith("kvpool.vllm."), type(ours.kv_cache_manager)
    assert type(theirs.kv_cache_manager) is VllmKVCacheManager
    prefixes = [[rng.randrange(1000) for _ in range(rng.randint(16, 96))] for _ in range(rng.randint(2, 5))]
    requests = _Arrivals((ours, theirs), make_request, block_size)
    steps = rng.randint(30, 90)
    for step in range(steps):
        for _ in range(rng.choice([0, 0, 1, 1, 2])):
            requests.arrive(rng, prefixes, max_tail=40, max_tokens=16)
        requests.maybe_abort(rng, 0.03)
        out_a, out_b = ours.schedule(), theirs.schedule()
        got = (_outputs(out_a), _offload_meta(out_a.kv_connector_metadata))
        want = (_outputs(out_b), _offload_meta(out_b.kv_connector_metadata))
        assert got == want, f"offload seed {seed} step {step}: scheduler outputs differ\nkvpool: {got}\nvLLM:   {want}"
        meta = out_b.kv_connector_metadata
        OFFLOAD_SEEN["steps"] += 1
        OFFLOAD_SEEN["stored"] += len(meta.store_gpu_blocks)
        OFFLOAD_SEEN["loaded"] += len(meta.load_gpu_blocks)
        OFFLOAD_SEEN["preemptions"] += len(out_b.preempted_req_ids or ())
        if len(layout) > 1:
            OFFLOAD_SEEN["hybrid_stored"] += len(meta.store_gpu_blocks)
            OFFLOAD_SEEN["hybrid_loaded"] += len(meta.load_gpu_blocks)
        # The fake worker: this step's store and load are done when the step is.
        loaded = set(meta.load_event_to_reqs.get(meta.load_event, ())) if meta.load_event >= 0 else set()
        stored = {meta.store_event: 1} if meta.store_event >= 0 else {}
        _update_both((ours, theirs), (out_a, out_b), step, f"offload seed {seed}", KVConnectorOutput(
            finished_recving=loaded or None,
            kv_connector_worker_meta=SimpleCPUOffloadWorkerMetadata(completed_store_events=dict(stored))))
        a_free = ours.kv_cache_manager.block_pool.get_num_free_blocks()
        b_free = theirs.kv_cache_manager.block_pool.get_num_free_blocks()
        assert a_free == b_free, f"offload seed {seed} step {step}: free blocks {a_free} != {b_free}"
        a_cpu, b_cpu = _cpu_pool(ours), _cpu_pool(theirs)
        assert a_cpu == b_cpu, f"offload seed {seed} step {step}: CPU pools differ\n{a_cpu}\n{b_cpu}"
        ours.kv_cache_manager._tables.check_invariants()
    return steps


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workloads", type=int, default=200)
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--offload", action="store_true",
                        help="run the workloads with vLLM's SimpleCPUOffloadConnector (eager and lazy)")
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
    if args.offload:
        from tests.v1.kv_connector.unit import utils as connector_utils  # type: ignore[import-not-found]

        for seed in range(args.first_seed, args.first_seed + args.workloads):
            np.random.seed(seed)
            total += run_offload_workload(seed, connector_utils.create_vllm_config, connector_utils.create_scheduler,
                                          make_request)
        print(f"kvpool.vllm differential (SimpleCPUOffloadConnector): {args.workloads} workloads, {total} steps, "
              f"every step equal; stored {OFFLOAD_SEEN['stored']} blocks to the CPU, loaded "
              f"{OFFLOAD_SEEN['loaded']} back ({OFFLOAD_SEEN['hybrid_stored']} and {OFFLOAD_SEEN['hybrid_loaded']} "
              f"of them with sliding-window groups), {OFFLOAD_SEEN['preemptions']} preemptions")
        return 0
    for seed in range(args.first_seed, args.first_seed + args.workloads):
        np.random.seed(seed)
        total += run_workload(seed, create_scheduler, make_request)
    print(f"kvpool.vllm differential: {args.workloads} workloads, {total} steps, every step equal; "
          f"exercised {SEEN['hit_tokens']} prefix-hit tokens, {SEEN['preemptions']} preemptions, "
          f"{SEEN['aborts']} aborts, {SEEN['resets']} prefix-cache resets")
    return 0


if __name__ == "__main__":
    sys.exit(main())
