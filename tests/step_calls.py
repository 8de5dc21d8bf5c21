"""The scheduler's one-by-one calls that ``schedule_step`` must equal, for
``test_manager_step.py`` (``KVCacheManager``) and ``test_group_manager.py`` (``GroupManager``).
"""

from __future__ import annotations

from typing import Any

from kvpool import StepStatus


def per_group(blocks: Any) -> tuple[Any, ...]:
    """A manager's block ids per group: ``GroupManager`` gives a tuple, ``KVCacheManager`` one
    array."""
    return blocks if isinstance(blocks, tuple) else (blocks,)


def step_by_calls(
    m: Any, ids: list[Any], budgets: list[int], lookaheads: list[int], limits: dict[str, Any]
) -> dict[str, Any]:
    """What ``schedule_step`` must return (``KVCacheManager``'s or ``GroupManager``'s), made of ``get_computed_blocks`` / ``allocate_slots``
    / ``preempt`` calls under vLLM's step rules: a token budget shared by the step, a cap on
    scheduled requests, stopping at the first failure, and FCFS preemption (newest running
    request first, then the request itself; no admission once a step preempted)."""
    stop = bool(limits.get("stop_at_first_failure"))
    left = limits.get("token_budget")
    cap = limits.get("max_num_requests")
    may_preempt = bool(limits.get("preempt"))
    block_ids: list[int] = []
    offsets = [0]
    hit_ids: list[int] = []
    hit_offsets = [0]
    scheduled: list[int] = []
    hit_tokens: list[int] = []
    status: list[int] = []
    preempted: set[int] = set()
    stopped = False

    groups = getattr(m, "num_groups", 1)

    def waiting(rid: Any) -> bool:
        return m.get_num_computed_tokens(rid) == 0 and all(len(g) == 0 for g in per_group(m.get_block_ids(rid)))

    for i, (rid, budget, lookahead) in enumerate(zip(ids, budgets, lookaheads)):
        num_new = num_hit = 0
        if i in preempted:
            code = StepStatus.PREEMPTED
        elif stopped:
            code = StepStatus.SKIPPED
        elif left == 0:
            code = StepStatus.TOKEN_BUDGET
        elif cap is not None and status.count(StepStatus.SCHEDULED) >= cap:
            code = StepStatus.REQUEST_CAP
        elif preempted and waiting(rid):
            code = StepStatus.SKIPPED
        else:
            num_new = budget if left is None else min(budget, left)
            blocks: Any = None
            is_waiting = waiting(rid)
            if is_waiting:
                blocks, num_hit = m.get_computed_blocks(rid)
                num_new = min(num_new, m.get_num_tokens(rid) - num_hit)
            while True:
                if num_new + num_hit == 0:
                    code = StepStatus.NO_TOKENS
                    break
                kwargs = {"num_lookahead_tokens": lookahead}
                if is_waiting:
                    kwargs.update(num_new_computed_tokens=num_hit, new_computed_blocks=blocks)
                    if groups > 1 and not any(len(g) for g in blocks):
                        kwargs["new_computed_blocks"] = None
                new = m.allocate_slots(rid, num_new, **kwargs)
                if new is not None:
                    code = StepStatus.SCHEDULED
                    for g, new_g in enumerate(per_group(new)):
                        block_ids.extend(new_g.tolist())
                        offsets.append(len(block_ids))
                        if blocks is not None:
                            hit_ids.extend(per_group(blocks)[g].tolist())
                        hit_offsets.append(len(hit_ids))
                    if left is not None:
                        left -= num_new
                    break
                if not may_preempt or is_waiting:
                    code = StepStatus.NO_BLOCKS
                    break
                later = [j for j in range(len(ids) - 1, i, -1) if j not in preempted and not waiting(ids[j])]
                victim = later[0] if later else i
                m.preempt(ids[victim])
                preempted.add(victim)
                if victim == i:
                    code = StepStatus.PREEMPTED
                    break
            if code != StepStatus.SCHEDULED:
                num_new = num_hit = 0
                stopped = stop and code in (StepStatus.NO_BLOCKS, StepStatus.NO_TOKENS)
        scheduled.append(num_new)
        hit_tokens.append(num_hit)
        status.append(code)
        if code != StepStatus.SCHEDULED:
            offsets.extend([len(block_ids)] * groups)
            hit_offsets.extend([len(hit_ids)] * groups)
    return {
        "block_ids": ("<i4", block_ids),
        "offsets": ("<i8", offsets),
        "hit_block_ids": ("<i4", hit_ids),
        "hit_offsets": ("<i8", hit_offsets),
        "num_scheduled_tokens": ("<i8", scheduled),
        "num_hit_tokens": ("<i8", hit_tokens),
        "allocated": ("|b1", [c == StepStatus.SCHEDULED for c in status]),
        "status": ("|u1", [int(c) for c in status]),
    }
