//! Encoding a serving step's KV events as vLLM's msgpack `EventBatch`: 100 requests of
//! 688 fresh tokens (16-token blocks) stored, and the 4,300 blocks they evicted
//! removed, one `BlockRemoved` each, as in `benches/events_publish.py`. In ns per event.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use kvpool::pool::{encode_event_batch, BlockHash, PoolEvent, StoredBlocks, WireBatch};

fn hash(i: u64) -> BlockHash {
    let mut bytes = [0u8; 32];
    bytes[..8].copy_from_slice(&i.wrapping_mul(0x9E37_79B9_7F4A_7C15).to_le_bytes());
    bytes[24..].copy_from_slice(
        &(i ^ 0x5555)
            .wrapping_mul(0xD6E8_FEB8_6659_FD93)
            .to_be_bytes(),
    );
    BlockHash::new(&bytes).unwrap()
}

fn step_events() -> Vec<PoolEvent> {
    let mut events = Vec::new();
    let mut next = 0u64;
    let mut token = 12_345i64;
    for _ in 0..100 {
        let block_hashes: Vec<BlockHash> = (0..43).map(|i| hash(next + i)).collect();
        next += 43;
        let token_ids = (0..43 * 16)
            .map(|_| {
                token = (token * 48_271) % 2_147_483_647;
                1 + token % 50_000
            })
            .collect();
        events.push(PoolEvent::BlockStored(Box::new(StoredBlocks {
            block_hashes,
            parent_block_hash: None,
            token_ids,
            block_size: 16,
            lora_id: None,
            lora_name: None,
            group_idx: 0,
            extra_keys: None,
        })));
    }
    for i in 0..4_300 {
        events.push(PoolEvent::BlockRemoved {
            block_hash: hash(1_000_000 + i),
            group_idx: 0,
        });
    }
    events
}

fn encode(c: &mut Criterion) {
    let events = step_events();
    let specs = [(0u32, Some("full_attention"), None)];
    let batch = WireBatch {
        ts: 1_764_000_000.25,
        data_parallel_rank: Some(0),
        medium: "GPU",
        group_specs: &specs,
    };
    let mut out = Vec::new();
    let mut group = c.benchmark_group("events_wire");
    group.throughput(Throughput::Elements(events.len() as u64));
    group.bench_function("serving_step", |b| {
        b.iter(|| {
            out.clear();
            encode_event_batch(black_box(&events), &batch, &mut out);
            black_box(out.len())
        })
    });
    group.finish();
}

criterion_group!(benches, encode);
criterion_main!(benches);
