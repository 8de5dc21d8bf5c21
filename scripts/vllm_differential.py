#!/usr/bin/env python3
"""Differential check of kvpool against vLLM 0.33's own classes, on random operations.

Drives vLLM's real ``BlockPool`` and ``KVCacheManager`` (with its request block hasher),
loaded from the vLLM wheel by the shared peer script, and kvpool's ``BlockPool`` and
``KVCacheManager`` with the same random operations, and asserts after every step that
both agree on every observable: block ids handed out, prefix hits, block hashes (sha256
and sha256_cbor), reference counts and the free queue, head to tail.

Not part of the test suite (it needs the 340 MB vLLM wheel):

    VLLM_WHEEL=/path/to/vllm-0.33.0-*.whl python scripts/vllm_differential.py --sequences 100
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import random
from pathlib import Path
from types import ModuleType
from typing import Any

import kvpool

BLOCK_SIZE = 4
SEED = "kvpool-differential"


def load_peer(path: Path) -> ModuleType:
    """The shared peer script, which knows how to load vLLM's KV-cache modules from the wheel."""
    spec = importlib.util.spec_from_file_location("vllm_peer", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def free_queue(vllm_pool: Any) -> list[int]:
    """vLLM's free queue, head to tail."""
    return [b.block_id for b in vllm_pool.free_block_queue.get_all_free_blocks()]


def pool_sequence(peer: ModuleType, v: Any, seed: int, num_blocks: int = 24, steps: int = 300) -> None:
    """Random allocate / cache / free / hit-and-touch on both pools, compared after each step."""
    rng = random.Random(seed)
    vp = v.BlockPool(num_blocks, enable_caching=True, hash_block_size=BLOCK_SIZE)
    kp = kvpool.BlockPool(num_blocks, block_size=BLOCK_SIZE)
    held: list[tuple[list[Any], list[int], list[bytes]]] = []
    for step in range(steps):
        where = f"pool sequence {seed}, step {step}"
        op = rng.random()
        if op < 0.35:
            n = rng.randint(0, 6)
            if n > kp.get_num_free_blocks():
                continue
            vb, kb = vp.get_new_blocks(n), kp.get_new_blocks(n)
            assert [b.block_id for b in vb] == kb.tolist(), where
            hashes = [bytes([rng.randint(0, 3), i]) * 16 for i in range(n)]  # collisions happen
            k = rng.randint(0, n)
            if k:
                vp.cache_full_blocks(peer.hashes_only(hashes), vb, 0, k, BLOCK_SIZE, 0)
                kp.cache_full_blocks(kb, hashes, 0, k)
            held.append((vb, kb.tolist(), hashes))
        elif op < 0.7 and held:
            vb, kb, _ = held.pop(rng.randrange(len(held)))
            vp.free_blocks(reversed(vb))
            kp.free_blocks(kb[::-1])
        elif held:
            _, _, hashes = held[rng.randrange(len(held))]
            v_hits = []
            for h in hashes:
                found = vp.get_cached_block(h, [0])
                if found is None:
                    break
                v_hits.append(found[0])
            k_hits = kp.find_longest_cache_hit(hashes)
            assert [b.block_id for b in v_hits] == k_hits.tolist(), where
            vp.touch(v_hits)
            kp.touch(k_hits)
            held.append((v_hits, k_hits.tolist(), hashes[: len(v_hits)]))
        assert free_queue(vp) == kp.free_block_ids().tolist(), where
        assert [b.ref_cnt for b in vp.blocks[1:]] == kp.ref_counts()[1:].tolist(), where


def manager_sequence(peer: ModuleType, v: Any, seed: int, algo: str, num_blocks: int = 40, steps: int = 200) -> None:
    """Random admit / decode (preempting when full) / free through both managers."""
    rng = random.Random(seed)
    hash_fn = v.hashing.get_hash_fn_by_name(algo)
    os.environ["PYTHONHASHSEED"] = SEED  # vLLM's NONE_HASH = H(PYTHONHASHSEED)
    v.utils.init_none_hash(hash_fn)
    hasher = v.utils.get_request_block_hasher(BLOCK_SIZE, hash_fn)
    vm = peer.make_manager(v, num_blocks, BLOCK_SIZE, caching=True)
    km = kvpool.KVCacheManager(num_blocks, BLOCK_SIZE, hash_algo=algo, seed=SEED)
    waiting: dict[str, Any] = {}
    running: dict[str, Any] = {}
    prefixes = [[rng.randint(0, 50) for _ in range(rng.randint(0, 12))] for _ in range(3)]
    for step in range(steps):
        where = f"manager sequence {seed} ({algo}), step {step}"
        op = rng.random()
        if op < 0.3:
            rid = f"r{step}"
            tokens = rng.choice(prefixes) + [rng.randint(0, 50) for _ in range(rng.randint(1, 10))]
            waiting[rid] = peer.make_request(v, rid, tokens, hasher)
            km.add_request(rid, tokens)
        elif op < 0.6 and waiting:
            rid = rng.choice(sorted(waiting))
            req = waiting[rid]
            v_blocks, v_hit, _ = vm.get_computed_blocks(req)
            k_blocks, k_hit = km.get_computed_blocks(rid)
            assert (v_hit, [b.block_id for b in v_blocks.blocks[0]]) == (k_hit, k_blocks.tolist()), where
            n = req.num_tokens - v_hit
            v_new = vm.allocate_slots(req, n, v_hit, v_blocks)
            k_new = km.allocate_slots(rid, n, num_new_computed_tokens=k_hit, new_computed_blocks=k_blocks)
            assert (v_new is None) == (k_new is None), where
            if v_new is not None:
                assert [b.block_id for b in v_new.blocks[0]] == k_new.tolist(), where
                req.num_computed_tokens = req.num_tokens
                running[rid] = waiting.pop(rid)
        elif op < 0.8 and running:
            rid = rng.choice(sorted(running))
            req = running[rid]
            token = rng.randint(0, 50)
            req.append_output_token_ids(token)
            km.append_token_ids(rid, [token])
            v_new, k_new = vm.allocate_slots(req, 1), km.allocate_slots(rid, 1)
            assert (v_new is None) == (k_new is None), where
            if v_new is not None:
                assert [b.block_id for b in v_new.blocks[0]] == k_new.tolist(), where
                req.num_computed_tokens += 1
            else:  # no room: preempt, as a scheduler would
                vm.free(req)
                km.preempt(rid)
                req.num_computed_tokens = 0
                waiting[rid] = running.pop(rid)
        elif running:
            rid = rng.choice(sorted(running))
            vm.free(running.pop(rid))
            km.free(rid)
        for rid, req in {**waiting, **running}.items():
            assert [bytes(h) for h in req.block_hashes] == km.get_block_hashes(rid).to_list(), where
        assert free_queue(vm.block_pool) == km.free_block_ids().tolist(), where


def main() -> None:
    """Run the sequences; any disagreement raises with the sequence and step."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--peer", type=Path, default=Path(__file__).resolve().parents[2] / "shared/peers/vllm_blockpool_peer.py")
    ap.add_argument("--wheel", default=os.environ.get("VLLM_WHEEL"), help="the vllm 0.33.0 wheel")
    ap.add_argument("--sequences", type=int, default=50)
    args = ap.parse_args()
    peer = load_peer(args.peer)
    v, _ = peer.load_vllm(peer.find_wheel(args.wheel))
    for seed in range(args.sequences):
        pool_sequence(peer, v, seed)
    print(f"BlockPool: {args.sequences} random sequences of 300 steps agree with vLLM 0.33")
    for algo in ("sha256", "sha256_cbor"):
        for seed in range(args.sequences):
            manager_sequence(peer, v, seed, algo)
        print(f"KVCacheManager ({algo}): {args.sequences} random sequences of 200 steps agree with vLLM 0.33")


if __name__ == "__main__":
    main()
