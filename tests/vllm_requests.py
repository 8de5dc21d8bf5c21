"""vLLM 0.33 ``Request`` objects for the tests that drive vLLM's classes and kvpool's side by
side: hashed with SHA-256 (``init_none_hash``), one output budget, no LoRA."""

from __future__ import annotations

from typing import Any


def make_request(request_id: str, tokens: list[int], block_size: int = 4, *, cache_salt: str | None = None,
                 max_tokens: int = 17, extra_args: dict[str, Any] | None = None) -> Any:
    """A request of ``tokens`` whose block hashes vLLM computes at ``block_size`` tokens."""
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.request import Request

    init_none_hash(sha256)
    params = SamplingParams(max_tokens=max_tokens, extra_args=extra_args)
    params.update_from_generation_config({}, eos_token_id=100)
    return Request(request_id=request_id, prompt_token_ids=list(tokens), mm_features=None, sampling_params=params,
                   pooling_params=None, lora_request=None, cache_salt=cache_salt,
                   block_hasher=get_request_block_hasher(block_size, sha256))
