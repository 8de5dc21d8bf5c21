"""``StepStatus``: what ``schedule_step`` did with each request (``StepResult.status``)."""

from __future__ import annotations

from enum import IntEnum


class StepStatus(IntEnum):
    """The codes of ``StepResult.status``, one per request of a step."""

    SCHEDULED = 0
    """Its slots were allocated."""
    NO_BLOCKS = 1
    """The pool could not hold it; nothing changed for it."""
    NO_TOKENS = 2
    """It had nothing to schedule (no new tokens and no prefix hit)."""
    TOKEN_BUDGET = 3
    """The step's ``token_budget`` was spent before it."""
    REQUEST_CAP = 4
    """The step had already scheduled ``max_num_requests`` requests."""
    SKIPPED = 5
    """Not tried: an earlier failure ended the step (``stop_at_first_failure``), or it was
    waiting and the step preempted (vLLM admits nothing in a step that preempts)."""
    PREEMPTED = 6
    """Preempted (``preempt=True``) to make room for an earlier running request, or for
    itself when no later one was left: its blocks are freed and it restarts from zero."""
