"""What the differential tests share: input forms, comparable return values, call outcomes.

The state machines (pool, tracker, manager) drive a Rust object and its
``kvpool.reference`` twin with the same calls and compare what each call did.
"""

from __future__ import annotations

from typing import Any

import numpy as np

UNSIGNED = {"uint8": 2**8, "uint16": 2**16}
STEP_FIELDS = ("block_ids", "offsets", "hit_block_ids", "hit_offsets", "num_scheduled_tokens", "num_hit_tokens",
               "allocated", "status")


def as_form(values: list[int], form: str) -> Any:
    """``values`` in an ids-like form: ``list``, ``tuple`` or a numpy dtype name. A numpy
    form the values do not fit falls back to a list."""
    if form == "tuple":
        return tuple(values)
    if form in ("int32", "int64") and all(-(2**31) <= v < 2**31 for v in values):
        return np.array(values, dtype=form)
    if form in UNSIGNED and all(0 <= v < UNSIGNED[form] for v in values):
        return np.array(values, dtype=form)
    return list(values)


def normalize(value: Any) -> Any:
    """A comparable form of a return value: arrays keep dtype and shape, a ``StepResult``
    becomes its fields, a ``BlockHashList`` its list of bytes."""
    if isinstance(value, np.ndarray):
        return ("ndarray", value.dtype.str, value.shape, value.tolist())
    if isinstance(value, np.generic):
        return ("numpy scalar", value.dtype.str, value.item())
    if hasattr(value, "allocated") and hasattr(value, "offsets"):  # a StepResult
        return ("StepResult", len(value), tuple(normalize(getattr(value, f)) for f in STEP_FIELDS))
    if hasattr(value, "to_list"):  # a BlockHashList (never compared with == against a list)
        return list(value.to_list())
    if isinstance(value, (tuple, list)):
        return type(value)(normalize(v) for v in value)
    return value


class Outcome:
    """What one call did on one object: a value or an exception."""

    def __init__(self, value: Any = None, error: BaseException | None = None) -> None:
        self.value = value
        self.error = error

    @classmethod
    def of(cls, obj: Any, method: str, *args: Any, **kwargs: Any) -> Outcome:
        """Call ``obj.method(*args, **kwargs)`` and record what happened."""
        try:
            return cls(value=getattr(obj, method)(*args, **kwargs))
        except Exception as e:  # noqa: BLE001  (the comparison reports it)
            return cls(error=e)

    @property
    def ok(self) -> bool:
        return self.error is None

    def key(self) -> Any:
        """What must agree between the two implementations: the value, or the exception type."""
        return ("ok", normalize(self.value)) if self.ok else ("raised", type(self.error))

    def __repr__(self) -> str:
        return f"returned {self.value!r}" if self.ok else f"raised {type(self.error).__name__}: {self.error}"


def agree(subject: Any, oracle: Any, method: str, *args: Any, **kwargs: Any) -> Outcome:
    """Call ``method`` on both objects, assert they did the same, return the oracle's outcome."""
    got, want = Outcome.of(subject, method, *args, **kwargs), Outcome.of(oracle, method, *args, **kwargs)
    assert got.key() == want.key(), f"{method}(args={args!r}, kwargs={kwargs!r}): subject {got!r}, reference {want!r}"
    return want
