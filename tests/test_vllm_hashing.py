"""``kvpool.vllm.get_request_block_hasher`` against vLLM 0.33's own request block hasher.

Both hash the same vLLM ``Request``s as their tokens arrive (a prompt, then decoded tokens
appended in random chunks, one at a time or several), with every hash algorithm, random block
sizes, and requests with LoRA adapters (a name and a path that may be one ``str`` object),
cache salts and multimodal inputs at random places: after every append the two
``request.block_hashes`` must be equal, byte for byte. Prompt embeddings and lookahead
hashing go to vLLM's own function (checked to be counted). Skipped without vLLM.
"""

from __future__ import annotations

import os
import random
from typing import Any

import pytest

pytest.importorskip("vllm")
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

from vllm.lora.request import LoRARequest  # noqa: E402
from vllm.multimodal.inputs import (  # noqa: E402
    MultiModalFeatureSpec,
    MultiModalKwargsItem,
    PlaceholderRange,
)
from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.utils.hashing import get_hash_fn_by_name  # noqa: E402
from vllm.v1.core.kv_cache_utils import init_none_hash  # noqa: E402
from vllm.v1.request import Request  # noqa: E402

from kvpool.vllm import hashing  # noqa: E402

ALGOS = ["sha256", "sha256_cbor", "xxhash", "xxhash_cbor"]


def make_request(rid: str, prompt: list[int], hasher: Any, *, lora: Any = None, salt: str | None = None,
                 mm: list[tuple[str, int, int]] | None = None, embeds: Any = None) -> Request:
    params = SamplingParams(max_tokens=1000, ignore_eos=True)
    params.update_from_generation_config({}, eos_token_id=None)
    features = [MultiModalFeatureSpec(data=MultiModalKwargsItem.dummy(), mm_position=PlaceholderRange(o, n),
                                      identifier=ident, modality="image") for ident, o, n in (mm or [])]
    return Request(request_id=rid, prompt_token_ids=list(prompt) if embeds is None else None,
                   prompt_embeds=embeds, mm_features=features or None, sampling_params=params,
                   pooling_params=None, lora_request=lora, cache_salt=salt, block_hasher=hasher)


def random_extras(rng: random.Random, n_prompt: int) -> dict[str, Any]:
    extras: dict[str, Any] = {}
    if rng.random() < 0.3:
        name = f"adapter-{rng.randrange(3)}"
        path = name if rng.random() < 0.3 else f"/adapters/{name}"  # one object, or two
        extras["lora"] = LoRARequest(lora_name=name, lora_int_id=rng.randrange(1, 5), lora_path=path)
    if rng.random() < 0.3:
        extras["salt"] = rng.choice(["", "tenant-a", "tenant-b"])
    if rng.random() < 0.3 and n_prompt > 4:
        mm, pos = [], rng.randrange(0, 4)
        while pos < n_prompt - 1 and len(mm) < 4:
            length = rng.randrange(1, 20)
            mm.append((f"img-{rng.randrange(6)}", pos, min(length, n_prompt - pos)))
            pos += length + rng.randrange(0, 12)
        extras["mm"] = mm
    return extras


@pytest.mark.parametrize("algo", ALGOS)
def test_block_hashes_equal_vllms_as_tokens_arrive(algo: str) -> None:
    hash_fn = get_hash_fn_by_name(algo)
    init_none_hash(hash_fn)
    rng = random.Random(algo)
    for case in range(60):
        block_size = rng.choice([1, 2, 3, 4, 5, 8, 16])
        n_prompt = rng.randrange(1, 120)
        prompt = [rng.choice([rng.randrange(0, 300), rng.randrange(0, 200_000), rng.randrange(0, 2**40)])
                  for _ in range(n_prompt)]
        extras = random_extras(rng, n_prompt)
        theirs = make_request(f"v{case}", prompt, hashing.vllm_get_request_block_hasher(block_size, hash_fn),
                              **extras)
        ours = make_request(f"k{case}", prompt, hashing.get_request_block_hasher(block_size, hash_fn), **extras)
        assert ours.block_hashes == theirs.block_hashes, (case, extras)
        for _ in range(rng.randrange(0, 6)):
            chunk = [rng.randrange(0, 100_000) for _ in range(rng.choice([1, 1, 3, block_size, 40]))]
            for request in (theirs, ours):
                request.append_output_token_ids(chunk if len(chunk) > 1 else chunk[0])
            assert ours.block_hashes == theirs.block_hashes, (case, extras)


def test_long_prompts_and_large_blocks() -> None:
    hash_fn = get_hash_fn_by_name("sha256")
    init_none_hash(hash_fn)
    for block_size, n in ((16, 10_000), (256, 5_000), (4096, 9_000)):
        prompt = [(t * 7919) % 150_000 for t in range(n)]
        theirs = make_request("v", prompt, hashing.vllm_get_request_block_hasher(block_size, hash_fn))
        ours = make_request("k", prompt, hashing.get_request_block_hasher(block_size, hash_fn))
        assert ours.block_hashes == theirs.block_hashes


def test_what_kvpool_does_not_hash_goes_to_vllms_function() -> None:
    torch = pytest.importorskip("torch")
    hash_fn = get_hash_fn_by_name("sha256")
    init_none_hash(hash_fn)
    before = dict(hashing.FALLBACKS)
    embeds = torch.arange(40 * 4, dtype=torch.float32).reshape(40, 4)
    theirs = make_request("v", [], hashing.vllm_get_request_block_hasher(4, hash_fn), embeds=embeds)
    ours = make_request("k", [], hashing.get_request_block_hasher(4, hash_fn), embeds=embeds)
    assert ours.block_hashes == theirs.block_hashes and len(ours.block_hashes) == 10
    assert hashing.FALLBACKS.get("prompt embeddings", 0) > before.get("prompt embeddings", 0)
    # Lookahead hashing: the factory returns vLLM's own function.
    assert hashing.get_request_block_hasher(4, hash_fn, 1).__module__ == "vllm.v1.core.kv_cache_utils"
    assert hashing.FALLBACKS.get("lookahead hashing", 0) >= 1


def test_install_points_vllms_names_at_kvpools_factory() -> None:
    import vllm.v1.core.kv_cache_utils as kv_cache_utils
    import vllm.v1.engine.core as engine_core

    saved = (kv_cache_utils.get_request_block_hasher, engine_core.get_request_block_hasher)
    try:
        hashing.install()
        assert kv_cache_utils.get_request_block_hasher is hashing.get_request_block_hasher
        assert engine_core.get_request_block_hasher is hashing.get_request_block_hasher
        hashing.install()  # twice: still kvpool's, never wrapping itself
        assert hashing.vllm_get_request_block_hasher is saved[0] or saved[0] is hashing.get_request_block_hasher
    finally:
        kv_cache_utils.get_request_block_hasher, engine_core.get_request_block_hasher = saved
