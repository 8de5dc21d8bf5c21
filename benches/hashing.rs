//! Block hashing in the core: one 1,200-token request (block size 16, 75 full
//! blocks) hashed into its chain, per algorithm, in ns per block. Two kinds of
//! tokens: `hashing` draws them below 151,000, so that 29 of the 75 pickled blocks
//! take three SHA-256 pieces (179 compressions); `hashing_vocab_32k` takes
//! `benches/vs_vllm.py`'s prompts (a 32,000-token vocabulary: every block two
//! pieces), the figure to set against vLLM's hasher there.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use kvpool::pool::hashing::{
    none_hash, BlockHasher, ExtraKeyInputs, HashAlgo, DEFAULT_NONE_HASH_SEED,
};

fn hashing(c: &mut Criterion) {
    let tokens: Vec<i64> = (0..1200).map(|t| (t * 7919 + 13) % 151_000).collect();
    hash_group(c, "hashing", &tokens);
    // vs_vllm.py's first prompt: a shared 1,000-token prefix, then 200 of its own.
    let vocab_32k: Vec<i64> = (0..1000)
        .map(|t| (t * 31 + 7) % 32_000)
        .chain(4001..4201)
        .collect();
    hash_group(c, "hashing_vocab_32k", &vocab_32k);
}

/// Every algorithm on `tokens` (1,200 of them), in group `name`.
fn hash_group(c: &mut Criterion, name: &str, tokens: &[i64]) {
    let mut group = c.benchmark_group(name);
    group.throughput(Throughput::Elements(75));
    for algo in HashAlgo::ALL {
        let root = none_hash(algo, DEFAULT_NONE_HASH_SEED);
        let mut hasher = BlockHasher::new(algo);
        let mut out = Vec::with_capacity(75 * 32);
        let extra = ExtraKeyInputs::default();
        group.bench_function(algo.name(), |b| {
            b.iter(|| {
                out.clear();
                hasher.update_chain(&root, black_box(tokens), 16, &extra, &mut out)
            })
        });
    }
    group.finish();
}

criterion_group!(benches, hashing);
criterion_main!(benches);
