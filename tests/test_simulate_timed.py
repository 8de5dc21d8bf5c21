"""The timed replay (``kvpool.simulate_timed``): hand-worked runs with overlap and preemption, the
sequential replay as its one-at-a-time limit, Rust against the reference, and its bounds."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from kvpool.simulate import get_impl, simulate_one
from kvpool.simulate_timed import ServiceModel, output_blocks, simulate_timed
from kvpool.traces import Trace, load_trace, parse_trace, synthetic_trace

SHARED = Path(__file__).resolve().parents[2] / "shared" / "traces"
SLOW = ServiceModel(prefill_tokens_per_s=1, decode_tokens_per_s=1, max_running=8)  # integer times


def trace_of(*rows: tuple[float, int, int, list[int]]) -> Trace:
    """A trace from ``(timestamp_ms, input_length, output_length, hash_ids)`` rows."""
    lines = [json.dumps({"timestamp": t, "input_length": n, "output_length": o, "hash_ids": ids})
             for t, n, o, ids in rows]
    return parse_trace(lines, name="hand")


@pytest.fixture(params=["kvpool", "reference"])
def impl_name(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def test_output_blocks() -> None:
    """The last output token takes no slot (the request ends when it is sampled), so a
    request holds at most ``input + output - 1`` tokens' slots, as in vLLM."""
    assert output_blocks(8, 1, 4) == 0  # the one output token is the last: no slot
    assert output_blocks(8, 2, 4) == 1  # token 9's KV is computed to sample token 10
    assert output_blocks(6, 3, 4) == 0  # tokens 7 and 8 fill the prompt's last block
    assert output_blocks(6, 4, 4) == 1
    assert output_blocks(0, 0, 4) == 0
    assert output_blocks(4, 0, 4) == 0


def test_a_prompt_that_fills_the_pool_may_sample_one_token(impl_name: str) -> None:
    """A 4-token prompt with one output token in a 1-block pool: the output token's KV is never
    computed, so the request fits (it was refused as needing 2 blocks)."""
    trace = trace_of((0, 4, 1, [1]),)
    r = simulate_timed(trace, 1, block_tokens=4, service=SLOW, impl=get_impl(impl_name))
    assert (r.rejected, r.peak_blocks_in_use, r.makespan_s) == (0, 1, 4.0)


def test_a_rejected_late_arrival_does_not_stretch_the_makespan(impl_name: str) -> None:
    """The makespan is when the last request finished: a request arriving at 100 s that can
    never fit is rejected then, but finishes nothing."""
    trace = trace_of((0, 4, 1, [1]), (100_000, 12, 0, [2, 3, 4]))
    r = simulate_timed(trace, 2, block_tokens=4, service=SLOW, impl=get_impl(impl_name))
    assert (r.rejected, r.makespan_s) == (1, 4.0)


def test_overlapping_requests_share_a_prefix_while_running(impl_name: str) -> None:
    """r0 (ids 1, 2) runs from 0 s; r1 (ids 1, 3) arrives at 1 s and hits id 1, which r0 holds:
    4 uncached tokens, prefill until 5 s. r0's prefill ends at 8 s with its one output token,
    which takes no slot (its KV is never computed), and it finishes then."""
    trace = trace_of((0, 8, 1, [1, 2]), (1000, 8, 0, [1, 3]))
    r = simulate_timed(trace, 3, block_tokens=4, service=SLOW, impl=get_impl(impl_name))
    assert (r.hit_blocks, r.peak_blocks_in_use, r.peak_running) == (1, 3, 2)
    assert (r.waited, r.waited_for_blocks, r.preemptions, r.rejected) == (0, 0, 0, 0)
    assert r.makespan_s == 8.0
    assert r.token_hit_ratio == 4 / 16


def test_a_short_pool_preempts_the_newest_request(impl_name: str) -> None:
    """Two 1-block requests fill a 2-block pool; at 4 s r0's first output token needs a block
    (its KV is computed to sample the second), so r1 (the newest) is preempted and r0's new
    block evicts r1's freed one (the only free block); a step that preempts admits nothing (as
    vLLM's), so r1 is taken back when r0 finishes at 5 s (it never was the head of the queue
    without room) and reruns its whole 4-token prefill, done at 9 s."""
    trace = trace_of((0, 4, 2, [1]), (0, 4, 0, [2]))
    r = simulate_timed(trace, 2, block_tokens=4, service=SLOW, impl=get_impl(impl_name))
    assert (r.preemptions, r.preempted_requests, r.waited_for_blocks) == (1, 1, 0)
    assert (r.peak_blocks_in_use, r.peak_running, r.makespan_s) == (2, 2, 9.0)
    assert r.hit_blocks == 0  # hits count at the first admission only


def test_the_concurrency_limit_queues_requests(impl_name: str) -> None:
    trace = trace_of((0, 4, 0, [1]), (0, 4, 0, [2]), (0, 4, 0, [3]))
    one = dataclasses.replace(SLOW, max_running=1)
    r = simulate_timed(trace, 10, block_tokens=4, service=one, impl=get_impl(impl_name))
    assert (r.peak_running, r.waited, r.waited_for_blocks) == (1, 2, 0)
    assert r.makespan_s == 12.0 and r.mean_wait_s == (0 + 4 + 8) / 3


def test_a_request_larger_than_the_pool_is_rejected(impl_name: str) -> None:
    trace = trace_of((0, 12, 0, [1, 2, 3]), (5, 4, 0, [1]))
    r = simulate_timed(trace, 2, block_tokens=4, service=SLOW, impl=get_impl(impl_name))
    assert (r.rejected, r.hit_blocks, r.peak_blocks_in_use) == (1, 0, 1)


def test_arrivals_are_sorted_by_timestamp(impl_name: str) -> None:
    """File order puts the later arrival first; the timed replay admits by time, so the earlier
    request caches id 1 and the later one hits it."""
    trace = trace_of((5000, 4, 0, [1, 9]), (0, 4, 0, [1]))
    r = simulate_timed(trace, 4, block_tokens=4, service=SLOW, impl=get_impl(impl_name))
    assert r.hit_blocks == 1


def test_one_at_a_time_is_the_sequential_replay() -> None:
    """With one request running at a time, no output tokens and a pool that holds every request,
    the timed replay makes the sequential replay's calls: the same hits at every capacity."""
    base = synthetic_trace(600, seed=3)
    trace = dataclasses.replace(base, output_lengths=[0] * base.num_requests)
    serial = ServiceModel(max_running=1)
    for capacity in (trace.max_request_blocks, 2 * trace.max_request_blocks, None):
        timed = simulate_timed(trace, capacity, service=serial)
        sequential = simulate_one(trace, capacity)
        assert (timed.hit_blocks, timed.token_hit_ratio) == (sequential.hit_blocks, sequential.token_hit_ratio)
        assert timed.preemptions == timed.rejected == 0


@pytest.mark.parametrize("policy", ["lru", "adaptive"])
def test_rust_and_reference_agree_under_pressure(policy: str) -> None:
    trace = synthetic_trace(300, seed=5)
    fast = ServiceModel(prefill_tokens_per_s=2_000, decode_tokens_per_s=20, max_running=16)
    pressed = []
    for capacity in (trace.max_request_blocks + 4, 3 * trace.max_request_blocks, None):
        a = simulate_timed(trace, capacity, service=fast, policy=policy)
        b = simulate_timed(trace, capacity, service=fast, policy=policy, impl=get_impl("reference"))
        assert a == b
        assert a.adaptive_horizon == (20_000 if policy == "adaptive" else None)
        pressed.append(a.preemptions + a.waited_for_blocks)
    assert pressed[0] > 0 and pressed[-1] == 0  # the small pool was short, the unbounded one never


def test_bounds_on_the_conversation_trace() -> None:
    """The peak in use never passes the capacity; a roomier pool never hits less, waits more or
    preempts more; unbounded never waits for blocks."""
    path = SHARED / "conversation_trace.jsonl"
    if not path.exists():
        pytest.skip(f"{path} is absent")
    trace = load_trace(path)
    results = [simulate_timed(trace, c) for c in (800, 1500, 3000, None)]
    for r in results[:-1]:
        assert r.peak_blocks_in_use <= r.capacity_blocks
        assert r.peak_running <= 64
    for small, big in zip(results, results[1:]):
        assert big.waited_for_blocks <= small.waited_for_blocks
    assert results[0].preemptions > 0 and results[-1].waited_for_blocks == 0 == results[-1].preemptions
    assert results[-1].hit_blocks >= results[0].hit_blocks


def test_bad_arguments() -> None:
    trace = trace_of((0, 4, 0, [1]))
    with pytest.raises(ValueError, match="capacity"):
        simulate_timed(trace, 0)
    with pytest.raises(ValueError, match="block_tokens"):
        simulate_timed(trace, 4, block_tokens=0)
    with pytest.raises(ValueError, match="max_running"):
        ServiceModel(max_running=0)
    with pytest.raises(ValueError, match="prefill_tokens_per_s"):
        ServiceModel(prefill_tokens_per_s=float("nan"))


def test_a_request_that_preempts_itself_waits_for_the_next_event(impl_name: str) -> None:
    """r0 holds 3 of 4 blocks and grows; r1 (newest, one block) needs a second block at once and
    preempts itself. Taken back in the same step, it would hit its own cached prompt and preempt
    itself again, each lap moving the clock by one prefill (forever at a huge prefill rate);
    it waits for r0's next event instead."""
    trace = trace_of((0, 512, 1536, [1]), (1, 512, 1024, [2]))
    fast = dataclasses.replace(SLOW, prefill_tokens_per_s=1e20)
    r = simulate_timed(trace, 4, block_tokens=512, service=fast, impl=get_impl(impl_name))
    assert r.preemptions <= 2
    # Epoch-nanosecond timestamps give the same replay as relative ones.
    shifted = trace_of((1_700_000_000_000_000_000, 512, 1536, [1]), (1_700_000_000_000_000_001, 512, 1024, [2]))
    s = simulate_timed(shifted, 4, block_tokens=512, service=fast, impl=get_impl(impl_name))
    assert (s.preemptions, s.makespan_s, s.mean_wait_s) == (r.preemptions, r.makespan_s, r.mean_wait_s)
