//! The prefix map under structured and adversarial keys, in ns per block.
//!
//! `key_shapes/churn/<shape>`: on a 100,000-block pool whose every free block holds a
//! cached hash, allocate 64 blocks (evicting 64 cached ones), cache them under 64 new
//! keys, free them tail first. `key_shapes/lookup/<shape>`: the longest cache hit of a
//! 64-key chain that is all cached. Shapes:
//!
//! - `sha256`: digest-like keys (well mixed already);
//! - `int32_be` / `int32_le`: `i` as a 32-byte big- / little-endian integer;
//! - `int16_be`: `i` as a 16-byte big-endian integer;
//! - `int8_be`: `i` as 8 bytes, big-endian (how kvpool stores numpy integer ids);
//! - `strided_be`: `i * 2^32` as a 32-byte big-endian integer;
//! - `one_key`: every block cached under the same key (a duplicate chain as long as
//!   the cache).
//!
//! No shape may cost more than twice `sha256` (a multiply-only table hash made the
//! integer shapes O(n) per operation, and one-key chains O(chain) per insert).

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use kvpool::pool::{BlockPool, CacheBlocks, HashSlice, PoolConfig};

const POOL: u32 = 100_000;
const BATCH: usize = 64;

fn key(shape: &str, i: u64) -> Vec<u8> {
    match shape {
        "sha256" => {
            // splitmix64 words: as mixed as a digest, and cheap to make.
            (0..4u64)
                .flat_map(|w| {
                    let mut z = (i * 4 + w).wrapping_add(0x9E37_79B9_7F4A_7C15);
                    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
                    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
                    (z ^ (z >> 31)).to_le_bytes()
                })
                .collect()
        }
        "int32_be" => be32(i as u128),
        "int32_le" => {
            let mut b = vec![0u8; 32];
            b[..16].copy_from_slice(&(i as u128).to_le_bytes());
            b
        }
        "int16_be" => (i as u128).to_be_bytes().to_vec(),
        "int8_be" => i.to_be_bytes().to_vec(),
        "strided_be" => be32((i as u128) << 32),
        _ => vec![0x5A; 32],
    }
}

/// `v` as a 32-byte big-endian integer.
fn be32(v: u128) -> Vec<u8> {
    let mut b = vec![0u8; 32];
    b[16..].copy_from_slice(&v.to_be_bytes());
    b
}

fn keys(shape: &str, first: u64, n: usize) -> (Vec<u8>, usize) {
    let flat: Vec<u8> = (first..first + n as u64)
        .flat_map(|i| key(shape, i))
        .collect();
    let width = flat.len() / n;
    (flat, width)
}

/// A pool whose every free block holds a cached key of `shape`; returns the next key.
fn filled_pool(shape: &str) -> (BlockPool, u64) {
    let mut pool = BlockPool::new(PoolConfig::new(POOL)).unwrap();
    let mut ids = Vec::with_capacity(BATCH);
    let mut next = 0u64;
    while pool.num_cached_blocks() + BATCH < POOL as usize {
        ids.clear();
        pool.get_new_blocks(BATCH, &mut ids).unwrap();
        let (flat, width) = keys(shape, next, BATCH);
        next += BATCH as u64;
        let call = CacheBlocks::new(&ids, HashSlice::new(&flat, width).unwrap(), 0, BATCH);
        pool.cache_full_blocks(call).unwrap();
        pool.free_blocks_reversed(&ids).unwrap();
    }
    (pool, next)
}

const SHAPES: [&str; 7] = [
    "sha256",
    "int32_be",
    "int32_le",
    "int16_be",
    "int8_be",
    "strided_be",
    "one_key",
];

fn churn(c: &mut Criterion) {
    let mut group = c.benchmark_group("key_shapes/churn");
    group.throughput(Throughput::Elements(BATCH as u64));
    for shape in SHAPES {
        let (mut pool, mut next) = filled_pool(shape);
        // Keys made ahead, outside the clock; cycled (a key evicted long ago is new again).
        let rounds = 4 * POOL as usize / BATCH;
        let batches: Vec<(Vec<u8>, usize)> = (0..rounds)
            .map(|r| keys(shape, next + (r * BATCH) as u64, BATCH))
            .collect();
        next += (rounds * BATCH) as u64;
        debug_assert!(next > 0);
        let mut ids = Vec::with_capacity(BATCH);
        let mut round = 0;
        group.bench_function(shape, |b| {
            b.iter(|| {
                let (flat, width) = &batches[round % rounds];
                round += 1;
                ids.clear();
                pool.get_new_blocks(BATCH, &mut ids).unwrap();
                let call = CacheBlocks::new(&ids, HashSlice::new(flat, *width).unwrap(), 0, BATCH);
                pool.cache_full_blocks(black_box(call)).unwrap();
                pool.free_blocks_reversed(&ids).unwrap();
            })
        });
    }
    group.finish();
}

fn lookup(c: &mut Criterion) {
    let mut group = c.benchmark_group("key_shapes/lookup");
    group.throughput(Throughput::Elements(BATCH as u64));
    for shape in SHAPES {
        let (pool, next) = filled_pool(shape);
        // The last batch cached is all still there: a full 64-block hit (for one_key,
        // every lookup hits the chain's head).
        let (flat, width) = keys(shape, next - BATCH as u64, BATCH);
        let slice = HashSlice::new(&flat, width).unwrap();
        let mut hits = Vec::with_capacity(BATCH);
        group.bench_function(shape, |b| {
            b.iter(|| {
                hits.clear();
                let n = pool
                    .find_longest_cache_hit(black_box(slice), 0, None, &mut hits)
                    .unwrap();
                assert_eq!(n, BATCH);
            })
        });
    }
    group.finish();
}

criterion_group!(benches, churn, lookup);
criterion_main!(benches);
