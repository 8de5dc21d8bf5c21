"""vLLM's request block hasher on kvpool's Rust hasher: the same hashes, byte for byte.

vLLM's engine core hashes every request's full blocks as its tokens arrive (the prompt when
the request is made, then one block each time decoding fills one), with the function
``get_request_block_hasher(hash_block_size, caching_hash_fn, num_hash_lookahead_tokens)``
returns; in Python that costs vLLM 1.3-2 µs a block. :func:`get_request_block_hasher` has
the same signature and returns a function that computes the same ``request.block_hashes``
with ``kvpool.BlockHasher.hash_blocks_from``: the request's token list is read in place, and
the LoRA name and path, cache salt and multimodal inputs become the same extra keys (pickle
memo references included). ``install()`` (``kvpool.vllm.install``) puts it where vLLM's
engine core and ``kv_cache_utils`` look the factory up.

Requests kvpool does not hash are hashed by vLLM's own function, per request: prompt
embeddings (vLLM hashes the tensor's bytes per block), a LoRA whose name or path is not a
``str``, a multimodal input whose identifier is not a ``str``; and hash functions other than
vLLM's four and lookahead hashing (speculative decoding with ``num_hash_lookahead_tokens``),
for which the factory returns vLLM's own function.
Counts by reason are in ``FALLBACKS``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal, cast

import vllm.utils.hashing as _vllm_hashing
import vllm.v1.core.kv_cache_utils as _kv_cache_utils

import kvpool

#: vLLM's own factory, as ``kv_cache_utils`` defines it.
vllm_get_request_block_hasher = _kv_cache_utils.get_request_block_hasher

_Algo = Literal["sha256", "sha256_cbor", "xxhash", "xxhash_cbor"]

#: vLLM's hash functions by kvpool's names for them.
_ALGORITHMS: dict[Callable[[Any], bytes], _Algo] = {
    _vllm_hashing.sha256: "sha256",
    _vllm_hashing.sha256_cbor: "sha256_cbor",
    _vllm_hashing.xxhash: "xxhash",
    _vllm_hashing.xxhash_cbor: "xxhash_cbor",
}

#: Requests (or hashers, for the factory's reasons) hashed by vLLM's own function, by reason.
FALLBACKS: dict[str, int] = {}

#: Request block hashers the factory built on kvpool.
BUILT = {"kvpool": 0}


def _fallback(reason: str) -> None:
    FALLBACKS[reason] = FALLBACKS.get(reason, 0) + 1


def get_request_block_hasher(
    hash_block_size: int,
    caching_hash_fn: Callable[[Any], bytes],
    num_hash_lookahead_tokens: int = 0,
) -> Callable[[Any], list[bytes]]:
    """vLLM 0.33's ``get_request_block_hasher``, computed by kvpool where it can be."""
    vllm_hasher = cast(Callable[[Any], list[bytes]],
                       vllm_get_request_block_hasher(hash_block_size, caching_hash_fn, num_hash_lookahead_tokens))
    algo = _ALGORITHMS.get(caching_hash_fn)
    if algo is None:
        _fallback("hash function other than vLLM's four")
        return vllm_hasher
    if num_hash_lookahead_tokens:
        _fallback("lookahead hashing")
        return vllm_hasher
    hasher = kvpool.BlockHasher(hash_block_size, hash_algo=algo)
    BUILT["kvpool"] += 1
    hash_blocks_from = hasher.hash_blocks_from
    kv_cache_utils = _kv_cache_utils

    def request_block_hasher(request: Any) -> list[bytes]:
        start = len(request.block_hashes)
        tokens = request._all_token_ids
        if (start + 1) * hash_block_size > len(tokens):
            return []  # no new full block (most calls: one token decoded)
        if request.prompt_embeds is not None:
            _fallback("prompt embeddings")
            return vllm_hasher(request)
        lora_request = request.lora_request
        lora = None
        if lora_request:
            lora = (lora_request.lora_name, lora_request.lora_path)
            if not (isinstance(lora[0], str) and isinstance(lora[1], str)):
                _fallback("a LoRA name or path that is not a str")
                return vllm_hasher(request)
        mm = request.mm_features
        if mm and not all(isinstance(f.identifier, str) for f in mm):
            _fallback("a multimodal input without a str identifier")
            return vllm_hasher(request)
        return hash_blocks_from(
            request.block_hashes[-1] if start else kv_cache_utils.NONE_HASH,
            tokens,
            start,
            lora=lora,
            cache_salt=request.cache_salt or None,
            mm_features=[(f.identifier, f.mm_position.offset, f.mm_position.length) for f in mm]
            if mm else None,
        )

    return request_block_hasher


def install() -> None:
    """Make vLLM's engine core (and ``kv_cache_utils``) build block hashers with
    :func:`get_request_block_hasher`."""
    import vllm.v1.engine.core as engine_core

    _kv_cache_utils.get_request_block_hasher = get_request_block_hasher
    engine_core.get_request_block_hasher = get_request_block_hasher
