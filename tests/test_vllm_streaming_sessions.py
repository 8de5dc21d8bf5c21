"""A request whose block hashes are cut back and grown again, as vLLM 0.33's streaming
sessions do (``Scheduler._update_request_as_session`` drops the last sampled token and appends
the next input chunk), on ``kvpool.vllm.KVCacheManager`` against vLLM's own manager: kvpool's
tables notice that hashes they had learnt changed, learn the new ones, and cache and hit the
same blocks as vLLM (they kept the old hash and cached a block under it)."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("vllm")
torch = pytest.importorskip("torch")

from vllm_requests import make_request  # noqa: E402


def request(request_id: str, tokens: list[int]) -> Any:
    return make_request(request_id, tokens)


@pytest.mark.parametrize("events", [False, True])
def test_a_session_whose_hashes_were_rewritten_caches_what_vllm_caches(events: bool) -> None:
    from vllm.v1.core.kv_cache_manager import KVCacheManager
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.request import RequestStatus, StreamingUpdate

    import kvpool.vllm

    spec = FullAttentionSpec(block_size=4, num_kv_heads=1, head_size=1, dtype=torch.float32)
    config = KVCacheConfig(num_blocks=32, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["l"], spec)])
    scheduler = SimpleNamespace(hash_block_size=4, log_stats=False, num_waiting_for_streaming_input=0)
    seen = []
    for cls in (KVCacheManager, kvpool.vllm.KVCacheManager):
        manager = cls(config, max_model_len=1024, scheduler_block_size=4, hash_block_size=4,
                      enable_kv_cache_events=events)
        session = request("s", [1, 2, 3, 4, 5, 6, 7])
        session.resumable = True
        manager.allocate_slots(session, 7)
        session.num_computed_tokens, session.status = 7, RequestStatus.RUNNING
        # Async scheduling: the sampled token is appended, and the blocks cached, before the
        # stop is handled; the session then drops that token and appends the next chunk.
        session.append_output_token_ids(99)
        manager.cache_blocks(session, 7)
        update = StreamingUpdate(mm_features=None, prompt_token_ids=[50, 51, 52, 53, 54], max_tokens=4,
                                 arrival_time=time.time(), sampling_params=session.sampling_params)
        Scheduler._update_request_as_session(scheduler, session, update)
        new = manager.allocate_slots(session, session.num_tokens - session.num_computed_tokens)
        stale = manager.get_computed_blocks(request("q", [1, 2, 3, 4, 5, 6, 7, 99, 8, 8]))
        real = manager.get_computed_blocks(request("q2", [1, 2, 3, 4, 5, 6, 7, 50, 51, 52, 53, 54, 0]))
        stored = [(e.token_ids, e.block_hashes) for e in manager.take_events()] if events else []
        seen.append((new.get_block_ids(), stale[1], stale[0].get_block_ids(), real[1], real[0].get_block_ids(),
                     stored))
    assert seen[1] == seen[0]
    assert seen[0][1] == 4 and seen[0][3] == 12  # the dropped token's block is no hit; the chunk's are
