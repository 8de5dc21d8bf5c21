"""vLLM 0.33's prefix-cache block hashing in plain Python: the oracle for kvpool's Rust hasher.

A readable transcription of vLLM 0.33:

* ``vllm/utils/hashing.py``: the four hash functions ``sha256`` (SHA-256 of
  ``pickle.dumps(x, protocol=5)``), ``sha256_cbor`` (SHA-256 of ``cbor2.dumps(x, canonical=True)``),
  ``xxhash`` and ``xxhash_cbor`` (``xxhash.xxh3_128_digest`` of the same bytes);
* ``vllm/v1/core/kv_cache_utils.py``: ``init_none_hash``, ``hash_block_tokens``,
  ``generate_block_hash_extra_keys`` with its ``_gen_*`` helpers, and the ``request_block_hasher``
  closure of ``get_request_block_hasher``;
* ``vllm/multimodal/utils.py``: ``get_mm_features_in_window``.

Block ``i`` of a request hashes as ``H((parent, tuple(token_ids_i), extra_keys_i))``: ``parent``
is hash ``i - 1``, or ``NONE_HASH = H(seed)`` for block 0. Only full blocks are hashed.
``extra_keys_i`` is ``None`` or a tuple of tagged entries, in this order:

* ``("lora", lora_name, lora_path)`` on every block of a LoRA request;
* ``("mm", identifier, offset - block_start)`` per multimodal input the block touches (the
  offset is negative when the input began in an earlier block);
* ``("cache_salt", salt)`` on the block starting at token 0 only, and only if the salt is non-empty;
* ``("prompt_embeds", digest)`` on every block of a request with prompt embeddings.

Where vLLM reads a ``Request``, the functions here take what kvpool takes (the same Python
argument forms as ``kvpool.BlockHasher.hash_tokens``): ``lora=(name, path)``, ``cache_salt``,
``mm_features=[(identifier, offset, length), ...]`` sorted by offset, and
``prompt_embed_digests``, the SHA-256 digest of each block's prompt embeddings (vLLM computes
``hashlib.sha256(tensor_data(embeds[start:end])).digest()`` itself). kvpool's documented choices:
the ``NONE_HASH`` seed defaults to ``"vllm-none-hash"`` for every algorithm (vLLM picks a random
seed for the xxhash ones unless ``PYTHONHASHSEED`` is set), and a request's chain stops at the
first block without a prompt-embedding digest.

Object identity. ``pickle`` memoizes ``str``/``bytes``/``tuple`` objects by identity: an object
seen twice in one pickled value is written once and then referenced (``BINGET``). vLLM's hash
input repeats objects in two ways: its tag literals (``"lora"``, ``"mm"``, ...) are one interned
object each, so a block touching two multimodal inputs pickles its second ``"mm"`` as a
``BINGET``; and the caller's own strings may be one object (a LoRA whose name and path are the
same ``str``, one identifier object for two inputs, a name that *is* the interned ``"lora"``,
CPython's shared empty and one-character strings). This module builds extra keys exactly as
vLLM does and keeps the caller's objects, so it pickles the same bytes in every such case; so
does the Rust extension, which records which of the caller's objects are the same. CBOR does
not depend on identity.

Example::

    >>> hasher = BlockHasher(4, hash_algo="sha256")
    >>> hashes = hasher.hash_tokens(range(10), lora=("my-lora", "/adapters/my-lora"))
    >>> len(hashes), len(hashes[0])
    (2, 32)
    >>> hasher.extend(hashes, range(12), lora=("my-lora", "/adapters/my-lora"))  # all tokens so far
    1
    >>> block_extra_keys(RequestExtras(lora=("my-lora", "/a")), 4, 0)
    (('lora', 'my-lora', '/a'),)

``cbor2`` and ``xxhash`` are imported only when an algorithm needs them.
"""

from __future__ import annotations

import bisect
import hashlib
import importlib
import pickle
from collections.abc import Callable, Iterable, Sequence
from types import ModuleType
from typing import Any

from kvpool._errors import DtypeError, HashWidthError, InvalidArgumentError
from kvpool.reference._args import (
    NO_EXTRAS,
    MmFeature,
    RequestExtras,
    as_int_arg,
    as_opt_str_arg,
    as_request_extras,
    as_token_ids,
    iterate,
    utf8_str,
)

__all__ = [
    "DEFAULT_HASH_ALGO",
    "DEFAULT_NONE_HASH_SEED",
    "DIGEST_LEN",
    "HASH_ALGOS",
    "BlockHasher",
    "MmFeature",
    "RequestExtras",
    "as_request_extras",
    "as_token_ids",
    "block_extra_keys",
    "compute_none_hash",
    "encode_hash_input",
    "extend",
    "generate_block_hash_extra_keys",
    "get_hash_fn",
    "get_mm_features_in_window",
    "hash_block_tokens",
    "hash_tokens",
    "hash_value",
    "none_hash",
    "request_block_hashes",
    "sha256",
    "sha256_cbor",
    "xxhash",
    "xxhash_cbor",
]

HashFunction = Callable[[Any], bytes]

HASH_ALGOS = ("sha256", "sha256_cbor", "xxhash", "xxhash_cbor")
DEFAULT_HASH_ALGO = "sha256_cbor"
DEFAULT_NONE_HASH_SEED = "vllm-none-hash"
DIGEST_LEN = {"sha256": 32, "sha256_cbor": 32, "xxhash": 16, "xxhash_cbor": 16}
MAX_BLOCK_SIZE = 2**32 - 1
HASH_INPUT_INT_MIN, HASH_INPUT_INT_MAX = -(2**127), 2**127 - 1  # kvpool's Value::Int is an i128


# --------------------------------------------------------------------------------------------
# The four hash functions (vllm/utils/hashing.py).
# --------------------------------------------------------------------------------------------


def _optional_module(name: str, needed_for: str) -> ModuleType:
    """Import ``name`` now, or raise ``ModuleNotFoundError`` saying which algorithms need it."""
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        raise ModuleNotFoundError(
            f"the {needed_for} hash algorithms need the {name!r} package (pip install {name})",
            name=name,
        ) from exc


def pickle_bytes(obj: Any) -> bytes:
    """What ``sha256`` and ``xxhash`` hash: ``pickle.dumps(obj, protocol=5)``."""
    return pickle.dumps(obj, protocol=5)


def cbor_bytes(obj: Any) -> bytes:
    """What ``sha256_cbor`` and ``xxhash_cbor`` hash: ``cbor2.dumps(obj, canonical=True)``."""
    data: bytes = _optional_module("cbor2", "sha256_cbor and xxhash_cbor").dumps(obj, canonical=True)
    return data


def _xxh3_128_digest(data: bytes) -> bytes:
    """xxh3-128 of ``data``, 16 bytes big-endian (``xxhash.xxh3_128_digest``)."""
    module = _optional_module("xxhash", "xxhash and xxhash_cbor")
    if not hasattr(module, "xxh3_128_digest"):
        raise ModuleNotFoundError("the xxhash hash algorithms need xxhash >= 3 (xxh3_128_digest)", name="xxhash")
    digest: bytes = module.xxh3_128_digest(data)
    return digest


def sha256(obj: Any) -> bytes:
    """SHA-256 of the pickle (vLLM's default ``--prefix-caching-hash-algo``)."""
    return hashlib.sha256(pickle_bytes(obj)).digest()


def sha256_cbor(obj: Any) -> bytes:
    """SHA-256 of the canonical CBOR."""
    return hashlib.sha256(cbor_bytes(obj)).digest()


def xxhash(obj: Any) -> bytes:
    """xxh3-128 of the pickle (16 bytes, big-endian)."""
    return _xxh3_128_digest(pickle_bytes(obj))


def xxhash_cbor(obj: Any) -> bytes:
    """xxh3-128 of the canonical CBOR (16 bytes, big-endian)."""
    return _xxh3_128_digest(cbor_bytes(obj))


_HASH_FUNCTIONS: dict[str, HashFunction] = {
    "sha256": sha256,
    "sha256_cbor": sha256_cbor,
    "xxhash": xxhash,
    "xxhash_cbor": xxhash_cbor,
}
_ENCODERS: dict[str, Callable[[Any], bytes]] = {
    "sha256": pickle_bytes,
    "sha256_cbor": cbor_bytes,
    "xxhash": pickle_bytes,
    "xxhash_cbor": cbor_bytes,
}


def check_hash_algo(hash_algo: Any) -> str:
    """The algorithm's name (``None`` gives the default, ``sha256_cbor``).

    ``DtypeError`` unless a ``str``; ``InvalidArgumentError`` for a name vLLM does not know.
    """
    name = as_opt_str_arg(hash_algo, "hash_algo")
    if name is None:
        return DEFAULT_HASH_ALGO
    if name not in _HASH_FUNCTIONS:
        raise InvalidArgumentError(f"unknown hash_algo {name!r}: expected one of {', '.join(HASH_ALGOS)}")
    return name


def get_hash_fn(hash_algo: str | None) -> HashFunction:
    """vLLM's ``get_hash_fn_by_name``, raising ``InvalidArgumentError`` for an unknown name."""
    return _HASH_FUNCTIONS[check_hash_algo(hash_algo)]


# --------------------------------------------------------------------------------------------
# Hash inputs: the values kvpool can hash (None, int, bytes, str and tuples of them).
# --------------------------------------------------------------------------------------------


def as_hash_input(value: Any) -> Any:
    """``value`` checked as a hash input, with ``str``/``bytes``/``int`` subclasses made plain.

    ``DtypeError`` for any other type (bool, float, list, bytearray, numpy scalars, ...),
    ``InvalidArgumentError`` for an int outside ``-2**127 .. 2**127 - 1``. Objects of the plain
    types are returned as they are, so their identity (and so the pickle's memo) is kept.
    """
    if value is None:
        return None
    if isinstance(value, bool):
        raise DtypeError("bool is not a supported hash-input value")
    if isinstance(value, bytes):
        return value if type(value) is bytes else bytes(value)
    if isinstance(value, str):
        utf8_str(value, "a hash-input str")
        return value if type(value) is str else str.__str__(value)
    if isinstance(value, tuple):
        items = [as_hash_input(item) for item in value]
        if type(value) is tuple and all(a is b for a, b in zip(items, value)):
            return value
        return tuple(items)
    if isinstance(value, int):
        if not HASH_INPUT_INT_MIN <= value <= HASH_INPUT_INT_MAX:
            raise InvalidArgumentError("hash-input ints must fit in 128 bits")
        return value if type(value) is int else int(value)
    raise DtypeError(f"hash inputs may be None, int, bytes, str or tuples of them, not {type(value).__name__}")


def encode_hash_input(value: Any, hash_algo: str = DEFAULT_HASH_ALGO) -> bytes:
    """The bytes ``hash_algo`` hashes for ``value`` (pickle protocol 5 or canonical CBOR)."""
    encode = _ENCODERS[check_hash_algo(hash_algo)]
    return encode(as_hash_input(value))


def hash_value(value: Any, hash_algo: str = DEFAULT_HASH_ALGO) -> bytes:
    """``H(value)`` as vLLM's hash function named ``hash_algo`` computes it."""
    hash_fn = get_hash_fn(hash_algo)
    return hash_fn(as_hash_input(value))


def _as_seed(seed: Any) -> str:
    """The ``NONE_HASH`` seed: a ``str``, or ``None`` for ``"vllm-none-hash"``; else ``DtypeError``."""
    text = as_opt_str_arg(seed, "seed")
    return DEFAULT_NONE_HASH_SEED if text is None else text


def none_hash(hash_algo: str = DEFAULT_HASH_ALGO, seed: str | None = None) -> bytes:
    """``NONE_HASH = H(seed)``, the parent of every first block (vLLM's ``init_none_hash``).

    The seed defaults to ``"vllm-none-hash"`` whatever the algorithm (kvpool's choice).
    """
    hash_fn = get_hash_fn(hash_algo)
    return hash_fn(_as_seed(seed))


compute_none_hash = none_hash


# --------------------------------------------------------------------------------------------
# Extra keys (vllm/v1/core/kv_cache_utils.py, vllm/multimodal/utils.py).
# --------------------------------------------------------------------------------------------


def get_mm_features_in_window(mm_features: Sequence[MmFeature], start: int, end: int) -> tuple[int, int]:
    """``(lo, hi)``: indices of the features overlapping ``[start, end)``.

    Assumes the features are sorted by offset and do not overlap, so their ends are sorted too.
    """
    lo = bisect.bisect_left(mm_features, start + 1, key=lambda f: f.offset + f.length)
    hi = bisect.bisect_left(mm_features, end, key=lambda f: f.offset)
    return lo, hi


def _gen_mm_extra_hash_keys(
    mm_features: Sequence[MmFeature], start_token_idx: int, end_token_idx: int, start_mm_idx: int
) -> tuple[list[tuple[str, str, int]], int]:
    """``("mm", identifier, offset - start)`` per input in the block; the next multimodal index.

    A cursor walk over the features from ``start_mm_idx``; it stops at the first input that
    continues past the block (so a later input that also starts in this block is not seen).
    """
    extra_keys: list[tuple[str, str, int]] = []
    if not mm_features:
        return extra_keys, start_mm_idx
    # Past the last input: nothing to walk (the late prefill and the decode phase).
    last = mm_features[-1]
    if last.offset + last.length <= start_token_idx:
        return extra_keys, start_mm_idx
    if start_mm_idx < 0:  # -1 stands for the last input
        start_mm_idx = len(mm_features) + start_mm_idx
    curr_mm_idx = start_mm_idx
    while curr_mm_idx < len(mm_features):
        feature = mm_features[curr_mm_idx]
        offset, length = feature.offset, feature.length
        if end_token_idx > offset:
            if start_token_idx >= offset + length:
                # The block has passed this input.
                curr_mm_idx += 1
                continue
            # The block holds (part of) this input; its offset relative to the block start keeps
            # otherwise identical placeholder blocks apart.
            extra_keys.append(("mm", feature.identifier, offset - start_token_idx))
            if end_token_idx >= offset + length:
                # The input ends in this block; the next one may start in it too.
                curr_mm_idx += 1
            else:
                # The input continues into the next block.
                break
        else:
            # The block has not reached this input.
            break
    return extra_keys, curr_mm_idx


def _gen_lora_extra_hash_keys(lora: tuple[str, str] | None) -> list[tuple[str, str, str]]:
    """``("lora", name, path)``: the path too, so re-pointing a name at another adapter misses."""
    if lora is None:
        return []
    return [("lora", lora[0], lora[1])]


def _gen_prompt_embeds_extra_hash_keys(
    digests: tuple[bytes, ...] | None, start_token_idx: int, end_token_idx: int
) -> list[tuple[str, bytes]]:
    """``("prompt_embeds", digest)`` of the block, for a request with prompt embeddings."""
    if digests is None:
        return []
    block_index = start_token_idx // (end_token_idx - start_token_idx)
    return [("prompt_embeds", digests[block_index])]


def generate_block_hash_extra_keys(
    extras: RequestExtras, start_token_idx: int, end_token_idx: int, start_mm_idx: int
) -> tuple[tuple[Any, ...] | None, int]:
    """The extra keys of block ``[start_token_idx, end_token_idx)`` (``None`` if there are none)
    and the multimodal index to resume the walk at for the next block."""
    mm_extra_keys, new_start_mm_idx = _gen_mm_extra_hash_keys(
        extras.mm_features, start_token_idx, end_token_idx, start_mm_idx
    )
    lora_extra_keys = _gen_lora_extra_hash_keys(extras.lora)
    cache_salt_keys: list[tuple[str, str]] = (
        [("cache_salt", extras.cache_salt)] if (start_token_idx == 0 and extras.cache_salt) else []
    )
    prompt_embeds_keys = _gen_prompt_embeds_extra_hash_keys(
        extras.prompt_embed_digests, start_token_idx, end_token_idx
    )
    extra_keys: list[Any] = [*lora_extra_keys, *mm_extra_keys, *cache_salt_keys, *prompt_embeds_keys]
    if not extra_keys:
        return None, new_start_mm_idx
    return tuple(extra_keys), new_start_mm_idx


def event_extra_keys(extras: RequestExtras, blocks: range, block_size: int) -> list[tuple[Any, ...] | None] | None:
    """The extra keys a ``BlockStored`` event of ``blocks`` carries, untagged as vLLM's
    ``to_event_extra_keys`` publishes them (the LoRA name, ``(identifier, offset)`` per
    multimodal input, the cache salt, the prompt-embeddings digest), one entry per block; the
    multimodal walk starts at the first input, as vLLM's event does. ``None`` when the request
    has no multimodal input, cache salt or prompt embeddings (the LoRA-only form says it all)."""
    if not extras.mm_features and not extras.cache_salt and extras.prompt_embed_digests is None:
        return None
    out: list[tuple[Any, ...] | None] = []
    mm_idx = 0
    for i in blocks:
        keys, mm_idx = generate_block_hash_extra_keys(extras, i * block_size, (i + 1) * block_size, mm_idx)
        out.append(None if keys is None else tuple(k[1:] if k[0] == "mm" else k[1] for k in keys))
    return out


def block_extra_keys(extras: RequestExtras, block_size: int, block_index: int) -> tuple[Any, ...] | None:
    """The extra keys of block ``block_index`` alone, the multimodal walk resumed as vLLM resumes it."""
    start = block_index * block_size
    mm_idx = 0
    if start > 0 and extras.mm_features and extras.mm_features[-1].end > start:
        mm_idx, _ = get_mm_features_in_window(extras.mm_features, start, start + block_size)
    keys, _ = generate_block_hash_extra_keys(extras, start, start + block_size, mm_idx)
    return keys


# --------------------------------------------------------------------------------------------
# The chain.
# --------------------------------------------------------------------------------------------


def hash_block_tokens(
    hash_function: HashFunction,
    none_hash_value: bytes,
    parent_block_hash: bytes | None,
    curr_block_token_ids: Iterable[int],
    extra_keys: Any = None,
) -> bytes:
    """``H((parent or NONE_HASH, tuple(token_ids), extra_keys))`` (an empty parent counts as none)."""
    if not parent_block_hash:
        parent_block_hash = none_hash_value
    return hash_function((parent_block_hash, tuple(curr_block_token_ids), extra_keys))


def request_block_hashes(
    hash_function: HashFunction,
    none_hash_value: bytes,
    block_size: int,
    token_ids: Sequence[int],
    extras: RequestExtras,
    block_hashes: Sequence[bytes],
) -> list[bytes]:
    """vLLM's ``request_block_hasher``: the hashes of the full blocks of ``token_ids`` (all of the
    request's tokens so far) after the ``len(block_hashes)`` already hashed.

    Resuming at a block other than the first restarts the multimodal walk at the first input
    ending after the block start (``get_mm_features_in_window``), so for sorted, non-overlapping
    inputs a chain hashed in steps equals one hashed at once. Blocks from the first without a
    prompt-embedding digest on are not hashed (kvpool's choice).
    """
    start_token_idx = len(block_hashes) * block_size
    num_tokens = extras.hashable_blocks(len(token_ids) // block_size) * block_size
    if start_token_idx + block_size > num_tokens:
        return []  # no new full block

    curr_mm_idx = 0
    mm_features = extras.mm_features
    if start_token_idx > 0 and mm_features:
        last = mm_features[-1]
        if last.offset + last.length > start_token_idx:
            curr_mm_idx, _ = get_mm_features_in_window(mm_features, start_token_idx, start_token_idx + block_size)

    prev_block_hash_value = block_hashes[-1] if block_hashes else None
    new_block_hashes: list[bytes] = []
    while True:
        end_token_idx = start_token_idx + block_size
        if end_token_idx > num_tokens:
            break  # only full blocks are hashed
        extra_keys, curr_mm_idx = generate_block_hash_extra_keys(extras, start_token_idx, end_token_idx, curr_mm_idx)
        block_tokens = token_ids[start_token_idx:end_token_idx]
        block_hash = hash_block_tokens(hash_function, none_hash_value, prev_block_hash_value, block_tokens, extra_keys)
        new_block_hashes.append(block_hash)
        start_token_idx += block_size
        prev_block_hash_value = block_hash
    return new_block_hashes


def _as_hash_chain(hashes: Any, hash_algo: str) -> list[bytes]:
    """The list ``extend`` appends to: a ``list`` of ``bytes`` of the algorithm's width."""
    if not isinstance(hashes, list):
        raise DtypeError(f"hashes must be a list of bytes, not {type(hashes).__name__}")
    width = DIGEST_LEN[hash_algo]
    for h in hashes:
        if not isinstance(h, bytes):
            raise DtypeError(f"block hashes must be bytes, got {type(h).__name__}")
        if len(h) != width:
            raise HashWidthError(f"a {hash_algo} block hash is {width} bytes, got {len(h)}")
    return hashes


def _check_parent(parent: Any) -> None:
    """A parent hash is ``bytes`` of 1 to 32 bytes, or None."""
    if parent is not None and not isinstance(parent, bytes):
        raise DtypeError(f"parent must be bytes or None, not {type(parent).__name__}")
    if parent is not None and not 1 <= len(parent) <= 32:
        raise HashWidthError(
            f"parent is {len(parent)} bytes wide; a hash must have 1 to 32 bytes (None for no parent)"
        )


class BlockHasher:
    """Hashes token blocks into chains of vLLM-compatible block hashes (``kvpool.BlockHasher``'s API).

    Hash chains are plain ``list[bytes]`` here (``kvpool.BlockHasher`` returns a ``BlockHashList``).
    """

    def __init__(self, block_size: int, *, hash_algo: str | None = None, seed: str | None = None) -> None:
        """``DtypeError`` for a non-int ``block_size`` or non-str ``hash_algo``/``seed``;
        ``InvalidArgumentError`` unless ``1 <= block_size <= 2**32 - 1`` and ``hash_algo`` is one of
        ``sha256``, ``sha256_cbor`` (the default), ``xxhash``, ``xxhash_cbor``."""
        as_opt_str_arg(hash_algo, "hash_algo")
        seed_str = _as_seed(seed)
        self._block_size = as_int_arg(block_size, "block_size", 1, MAX_BLOCK_SIZE)
        self._hash_algo = check_hash_algo(hash_algo)
        self._hash_fn = _HASH_FUNCTIONS[self._hash_algo]
        self._none_hash = self._hash_fn(seed_str)

    @property
    def block_size(self) -> int:
        """Tokens per block."""
        return self._block_size

    @property
    def hash_algo(self) -> str:
        """The algorithm's name."""
        return self._hash_algo

    @property
    def none_hash(self) -> bytes:
        """``NONE_HASH``, the parent of every first block."""
        return self._none_hash

    def __repr__(self) -> str:
        """A summary: block size and hash algorithm."""
        return f"reference.BlockHasher(block_size={self._block_size}, hash_algo={self._hash_algo!r})"

    def update_chain(self, hashes: list[bytes], token_ids: Sequence[int], extras: RequestExtras) -> int:
        """Appends to ``hashes`` the hashes of the full blocks of ``token_ids`` it lacks; returns
        how many (inputs already checked)."""
        new = request_block_hashes(self._hash_fn, self._none_hash, self._block_size, token_ids, extras, hashes)
        hashes.extend(new)
        return len(new)

    def hash_tokens(
        self,
        token_ids: Any,
        *,
        lora: tuple[str, str] | None = None,
        cache_salt: str | None = None,
        mm_features: Sequence[tuple[str, int, int]] | None = None,
        prompt_embed_digests: Sequence[bytes] | None = None,
    ) -> list[bytes]:
        """The hashes of every full block of ``token_ids``, with the request's extra keys."""
        extras = as_request_extras(lora, cache_salt, mm_features, prompt_embed_digests)
        tokens = as_token_ids(token_ids)
        hashes: list[bytes] = []
        self.update_chain(hashes, tokens, extras)
        return hashes

    def hash_tokens_many(self, token_lists: Any) -> list[list[bytes]]:
        """``hash_tokens`` of each token list (no extra keys)."""
        lists = [as_token_ids(tokens) for tokens in iterate(token_lists, "token_lists must be a sequence")]
        out = []
        for tokens in lists:
            hashes: list[bytes] = []
            self.update_chain(hashes, tokens, NO_EXTRAS)
            out.append(hashes)
        return out

    def extend(
        self,
        hashes: list[bytes],
        token_ids: Any,
        *,
        lora: tuple[str, str] | None = None,
        cache_salt: str | None = None,
        mm_features: Sequence[tuple[str, int, int]] | None = None,
        prompt_embed_digests: Sequence[bytes] | None = None,
    ) -> int:
        """Appends to ``hashes`` the hashes of the full blocks of ``token_ids`` (all of the request's
        tokens so far) that it lacks, without rehashing the others; returns how many.

        ``HashWidthError`` if ``hashes`` holds a hash of another width than this algorithm's.
        """
        chain = _as_hash_chain(hashes, self._hash_algo)
        extras = as_request_extras(lora, cache_salt, mm_features, prompt_embed_digests)
        tokens = as_token_ids(token_ids)
        return self.update_chain(chain, tokens, extras)

    def hash_blocks_from(
        self,
        parent: bytes | None,
        token_ids: Any,
        start_block: Any,
        *,
        lora: tuple[str, str] | None = None,
        cache_salt: str | None = None,
        mm_features: Sequence[tuple[str, int, int]] | None = None,
        prompt_embed_digests: Sequence[bytes] | None = None,
    ) -> list[bytes]:
        """The hashes of the full blocks of ``token_ids`` (a request's tokens so far) from block
        ``start_block`` on, the first chained to ``parent`` (the hash of block ``start_block - 1``;
        None: this hasher's ``NONE_HASH``): what vLLM's ``request_block_hasher`` appends to
        ``request.block_hashes``. Only the tokens from block ``start_block`` on are read."""
        start = as_int_arg(start_block, "start_block", 0)
        _check_parent(parent)
        extras = as_request_extras(lora, cache_salt, mm_features, prompt_embed_digests)
        skip = start * self._block_size
        if skip == 0:
            rest = as_token_ids(token_ids)
        else:
            # Only what can be sliced (as the Rust hasher takes token_ids[skip:]).
            try:
                sliced, total = token_ids[skip:], len(token_ids)
            except Exception:
                raise DtypeError("token_ids must be a 1-D numpy integer array or a sequence of ints, "
                                 f"got {type(token_ids).__name__}") from None
            rest = as_token_ids(sliced)
            if skip > total:
                return []
        # request_block_hashes reads only the length and the last of the hashes before; at
        # block 0 the parent stands in for NONE_HASH.
        none = parent if start == 0 and parent is not None else self._none_hash
        return request_block_hashes(self._hash_fn, none, self._block_size, [0] * skip + rest,
                                    extras, [parent] * start)  # type: ignore[list-item]

    def hash_block(self, parent: bytes | None, token_ids: Any, extra_keys: Any = None) -> bytes:
        """One block's hash: ``H((parent or NONE_HASH, tuple(token_ids), extra_keys))``.

        ``extra_keys`` is any None/int/bytes/str/tuple value (vLLM's tagged tuples, say).
        """
        _check_parent(parent)
        tokens = as_token_ids(token_ids)
        keys = as_hash_input(extra_keys)
        return hash_block_tokens(self._hash_fn, self._none_hash, parent, tokens, keys)


def hash_tokens(
    token_ids: Any,
    block_size: int,
    *,
    hash_algo: str | None = None,
    seed: str | None = None,
    lora: tuple[str, str] | None = None,
    cache_salt: str | None = None,
    mm_features: Sequence[tuple[str, int, int]] | None = None,
    prompt_embed_digests: Sequence[bytes] | None = None,
) -> list[bytes]:
    """``BlockHasher(block_size, hash_algo=..., seed=...).hash_tokens(token_ids, ...)``."""
    hasher = BlockHasher(block_size, hash_algo=hash_algo, seed=seed)
    return hasher.hash_tokens(
        token_ids, lora=lora, cache_salt=cache_salt, mm_features=mm_features, prompt_embed_digests=prompt_embed_digests
    )


def extend(
    hashes: list[bytes],
    token_ids: Any,
    block_size: int,
    *,
    hash_algo: str | None = None,
    seed: str | None = None,
    lora: tuple[str, str] | None = None,
    cache_salt: str | None = None,
    mm_features: Sequence[tuple[str, int, int]] | None = None,
    prompt_embed_digests: Sequence[bytes] | None = None,
) -> int:
    """``BlockHasher(block_size, hash_algo=..., seed=...).extend(hashes, token_ids, ...)``."""
    hasher = BlockHasher(block_size, hash_algo=hash_algo, seed=seed)
    return hasher.extend(
        hashes,
        token_ids,
        lora=lora,
        cache_salt=cache_salt,
        mm_features=mm_features,
        prompt_embed_digests=prompt_embed_digests,
    )
