"""Argument conversion for the reference classes, mirroring the Rust binding.

One place for what ``src/bindings/convert.rs`` (ints, bools, int lists, block ids),
``requests.rs`` (request ids) and ``hashing.rs::extract_extras`` (a request's extra-key
inputs) do at the Python boundary, plus the pool's block hashes and the per-request counts and
segmented token lists of the batched calls. Each helper returns plain Python values or raises
the kvpool exception the binding raises: ``DtypeError`` for a wrong type,
``InvalidArgumentError`` for a value out of range, ``InvalidBlockIdError`` and
``HashWidthError``. None of them looks at a pool's or a request's state, so the callers choose
the order in which arguments are checked.

What counts as an int is what PyO3's ``extract::<i64>`` takes: anything with ``__index__``
(Python ints, bools included, numpy integers, 0-d integer arrays), not floats, strs or numpy
bools, within int64 unless a narrower range is asked for. An int list is a 1-D numpy integer
array or any iterable of such ints other than a ``str`` or ``bytes``.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from kvpool._errors import DtypeError, HashWidthError, InvalidArgumentError, InvalidBlockIdError

I64_MIN, I64_MAX = -(2**63), 2**63 - 1
PROMPT_EMBED_DIGEST_LEN = 32

RequestId = str | int


# --------------------------------------------------------------------------------------------
# Containers.
# --------------------------------------------------------------------------------------------


def iterate(values: Any, message: str) -> Iterator[Any]:
    """An iterator over ``values``; ``DtypeError(message)`` if it is not iterable."""
    try:
        items: Iterator[Any] = iter(values)
    except TypeError:
        raise DtypeError(message) from None
    return items


def as_sequence(values: Any, message: str) -> Sequence[Any]:
    """``values`` if it is a sequence other than a ``str`` or bytes-like object; else
    ``DtypeError(message)``."""
    if isinstance(values, (str, bytes, bytearray, memoryview)) or not isinstance(values, Sequence):
        raise DtypeError(message)
    items: Sequence[Any] = values
    return items


# --------------------------------------------------------------------------------------------
# Scalars (convert.rs: int_arg, opt_int_arg, opt_bool_arg; hashing.rs: opt_str_arg).
# --------------------------------------------------------------------------------------------


def _index(value: Any) -> int | None:
    """``value`` as an ``int`` if it has ``__index__`` and is no bool (Python's or numpy's, as
    the Rust classes refuse them), else ``None``."""
    if isinstance(value, (bool, np.bool_)):
        return None
    try:
        return operator.index(value)
    except Exception:  # whatever an odd __index__ raises: not an int (Rust's DtypeError)
        return None


def as_int_arg(value: Any, name: str, low: int = I64_MIN, high: int = I64_MAX) -> int:
    """An int argument in ``low..=high`` (int64 by default).

    ``DtypeError`` if ``value`` is not an int (see the module docstring), else
    ``InvalidArgumentError`` if it is out of range.
    """
    v = _index(value)
    if v is None:
        raise DtypeError(f"{name} must be an int, got {type(value).__name__}")
    check_range(v, name, low, high)
    return v


def check_range(value: int, name: str, low: int, high: int) -> None:
    """``InvalidArgumentError`` unless ``low <= value <= high`` (for an int converted earlier)."""
    if not low <= value <= high:
        raise InvalidArgumentError(f"{name} must be {range_text(low, high)}, got {value}")


def range_text(low: int, high: int) -> str:
    """The range ``low..=high`` in words: ">= 0", "an int64", "between 1 and 100"."""
    if (low, high) == (I64_MIN, I64_MAX):
        return "an int64"
    if high == I64_MAX:
        return f">= {low}"
    return f"between {low} and {high}"


def as_opt_int_arg(value: Any, name: str, low: int = I64_MIN, high: int = I64_MAX) -> int | None:
    """``None``, or an int argument in ``low..=high`` as ``as_int_arg`` takes it."""
    return None if value is None else as_int_arg(value, name, low, high)


def as_bool_arg(value: Any, name: str, default: bool) -> bool:
    """A ``bool`` or numpy bool, as ``bool``; ``None`` gives ``default``; else ``DtypeError``."""
    if value is None:
        return default
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise DtypeError(f"{name} must be a bool, got {type(value).__name__}")


def as_opt_str_arg(value: Any, name: str) -> str | None:
    """``None``, or a ``str`` (a subclass's value as a plain ``str``); else ``DtypeError``."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise DtypeError(f"{name} must be a str, got {type(value).__name__}")
    return utf8_str(value, name)


def utf8_str(value: str, name: str) -> str:
    """``value`` as a plain ``str``, if UTF-8 can hold it (convert.rs: utf8_str); a lone
    surrogate is an ``InvalidArgumentError``."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidArgumentError(f"{name} is not encodable as UTF-8 (it holds a lone surrogate)") from None
    return str.__str__(value)


# --------------------------------------------------------------------------------------------
# Int lists, block ids and block hashes (convert.rs: extract_i64s, extract_block_ids).
# --------------------------------------------------------------------------------------------


#: Types that iterate but are no ordered sequence of ints (convert.rs:
#: not_a_sequence_of_ints): text, the bytes-like types and the unordered dict and sets.
NOT_SEQUENCES_OF_INTS = (str, bytes, bytearray, memoryview, dict, set, frozenset)


def as_int_list(values: Any, name: str) -> list[int]:
    """A 1-D numpy integer array or an iterable of ints (not a ``str``/``bytes``), as ints.

    ``DtypeError`` for anything else (float, bool or object arrays, 2-D or 0-d arrays, a
    scalar, a float or ``None`` element, ...); ``InvalidArgumentError`` for a value outside
    int64. Values are not otherwise range-checked.
    """
    message = f"{name} must be a 1-D numpy integer array or a sequence of ints, got {type(values).__name__}"
    if isinstance(values, np.ma.MaskedArray):
        raise DtypeError(f"{name} must not be a masked array (its mask would be ignored); pass .compressed() "
                         "or .filled()")
    if isinstance(values, np.ndarray):
        if values.ndim != 1 or values.dtype.kind not in "iu":
            raise DtypeError(message)
        ints: list[int] = values.tolist()
        if values.dtype.kind == "u" and ints and max(ints) > I64_MAX:
            raise InvalidArgumentError(f"{name} holds integers beyond int64")
        return ints
    if isinstance(values, NOT_SEQUENCES_OF_INTS):
        raise DtypeError(message)
    out = []
    for item in iterate(values, message):
        v = _index(item)
        if v is None:
            raise DtypeError(message)
        if not I64_MIN <= v <= I64_MAX:
            raise InvalidArgumentError(f"{name} holds an integer beyond int64")
        out.append(v)
    return out


def as_token_ids(values: Any, name: str = "token_ids") -> list[int]:
    """Token ids: ``as_int_list`` with the argument's name defaulting to ``token_ids``."""
    return as_int_list(values, name)


def check_block_ids(block_ids: Iterable[int], num_blocks: int) -> None:
    """``InvalidBlockIdError`` for the first id outside ``0..num_blocks``."""
    for block_id in block_ids:
        if not 0 <= block_id < num_blocks:
            raise InvalidBlockIdError(f"block id {block_id} is out of range for a pool of {num_blocks} blocks")


def as_block_ids(values: Any, num_blocks: int) -> list[int]:
    """Block ids in ``0..num_blocks``: ``as_int_list``, then ``check_block_ids``."""
    ids = as_int_list(values, "block ids")
    check_block_ids(ids, num_blocks)
    return ids


def as_hash(value: Any, name: str) -> bytes:
    """A block hash: ``bytes``, else ``DtypeError``. Its width is not checked here."""
    if not isinstance(value, bytes):
        raise DtypeError(f"{name} must be bytes, got {type(value).__name__}")
    return bytes(value)


def as_hash_list(values: Any, name: str) -> list[bytes]:
    """A sequence of ``bytes`` (not one ``bytes``), as a list; else ``DtypeError``. Widths are
    not checked here. A 1-D numpy integer array holds hash ids (a trace's ``hash_ids``): each
    stands for its 8-byte big-endian form, and must be ``>= 0``."""
    if isinstance(values, np.ndarray):
        return [v.to_bytes(8, "big") for v in _hash_ids(as_int_list(values, "block hashes"))]
    items = as_sequence(values, f"{name} must be a sequence of bytes, got {type(values).__name__}")
    return [as_hash(v, name) for v in items]


def _hash_ids(ids: list[int]) -> list[int]:
    """Hash ids, which must be ``>= 0`` (``InvalidArgumentError``)."""
    negative = next((v for v in ids if v < 0), None)
    if negative is not None:
        raise InvalidArgumentError(f"block hashes as integers must be >= 0, got {negative}")
    return ids


# --------------------------------------------------------------------------------------------
# Request ids (requests.rs) and the batched calls' per-request arguments.
# --------------------------------------------------------------------------------------------


def as_request_id(value: Any) -> RequestId:
    """A request id: a ``str``, or an int in int64 (not a bool); ``str`` and int ids are distinct.

    ``DtypeError`` for another type, ``InvalidArgumentError`` for an int outside int64.
    """
    if isinstance(value, str):
        return utf8_str(value, "a request id")
    v = None if isinstance(value, (bool, np.bool_)) else _index(value)
    if v is None:
        raise DtypeError(f"a request id must be a str or an int, got {type(value).__name__}")
    if not I64_MIN <= v <= I64_MAX:
        raise InvalidArgumentError(f"an int request id must fit in int64, got {v}")
    return v


def as_request_ids(values: Any) -> list[RequestId]:
    """Request ids from an iterable (not a single ``str``); ``DtypeError`` otherwise."""
    if isinstance(values, str):
        raise DtypeError("request ids must be a sequence of ids, not one str")
    items = iterate(values, f"request ids must be a sequence, got {type(values).__name__}")
    return [as_request_id(item) for item in items]


def as_per_request(value: Any, name: str, n: int) -> list[int]:
    """A count for each of ``n`` requests: one int for all, or an int list of length ``n``;
    each must be >= 0 (``InvalidArgumentError``)."""
    v = _index(value)
    if v is not None and I64_MIN <= v <= I64_MAX:
        if v < 0:
            raise InvalidArgumentError(f"{name} must be >= 0")
        return [v] * n
    counts = as_int_list(value, name)
    if len(counts) != n:
        raise InvalidArgumentError(f"{name} has {len(counts)} entries for {n} requests")
    if any(c < 0 for c in counts):
        raise InvalidArgumentError(f"{name} must be >= 0")
    return counts


def check_offsets(cuts: Sequence[int], total: int) -> None:
    """``InvalidArgumentError`` unless ``cuts`` starts at 0, never decreases and ends at ``total``."""
    if not cuts or cuts[0] != 0 or cuts[-1] != total or any(a > b for a, b in zip(cuts, cuts[1:])):
        raise InvalidArgumentError(f"offsets must start at 0, never decrease and end at {total} (the number of ids)")


def as_segments(token_ids: Any, offsets: Any, n: int) -> tuple[list[int], list[int]]:
    """A flat token list and the offsets cutting it into ``n`` segments (one token each when
    ``offsets`` is ``None``): segment ``i`` is ``tokens[cuts[i]:cuts[i + 1]]``."""
    tokens = as_token_ids(token_ids)
    cuts = list(range(len(tokens) + 1)) if offsets is None else as_int_list(offsets, "offsets")
    if len(cuts) != n + 1:
        raise InvalidArgumentError(f"{max(len(cuts) - 1, 0)} segments of token ids for {n} ids")
    check_offsets(cuts, len(tokens))
    return tokens, cuts


# --------------------------------------------------------------------------------------------
# A request's extra-key inputs (hashing.rs::extract_extras).
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MmFeature:
    """A multimodal input: vLLM's ``MultiModalFeatureSpec`` reduced to what hashing reads."""

    identifier: str
    offset: int  # mm_position.offset: index of the first placeholder token
    length: int  # mm_position.length: number of placeholder tokens

    @property
    def end(self) -> int:
        """The index just past the input's last placeholder token."""
        return self.offset + self.length


@dataclass(frozen=True)
class RequestExtras:
    """A request's inputs to its blocks' extra keys (vLLM reads them off the ``Request``)."""

    lora: tuple[str, str] | None = None  # (lora_name, lora_path)
    cache_salt: str | None = None
    mm_features: tuple[MmFeature, ...] = ()  # sorted by offset
    prompt_embed_digests: tuple[bytes, ...] | None = None  # one SHA-256 digest per block

    def hashable_blocks(self, num_full_blocks: int) -> int:
        """How many of the first ``num_full_blocks`` blocks have every input they need."""
        if self.prompt_embed_digests is None:
            return num_full_blocks
        return min(num_full_blocks, len(self.prompt_embed_digests))


NO_EXTRAS = RequestExtras()


def _plain(text: str) -> str:
    """``text`` itself if it is a plain ``str``, else a plain copy: the caller's objects are
    kept, so pickle's memo sees the objects vLLM's would (see ``kvpool.reference.hashing``).
    A ``str`` UTF-8 cannot hold is an ``InvalidArgumentError``, as in Rust."""
    utf8_str(text, "an extra key's str")
    return text if type(text) is str else str.__str__(text)


def _mm_feature(item: Any) -> MmFeature:
    """One ``(identifier, offset, length)`` tuple, offset and length >= 0."""
    if not (isinstance(item, tuple) and len(item) == 3 and isinstance(item[0], str)):
        raise DtypeError(
            f"each mm feature must be an (identifier: str, offset: int, length: int) tuple, got {type(item).__name__}"
        )
    offset = as_int_arg(item[1], "mm feature offset")
    length = as_int_arg(item[2], "mm feature length")
    if offset < 0 or length < 0:
        raise InvalidArgumentError("mm feature offset and length must be >= 0")
    return MmFeature(_plain(item[0]), offset, length)


def _digest(item: Any) -> bytes:
    """One prompt-embedding digest: ``bytes`` of 32 bytes."""
    if not isinstance(item, bytes):
        raise DtypeError(f"prompt embed digests must be bytes, got {type(item).__name__}")
    if len(item) != PROMPT_EMBED_DIGEST_LEN:
        raise HashWidthError(f"a prompt embed digest must be {PROMPT_EMBED_DIGEST_LEN} bytes, got {len(item)}")
    return bytes(item)


def as_request_extras(
    lora: Any = None,
    cache_salt: Any = None,
    mm_features: Any = None,
    prompt_embed_digests: Any = None,
) -> RequestExtras:
    """The request-level extra-key inputs, checked as ``kvpool.BlockHasher.hash_tokens`` checks them.

    ``DtypeError`` for a wrong type (``lora`` must be a ``(name, path)`` tuple of ``str``,
    ``cache_salt`` a ``str``, each mm feature an ``(identifier, offset, length)`` tuple, each
    digest ``bytes``); ``InvalidArgumentError`` for a negative mm offset or length, or mm
    features not sorted by offset; ``HashWidthError`` for a digest not of 32 bytes. The
    caller's ``str`` objects are kept (see ``kvpool.reference.hashing``, "Object identity").
    """
    lora_pair: tuple[str, str] | None = None
    if lora is not None:
        if not (isinstance(lora, tuple) and len(lora) == 2 and all(isinstance(x, str) for x in lora)):
            raise DtypeError(f"lora must be a (name, path) tuple of str, got {type(lora).__name__}")
        lora_pair = (_plain(lora[0]), _plain(lora[1]))
    salt = as_opt_str_arg(cache_salt, "cache_salt")
    features: tuple[MmFeature, ...] = ()
    if mm_features is not None:
        features = tuple(_mm_feature(item) for item in iterate(mm_features, "mm_features must be a sequence"))
    digests: tuple[bytes, ...] | None = None
    if prompt_embed_digests is not None:
        message = "prompt_embed_digests must be a sequence of bytes"
        digests = tuple(_digest(item) for item in iterate(prompt_embed_digests, message))
    if any(a.offset > b.offset for a, b in zip(features, features[1:])):
        raise InvalidArgumentError("multimodal features must be sorted by offset")
    return RequestExtras(lora_pair, None if salt is None else _plain(salt), features, digests)
