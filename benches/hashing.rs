//! Block hashing in the core: one 1,200-token request (block size 16, 75 full
//! blocks) hashed into its chain, per algorithm, in ns per block.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use kvpool::pool::hashing::{
    none_hash, BlockHasher, ExtraKeyInputs, HashAlgo, DEFAULT_NONE_HASH_SEED,
};

fn hashing(c: &mut Criterion) {
    let tokens: Vec<i64> = (0..1200).map(|t| (t * 7919 + 13) % 151_000).collect();
    let mut group = c.benchmark_group("hashing");
    group.throughput(Throughput::Elements(75));
    for algo in HashAlgo::ALL {
        let root = none_hash(algo, DEFAULT_NONE_HASH_SEED);
        let mut hasher = BlockHasher::new(algo);
        let mut out = Vec::with_capacity(75 * 32);
        let extra = ExtraKeyInputs::default();
        group.bench_function(algo.name(), |b| {
            b.iter(|| {
                out.clear();
                hasher.update_chain(&root, black_box(&tokens), 16, &extra, &mut out)
            })
        });
    }
    group.finish();
}

criterion_group!(benches, hashing);
criterion_main!(benches);
