//! The core manager without Python: scheduler scenarios, and a property test that
//! `schedule_step` gives exactly what the one-by-one calls give.

use kvpool::pool::{
    KVCacheManager, LoraInfo, ManagerConfig, RequestId, SequenceExtras, StepLimits, StepOutcome,
    StepRequest, StepStatus, TokenIds,
};
use proptest::prelude::*;

#[path = "../fuzz/src/lib.rs"]
#[allow(dead_code)]
mod harness;

fn manager(num_blocks: u32, block_size: u32, caching: bool) -> KVCacheManager {
    let mut config = ManagerConfig::new(num_blocks, block_size);
    config.enable_caching = caching;
    KVCacheManager::new(config).unwrap()
}

fn add(m: &mut KVCacheManager, id: i64, tokens: &[i64]) -> RequestId {
    let id = RequestId::Int(id);
    m.add_request(
        id.clone(),
        TokenIds::Values(tokens),
        SequenceExtras::default(),
        LoraInfo::default(),
    )
    .unwrap();
    id
}

/// What a scheduler does for one request, one call at a time (the fuzz harness's
/// rule, without lookahead).
fn one_by_one(
    m: &mut KVCacheManager,
    id: &RequestId,
    budget: usize,
    out: &mut Vec<u32>,
) -> (bool, usize, usize) {
    harness::one_by_one(m, id, budget, 0, out)
}

#[test]
fn prefix_hits_are_capped_below_the_last_token_and_touched() {
    let mut m = manager(16, 4, true);
    let a = add(&mut m, 1, &(0..12).collect::<Vec<_>>()); // exactly 3 full blocks
    let mut out = Vec::new();
    assert_eq!(one_by_one(&mut m, &a, 100, &mut out), (true, 12, 0));
    assert_eq!(out, vec![1, 2, 3]);
    let b = add(&mut m, 2, &(0..12).collect::<Vec<_>>());
    let mut hits = Vec::new();
    assert_eq!(m.get_computed_blocks(&b, &mut hits).unwrap(), 8); // 3 blocks, hit at most 2
    assert_eq!(hits, vec![1, 2]);
    m.free(&a).unwrap();
    out.clear();
    assert_eq!(one_by_one(&mut m, &b, 100, &mut out), (true, 4, 8));
    assert_eq!(m.block_ids(&b).unwrap(), &[1, 2, 4]); // the hits were touched out of the queue
    m.check_invariants().unwrap();
}

#[test]
fn a_failed_allocation_changes_nothing_and_preemption_restarts() {
    let mut m = manager(5, 4, true);
    let a = add(&mut m, 1, &(0..16).collect::<Vec<_>>());
    let mut out = Vec::new();
    assert_eq!(one_by_one(&mut m, &a, 100, &mut out), (true, 16, 0));
    m.append_token_ids(&a, TokenIds::Values(&[99])).unwrap();
    let free: Vec<u32> = m.pool().free_block_ids().collect();
    assert!(!m.allocate_slots(&a, 1, 0, &[], 0, &mut out).unwrap()); // needs a 5th block
    assert_eq!(m.pool().free_block_ids().collect::<Vec<_>>(), free);
    m.preempt(&a).unwrap();
    assert_eq!(m.num_computed_tokens(&a).unwrap(), 0);
    let mut hits = Vec::new();
    assert_eq!(m.get_computed_blocks(&a, &mut hits).unwrap(), 16); // its own former blocks
    m.check_invariants().unwrap();
}

#[derive(Debug, Clone)]
enum Op {
    Add(Vec<i64>),
    Step(Vec<(usize, usize)>, bool),
    Decode(usize),
    Free(usize),
    Preempt(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (prop::sample::select(vec![0usize, 3, 8]), prop::collection::vec(0i64..4, 1..14))
            .prop_map(|(prefix, tail)| Op::Add((0..prefix as i64).chain(tail).collect())),
        4 => (prop::collection::vec((any::<usize>(), 1usize..20), 1..5), any::<bool>()).prop_map(|(r, s)| Op::Step(r, s)),
        2 => any::<usize>().prop_map(Op::Decode),
        1 => any::<usize>().prop_map(Op::Free),
        1 => any::<usize>().prop_map(Op::Preempt),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    #[test]
    fn schedule_step_equals_one_by_one(caching in any::<bool>(), ops in prop::collection::vec(op(), 1..40)) {
        let (mut stepped, mut single) = (manager(12, 4, caching), manager(12, 4, caching));
        let mut ids: Vec<RequestId> = Vec::new();
        for (n, op) in ops.into_iter().enumerate() {
            match op {
                Op::Add(tokens) => {
                    ids.push(add(&mut stepped, n as i64, &tokens));
                    add(&mut single, n as i64, &tokens);
                }
                Op::Step(reqs, stop) if !ids.is_empty() => {
                    let picked: Vec<(RequestId, usize)> = reqs.iter().map(|&(i, b)| (ids[i % ids.len()].clone(), b)).collect();
                    let step: Vec<StepRequest<'_>> = picked.iter().map(|(id, b)| StepRequest { id, num_new_tokens: *b, num_lookahead_tokens: 0 }).collect();
                    let mut got = StepOutcome::default();
                    stepped.schedule_step(&step, StepLimits { stop_at_first_failure: stop, ..StepLimits::default() }, &mut got).unwrap();
                    prop_assert!(got.status.iter().zip(&got.allocated).all(|(s, a)| (*s == StepStatus::Scheduled) == *a));
                    prop_assert_eq!(got.hit_offsets.len(), got.offsets.len());
                    (got.hit_block_ids, got.hit_offsets, got.status) = (Vec::new(), Vec::new(), Vec::new());
                    let mut want = StepOutcome { offsets: vec![0], ..Default::default() };
                    let mut stopped = false;
                    for (id, budget) in &picked {
                        let (ok, scheduled, hit) = if stopped { (false, 0, 0) } else { one_by_one(&mut single, id, *budget, &mut want.block_ids) };
                        stopped |= stop && !ok;
                        want.allocated.push(ok);
                        want.num_scheduled_tokens.push(scheduled);
                        want.num_hit_tokens.push(hit);
                        want.offsets.push(want.block_ids.len());
                    }
                    prop_assert_eq!(got, want);
                }
                Op::Decode(i) if !ids.is_empty() => {
                    let id = &ids[i % ids.len()];
                    stepped.append_token_ids(id, TokenIds::Values(&[7])).unwrap();
                    single.append_token_ids(id, TokenIds::Values(&[7])).unwrap();
                }
                Op::Free(i) if !ids.is_empty() => {
                    let id = ids.remove(i % ids.len());
                    stepped.free(&id).unwrap();
                    single.free(&id).unwrap();
                }
                Op::Preempt(i) if !ids.is_empty() => {
                    let id = &ids[i % ids.len()];
                    stepped.preempt(id).unwrap();
                    single.preempt(id).unwrap();
                }
                _ => {}
            }
            prop_assert_eq!(stepped.pool().free_block_ids().collect::<Vec<_>>(), single.pool().free_block_ids().collect::<Vec<_>>());
            prop_assert_eq!(stepped.prefix_cache_stats(), single.prefix_cache_stats());
            stepped.check_invariants().unwrap();
        }
    }
}
