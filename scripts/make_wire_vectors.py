#!/usr/bin/env python3
"""Writes ``tests/data/wire_vectors.json``: random KV-event batches and the msgpack bytes vLLM
0.33's own ``KVEventBatch`` encoder gives them (``msgspec.msgpack.Encoder()``, as its
``ZmqEventPublisher``), so that ``tests/test_wire.py`` checks kvpool's encoder byte for byte
on machines without vLLM. Needs vLLM 0.33.0. ``python scripts/make_wire_vectors.py [--seed 0]``.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parent.parent / "tests" / "data" / "wire_vectors.json"


def random_fields(rng: random.Random) -> tuple[str, dict[str, Any]]:
    """One event as (type, fields), fields left out where they keep their default."""
    kind = rng.choice(["BlockStored", "BlockStored", "BlockRemoved", "AllBlocksCleared"])
    h = lambda: rng.choice([rng.getrandbits(64), rng.getrandbits(8), 0, 2**64 - 1])  # noqa: E731
    if kind == "AllBlocksCleared":
        return kind, {}
    if kind == "BlockRemoved":
        fields: dict[str, Any] = {"block_hashes": [h() for _ in range(rng.randint(1, 3))],
                                  "medium": rng.choice(["GPU", "CPU", None])}
        if rng.random() < 0.7:
            fields["group_idx"] = rng.randint(0, 5)
        return kind, fields
    n = rng.randint(1, 4)
    bs = rng.choice([1, 4, 16])
    fields = {"block_hashes": [h() for _ in range(n)], "parent_block_hash": rng.choice([None, h()]),
              "token_ids": [rng.randrange(200_000) for _ in range(n * bs)], "block_size": bs,
              "lora_id": rng.choice([None, rng.randint(0, 9)]), "medium": "GPU",
              "lora_name": rng.choice([None, "adapter"])}
    if rng.random() < 0.3:
        fields["extra_keys"] = [rng.choice([None, ["adapter"], [["img", 3]], ["salt"]]) for _ in range(n)]
    if rng.random() < 0.6:
        fields["group_idx"] = rng.randint(0, 5)
        fields["kv_cache_spec_kind"] = rng.choice(["full_attention", "sliding_window"])
        if fields["kv_cache_spec_kind"] == "sliding_window":
            fields["kv_cache_spec_sliding_window"] = rng.choice([128, 1024])
    if rng.random() < 0.1:
        fields["session_id"] = "s1"
    return kind, fields


def main() -> int:
    import vllm.distributed.kv_events as kv

    import msgspec

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--batches", type=int, default=40)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    encoder = msgspec.msgpack.Encoder()
    vectors = []
    for _ in range(args.batches):
        events = [random_fields(rng) for _ in range(rng.randint(0, 5))]
        ts = rng.choice([0.0, 1.5, 1733000000.123456])
        rank = rng.choice([None, 0, 3])
        batch = kv.KVEventBatch(ts=ts, events=[getattr(kv, k)(**f) for k, f in events], data_parallel_rank=rank)
        vectors.append({"ts": ts, "data_parallel_rank": rank,
                        "events": [{"type": k, "fields": f} for k, f in events],
                        "msgpack": encoder.encode(batch).hex()})
    OUT.write_text(json.dumps({"vllm": "0.33.0", "seed": args.seed, "vectors": vectors}, indent=1) + "\n")
    print(f"wrote {len(vectors)} batches to {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
