"""Pickle's memo: inputs that share objects hash as vLLM's pickle-based hashes do.

Python's pickler writes an object it has already written in the same pickle as a memo
reference (``BINGET``), so for the ``sha256`` and ``xxhash`` algorithms a hash depends on
which of the caller's ``str``/``bytes``/``tuple`` objects are *the same object*: a LoRA
whose name and path are one ``str``, a name that is the interned ``"lora"`` literal vLLM
uses as a tag, CPython's shared empty and one-character strings, one identifier object for
two multimodal inputs. Every input here is drawn from a small pool of objects so that such
sharing is the rule, and every hash is checked against ``pickle.dumps`` itself (through
the vLLM transcription of ``test_hashing``) for the Rust extension and the reference.
"""

from __future__ import annotations

import pickle
import pickletools
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvpool._errors import HAVE_CORE
from kvpool.reference import hashing as ref
from test_hashing import ALGOS, PICKLE_ALGOS, SETTINGS, H, Req, as_list, hashers, vllm_chain

if HAVE_CORE:
    import kvpool._core as core

needs_core = pytest.mark.skipif(not HAVE_CORE, reason="kvpool._core is not built")

LONG = "adapter-" + "x" * 20  # one object, not interned
OTHER_LONG = "".join(["adapter-", "y" * 20])
# vLLM's tags are interned literals: these are the very objects vLLM's code holds.
STRINGS = ["lora", "mm", "cache_salt", "prompt_embeds", "", "a", "b", LONG, OTHER_LONG, "x" * 300]
BYTES = [b"", b"k", b"digest" * 5, bytes(range(32))]
SHARED_TUPLE = ("t", 1)

strings_st = st.sampled_from(STRINGS)
leaves_st = st.one_of(strings_st, st.sampled_from(BYTES), st.integers(-3, 300), st.none(),
                      st.just(SHARED_TUPLE), st.just(()))
values_st = st.recursive(leaves_st, lambda c: st.lists(c, max_size=5).map(tuple), max_leaves=20)


def memo_gets(data: bytes) -> int:
    return sum(op.name in ("BINGET", "LONG_BINGET") for op, _, _ in pickletools.genops(data))


@needs_core
@pytest.mark.parametrize("algo", PICKLE_ALGOS)
@SETTINGS
@given(value=values_st)
def test_shared_objects_encode_as_pickle_does(value: Any, algo: str) -> None:
    expected = pickle.dumps(value, protocol=5)
    assert core.encode_hash_input(value, algo) == expected
    assert ref.encode_hash_input(value, algo) == expected
    assert core.hash_value(value, algo) == H(algo, value)


@pytest.mark.parametrize("algo", ALGOS)
@SETTINGS
@given(parent=st.one_of(st.none(), st.sampled_from(BYTES[1:])), tokens=st.lists(st.integers(0, 2**20), max_size=8),
       extra=values_st)
def test_block_with_shared_extra_keys(algo: str, parent: bytes | None, tokens: list[int], extra: Any) -> None:
    expected = H(algo, (parent or H(algo, "vllm-none-hash"), tuple(tokens), extra))
    for hasher in hashers(16, algo):
        assert hasher.hash_block(parent, tokens, extra) == expected


@st.composite
def shared_requests_st(draw: st.DrawFn) -> Req:
    bs = draw(st.sampled_from([1, 2, 4]))
    tokens = draw(st.lists(st.integers(0, 1000), min_size=bs, max_size=6 * bs))
    req = Req(bs, tokens)
    if draw(st.booleans()):
        req.lora = (draw(strings_st), draw(strings_st))
    req.cache_salt = draw(st.one_of(st.none(), strings_st))
    pos = 0
    for _ in range(draw(st.integers(0, 4))):
        offset = pos + draw(st.integers(0, 3))
        length = draw(st.integers(1, 2 * bs))
        req.mm_features.append((draw(strings_st), offset, length))
        pos = offset + length
    return req


@pytest.mark.parametrize("algo", PICKLE_ALGOS)
@settings(SETTINGS)
@given(req=shared_requests_st())
def test_requests_with_shared_strings_hash_as_vllm(req: Req, algo: str) -> None:
    expected = vllm_chain(req, algo)
    for hasher in hashers(req.block_size, algo):
        assert as_list(hasher.hash_tokens(req.tokens, **req.kwargs())) == expected


@pytest.mark.parametrize("algo", PICKLE_ALGOS)
@pytest.mark.parametrize(
    "kwargs",
    [
        dict(lora=(LONG, LONG)),
        dict(lora=("lora", "/p")),
        dict(lora=("a", "a")),
        dict(lora=("", "")),
        dict(lora=("lora", "lora")),
        dict(lora=(LONG, "/p"), cache_salt=LONG),
        dict(mm_features=[(LONG, 0, 2), (LONG, 2, 2)]),
        dict(mm_features=[("mm", 0, 2), ("mm", 3, 1)]),
        dict(lora=("mm", LONG), mm_features=[(LONG, 1, 1)], cache_salt="cache_salt"),
    ],
    ids=lambda kw: ",".join(kw),
)
def test_the_issue_probes(kwargs: dict[str, Any], algo: str) -> None:
    """The reported cases: each pickles with memo references, and every hasher agrees with vLLM."""
    req = Req(4, list(range(8)), **kwargs)
    expected = vllm_chain(req, algo)
    for hasher in hashers(4, algo):
        assert as_list(hasher.hash_tokens(req.tokens, **req.kwargs())) == expected
    if HAVE_CORE:  # the tracker and the manager hash through the same code
        pool = core.BlockPool(16, block_size=4)
        tracker = core.ComputedBlocksTracker(pool, 4, hash_algo=algo)
        tracker.add_sequence("s", req.tokens, **req.kwargs())
        assert as_list(tracker.get_block_hashes("s")) == expected


def test_probes_really_share_objects() -> None:
    """The probes above are only meaningful if pickle does write memo references for them."""
    keys = (("lora", LONG, LONG),)
    assert memo_gets(pickle.dumps(keys, protocol=5)) == 1
    keys = (("lora", "lora", "/p"),)
    assert memo_gets(pickle.dumps(keys, protocol=5)) == 1
