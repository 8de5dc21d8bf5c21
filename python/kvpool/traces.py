"""Mooncake-format request traces: loading, validating, writing, and a seeded synthetic one.

A trace is a JSON-lines file, one request per line (the format of the traces released with the
Mooncake FAST'25 paper)::

    {"timestamp": 0, "input_length": 6758, "output_length": 500, "hash_ids": [0, 1, 2, 3]}

``timestamp`` is the arrival time in milliseconds, ``input_length`` and ``output_length`` count
tokens, and ``hash_ids`` holds one integer per prompt block (512 tokens in the released traces):
equal ids mean equal content, and ids are prefix-chained (a shared id implies the whole prefix
before it is shared).

:func:`load_trace` validates every line and raises :class:`TraceError` naming the file and line
of the first problem. Each request's ids become one ``np.uint64`` array at load time, so a replay
never converts anything inside its timed region. :func:`synthetic_trace` builds a deterministic
chat-like trace, so the benchmark and the tests run with no files.

Example::

    >>> trace = synthetic_trace(200, seed=1)
    >>> trace.num_requests, trace.hash_ids[0].dtype
    (200, dtype('uint64'))
"""

from __future__ import annotations

import gzip
import json
import math
import random
import sys
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = [
    "MOONCAKE_BLOCK_TOKENS",
    "SyntheticShape",
    "Trace",
    "TraceError",
    "TraceRequest",
    "dump_trace",
    "is_prefix_consistent",
    "load_trace",
    "parse_trace",
    "synthetic_trace",
    "trace_warnings",
]

MOONCAKE_BLOCK_TOKENS = 512
"""Tokens per hash id in the released Mooncake traces."""

MAX_HASH_ID = 2**64 - 1
"""Hash ids become 8-byte big-endian block hashes, so they must fit in 64 unsigned bits."""

FIELDS = ("timestamp", "input_length", "output_length", "hash_ids")

HashIds = npt.NDArray[np.uint64]


class TraceError(ValueError):
    """A trace file is missing, unreadable, empty, or has a malformed line (the message says where)."""


@dataclass(frozen=True)
class TraceRequest:
    """One request of a trace, as plain Python values."""

    timestamp: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]


@dataclass(frozen=True)
class Trace:
    """A validated trace, column-wise: ``hash_ids[i]`` is request ``i``'s ids as ``np.uint64``."""

    name: str
    timestamps: list[float]
    input_lengths: list[int]
    output_lengths: list[int]
    hash_ids: list[HashIds] = field(repr=False)

    @property
    def num_requests(self) -> int:
        """Number of requests."""
        return len(self.hash_ids)

    @property
    def num_blocks(self) -> int:
        """Total number of blocks over all requests (ids counted with repetition)."""
        return sum(len(ids) for ids in self.hash_ids)

    @property
    def max_request_blocks(self) -> int:
        """The number of blocks of the longest request (0 for a trace of empty requests)."""
        return max((len(ids) for ids in self.hash_ids), default=0)

    def distinct_ids(self) -> int:
        """Number of distinct hash ids in the whole trace."""
        if not self.hash_ids:
            return 0
        return int(np.unique(np.concatenate(self.hash_ids)).size)

    def requests(self) -> Iterator[TraceRequest]:
        """The requests one by one, as :class:`TraceRequest` values."""
        for i, ids in enumerate(self.hash_ids):
            yield TraceRequest(
                self.timestamps[i], self.input_lengths[i], self.output_lengths[i], tuple(ids.tolist())
            )


# --------------------------------------------------------------------------------------------
# Loading and validating.
# --------------------------------------------------------------------------------------------


def load_trace(path: str | Path) -> Trace:
    """Load and validate the Mooncake trace at ``path``: a JSON-lines file, gzip-compressed if
    its name ends in ``.gz``, or standard input for ``"-"``.

    Blank lines are skipped. Raises :class:`TraceError` (a ``ValueError``) for a file that
    cannot be read, has no requests, or has a line that is not a JSON object with the four
    fields: a finite number ``timestamp``, integers ``input_length, output_length >= 0`` and a
    list ``hash_ids`` of integers in ``0..2**64``. The message names the file and line.
    """
    if str(path) == "-":
        return parse_trace(sys.stdin.buffer, name="stdin", where="<stdin>")
    path = Path(path)
    try:
        if path.suffix == ".gz":
            with gzip.open(path, "rb") as f:
                return parse_trace(f, name=path.name[: -len(".gz")], where=str(path))
        with path.open("rb") as f:
            return parse_trace(f, name=path.name, where=str(path))
    except OSError as exc:  # gzip.BadGzipFile is an OSError too
        raise TraceError(f"{path}: cannot read the trace: {exc.strerror or exc}") from None
    except EOFError:
        raise TraceError(f"{path}: cannot read the trace: the gzip stream is truncated") from None
    except zlib.error as exc:
        raise TraceError(f"{path}: cannot read the trace: the gzip stream is corrupt ({exc})") from None


def parse_trace(lines: Iterable[bytes | str], *, name: str = "trace", where: str | None = None) -> Trace:
    """Validate the JSON lines of a trace and build a :class:`Trace` called ``name``.

    ``where`` (default ``name``) prefixes error messages, e.g. ``"trace.jsonl:3: ..."``.
    """
    where = name if where is None else where
    timestamps: list[float] = []
    inputs: list[int] = []
    outputs: list[int] = []
    hash_ids: list[HashIds] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            request = _parse_line(line)
        except ValueError as exc:
            raise TraceError(f"{where}:{number}: {exc}") from None
        timestamps.append(request.timestamp)
        inputs.append(request.input_length)
        outputs.append(request.output_length)
        hash_ids.append(np.array(request.hash_ids, dtype=np.uint64))
    if not hash_ids:
        raise TraceError(f"{where}: the trace is empty (no requests)")
    return Trace(name, timestamps, inputs, outputs, hash_ids)


def _parse_line(line: bytes | str) -> TraceRequest:
    """One request from one line; ``ValueError`` with a short reason if the line is bad."""
    try:
        obj = json.loads(line)
    except UnicodeDecodeError:
        raise ValueError("not valid UTF-8 text") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"not valid JSON ({exc.msg} at column {exc.colno})") from None
    except RecursionError:
        raise ValueError("not valid JSON for a trace (nested too deeply)") from None
    if not isinstance(obj, dict):
        raise ValueError(f"expected a JSON object, got {_json_type(obj)}")
    missing = [key for key in FIELDS if key not in obj]
    if missing:
        raise ValueError(f"missing field {', '.join(repr(k) for k in missing)}")
    return TraceRequest(
        timestamp=_timestamp(obj["timestamp"]),
        input_length=_length(obj["input_length"], "input_length"),
        output_length=_length(obj["output_length"], "output_length"),
        hash_ids=_hash_ids(obj["hash_ids"]),
    )


def _json_type(value: Any) -> str:
    """The JSON name of a decoded value's type, for messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


def _timestamp(value: Any) -> float:
    """A finite JSON number, as ``float``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"'timestamp' must be a finite number, got {json.dumps(value)}")
    return float(value)


def _length(value: Any, key: str) -> int:
    """A non-negative JSON integer."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{key!r} must be an integer, got {json.dumps(value)}")
    if value < 0:
        raise ValueError(f"{key!r} must be >= 0, got {value}")
    if value >= 2**63:
        raise ValueError(f"{key!r} must be below 2**63, got {value}")
    return int(value)


def _hash_ids(value: Any) -> tuple[int, ...]:
    """A JSON array of integers in ``0..2**64``, as a tuple."""
    if not isinstance(value, list):
        raise ValueError(f"'hash_ids' must be an array of integers, got {_json_type(value)}")
    for i, x in enumerate(value):
        if isinstance(x, bool) or not isinstance(x, int):
            raise ValueError(f"'hash_ids'[{i}] must be an integer, got {json.dumps(x)}")
        if not 0 <= x <= MAX_HASH_ID:
            raise ValueError(f"'hash_ids'[{i}] = {x} is outside 0..2**64-1")
    return tuple(value)


# --------------------------------------------------------------------------------------------
# Properties and writing.
# --------------------------------------------------------------------------------------------


def is_prefix_consistent(trace: Trace) -> bool:
    """Whether every id always follows the same id (the first block: none) across the trace.

    True for well-formed Mooncake traces: then an id that is cached implies its prefix is, and
    no request repeats an id. A replay needs this to bound the pool that never evicts.
    """
    parent_of: dict[int, int | None] = {}
    for ids in trace.hash_ids:
        parent: int | None = None
        for x in ids.tolist():
            if parent_of.setdefault(x, parent) != parent:
                return False
            parent = x
    return True


def trace_warnings(trace: Trace, block_tokens: int) -> list[str]:
    """What makes a replay of ``trace`` at ``block_tokens`` tokens per hash id misleading, in
    words (empty when nothing does): lengths that disagree with the ids, timestamps out of
    order, ids that are not prefix-chained.

    A request's ``input_length`` should need ``len(hash_ids)`` blocks of ``block_tokens``; when
    most disagree, ``block_tokens`` is likely not the trace's (512 for the Mooncake traces).
    """
    out = []
    lengths = np.asarray(trace.input_lengths, dtype=np.int64)
    counts = np.fromiter((len(ids) for ids in trace.hash_ids), dtype=np.int64, count=trace.num_requests)
    off = np.flatnonzero(-(-lengths // block_tokens) != counts)
    if off.size:
        i = int(off[0])
        out.append(
            f"{off.size} of {trace.num_requests} requests have an input_length that does not need "
            f"len(hash_ids) blocks of {block_tokens} tokens (the first: request {i}, "
            f"{trace.input_lengths[i]} tokens and {int(counts[i])} ids)"
            + ("; is --block-tokens the trace's?" if off.size * 2 > trace.num_requests else "")
        )
    stamps = np.asarray(trace.timestamps, dtype=np.float64)
    back = np.flatnonzero(np.diff(stamps) < 0)
    if back.size:
        out.append(
            f"timestamps go back {back.size} times (first at request {int(back[0]) + 1}); the sequential "
            "replay uses file order, the timed one sorts by timestamp"
        )
    if not is_prefix_consistent(trace):
        out.append("hash ids are not prefix-chained (an id follows different ids); hits are counted as "
                   "prefixes all the same")
    return out


def dump_trace(trace: Trace) -> str:
    """The trace as Mooncake JSON lines (integral timestamps written as integers)."""
    out = []
    for request in trace.requests():
        ts = request.timestamp
        row = {
            "timestamp": int(ts) if ts.is_integer() else ts,
            "input_length": request.input_length,
            "output_length": request.output_length,
            "hash_ids": list(request.hash_ids),
        }
        out.append(json.dumps(row) + "\n")
    return "".join(out)


# --------------------------------------------------------------------------------------------
# The synthetic trace.
# --------------------------------------------------------------------------------------------

SYNTHETIC_REQUESTS = 4000
"""Default size of the synthetic trace: about 71,000 blocks of which 36,000 distinct, and a
block hit ratio of about 0.5 in a pool that never evicts (0.37 for Mooncake's conversation trace)."""


@dataclass
class _Session:
    """A conversation: the ids of its last prompt and the tokens of its history so far."""

    prompt_ids: list[int]
    prompt_tokens: int
    history_tokens: int


@dataclass(frozen=True)
class SyntheticShape:
    """The knobs of :func:`synthetic_trace` (defaults give a chat-like workload)."""

    system_prompts: int = 12  # shared system prompts, 1..6 full blocks each
    max_sessions: int = 64  # conversations open at once
    new_session_p: float = 0.6  # chance that a request opens a new conversation
    end_session_p: float = 0.6  # chance that a conversation ends after a turn
    max_context: int = 32_768  # a conversation ends once its history exceeds this (tokens)
    user_tokens: tuple[int, int] = (100, 8_000)
    output_tokens: tuple[int, int] = (1, 800)
    mean_gap_ms: float = 300.0


def synthetic_trace(
    num_requests: int = SYNTHETIC_REQUESTS,
    *,
    seed: int = 0,
    block_tokens: int = MOONCAKE_BLOCK_TOKENS,
    shape: SyntheticShape | None = None,
) -> Trace:
    """A deterministic, prefix-consistent, chat-like trace of ``num_requests`` requests.

    Conversations start from one of a few shared system prompts and grow turn by turn: each
    turn's prompt is the previous prompt, the previous answer and a new user message, so it
    shares the previous prompt's full blocks (same ids) and gets new ids for the rest. The same
    ``seed`` always gives the same trace.
    """
    if num_requests < 1:
        raise ValueError(f"num_requests must be >= 1, got {num_requests}")
    if block_tokens < 1:
        raise ValueError(f"block_tokens must be >= 1, got {block_tokens}")
    shape = shape or SyntheticShape()
    rng = random.Random(seed)
    next_id = 0

    def new_ids(n: int) -> list[int]:
        nonlocal next_id
        next_id += n
        return list(range(next_id - n, next_id))

    system_prompts = [new_ids(rng.randint(1, 6)) for _ in range(shape.system_prompts)]
    sessions: list[_Session] = []
    timestamps: list[float] = []
    inputs: list[int] = []
    outputs: list[int] = []
    hash_ids: list[HashIds] = []
    clock = 0.0
    for _ in range(num_requests):
        clock += rng.expovariate(1.0 / shape.mean_gap_ms)
        if not sessions or (len(sessions) < shape.max_sessions and rng.random() < shape.new_session_p):
            system = rng.choice(system_prompts)
            sessions.append(_Session(list(system), len(system) * block_tokens, len(system) * block_tokens))
        index = rng.randrange(len(sessions))
        session = sessions[index]
        input_length = session.history_tokens + rng.randint(*shape.user_tokens)
        shared = session.prompt_ids[: session.prompt_tokens // block_tokens]
        ids = shared + new_ids(-(-input_length // block_tokens) - len(shared))
        output_length = rng.randint(*shape.output_tokens)
        timestamps.append(float(round(clock)))
        inputs.append(input_length)
        outputs.append(output_length)
        hash_ids.append(np.array(ids, dtype=np.uint64))
        session.prompt_ids, session.prompt_tokens = ids, input_length
        session.history_tokens = input_length + output_length
        if session.history_tokens > shape.max_context or rng.random() < shape.end_session_p:
            sessions.pop(index)
    return Trace(f"synthetic(n={num_requests}, seed={seed})", timestamps, inputs, outputs, hash_ids)
