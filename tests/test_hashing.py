"""Block hashing, byte for byte: kvpool's Rust hasher against Python's own encoders, against a
direct transcription of vLLM 0.33's chain, and against ``kvpool.reference.hashing``.

* ``encode_hash_input`` / ``hash_value`` / ``compute_none_hash`` against ``cbor2``, ``pickle``,
  ``hashlib`` and ``xxhash`` on random values.
* ``BlockHasher.hash_block`` against ``H((parent, tuple(tokens), extra_keys))``.
* ``BlockHasher.hash_tokens`` / ``extend`` against the reference and the vLLM transcription
  below (``vllm_*``, copied from vLLM 0.33's ``kv_cache_utils.py`` with a stub ``Request``), on
  random requests: token ids up to and beyond ``2**31``, random block sizes, LoRA, cache salt,
  multimodal inputs and prompt-embedding digests. Tests whose requests carry extra keys have
  ``extra_keys`` in their names: vLLM 0.33 tags them (``("lora", name, path)``, ``("mm", id,
  offset)``, ``("cache_salt", salt)``, ``("prompt_embeds", digest)``).
* ``BlockHashList``'s API, and that pools take a ``BlockHashList`` as they take its ``to_list()``.
* Errors: the specific ``kvpool`` exception for each kind of bad input.

Pickle memoizes ``str``/``bytes``/``tuple`` objects by identity (a repeated object is written as
a ``BINGET``), which kvpool's encoder, working on values, cannot see. Random values are therefore
rebuilt from fresh objects and those whose pickle still holds a ``BINGET`` (CPython shares ""
and one-character strings) are skipped; request strings have at least two characters. The one
repetition vLLM's own hash input has, the ``"mm"`` tag literal, is tested on purpose.

``KVPOOL_HYPOTHESIS_EXAMPLES`` sets the number of examples per property and algorithm (default 300).
"""

from __future__ import annotations

import bisect
import hashlib
import os
import pickle
import pickletools
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from kvpool._errors import HAVE_CORE, DtypeError, HashWidthError, InvalidArgumentError
from kvpool.reference import hashing as ref

cbor2 = pytest.importorskip("cbor2")
xxhash = pytest.importorskip("xxhash")

if HAVE_CORE:
    import kvpool._core as core
else:  # pragma: no cover - the Rust half of this file needs the extension
    core = None

needs_core = pytest.mark.skipif(not HAVE_CORE, reason="kvpool._core is not built")

SETTINGS = settings(
    max_examples=int(os.environ.get("KVPOOL_HYPOTHESIS_EXAMPLES", "300")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large],
)

ALGOS = list(ref.HASH_ALGOS)
PICKLE_ALGOS = ["sha256", "xxhash"]
CBOR_ALGOS = ["sha256_cbor", "xxhash_cbor"]


def H(algo: str, value: Any) -> bytes:
    """vLLM's hash function ``algo``, written out with the libraries themselves."""
    data = pickle.dumps(value, protocol=5) if algo in PICKLE_ALGOS else cbor2.dumps(value, canonical=True)
    return hashlib.sha256(data).digest() if algo.startswith("sha256") else xxhash.xxh3_128_digest(data)


def hashers(block_size: int, algo: str, seed: str | None = None) -> list[Any]:
    """The Rust and the reference ``BlockHasher`` (the Rust one only when built)."""
    out: list[Any] = [ref.BlockHasher(block_size, hash_algo=algo, seed=seed)]
    if HAVE_CORE:
        out.insert(0, core.BlockHasher(block_size, hash_algo=algo, seed=seed))
    return out


def as_list(hashes: Any) -> list[bytes]:
    """A ``BlockHashList`` or a list of hashes, as a list of bytes."""
    return hashes.to_list() if hasattr(hashes, "to_list") else list(hashes)


# --------------------------------------------------------------------------------------------
# Fresh objects, and pickles without memo references.
# --------------------------------------------------------------------------------------------


def fresh(value: Any) -> Any:
    """``value`` rebuilt from new ``str``/``bytes``/``tuple`` objects wherever CPython allows."""
    if isinstance(value, str):
        return value[:1] + value[1:]
    if isinstance(value, bytes):
        return value[:1] + value[1:]
    if isinstance(value, tuple):
        return tuple(fresh(v) for v in value)
    return value


def has_memo_get(data: bytes) -> bool:
    return any(op.name in ("GET", "BINGET", "LONG_BINGET") for op, _, _ in pickletools.genops(data))


# --------------------------------------------------------------------------------------------
# Strategies.
# --------------------------------------------------------------------------------------------

INT_EDGES = [
    0, 1, -1, 23, 24, -24, -25, 255, 256, 65535, 65536, 2**31 - 1, 2**31, -(2**31), -(2**31) - 1,
    2**32 - 1, 2**32, 2**63 - 1, 2**63, -(2**63), -(2**63) - 1, 2**64 - 1, 2**64, -(2**64), -(2**64) - 1,
    2**127 - 1, -(2**127),
]
ints_st = st.one_of(
    st.integers(-300, 300),
    st.sampled_from(INT_EDGES),
    st.integers(-(2**63), 2**63),
    st.integers(-(2**127), 2**127 - 1),
)
texts_st = st.one_of(st.text(max_size=30), st.text(alphabet="aé€😀\u0101\x00", max_size=12))
scalars_st = st.one_of(st.none(), ints_st, st.binary(max_size=40), texts_st)
values_st = st.recursive(scalars_st, lambda children: st.lists(children, max_size=6).map(tuple), max_leaves=25)

token_st = st.one_of(
    st.integers(0, 2**31 - 1),
    st.integers(0, 200),
    st.integers(2**31, 2**63 - 1),
    st.integers(-(2**63), -1),
    st.sampled_from([0, 1, 2**31 - 1, 2**31, 2**32, 2**63 - 1, -(2**63)]),
)
tokens_st = st.lists(token_st, max_size=90)
block_sizes_st = st.sampled_from([1, 2, 3, 4, 5, 7, 8, 16, 32])
names_st = st.text(min_size=2, max_size=12).map(fresh)  # two characters or more: never CPython-shared


@dataclass
class Req:
    """A random request: its tokens and the extra-key arguments of ``hash_tokens``."""

    block_size: int
    tokens: list[int]
    lora: tuple[str, str] | None = None
    cache_salt: str | None = None
    mm_features: list[tuple[str, int, int]] = field(default_factory=list)
    prompt_embed_digests: list[bytes] | None = None

    def kwargs(self) -> dict[str, Any]:
        return dict(
            lora=self.lora,
            cache_salt=self.cache_salt,
            mm_features=self.mm_features or None,
            prompt_embed_digests=self.prompt_embed_digests,
        )

    @property
    def num_blocks(self) -> int:
        return len(self.tokens) // self.block_size


@st.composite
def mm_features_st(draw: st.DrawFn, num_tokens: int, overlapping: bool = False) -> list[tuple[str, int, int]]:
    """Multimodal inputs sorted by offset; non-overlapping unless ``overlapping`` (as vLLM assumes)."""
    features = []
    pos = draw(st.integers(0, 6))
    for _ in range(draw(st.integers(0, 4))):
        if overlapping and features and draw(st.booleans()):
            offset = max(features[-1][1], pos - draw(st.integers(0, 5)))
        else:
            offset = pos + draw(st.integers(0, 10))
        length = draw(st.integers(0, max(1, num_tokens // 2)))
        features.append((draw(names_st), offset, length))
        pos = offset + length
    return features


@st.composite
def requests_st(draw: st.DrawFn, extra_keys: bool = True, overlapping: bool = False, all_digests: bool = True) -> Req:
    bs = draw(block_sizes_st)
    tokens = draw(tokens_st)
    req = Req(bs, tokens)
    if not extra_keys:
        return req
    if draw(st.booleans()):
        req.lora = (draw(names_st), draw(names_st))
    req.cache_salt = draw(st.one_of(st.none(), st.just(""), names_st))
    if draw(st.booleans()):
        req.mm_features = draw(mm_features_st(len(tokens), overlapping))
    if draw(st.integers(0, 3)) == 0:
        n = req.num_blocks + (2 if all_digests else draw(st.integers(-req.num_blocks, 2)))
        req.prompt_embed_digests = [hashlib.sha256(b"embeds %d" % k).digest() for k in range(max(n, 0))]
    return req


def token_forms(tokens: list[int]) -> list[Any]:
    """``tokens`` as the forms ``hash_tokens`` takes: list, tuple, numpy arrays where they fit."""
    forms: list[Any] = [list(tokens), tuple(tokens), np.array(tokens, dtype=np.int64)]
    if all(-(2**31) <= t < 2**31 for t in tokens):
        forms.append(np.array(tokens, dtype=np.int32))
    if all(0 <= t < 2**32 for t in tokens):
        forms.append(np.array(tokens, dtype=np.uint32))
    return forms


# --------------------------------------------------------------------------------------------
# vLLM 0.33's block hashing, transcribed directly (vllm/v1/core/kv_cache_utils.py,
# vllm/multimodal/utils.py), over a stub Request. Independent of kvpool.reference.
# --------------------------------------------------------------------------------------------


class _Pos:
    def __init__(self, offset: int, length: int) -> None:
        self.offset, self.length = offset, length


class _Feature:
    def __init__(self, identifier: str, offset: int, length: int) -> None:
        self.identifier, self.mm_position = identifier, _Pos(offset, length)


class _Lora:
    def __init__(self, name: str, path: str) -> None:
        self.lora_name, self.lora_path = name, path


class VllmRequest:
    """The attributes of ``vllm.v1.request.Request`` that block hashing reads."""

    def __init__(self, req: Req) -> None:
        self.all_token_ids: list[int] = []
        self.lora_request = _Lora(*req.lora) if req.lora else None
        self.cache_salt = req.cache_salt
        self.mm_features = [_Feature(*f) for f in req.mm_features]
        digests = req.prompt_embed_digests
        # vLLM hashes each block's prompt embeddings once and caches the digest here.
        self.prompt_embeds = None if digests is None else object()
        bs = req.block_size
        self._prompt_embeds_per_block_hashes = {} if digests is None else {
            (k * bs, (k + 1) * bs): d for k, d in enumerate(digests)
        }
        self.block_hashes: list[bytes] = []

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)


def vllm_get_mm_features_in_window(mm_features: list[Any], start: int, end: int) -> tuple[int, int]:
    lo = bisect.bisect_left(mm_features, start + 1, key=lambda f: f.mm_position.offset + f.mm_position.length)
    hi = bisect.bisect_left(mm_features, end, key=lambda f: f.mm_position.offset)
    return lo, hi


def vllm_gen_mm_extra_hash_keys(request: VllmRequest, start_token_idx: int, end_token_idx: int,
                                start_mm_idx: int) -> tuple[list[Any], int]:
    extra_keys: list[Any] = []
    mm_features = request.mm_features
    if not mm_features:
        return extra_keys, start_mm_idx
    last_pos = mm_features[-1].mm_position
    if last_pos.offset + last_pos.length <= start_token_idx:
        return extra_keys, start_mm_idx
    if start_mm_idx < 0:
        assert -start_mm_idx <= len(mm_features)
        start_mm_idx = len(mm_features) + start_mm_idx
    curr_mm_idx = start_mm_idx
    while mm_features and curr_mm_idx < len(mm_features):
        mm_feature = mm_features[curr_mm_idx]
        assert mm_feature.identifier is not None
        offset = mm_feature.mm_position.offset
        length = mm_feature.mm_position.length
        if end_token_idx > offset:
            if start_token_idx >= offset + length:
                curr_mm_idx += 1
                continue
            extra_keys.append(("mm", mm_feature.identifier, offset - start_token_idx))
            if end_token_idx >= offset + length:
                curr_mm_idx += 1
            else:
                break
        else:
            break
    return extra_keys, curr_mm_idx


def vllm_gen_lora_extra_hash_keys(request: VllmRequest) -> list[tuple[str, str, str]]:
    lora_request = request.lora_request
    if not lora_request:
        return []
    return [("lora", lora_request.lora_name, lora_request.lora_path)]


def vllm_gen_prompt_embeds_extra_hash_keys(request: VllmRequest, start_token_idx: int,
                                           end_token_idx: int) -> list[tuple[str, bytes]]:
    if request.prompt_embeds is None:
        return []
    block_range = (start_token_idx, end_token_idx)
    embeds_hash = request._prompt_embeds_per_block_hashes.get(block_range)
    assert embeds_hash is not None, "the test gives a digest for every block"
    return [("prompt_embeds", embeds_hash)]


def vllm_generate_block_hash_extra_keys(request: VllmRequest, start_token_idx: int, end_token_idx: int,
                                        start_mm_idx: int) -> tuple[tuple[Any, ...] | None, int]:
    mm_extra_keys, new_start_mm_idx = vllm_gen_mm_extra_hash_keys(request, start_token_idx, end_token_idx,
                                                                  start_mm_idx)
    lora_extra_keys = vllm_gen_lora_extra_hash_keys(request)
    cache_salt_keys = [("cache_salt", request.cache_salt)] if (start_token_idx == 0 and request.cache_salt) else []
    prompt_embeds_keys = vllm_gen_prompt_embeds_extra_hash_keys(request, start_token_idx, end_token_idx)
    extra_keys: list[Any] = lora_extra_keys + mm_extra_keys + cache_salt_keys + prompt_embeds_keys
    if not extra_keys:
        return None, new_start_mm_idx
    return tuple(extra_keys), new_start_mm_idx


def vllm_hash_block_tokens(hash_function: Any, none_hash: bytes, parent_block_hash: bytes | None,
                           curr_block_token_ids: list[int], extra_keys: Any = None) -> bytes:
    if not parent_block_hash:
        parent_block_hash = none_hash
    return hash_function((parent_block_hash, tuple(curr_block_token_ids), extra_keys))


def vllm_request_block_hasher(request: VllmRequest, hash_block_size: int, hash_function: Any,
                              none_hash: bytes) -> list[bytes]:
    """``get_request_block_hasher(hash_block_size, hash_function)(request)``."""
    start_token_idx = len(request.block_hashes) * hash_block_size
    num_tokens = request.num_tokens
    if start_token_idx + hash_block_size > num_tokens:
        return []
    curr_mm_idx = 0
    mm_features = request.mm_features
    if start_token_idx > 0 and mm_features:
        last_mm_pos = mm_features[-1].mm_position
        if last_mm_pos.offset + last_mm_pos.length > start_token_idx:
            curr_mm_idx, _ = vllm_get_mm_features_in_window(mm_features, start_token_idx,
                                                            start_token_idx + hash_block_size)
    prev_block_hash_value = request.block_hashes[-1] if request.block_hashes else None
    new_block_hashes: list[bytes] = []
    while True:
        end_token_idx = start_token_idx + hash_block_size
        if end_token_idx > num_tokens:
            break
        extra_keys, curr_mm_idx = vllm_generate_block_hash_extra_keys(request, start_token_idx, end_token_idx,
                                                                      curr_mm_idx)
        block_tokens = request.all_token_ids[start_token_idx:end_token_idx]
        block_hash = vllm_hash_block_tokens(hash_function, none_hash, prev_block_hash_value, block_tokens,
                                            extra_keys)
        new_block_hashes.append(block_hash)
        start_token_idx += hash_block_size
        prev_block_hash_value = block_hash
    return new_block_hashes


def vllm_chain(req: Req, algo: str, steps: list[int] | None = None, seed: str = ref.DEFAULT_NONE_HASH_SEED) -> list[bytes]:
    """vLLM's block hashes of ``req``, its hasher called after each step (token counts)."""
    def hash_fn(value: Any) -> bytes:
        return H(algo, value)

    none_hash = hash_fn(seed)
    request = VllmRequest(req)
    for n in (steps or []) + [len(req.tokens)]:
        request.all_token_ids = req.tokens[:n]
        request.block_hashes.extend(vllm_request_block_hasher(request, req.block_size, hash_fn, none_hash))
    return request.block_hashes


# --------------------------------------------------------------------------------------------
# Encoders and hash functions.
# --------------------------------------------------------------------------------------------


@needs_core
@pytest.mark.parametrize("algo", CBOR_ALGOS)
@SETTINGS
@given(value=values_st)
def test_encode_hash_input_matches_cbor2(value: Any, algo: str) -> None:
    expected = cbor2.dumps(value, canonical=True)
    assert core.encode_hash_input(value, algo) == expected
    assert ref.encode_hash_input(value, algo) == expected


@needs_core
@pytest.mark.parametrize("algo", PICKLE_ALGOS)
@SETTINGS
@given(value=values_st)
def test_encode_hash_input_matches_pickle(value: Any, algo: str) -> None:
    expected = pickle.dumps(value, protocol=5)
    assert core.encode_hash_input(value, algo) == expected
    assert ref.encode_hash_input(value, algo) == expected


@needs_core
@pytest.mark.parametrize("algo", ALGOS)
@SETTINGS
@given(value=values_st)
def test_hash_value_matches_hashlib_and_xxhash(value: Any, algo: str) -> None:
    expected = H(algo, value)
    assert len(expected) == ref.DIGEST_LEN[algo]
    assert core.hash_value(value, algo) == expected
    assert ref.hash_value(value, algo) == expected


@needs_core
@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize("size", [0, 1, 255, 256, 65535, 65536, 70_000])
def test_large_payloads_and_pickle_frames(algo: str, size: int) -> None:
    """Payloads around the 64 KiB pickle frame size, and a block of 20,000 tokens."""
    payload = bytes(k % 251 for k in range(size))
    text = "".join(chr(0x61 + k % 26) if k % 7 else "é" for k in range(size))
    for value in (payload, text, (b"\x01" * 32, tuple(range(size, size + 20_000)), None), (text, payload, 5)):
        assert core.encode_hash_input(value, algo) == ref.encode_hash_input(value, algo)
        assert core.hash_value(value, algo) == H(algo, value)


@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize("seed", [None, "vllm-none-hash", "0", "", "graine-é€", "x" * 300])
def test_compute_none_hash_is_hash_of_the_seed(algo: str, seed: str | None) -> None:
    expected = H(algo, "vllm-none-hash" if seed is None else seed)
    assert ref.none_hash(algo, seed) == expected
    assert ref.BlockHasher(4, hash_algo=algo, seed=seed).none_hash == expected
    if HAVE_CORE:
        assert core.compute_none_hash(algo, seed) == expected
        assert core.BlockHasher(4, hash_algo=algo, seed=seed).none_hash == expected


@needs_core
def test_defaults_are_sha256_cbor_and_the_fixed_seed() -> None:
    expected = H("sha256_cbor", "vllm-none-hash")
    assert core.compute_none_hash() == ref.none_hash() == expected
    assert core.BlockHasher(16).hash_algo == ref.BlockHasher(16).hash_algo == "sha256_cbor"
    assert core.encode_hash_input((1, "a")) == ref.encode_hash_input((1, "a")) == cbor2.dumps((1, "a"), canonical=True)


# --------------------------------------------------------------------------------------------
# One block.
# --------------------------------------------------------------------------------------------


@needs_core
@pytest.mark.parametrize("algo", ALGOS)
@SETTINGS
@given(
    parent=st.one_of(st.none(), st.just(b""), st.binary(min_size=16, max_size=32)),
    tokens=tokens_st,
    extra=st.one_of(st.none(), values_st).map(fresh),
)
def test_hash_block_is_hash_of_the_triple(algo: str, parent: bytes | None, tokens: list[int], extra: Any) -> None:
    parent = fresh(parent)
    if parent == b"":
        for hasher in hashers(16, algo):
            with pytest.raises(HashWidthError):
                hasher.hash_block(parent, tokens, extra)
        return
    none_hash = H(algo, "vllm-none-hash")
    triple = (parent or none_hash, tuple(tokens), extra)
    expected = H(algo, triple)
    for hasher in hashers(16, algo):
        assert hasher.hash_block(parent, tokens, extra) == expected
        assert hasher.hash_block(parent, np.array(tokens, dtype=np.int64), extra) == expected


# --------------------------------------------------------------------------------------------
# Whole requests: hash_tokens.
# --------------------------------------------------------------------------------------------


def check_hash_tokens(req: Req, algo: str) -> None:
    expected = vllm_chain(req, algo)
    assert len(expected) == req.num_blocks
    for hasher in hashers(req.block_size, algo):
        for form in token_forms(req.tokens):
            got = hasher.hash_tokens(form, **req.kwargs())
            assert as_list(got) == expected, f"{type(hasher).__module__}.BlockHasher, tokens as {type(form)}"


@pytest.mark.parametrize("algo", ALGOS)
@SETTINGS
@given(req=requests_st(extra_keys=False))
def test_hash_tokens_matches_vllm_and_reference(req: Req, algo: str) -> None:
    check_hash_tokens(req, algo)


@pytest.mark.parametrize("algo", ALGOS)
@SETTINGS
@given(req=requests_st(extra_keys=True, overlapping=True))
def test_hash_tokens_with_extra_keys_matches_vllm_and_reference(req: Req, algo: str) -> None:
    check_hash_tokens(req, algo)


@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize("big", [1 << 60, -(1 << 62)])
def test_a_list_with_an_int_read_the_slow_way_carries_the_multimodal_walk_on(algo: str, big: int) -> None:
    """Found by Hypothesis: a token list is hashed in place up to an int it cannot read
    there (three digits), then the rest the general way; the multimodal walk must carry
    on across the two, not start afresh (an input of no tokens and one nested in another
    made a fresh walk differ at the block holding that int)."""
    req = Req(block_size=1, tokens=[0] * 7 + [big], mm_features=[("00", 4, 4), ("00", 7, 0), ("00", 7, 1)])
    check_hash_tokens(req, algo)
    req = Req(block_size=2, tokens=[1, 2, 3, 4, 5, 6, 7, 8, big, 9, 10, 11],
              mm_features=[("a", 2, 6), ("b", 7, 0), ("c", 7, 2), ("d", 9, 0)])
    check_hash_tokens(req, algo)


@pytest.mark.parametrize("algo", ALGOS)
def test_extra_keys_are_tagged_tuples_in_vllm_033_order(algo: str) -> None:
    """A hand-checked request: LoRA, two images (one spanning three blocks), a salt, embeddings."""
    bs = 8
    digests = [hashlib.sha256(b"block %d" % k).digest() for k in range(4)]
    lora = ("my-lora", "/adapters/my-lora")
    mm = [("img-a", 2, 3), ("img-b", 6, 12)]  # img-a: tokens 2..5, img-b: tokens 6..18
    expected_keys = [
        (("lora", "my-lora", "/adapters/my-lora"), ("mm", "img-a", 2), ("mm", "img-b", 6),
         ("cache_salt", "tenant-1"), ("prompt_embeds", digests[0])),
        (("lora", "my-lora", "/adapters/my-lora"), ("mm", "img-b", -2), ("prompt_embeds", digests[1])),
        (("lora", "my-lora", "/adapters/my-lora"), ("mm", "img-b", -10), ("prompt_embeds", digests[2])),
        (("lora", "my-lora", "/adapters/my-lora"), ("prompt_embeds", digests[3])),
    ]
    extras = ref.as_request_extras(lora, "tenant-1", mm, digests)
    assert [ref.block_extra_keys(extras, bs, b) for b in range(4)] == expected_keys

    tokens = list(range(1000, 1000 + 4 * bs + 3))
    none_hash = H(algo, "vllm-none-hash")
    expected, parent = [], none_hash
    for b, keys in enumerate(expected_keys):
        keys = fresh(keys) if b else keys  # block 0: the two "mm" tags are one object, as in vLLM
        parent = H(algo, (parent, tuple(tokens[b * bs:(b + 1) * bs]), keys))
        expected.append(parent)
    req = Req(bs, tokens, lora, "tenant-1", mm, digests)
    assert vllm_chain(req, algo) == expected
    for hasher in hashers(bs, algo):
        assert as_list(hasher.hash_tokens(tokens, **req.kwargs())) == expected


@pytest.mark.parametrize("algo", PICKLE_ALGOS)
def test_two_mm_inputs_in_one_block_pickle_the_mm_tag_once(algo: str) -> None:
    """vLLM's ``"mm"`` tag is one literal object: the second entry of a block pickles it as BINGET."""
    bs = 16
    mm = [("image-one", 1, 4), ("image-two", 8, 4)]
    keys = (("mm", "image-one", 1), ("mm", "image-two", 8))  # one "mm" object: a code constant
    tokens = list(range(bs))
    triple = (H(algo, "vllm-none-hash"), tuple(tokens), keys)
    assert has_memo_get(pickle.dumps(triple, protocol=5))
    expected = [H(algo, triple)]
    assert vllm_chain(Req(bs, tokens, mm_features=mm), algo) == expected
    for hasher in hashers(bs, algo):
        assert as_list(hasher.hash_tokens(tokens, mm_features=mm)) == expected


@pytest.mark.parametrize("algo", ALGOS)
def test_empty_cache_salt_is_no_salt_and_salt_keys_block_zero_only(algo: str) -> None:
    tokens = list(range(40))
    for hasher in hashers(8, algo):
        plain = as_list(hasher.hash_tokens(tokens))
        assert as_list(hasher.hash_tokens(tokens, cache_salt="")) == plain
        salted = as_list(hasher.hash_tokens(tokens, cache_salt="tenant"))
        assert all(a != b for a, b in zip(plain, salted))  # block 0 differs, so every chained hash does


@pytest.mark.parametrize("algo", ALGOS)
def test_prompt_embed_digests_missing_stop_the_chain(algo: str) -> None:
    digests = [hashlib.sha256(b"%d" % k).digest() for k in range(5)]
    tokens = list(range(64))  # 8 blocks of 8
    for hasher in hashers(8, algo):
        for n in (0, 1, 3, 5):
            assert len(hasher.hash_tokens(tokens, prompt_embed_digests=digests[:n])) == n
        assert len(hasher.hash_tokens(tokens[:20], prompt_embed_digests=digests)) == 2


@SETTINGS
@given(token_lists=st.lists(tokens_st, max_size=5), bs=block_sizes_st, algo=st.sampled_from(ALGOS))
def test_hash_tokens_many_is_hash_tokens_of_each(token_lists: list[list[int]], bs: int, algo: str) -> None:
    for hasher in hashers(bs, algo):
        many = hasher.hash_tokens_many(token_lists)
        assert [as_list(h) for h in many] == [as_list(hasher.hash_tokens(t)) for t in token_lists]


# --------------------------------------------------------------------------------------------
# Whole requests: extend.
# --------------------------------------------------------------------------------------------


def steps_st(num_tokens: int) -> st.SearchStrategy[list[int]]:
    """Token counts at which a request is (re)hashed: chunked prefill, or one decode step at a time."""
    chunks = st.lists(st.integers(0, num_tokens), max_size=6).map(sorted)
    decode = st.integers(0, num_tokens).map(lambda start: list(range(start, num_tokens + 1)))
    return st.one_of(chunks, decode)


def check_extend(req: Req, algo: str, steps: list[int], from_scratch: bool) -> None:
    """Hash ``req`` in ``steps`` with ``extend``: the result is vLLM's step-wise chain, which (for
    sorted, non-overlapping multimodal inputs, the only kind vLLM supports) is the one-shot chain."""
    stepwise = vllm_chain(req, algo, steps)
    if from_scratch:
        assert stepwise == vllm_chain(req, algo)
    for hasher in hashers(req.block_size, algo):
        first = steps[0] if steps else len(req.tokens)
        hashes = hasher.hash_tokens(req.tokens[:first], **req.kwargs())
        for n in steps[1:] + [len(req.tokens)]:
            before = as_list(hashes)
            added = hasher.extend(hashes, req.tokens[:n], **req.kwargs())
            after = as_list(hashes)
            assert after[: len(before)] == before, "extend only appends"
            assert added == len(after) - len(before)
        assert as_list(hashes) == stepwise
        if from_scratch:
            assert as_list(hashes) == as_list(hasher.hash_tokens(req.tokens, **req.kwargs()))


@SETTINGS
@given(data=st.data(), req=requests_st(extra_keys=False), algo=st.sampled_from(ALGOS))
def test_extend_equals_hashing_from_scratch(data: st.DataObject, req: Req, algo: str) -> None:
    check_extend(req, algo, data.draw(steps_st(len(req.tokens)), label="steps"), from_scratch=True)


@SETTINGS
@given(data=st.data(), req=requests_st(extra_keys=True), algo=st.sampled_from(ALGOS))
def test_extend_with_extra_keys_equals_hashing_from_scratch(data: st.DataObject, req: Req, algo: str) -> None:
    check_extend(req, algo, data.draw(steps_st(len(req.tokens)), label="steps"), from_scratch=True)


@SETTINGS
@given(data=st.data(), req=requests_st(extra_keys=True, overlapping=True), algo=st.sampled_from(ALGOS))
def test_extend_with_extra_keys_and_overlapping_mm_matches_vllm_stepwise(data: st.DataObject, req: Req,
                                                                          algo: str) -> None:
    """vLLM assumes non-overlapping inputs; with overlapping ones a resumed walk may differ from a
    one-shot one, and kvpool must still match vLLM's step-wise hashes."""
    check_extend(req, algo, data.draw(steps_st(len(req.tokens)), label="steps"), from_scratch=False)


@pytest.mark.parametrize("algo", ALGOS)
def test_extend_with_more_digests_continues_the_chain(algo: str) -> None:
    digests = [hashlib.sha256(b"%d" % k).digest() for k in range(4)]
    tokens = list(range(32))
    for hasher in hashers(8, algo):
        hashes = hasher.hash_tokens(tokens, prompt_embed_digests=digests[:2])
        assert hasher.extend(hashes, tokens, prompt_embed_digests=digests) == 2
        assert as_list(hashes) == as_list(hasher.hash_tokens(tokens, prompt_embed_digests=digests))
        assert hasher.extend(hashes, tokens[:8], prompt_embed_digests=digests) == 0  # fewer tokens: nothing


# --------------------------------------------------------------------------------------------
# BlockHashList.
# --------------------------------------------------------------------------------------------


@needs_core
@SETTINGS
@given(data=st.data(), tokens=tokens_st, bs=st.sampled_from([1, 2, 4]), algo=st.sampled_from(ALGOS))
def test_block_hash_list_api(data: st.DataObject, tokens: list[int], bs: int, algo: str) -> None:
    hl = core.BlockHasher(bs, hash_algo=algo).hash_tokens(tokens)
    expected = ref.BlockHasher(bs, hash_algo=algo).hash_tokens(tokens)
    n = len(expected)
    assert len(hl) == n
    assert hl.width == ref.DIGEST_LEN[algo] and hl.hash_algo == algo
    assert hl.to_list() == expected
    assert hl.to_bytes() == b"".join(expected)
    ints = hl.to_ints()
    assert ints.dtype == np.uint64 and ints.tolist() == [int.from_bytes(h[-8:], "big") for h in expected]
    for i in range(-n, n):
        assert hl[i] == expected[i]
    for i in (n, -n - 1, n + 5):
        with pytest.raises(IndexError):
            hl[i]
    sl = data.draw(st.slices(max(n, 1)), label="slice")
    part = hl[sl]
    assert isinstance(part, core.BlockHashList) and part.to_list() == expected[sl] and part.hash_algo == algo
    assert hl == core.BlockHasher(bs, hash_algo=algo).hash_tokens(tokens)
    assert hl == hl and not hl != hl
    if n:
        assert hl != hl[:-1] and hl != core.BlockHasher(bs, hash_algo=algo).hash_tokens(tokens + [7] * bs)[1:]
    # `hl == list` is tested in a subprocess by test_block_hash_list_equals_a_list_of_its_bytes (it once hung).


EQ_LIST_SCRIPT = '''
import kvpool
hl = kvpool.BlockHasher(2).hash_tokens([1, 2, 3, 4, 5])
hashes = hl.to_list()
print(hl == hashes, hl == hashes[:1], hl == [], hl == [b"x", b"y"], hl != hashes)
'''


@needs_core
def test_block_hash_list_equals_a_list_of_its_bytes() -> None:
    """``BlockHashList == list``, in a subprocess: it deadlocked in ``__eq__`` (the list branch
    re-locked the list's own mutex through ``len()``), hanging the interpreter."""
    try:
        result = subprocess.run([sys.executable, "-c", EQ_LIST_SCRIPT], capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail("BlockHashList.__eq__(list) hangs (self-deadlock on the list's mutex)")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["True", "False", "False", "False", "False"]


@needs_core
@SETTINGS
@given(prefix=st.lists(st.integers(0, 9), max_size=24), a=st.lists(st.integers(0, 9), max_size=12),
       b=st.lists(st.integers(0, 9), max_size=12), max_blocks=st.one_of(st.none(), st.integers(0, 10)),
       algo=st.sampled_from(ALGOS))
def test_pool_takes_a_block_hash_list_as_its_list(prefix: list[int], a: list[int], b: list[int],
                                                  max_blocks: int | None, algo: str) -> None:
    bs = 4
    hasher = core.BlockHasher(bs, hash_algo=algo)
    ha, hb = hasher.hash_tokens(prefix + a), hasher.hash_tokens(prefix + b)
    pools = [core.BlockPool(32, block_size=bs, enable_events=True) for _ in range(2)]
    for pool, as_given in zip(pools, (lambda h: h, lambda h: h.to_list())):
        ids = pool.get_new_blocks(len(ha))
        k = len(ha) // 2
        pool.cache_full_blocks(ids, as_given(ha), 0, k, token_ids=prefix + a)
        pool.cache_full_blocks(ids, as_given(ha), k, len(ha), token_ids=prefix + a)
        pool.cache_full_blocks(pool.get_new_blocks(1), as_given(hb[len(hb) - 1:]), 0, min(1, len(hb)))
    (p1, p2) = pools
    for h in (ha, hb, ha[1:], hb[::-1]):
        assert p1.find_longest_cache_hit(h, max_blocks=max_blocks).tolist() == \
            p2.find_longest_cache_hit(h.to_list(), max_blocks=max_blocks).tolist()
    assert [p1.block_hash(i) for i in range(32)] == [p2.block_hash(i) for i in range(32)]
    assert p1.take_events() == p2.take_events()


# --------------------------------------------------------------------------------------------
# Errors.
# --------------------------------------------------------------------------------------------


def both(name: str) -> list[Any]:
    """``name`` from the reference and, when built, the Rust module."""
    out = [getattr(ref, name)]
    if HAVE_CORE:
        out.insert(0, getattr(core, name if name != "none_hash" else "compute_none_hash"))
    return out


@pytest.mark.parametrize("algo", ["md5", "SHA256", "sha-256", "", "xxh3"])
def test_unknown_hash_algo(algo: str) -> None:
    for make in both("BlockHasher"):
        with pytest.raises(InvalidArgumentError, match="hash_algo"):
            make(16, hash_algo=algo)
    for fn in both("encode_hash_input") + both("hash_value"):
        with pytest.raises(InvalidArgumentError):
            fn(1, algo)
    for fn in both("none_hash"):
        with pytest.raises(InvalidArgumentError):
            fn(algo)
    assert issubclass(InvalidArgumentError, ValueError)


BAD_VALUES = [True, False, 1.5, [1], {}, {1: 2}, set(), bytearray(b"ab"), np.int64(1), np.float64(1.0), (1, True),
              ((1, (2.0,)),), object()]


@pytest.mark.parametrize("value", BAD_VALUES, ids=lambda v: type(v).__name__)
@pytest.mark.parametrize("algo", ALGOS)
def test_unsupported_hash_input_types(value: Any, algo: str) -> None:
    for fn in both("encode_hash_input") + both("hash_value"):
        with pytest.raises(DtypeError):
            fn(value, algo)
    for hasher in hashers(4, algo):
        with pytest.raises(DtypeError):
            hasher.hash_block(None, [1, 2, 3, 4], value)


@pytest.mark.parametrize("value", [2**127, -(2**127) - 1, 2**200, (1, -(2**128))], ids=repr)
def test_hash_input_ints_beyond_128_bits(value: Any) -> None:
    for fn in both("encode_hash_input") + both("hash_value"):
        with pytest.raises(InvalidArgumentError):
            fn(value)


BAD_TOKEN_DTYPES = [
    [1.0, 2.0], [1, 2.5], "abcd", b"abcd", None, 5, [None], [1, "2"], [np.float32(1)],
    np.array([1.0, 2.0]), np.array([True, False]), np.zeros((2, 2), dtype=np.int64), np.array(3),
    np.array([1, 2], dtype=object),
]
BAD_TOKEN_VALUES = [[2**63], [-(2**63) - 1], [2**100], [2**130], np.array([2**63], dtype=np.uint64)]


@pytest.mark.parametrize("tokens", BAD_TOKEN_DTYPES, ids=repr)
def test_token_ids_of_wrong_dtype(tokens: Any) -> None:
    for hasher in hashers(2, "sha256_cbor"):
        with pytest.raises(DtypeError):
            hasher.hash_tokens(tokens)
        with pytest.raises(DtypeError):
            hasher.hash_block(None, tokens)
        with pytest.raises(DtypeError):
            hasher.hash_tokens_many([[1, 2], tokens])


@pytest.mark.parametrize("tokens", BAD_TOKEN_VALUES, ids=repr)
def test_token_ids_beyond_int64(tokens: Any) -> None:
    for hasher in hashers(2, "sha256_cbor"):
        with pytest.raises(InvalidArgumentError):
            hasher.hash_tokens(tokens)


def test_token_ids_accepted_forms() -> None:
    expected = ref.BlockHasher(2).hash_tokens([5, 6, 7, 8])
    for hasher in hashers(2, "sha256_cbor"):
        forms = [[5, 6, 7, 8], (5, 6, 7, 8), range(5, 9), iter([5, 6, 7, 8]), [np.int64(5), 6, np.uint8(7), 8],
                 np.array([5, 6, 7, 8], dtype=np.int16), np.array([5, 6, 7, 8], dtype=np.uint64)]
        for form in forms:  # built per hasher: the iterator is used up
            assert as_list(hasher.hash_tokens(form)) == expected, repr(form)


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        (dict(lora=["name", "path"]), DtypeError),
        (dict(lora=("name",)), DtypeError),
        (dict(lora=("name", 1)), DtypeError),
        (dict(lora="name"), DtypeError),
        (dict(cache_salt=b"salt"), DtypeError),
        (dict(cache_salt=5), DtypeError),
        (dict(mm_features=5), DtypeError),
        (dict(mm_features=[("img", 1)]), DtypeError),
        (dict(mm_features=[["img", 1, 2]]), DtypeError),
        (dict(mm_features=[("img", 1.0, 2)]), DtypeError),
        (dict(mm_features=[(7, 1, 2)]), DtypeError),
        (dict(mm_features=[("img", -1, 2)]), InvalidArgumentError),
        (dict(mm_features=[("img", 1, -2)]), InvalidArgumentError),
        (dict(mm_features=[("img", 2**64, 2)]), InvalidArgumentError),
        (dict(mm_features=[("b", 5, 1), ("a", 2, 1)]), InvalidArgumentError),
        (dict(prompt_embed_digests=5), DtypeError),
        (dict(prompt_embed_digests=["x" * 32]), DtypeError),
        (dict(prompt_embed_digests=[bytearray(32)]), DtypeError),
        (dict(prompt_embed_digests=[b"x" * 31]), HashWidthError),
        (dict(prompt_embed_digests=[b"x" * 32, b"x" * 33]), HashWidthError),
    ],
    ids=repr,
)
def test_bad_extra_key_arguments(kwargs: dict[str, Any], error: type[Exception]) -> None:
    for hasher in hashers(4, "sha256"):
        with pytest.raises(error):
            hasher.hash_tokens([1, 2, 3, 4], **kwargs)
        with pytest.raises(error):
            hasher.extend(hasher.hash_tokens([]), [1, 2, 3, 4], **kwargs)


@pytest.mark.parametrize(("block_size", "error"), [(0, InvalidArgumentError), (-1, InvalidArgumentError),
                                                  (2**32, InvalidArgumentError), (1.5, DtypeError),
                                                  ("4", DtypeError), (None, DtypeError)], ids=repr)
def test_bad_block_size(block_size: Any, error: type[Exception]) -> None:
    for make in both("BlockHasher"):
        with pytest.raises(error):
            make(block_size)


def test_non_str_algo_seed_or_non_bytes_parent_are_type_errors() -> None:
    """(The Rust binding raises PyO3's plain ``TypeError`` here; the reference its ``DtypeError``.)"""
    for make in both("BlockHasher"):
        with pytest.raises(TypeError):
            make(4, hash_algo=5)
        with pytest.raises(TypeError):
            make(4, seed=5)
        with pytest.raises(TypeError):
            make(4).hash_block("parent", [1, 2, 3, 4])
    for fn in both("none_hash"):
        with pytest.raises(TypeError):
            fn("sha256", 5)


@needs_core
def test_extend_a_list_of_another_algorithm() -> None:
    with pytest.raises(HashWidthError):
        core.BlockHasher(4, hash_algo="sha256").extend(core.BlockHasher(4, hash_algo="xxhash").hash_tokens([1] * 8),
                                                       [1] * 12)
    with pytest.raises(HashWidthError):
        core.BlockHasher(4, hash_algo="sha256").extend(core.BlockHasher(4).hash_tokens([1] * 8), [1] * 12)
    with pytest.raises(HashWidthError):
        ref.BlockHasher(4, hash_algo="sha256").extend(ref.BlockHasher(4, hash_algo="xxhash").hash_tokens([1] * 8),
                                                      [1] * 12)


# --------------------------------------------------------------------------------------------
# The reference's optional dependencies.
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("module", "algos"), [("cbor2", CBOR_ALGOS), ("xxhash", ["xxhash", "xxhash_cbor"])])
def test_reference_imports_cbor2_and_xxhash_lazily(monkeypatch: pytest.MonkeyPatch, module: str,
                                                   algos: list[str]) -> None:
    monkeypatch.setitem(sys.modules, module, None)  # makes `import module` fail
    for algo in algos:
        with pytest.raises(ModuleNotFoundError, match=module):
            ref.hash_value(1, algo)
        with pytest.raises(ModuleNotFoundError, match=module):
            ref.BlockHasher(4, hash_algo=algo)
    assert ref.hash_value(1, "sha256") == hashlib.sha256(pickle.dumps(1, protocol=5)).digest()


@needs_core
def test_extend_needs_a_block_hash_list() -> None:
    hasher = core.BlockHasher(2)
    with pytest.raises(DtypeError):
        hasher.extend([b"x" * 32], [1, 2])
    pool = core.BlockPool(4)
    blocks = pool.get_new_blocks(1)
    with pytest.raises(DtypeError):
        pool.cache_full_blocks(blocks, [b"a"], 0, 1, lora_name=3)
    assert pool.get_num_cached_blocks() == 0


@SETTINGS
@given(data=st.data())
def test_hash_blocks_from_continues_a_chain_at_any_block(data: st.DataObject) -> None:
    """``hash_blocks_from(parent, tokens, start)`` is the tail of the whole chain from ``start``
    (parent: the hash of block ``start - 1``), with extra keys walked as vLLM resumes them; the
    Rust hasher and the reference agree, and only the tokens from ``start`` on are read."""
    algo = data.draw(st.sampled_from(ALGOS), label="algo")
    block_size = data.draw(st.integers(1, 8), label="block_size")
    tokens = data.draw(st.lists(st.integers(-(2**40), 2**40) | st.integers(0, 300), max_size=60), label="tokens")
    n_blocks = len(tokens) // block_size
    extras: dict[str, Any] = {}
    if data.draw(st.booleans(), label="lora"):
        extras["lora"] = ("ad", data.draw(st.sampled_from(["ad", "/p/ad"]), label="path"))
    if data.draw(st.booleans(), label="salt"):
        extras["cache_salt"] = data.draw(st.sampled_from(["", "s1"]), label="salt value")
    if data.draw(st.booleans(), label="mm") and len(tokens) > 2:
        pos, mm = 0, []
        while pos < len(tokens) - 1 and len(mm) < 3:
            pos += data.draw(st.integers(0, 6), label="gap")
            length = data.draw(st.integers(1, 10), label="length")
            mm.append((f"img{len(mm)}", pos, length))
            pos += length
        extras["mm_features"] = mm
    start = data.draw(st.integers(0, n_blocks + 1), label="start")
    for hasher in hashers(block_size, algo):
        whole = as_list(hasher.hash_tokens(tokens, **extras))
        parent = whole[start - 1] if 0 < start <= len(whole) else None
        assume(start == 0 or start <= len(whole))
        assert hasher.hash_blocks_from(parent, tokens, start, **extras) == whole[start:]
        # The tokens before block `start` are not read.
        if start and start * block_size <= len(tokens):
            hidden: list[Any] = ["not a token"] * (start * block_size) + tokens[start * block_size:]
            assert hasher.hash_blocks_from(parent, hidden, start, **extras) == whole[start:]
    # At block 0 a parent given replaces NONE_HASH: block 0 chained to it.
    if n_blocks:
        rust_and_ref = [h.hash_blocks_from(b"p" * 32, tokens, 0, **extras) for h in hashers(block_size, algo)]
        assert rust_and_ref[0] == rust_and_ref[-1]
        assert rust_and_ref[0][0] == hashers(block_size, algo)[-1].hash_block(
            b"p" * 32, tokens[:block_size], None if not extras else ref.block_extra_keys(
                ref.as_request_extras(extras.get("lora"), extras.get("cache_salt"), extras.get("mm_features"), None),
                block_size, 0))


@pytest.mark.parametrize("start", [5, 2**31, 2**62, 2**63 - 1])
@pytest.mark.parametrize("form", [list, tuple, np.array], ids=["list", "tuple", "array"])
def test_hash_blocks_from_past_the_end_hashes_nothing(start: int, form: Any) -> None:
    for block_size in (1, 16, 2**32 - 1):
        for hasher in hashers(block_size, "sha256"):
            assert as_list(hasher.hash_blocks_from(None, form(list(range(40))), start)) == [] or start * block_size < 40


def test_hash_blocks_from_refuses_what_hash_block_refuses() -> None:
    for hasher in hashers(4, "xxhash"):
        with pytest.raises(DtypeError):
            hasher.hash_blocks_from("not bytes", [1, 2, 3, 4], 0)
        with pytest.raises(HashWidthError):
            hasher.hash_blocks_from(b"", [1, 2, 3, 4], 0)
        with pytest.raises(HashWidthError):
            hasher.hash_blocks_from(b"x" * 33, [1, 2, 3, 4], 0)
        with pytest.raises(InvalidArgumentError):
            hasher.hash_blocks_from(None, [1, 2, 3, 4], -1)
        with pytest.raises(DtypeError):
            hasher.hash_blocks_from(None, [1, 2, 3, 4.5], 0)
