"""Capacities in tokens and GiB (``kvpool.capacity``)."""

from __future__ import annotations

import pytest

from kvpool.capacity import (
    MODEL_PRESETS,
    CapacityUnits,
    ModelShape,
    blocks_for_gib,
    blocks_for_tokens,
    kv_bytes_per_token,
    parse_model_shape,
)


def test_bytes_per_token() -> None:
    assert kv_bytes_per_token(32, 8, 128, "bf16") == 131_072  # Llama 3 8B: 128 KiB per token
    assert MODEL_PRESETS["llama3-70b"].bytes_per_token == 327_680
    assert MODEL_PRESETS["qwen2.5-7b"].bytes_per_token == 57_344
    assert kv_bytes_per_token(32, 8, 128, "fp8") == 65_536
    with pytest.raises(ValueError, match="unknown dtype"):
        kv_bytes_per_token(1, 1, 1, "int3")
    with pytest.raises(ValueError, match="layers must be >= 1"):
        kv_bytes_per_token(0, 1, 1, "bf16")


def test_parse_model_shape() -> None:
    assert parse_model_shape("llama3-8b") is MODEL_PRESETS["llama3-8b"]
    assert parse_model_shape("40:8:128") == ModelShape(40, 8, 128, "bf16")
    assert parse_model_shape("40:8:128:fp8").bytes_per_token == 2 * 40 * 8 * 128
    for bad, match in [("nope", "neither a preset"), ("a:b:c", "must be integers"), ("1:1:1:int3", "unknown dtype")]:
        with pytest.raises(ValueError, match=match):
            parse_model_shape(bad)


def test_blocks_round_down() -> None:
    assert blocks_for_tokens(3_000_000, 512) == 5859
    assert blocks_for_tokens(511, 512) == 0
    assert blocks_for_gib(40, 131_072, 512) == 640  # 40 GiB / 64 MiB per block
    assert blocks_for_gib(0.0624, 131_072, 512) == 0
    with pytest.raises(ValueError):
        blocks_for_gib(float("inf"), 1, 1)


def test_units() -> None:
    plain = CapacityUnits(512)
    assert (plain.tokens(10), plain.gib(10), plain.axis(10)) == (5120, None, 5120.0)
    assert plain.axis_label == "capacity (tokens)"
    model = CapacityUnits(512, 131_072)
    assert model.gib(640) == 40.0 and model.axis(640) == 40.0 and "GiB" in model.axis_label
