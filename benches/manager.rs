//! The per-request manager in the core, in ns per request.
//!
//! - `manager/serve_no_caching`: issue #4's serving scenario: 100 requests of 700
//!   prompt tokens (block size 16, caching off): one batched prefill step, one
//!   token appended to each, one batched decode step, free all.
//! - `manager/serve_shared_prefix`: the same with caching on and a 1,000-token shared
//!   prefix (+200 unique tokens) per request, after a first pass warmed the cache.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use kvpool::pool::{
    KVCacheManager, LoraInfo, ManagerConfig, RequestId, SequenceExtras, StepLimits, StepOutcome,
    StepRequest, TokenIds,
};

const REQUESTS: usize = 100;

fn manager_with(caching: bool, prompts: &[Vec<i64>], ids: &[RequestId]) -> KVCacheManager {
    let mut config = ManagerConfig::new(32_768, 16);
    config.enable_caching = caching;
    let mut m = KVCacheManager::new(config).unwrap();
    for (id, p) in ids.iter().zip(prompts) {
        m.add_request(
            id.clone(),
            TokenIds::Values(p),
            SequenceExtras::default(),
            LoraInfo::default(),
        )
        .unwrap();
    }
    m
}

fn serve(m: &mut KVCacheManager, ids: &[RequestId]) {
    let mut out = StepOutcome::default();
    let prefill: Vec<StepRequest<'_>> = ids
        .iter()
        .map(|id| StepRequest {
            id,
            num_new_tokens: usize::MAX,
            num_lookahead_tokens: 0,
        })
        .collect();
    m.schedule_step(&prefill, StepLimits::default(), &mut out)
        .unwrap();
    for id in ids {
        m.append_token_ids(id, TokenIds::Values(&[1])).unwrap();
    }
    let decode: Vec<StepRequest<'_>> = ids
        .iter()
        .map(|id| StepRequest {
            id,
            num_new_tokens: 1,
            num_lookahead_tokens: 0,
        })
        .collect();
    let mut out = StepOutcome::default();
    m.schedule_step(&decode, StepLimits::default(), &mut out)
        .unwrap();
    m.free_many(ids).unwrap();
}

fn bench(c: &mut Criterion) {
    let ids: Vec<RequestId> = (0..REQUESTS as i64).map(RequestId::Int).collect();
    let random: Vec<Vec<i64>> = (0..REQUESTS as i64)
        .map(|i| (0..700).map(|t| (i * 7919 + t) % 32_000).collect())
        .collect();
    let prefix: Vec<i64> = (0..1000).map(|t| (t * 31 + 7) % 32_000).collect();
    let shared: Vec<Vec<i64>> = (0..REQUESTS as i64)
        .map(|i| {
            prefix
                .iter()
                .copied()
                .chain((0..200).map(|t| 4001 + i * 200 + t))
                .collect()
        })
        .collect();
    let mut group = c.benchmark_group("manager");
    group.throughput(Throughput::Elements(REQUESTS as u64));
    group.bench_function("serve_no_caching", |b| {
        b.iter_batched_ref(
            || manager_with(false, &random, &ids),
            |m| serve(black_box(m), &ids),
            BatchSize::LargeInput,
        )
    });
    group.bench_function("serve_shared_prefix", |b| {
        b.iter_batched_ref(
            || {
                let mut m = manager_with(true, &shared, &ids);
                serve(&mut m, &ids); // warm the cache; requests are freed
                for (id, p) in ids.iter().zip(&shared) {
                    m.add_request(
                        id.clone(),
                        TokenIds::Values(p),
                        SequenceExtras::default(),
                        LoraInfo::default(),
                    )
                    .unwrap();
                }
                m
            },
            |m| serve(black_box(m), &ids),
            BatchSize::LargeInput,
        )
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
