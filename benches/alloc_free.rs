//! Allocation and freeing in the core, in ns per block.
//!
//! - `alloc_free/no_caching`: the serve-random workload's pool work: allocate the 44
//!   blocks of a 700-token request (block size 16), free them tail first
//!   (`free_blocks_reversed`); caching off.
//! - `alloc_free/step_of_100`: a scheduler step's pool work in two calls: 100 requests
//!   of 44 blocks allocated by `get_new_blocks_many`, freed by `free_blocks_many`
//!   (each request tail first); caching off; per block.
//! - `alloc_free/evicting`: the same on a pool whose every free block holds a cached
//!   hash, so each allocated block is first evicted from the prefix cache, then
//!   re-cached under a new hash and freed (to the tail), keeping the pool full of
//!   cached blocks.
//! - `alloc_free/empty`: an empty allocation and an empty free (the fixed cost of a call).
//! - `alloc_free/whole_pool`: every block of a 1,000,000-block pool allocated in one call
//!   and freed in one, per block.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use kvpool::pool::{BlockPool, CacheBlocks, HashSlice, PoolConfig};

const BLOCKS_PER_REQUEST: usize = 44;

fn no_caching(c: &mut Criterion) {
    let mut config = PoolConfig::new(32_768);
    config.enable_caching = false;
    let mut pool = BlockPool::new(config).unwrap();
    let mut ids = Vec::with_capacity(BLOCKS_PER_REQUEST);
    let mut group = c.benchmark_group("alloc_free");
    group.throughput(Throughput::Elements(BLOCKS_PER_REQUEST as u64));
    group.bench_function("no_caching", |b| {
        b.iter(|| {
            ids.clear();
            pool.get_new_blocks(black_box(BLOCKS_PER_REQUEST), &mut ids)
                .unwrap();
            pool.free_blocks_reversed(black_box(&ids)).unwrap();
        })
    });
    let counts = vec![BLOCKS_PER_REQUEST; 100];
    let mut offsets = Vec::with_capacity(101);
    ids.reserve(counts.len() * BLOCKS_PER_REQUEST);
    group.throughput(Throughput::Elements(
        (counts.len() * BLOCKS_PER_REQUEST) as u64,
    ));
    group.bench_function("step_of_100", |b| {
        b.iter(|| {
            ids.clear();
            offsets.clear();
            pool.get_new_blocks_many(black_box(&counts), &mut ids, &mut offsets)
                .unwrap();
            pool.free_blocks_many(black_box(&ids), &offsets, true)
                .unwrap();
        })
    });
    group.finish();
}

/// 32-byte hashes numbered by `n`.
fn hashes(first: u64, count: usize) -> Vec<u8> {
    (first..first + count as u64)
        .flat_map(|n| {
            let mut h = [0u8; 32];
            h[..8].copy_from_slice(&n.to_le_bytes());
            h[24..].copy_from_slice(&n.wrapping_mul(0x9E37_79B9_7F4A_7C15).to_be_bytes());
            h
        })
        .collect()
}

fn evicting(c: &mut Criterion) {
    let num_blocks = 100_000u32;
    let mut pool = BlockPool::new(PoolConfig::new(num_blocks)).unwrap();
    let mut next_hash = 0u64;
    let mut ids = Vec::with_capacity(BLOCKS_PER_REQUEST);
    // Fill the cache: after one pass every free block holds a hash.
    while next_hash
        < (num_blocks as u64 - 1) / BLOCKS_PER_REQUEST as u64 * BLOCKS_PER_REQUEST as u64
    {
        ids.clear();
        pool.get_new_blocks(BLOCKS_PER_REQUEST, &mut ids).unwrap();
        let h = hashes(next_hash, BLOCKS_PER_REQUEST);
        next_hash += BLOCKS_PER_REQUEST as u64;
        let call = CacheBlocks::new(&ids, HashSlice::new(&h, 32).unwrap(), 0, BLOCKS_PER_REQUEST);
        pool.cache_full_blocks(call).unwrap();
        ids.reverse();
        pool.free_blocks(&ids).unwrap();
    }
    let mut group = c.benchmark_group("alloc_free");
    group.throughput(Throughput::Elements(BLOCKS_PER_REQUEST as u64));
    group.bench_function("evicting", |b| {
        b.iter_batched_ref(
            || {
                next_hash += BLOCKS_PER_REQUEST as u64;
                hashes(next_hash, BLOCKS_PER_REQUEST)
            },
            |h| {
                ids.clear();
                pool.get_new_blocks(BLOCKS_PER_REQUEST, &mut ids).unwrap();
                let call =
                    CacheBlocks::new(&ids, HashSlice::new(h, 32).unwrap(), 0, BLOCKS_PER_REQUEST);
                pool.cache_full_blocks(call).unwrap();
                ids.reverse();
                pool.free_blocks(&ids).unwrap();
            },
            BatchSize::SmallInput,
        )
    });
    group.finish();
}

fn batch_sizes(c: &mut Criterion) {
    let mut config = PoolConfig::new(1_000_000);
    config.enable_caching = false;
    let mut pool = BlockPool::new(config).unwrap();
    let mut ids = Vec::with_capacity(1_000_000);
    let mut group = c.benchmark_group("alloc_free");
    group.bench_function("empty", |b| {
        b.iter(|| {
            ids.clear();
            pool.get_new_blocks(black_box(0), &mut ids).unwrap();
            pool.free_blocks_reversed(black_box(&ids)).unwrap();
        })
    });
    group.throughput(Throughput::Elements(999_999));
    group.sample_size(20);
    group.bench_function("whole_pool", |b| {
        b.iter(|| {
            ids.clear();
            pool.get_new_blocks(black_box(999_999), &mut ids).unwrap();
            pool.free_blocks_reversed(black_box(&ids)).unwrap();
        })
    });
    group.finish();
}

criterion_group!(benches, no_caching, evicting, batch_sizes);
criterion_main!(benches);
