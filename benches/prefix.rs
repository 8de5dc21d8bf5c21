//! Prefix caching in the core, in ns per block.
//!
//! - `prefix/cache_75`: cache the 75 full blocks of a 1,200-token request (block
//!   size 16) right after allocating them, then free them (tail first) and evict
//!   them again by reallocating, so every iteration caches into the same state.
//! - `prefix/longest_hit_75`: the longest cache hit of a request whose 75 blocks are
//!   all cached (a warm prefix), 32-byte SHA-256-sized hashes.
//! - `prefix/hit_touch_free_75`: a warm request's scheduler work: longest hit,
//!   touch the hits, free them tail first.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use kvpool::pool::{BlockPool, CacheBlocks, HashSlice, PoolConfig};

const BLOCKS: usize = 75;

fn request_hashes(seed: u64) -> Vec<u8> {
    (0..BLOCKS as u64)
        .flat_map(|i| {
            let mut h = [0u8; 32];
            let x = (seed << 32 | i).wrapping_mul(0x9E37_79B9_7F4A_7C15);
            h[..8].copy_from_slice(&x.to_le_bytes());
            h[24..].copy_from_slice(&x.rotate_left(17).to_be_bytes());
            h
        })
        .collect()
}

fn warm_pool(hashes: &[u8]) -> (BlockPool, Vec<u32>) {
    let mut pool = BlockPool::new(PoolConfig::new(32_768)).unwrap();
    let mut ids = Vec::new();
    pool.get_new_blocks(BLOCKS, &mut ids).unwrap();
    pool.cache_full_blocks(CacheBlocks::new(
        &ids,
        HashSlice::new(hashes, 32).unwrap(),
        0,
        BLOCKS,
    ))
    .unwrap();
    let mut reversed = ids.clone();
    reversed.reverse();
    pool.free_blocks(&reversed).unwrap();
    (pool, ids)
}

fn cache(c: &mut Criterion) {
    let hashes = request_hashes(1);
    let mut pool = BlockPool::new(PoolConfig::new(BLOCKS as u32 + 1)).unwrap();
    let mut ids = Vec::with_capacity(BLOCKS);
    let mut group = c.benchmark_group("prefix");
    group.throughput(Throughput::Elements(BLOCKS as u64));
    group.bench_function("cache_75", |b| {
        b.iter(|| {
            ids.clear();
            // The pool has exactly 75 usable blocks: this evicts the previous round.
            pool.get_new_blocks(BLOCKS, &mut ids).unwrap();
            let call = CacheBlocks::new(&ids, HashSlice::new(&hashes, 32).unwrap(), 0, BLOCKS);
            pool.cache_full_blocks(black_box(call)).unwrap();
            ids.reverse();
            pool.free_blocks(&ids).unwrap();
        })
    });
    group.finish();
}

fn lookup(c: &mut Criterion) {
    let hashes = request_hashes(2);
    let (mut pool, _) = warm_pool(&hashes);
    let slice = HashSlice::new(&hashes, 32).unwrap();
    let mut hits = Vec::with_capacity(BLOCKS);
    let mut group = c.benchmark_group("prefix");
    group.throughput(Throughput::Elements(BLOCKS as u64));
    group.bench_function("longest_hit_75", |b| {
        b.iter(|| {
            hits.clear();
            pool.find_longest_cache_hit(black_box(slice), 0, None, &mut hits)
                .unwrap()
        })
    });
    group.bench_function("hit_touch_free_75", |b| {
        b.iter(|| {
            hits.clear();
            pool.find_longest_cache_hit(black_box(slice), 0, Some(BLOCKS - 1), &mut hits)
                .unwrap();
            pool.touch(&hits).unwrap();
            hits.reverse();
            pool.free_blocks(&hits).unwrap();
        })
    });
    group.finish();
}

criterion_group!(benches, cache, lookup);
criterion_main!(benches);
