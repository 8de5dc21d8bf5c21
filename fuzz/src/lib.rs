//! Fuzz harnesses for kvpool's core: the block pool, the manager and the hashing
//! chain, each driven by a sequence of [`arbitrary`] operations.
//!
//! After every operation a harness checks the structure (`check_invariants`) and,
//! when the operation returned an `Err`, that nothing observable changed. The
//! manager harness runs two managers in lockstep and schedules each step one
//! request at a time on one and with `schedule_step` on the other: they must
//! agree on every result and every observable. The hashing harness checks that a
//! chain hashed in pieces equals the chain hashed at once, that the borrowed
//! extra-keys path equals the `Value` path, and that the encoders never panic.
//!
//! The same functions run under cargo-fuzz (`fuzz/fuzz_targets/*.rs`) and on
//! stable Rust from the main crate's `tests/fuzz_replay.rs`, which replays the
//! seed corpus in `fuzz/corpus/` and then random inputs for a fixed time.

use arbitrary::{Arbitrary, Result as ArbResult, Unstructured};
use kvpool::pool::hashing::{
    encode_cbor, encode_pickle, none_hash, BlockHasher, ExtraKeyInputs, ExtraObjects, HashAlgo,
    MmFeature, Value, MAX_DEPTH,
};
use kvpool::pool::{
    BlockPool, CacheBlocks, HashSlice, KVCacheManager, LoraInfo, ManagerConfig, PoolConfig,
    PoolEvent, RequestId, SequenceExtras, StepLimits, StepOutcome, StepRequest, TokenIds,
};

/// Most operations per input, so one input stays fast.
const MAX_OPS: usize = 256;

// ---------------------------------------------------------------------------------
// The pool.
// ---------------------------------------------------------------------------------

/// One call on a [`BlockPool`]. Block ids are picked from the blocks the harness
/// holds (`Held`) or given raw (which may be out of range or free).
#[derive(Arbitrary, Debug, Clone)]
pub enum PoolOp {
    /// `get_new_blocks(n)`.
    GetNew(u8),
    /// `get_new_blocks_many(counts)`.
    GetNewMany(Vec<u8>),
    /// `free_blocks` (or `free_blocks_reversed`) of some held blocks.
    Free { picks: Vec<u8>, reversed: bool },
    /// `free_blocks_many` of held blocks split at `cuts`.
    FreeMany {
        picks: Vec<u8>,
        cuts: Vec<u8>,
        reversed: bool,
    },
    /// `free_blocks` of raw ids (mostly errors: double frees, bad ids).
    FreeRaw(Vec<u16>),
    /// `touch` of raw ids (cached free blocks come back into use).
    Touch(Vec<u16>),
    /// `cache_full_blocks` over a run of held blocks.
    Cache {
        start: u8,
        len: u8,
        num_cached: u8,
        num_full: u8,
        keys: Vec<u8>,
        width: u8,
        group: u8,
    },
    /// `find_longest_cache_hit` of a chain of keys.
    Lookup {
        keys: Vec<u8>,
        width: u8,
        group: u8,
        max: Option<u8>,
    },
    /// `get_cached_block` of one key.
    GetCached { key: u8, width: u8, group: u8 },
    /// `evict_blocks` of raw ids.
    Evict(Vec<u16>),
    /// `reset_prefix_cache()`.
    Reset,
    /// `take_events()`.
    TakeEvents,
}

/// A pool's configuration, drawn small so that the pool fills up and evicts.
#[derive(Debug, Clone)]
pub struct PoolSetup {
    num_blocks: u32,
    enable_caching: bool,
    null_block: bool,
    max_pending_events: usize,
    hash_width: Option<usize>,
}

impl<'a> Arbitrary<'a> for PoolSetup {
    fn arbitrary(u: &mut Unstructured<'a>) -> ArbResult<Self> {
        Ok(Self {
            num_blocks: u.int_in_range(1..=64)?,
            enable_caching: u.ratio(7, 8)?,
            null_block: u.arbitrary()?,
            max_pending_events: u.int_in_range(1..=64)?,
            hash_width: if u.ratio(1, 4)? {
                Some(u.int_in_range(1..=32)?)
            } else {
                None
            },
        })
    }
}

/// A key of `width` bytes from a small seed: few distinct keys, so chains share
/// prefixes and blocks share keys; the seed sits in the last bytes, big-endian, as
/// the integer-like keys that once made the map quadratic.
fn key(seed: u8, width: u8) -> Vec<u8> {
    let width = usize::from(width % 33).max(1);
    let mut k = vec![0u8; width];
    k[width - 1] = seed % 16;
    if width > 1 {
        k[0] = seed / 16;
    }
    k
}

/// Everything observable about a pool, for "an `Err` changes nothing".
#[derive(Debug, PartialEq)]
struct PoolState {
    free: Vec<u32>,
    refs: Vec<u32>,
    hashes: Vec<Option<(Vec<u8>, u32)>>,
    cached: usize,
    events: Vec<PoolEvent>,
    dropped: u64,
}

fn pool_state(pool: &BlockPool) -> PoolState {
    let mut copy = pool.clone();
    PoolState {
        free: pool.free_block_ids().collect(),
        refs: pool.ref_counts().collect(),
        hashes: (0..pool.num_blocks())
            .map(|id| {
                pool.block_hash(id)
                    .unwrap()
                    .map(|k| (k.hash.as_bytes().to_vec(), k.group))
            })
            .collect(),
        cached: pool.num_cached_blocks(),
        events: copy.take_events(),
        dropped: pool.num_dropped_events(),
    }
}

fn check_pool(pool: &BlockPool, what: &str) {
    if let Err(problems) = pool.check_invariants() {
        panic!("invariants broken after {what}: {problems:?}");
    }
}

fn pick(held: &[u32], picks: &[u8]) -> Vec<u32> {
    if held.is_empty() {
        return Vec::new();
    }
    picks
        .iter()
        .map(|&p| held[usize::from(p) % held.len()])
        .collect()
}

/// Removes one occurrence of each of `ids` from `held` (the harness's references).
fn release(held: &mut Vec<u32>, ids: &[u32]) {
    for id in ids {
        if let Some(i) = held.iter().position(|h| h == id) {
            held.swap_remove(i);
        }
    }
}

/// Runs one pool input: a setup, then operations.
pub fn run_pool(data: &[u8]) {
    let mut u = Unstructured::new(data);
    let Ok(setup) = PoolSetup::arbitrary(&mut u) else {
        return;
    };
    let mut config = PoolConfig::new(setup.num_blocks);
    config.enable_caching = setup.enable_caching;
    config.null_block = setup.null_block;
    config.enable_events = true;
    config.block_size = 2;
    config.max_pending_events = setup.max_pending_events;
    config.hash_width = setup.hash_width;
    let mut pool = BlockPool::new(config).expect("a valid configuration");
    let mut held: Vec<u32> = Vec::new();
    let mut out = Vec::new();
    for _ in 0..MAX_OPS {
        let Ok(op) = PoolOp::arbitrary(&mut u) else {
            break;
        };
        let before = pool_state(&pool);
        out.clear();
        let result = apply_pool_op(&mut pool, &mut held, &op, &mut out);
        check_pool(&pool, &format!("{op:?}"));
        if result.is_err() {
            assert_eq!(
                before,
                pool_state(&pool),
                "{op:?} failed but changed the pool"
            );
        }
    }
}

fn apply_pool_op(
    pool: &mut BlockPool,
    held: &mut Vec<u32>,
    op: &PoolOp,
    out: &mut Vec<u32>,
) -> Result<(), ()> {
    let n = pool.num_blocks();
    let raw = |ids: &[u16]| {
        ids.iter()
            .map(|&i| u32::from(i) % (n + 2))
            .collect::<Vec<_>>()
    };
    match op {
        PoolOp::GetNew(k) => {
            pool.get_new_blocks(usize::from(*k % 70), out)
                .map_err(drop)?;
            held.extend_from_slice(out);
        }
        PoolOp::GetNewMany(counts) => {
            let counts: Vec<usize> = counts.iter().map(|&c| usize::from(c % 20)).collect();
            let mut offsets = Vec::new();
            pool.get_new_blocks_many(&counts, out, &mut offsets)
                .map_err(drop)?;
            assert_eq!(offsets.len(), counts.len() + 1);
            assert_eq!(*offsets.last().unwrap(), out.len());
            held.extend_from_slice(out);
        }
        PoolOp::Free { picks, reversed } => {
            let ids = pick(held, picks);
            let r = if *reversed {
                pool.free_blocks_reversed(&ids)
            } else {
                pool.free_blocks(&ids)
            };
            r.map_err(drop)?;
            release(held, &ids);
        }
        PoolOp::FreeMany {
            picks,
            cuts,
            reversed,
        } => {
            let ids = pick(held, picks);
            let mut offsets: Vec<usize> = cuts
                .iter()
                .map(|&c| usize::from(c) % (ids.len() + 1))
                .collect();
            offsets.push(0);
            offsets.push(ids.len());
            offsets.sort_unstable();
            pool.free_blocks_many(&ids, &offsets, *reversed)
                .map_err(drop)?;
            release(held, &ids);
        }
        PoolOp::FreeRaw(ids) => {
            let ids = raw(ids);
            pool.free_blocks(&ids).map_err(drop)?;
            release(held, &ids);
        }
        PoolOp::Touch(ids) => {
            let ids = raw(ids);
            pool.touch(&ids).map_err(drop)?;
            held.extend_from_slice(&ids);
        }
        PoolOp::Cache {
            start,
            len,
            num_cached,
            num_full,
            keys,
            width,
            group,
        } => {
            let start = usize::from(*start) % (held.len() + 1);
            let end = (start + usize::from(*len % 16)).min(held.len());
            let ids = &held[start..end];
            let mut flat = Vec::new();
            let w = key(0, *width).len();
            for &k in keys.iter().take(24) {
                flat.extend_from_slice(&key(k, *width));
            }
            let hashes = HashSlice::new(&flat, w).unwrap_or_else(|_| HashSlice::empty());
            let call = CacheBlocks {
                group: u32::from(*group % 3),
                ..CacheBlocks::new(
                    ids,
                    hashes,
                    usize::from(*num_cached % 20),
                    usize::from(*num_full % 20),
                )
            };
            pool.cache_full_blocks(call).map_err(drop)?;
        }
        PoolOp::Lookup {
            keys,
            width,
            group,
            max,
        } => {
            let mut flat = Vec::new();
            let w = key(0, *width).len();
            for &k in keys.iter().take(24) {
                flat.extend_from_slice(&key(k, *width));
            }
            let hashes = HashSlice::new(&flat, w).unwrap_or_else(|_| HashSlice::empty());
            let max = max.map(usize::from);
            pool.find_longest_cache_hit(hashes, u32::from(*group % 3), max, out)
                .map_err(drop)?;
            assert!(out.len() <= hashes.len().min(max.unwrap_or(usize::MAX)));
        }
        PoolOp::GetCached {
            key: k,
            width,
            group,
        } => {
            pool.get_cached_block(&key(*k, *width), u32::from(*group % 3))
                .map_err(drop)?;
        }
        PoolOp::Evict(ids) => pool.evict_blocks(&raw(ids)).map_err(drop)?,
        PoolOp::Reset => {
            pool.reset_prefix_cache();
        }
        PoolOp::TakeEvents => {
            pool.take_events();
            assert_eq!(pool.num_pending_events(), 0);
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------
// The manager, one by one against schedule_step.
// ---------------------------------------------------------------------------------

/// One call on a manager (applied to both managers of the pair).
#[derive(Arbitrary, Debug, Clone)]
pub enum ManagerOp {
    /// `add_request` with a prompt from a small alphabet (so prefixes repeat).
    Add { id: u8, len: u8, seed: u8 },
    /// `append_token_ids`.
    Append { id: u8, len: u8, seed: u8 },
    /// A step: one by one on the first manager, `schedule_step` on the second.
    Step {
        requests: Vec<(u8, u8, u8)>,
        stop_at_first_failure: bool,
    },
    /// `allocate_slots` with raw, possibly inconsistent, arguments.
    AllocateRaw {
        id: u8,
        num_new: u8,
        num_computed: u8,
        hits: Vec<u16>,
        lookahead: u8,
    },
    /// `set_num_computed_tokens`.
    SetComputed { id: u8, n: u8 },
    /// `free`.
    Free(u8),
    /// `free_many`.
    FreeMany(Vec<u8>),
    /// `preempt`.
    Preempt(u8),
    /// `reset_prefix_cache()`.
    Reset,
    /// `take_events()`.
    TakeEvents,
}

fn tokens(len: u8, seed: u8) -> Vec<i64> {
    let shared = usize::from(seed % 4) * 8; // a shared prefix of 0, 8, 16 or 24 tokens
    (0..usize::from(len % 48))
        .map(|i| {
            if i < shared {
                i as i64
            } else {
                (i as i64) * 7 + i64::from(seed)
            }
        })
        .collect()
}

fn rid(id: u8) -> RequestId {
    RequestId::Int(i64::from(id % 8))
}

/// One request as the manager reports it: id, tokens, computed tokens, block ids,
/// block hashes.
type RequestRow = (RequestId, usize, usize, Vec<u32>, Vec<u8>);

/// Everything observable about a manager.
#[derive(Debug, PartialEq)]
struct ManagerState {
    pool: PoolState,
    requests: Vec<RequestRow>,
    stats: String,
}

fn manager_state(m: &KVCacheManager) -> ManagerState {
    let mut ids: Vec<RequestId> = m.request_ids().cloned().collect();
    ids.sort();
    ManagerState {
        pool: pool_state(m.pool()),
        requests: ids
            .into_iter()
            .map(|id| {
                let row = (
                    m.num_tokens(&id).unwrap(),
                    m.num_computed_tokens(&id).unwrap(),
                    m.block_ids(&id).unwrap().to_vec(),
                    m.block_hashes(&id).unwrap().as_bytes().to_vec(),
                );
                (id, row.0, row.1, row.2, row.3)
            })
            .collect(),
        stats: format!("{:?}", m.prefix_cache_stats()),
    }
}

/// One request scheduled as `schedule_step` schedules it, with single calls (also
/// the reference of `tests/manager_step.rs`).
pub fn one_by_one(
    m: &mut KVCacheManager,
    id: &RequestId,
    budget: usize,
    lookahead: usize,
    out: &mut Vec<u32>,
) -> (bool, usize, usize) {
    let mut hits = Vec::new();
    let (mut num_new, mut hit) = (budget, 0);
    if m.block_ids(id).unwrap().is_empty() && m.num_computed_tokens(id).unwrap() == 0 {
        hit = m.get_computed_blocks(id, &mut hits).unwrap();
        num_new = num_new.min(m.num_tokens(id).unwrap() - hit);
    }
    let ok = num_new + hit > 0
        && m.allocate_slots(id, num_new, hit, &hits, lookahead, out)
            .unwrap();
    if ok {
        (true, num_new, hit)
    } else {
        (false, 0, 0)
    }
}

/// Runs one manager input.
pub fn run_manager(data: &[u8]) {
    let mut u = Unstructured::new(data);
    let Ok((num_blocks, block_size, caching, algo, max_len)) =
        <(u8, u8, bool, u8, Option<u8>)>::arbitrary(&mut u)
    else {
        return;
    };
    let mut config = ManagerConfig::new(
        u32::from(num_blocks % 40) + 2,
        u32::from(block_size % 4) + 1,
    );
    config.enable_caching = caching || algo % 8 != 0;
    config.hash_algo = HashAlgo::ALL[usize::from(algo) % HashAlgo::ALL.len()];
    config.enable_events = true;
    config.max_pending_events = 32;
    config.max_model_len = max_len.map(|m| usize::from(m) + 1);
    let mut a = KVCacheManager::new(config.clone()).expect("a valid configuration");
    let mut b = KVCacheManager::new(config).expect("a valid configuration");
    for _ in 0..MAX_OPS {
        let Ok(op) = ManagerOp::arbitrary(&mut u) else {
            break;
        };
        let before = manager_state(&a);
        let (ra, rb) = apply_manager_op(&mut a, &mut b, &op);
        for (m, r) in [(&a, &ra), (&b, &rb)] {
            if let Err(problems) = m.check_invariants() {
                panic!("invariants broken after {op:?}: {problems:?}");
            }
            if r.is_err() {
                assert_eq!(
                    before,
                    manager_state(m),
                    "{op:?} failed but changed the manager"
                );
            }
        }
        assert_eq!(ra, rb, "{op:?}: the two managers disagree");
        assert_eq!(manager_state(&a), manager_state(&b), "after {op:?}");
    }
}

type OpResult = Result<String, String>;

fn apply_manager_op(
    a: &mut KVCacheManager,
    b: &mut KVCacheManager,
    op: &ManagerOp,
) -> (OpResult, OpResult) {
    let mut both = |f: &mut dyn FnMut(&mut KVCacheManager) -> OpResult| (f(a), f(b));
    let err = |e: kvpool::pool::PoolError| e.to_string();
    match op {
        ManagerOp::Add { id, len, seed } => both(&mut |m| {
            let t = tokens(*len, *seed);
            m.add_request(
                rid(*id),
                TokenIds::Values(&t),
                SequenceExtras::default(),
                LoraInfo::default(),
            )
            .map(|()| String::new())
            .map_err(err)
        }),
        ManagerOp::Append { id, len, seed } => both(&mut |m| {
            let t = tokens(*len % 8, *seed);
            m.append_token_ids(&rid(*id), TokenIds::Values(&t))
                .map(|()| String::new())
                .map_err(err)
        }),
        ManagerOp::Step {
            requests,
            stop_at_first_failure,
        } => {
            let ids: Vec<(RequestId, usize, usize)> = requests
                .iter()
                .take(8)
                .map(|&(id, n, la)| (rid(id), usize::from(n % 40), usize::from(la % 3)))
                .collect();
            let known = ids.iter().all(|(id, _, _)| a.contains(id));
            // One by one on `a`, as a scheduler loop does; a step naming an unknown
            // request is refused as a whole.
            let ra = if known {
                let mut rows = Vec::new();
                let mut stopped = false;
                for (id, n, la) in &ids {
                    let mut out = Vec::new();
                    let row = if stopped {
                        (false, 0, 0)
                    } else {
                        one_by_one(a, id, *n, *la, &mut out)
                    };
                    if !row.0 {
                        stopped = *stop_at_first_failure;
                    }
                    rows.push((row, out));
                }
                Ok(format!("{rows:?}"))
            } else {
                Err(String::from("unknown request"))
            };
            let step: Vec<StepRequest<'_>> = ids
                .iter()
                .map(|(id, n, la)| StepRequest {
                    id,
                    num_new_tokens: *n,
                    num_lookahead_tokens: *la,
                })
                .collect();
            let mut out = StepOutcome::default();
            let rb = match b.schedule_step(
                &step,
                StepLimits {
                    stop_at_first_failure: *stop_at_first_failure,
                    ..StepLimits::default()
                },
                &mut out,
            ) {
                Ok(()) => {
                    let rows: Vec<_> = (0..ids.len())
                        .map(|i| {
                            let row = (
                                out.allocated[i],
                                out.num_scheduled_tokens[i],
                                out.num_hit_tokens[i],
                            );
                            (
                                row,
                                out.block_ids[out.offsets[i]..out.offsets[i + 1]].to_vec(),
                            )
                        })
                        .collect();
                    Ok(format!("{rows:?}"))
                }
                Err(_) => Err(String::from("unknown request")),
            };
            (ra, rb)
        }
        ManagerOp::AllocateRaw {
            id,
            num_new,
            num_computed,
            hits,
            lookahead,
        } => both(&mut |m| {
            let hits: Vec<u32> = hits.iter().take(8).map(|&h| u32::from(h % 48)).collect();
            let mut out = Vec::new();
            m.allocate_slots(
                &rid(*id),
                usize::from(*num_new % 40),
                usize::from(*num_computed % 20),
                &hits,
                usize::from(*lookahead % 3),
                &mut out,
            )
            .map(|ok| format!("{ok} {out:?}"))
            .map_err(err)
        }),
        ManagerOp::SetComputed { id, n } => both(&mut |m| {
            m.set_num_computed_tokens(&rid(*id), usize::from(*n % 50))
                .map(|()| String::new())
                .map_err(err)
        }),
        ManagerOp::Free(id) => {
            both(&mut |m| m.free(&rid(*id)).map(|()| String::new()).map_err(err))
        }
        ManagerOp::FreeMany(ids) => both(&mut |m| {
            let ids: Vec<RequestId> = ids.iter().take(8).map(|&i| rid(i)).collect();
            m.free_many(&ids).map(|()| String::new()).map_err(err)
        }),
        ManagerOp::Preempt(id) => {
            both(&mut |m| m.preempt(&rid(*id)).map(|()| String::new()).map_err(err))
        }
        ManagerOp::Reset => both(&mut |m| Ok(m.reset_prefix_cache().to_string())),
        ManagerOp::TakeEvents => both(&mut |m| Ok(format!("{:?}", m.take_events()))),
    }
}

// ---------------------------------------------------------------------------------
// Hashing.
// ---------------------------------------------------------------------------------

/// A hash-input value at most [`MAX_DEPTH`] deep (deeper ones are refused where
/// values come from Python).
#[derive(Debug)]
pub struct BoundedValue(pub Value);

impl<'a> Arbitrary<'a> for BoundedValue {
    fn arbitrary(u: &mut Unstructured<'a>) -> ArbResult<Self> {
        fn value(u: &mut Unstructured<'_>, depth: usize) -> ArbResult<Value> {
            let choice = u.int_in_range(0..=6)?;
            Ok(match choice {
                0 => Value::None,
                1 => Value::Int(u.arbitrary()?),
                2 => Value::Bytes(u.arbitrary()?),
                3 => Value::Str(u.arbitrary()?),
                4 | 5 if depth < MAX_DEPTH => {
                    let n = u.int_in_range(0..=4)?;
                    Value::Tuple(
                        (0..n)
                            .map(|_| value(u, depth + 1))
                            .collect::<ArbResult<_>>()?,
                    )
                }
                6 => Value::Shared(u.int_in_range(0..=3)?, Box::new(value(u, depth)?)),
                _ => Value::Int(0),
            })
        }
        Ok(Self(value(u, 0)?))
    }
}

/// One hashing input.
#[derive(Arbitrary, Debug)]
pub struct HashCase {
    algo: u8,
    block_size: u8,
    tokens: Vec<i64>,
    lora: Option<(String, String)>,
    salt: Option<String>,
    mm: Vec<(String, u16, u16)>,
    share: Vec<u8>,
    cuts: Vec<u8>,
    value: BoundedValue,
}

/// Runs one hashing input.
pub fn run_hashing(data: &[u8]) {
    let mut u = Unstructured::new(data);
    let Ok(case) = HashCase::arbitrary(&mut u) else {
        return;
    };
    let algo = HashAlgo::ALL[usize::from(case.algo) % HashAlgo::ALL.len()];
    let block_size = usize::from(case.block_size % 8) + 1;
    let tokens: Vec<i64> = case.tokens.iter().copied().take(256).collect();
    // Sorted and non-overlapping, as vLLM assumes (for nested inputs a resumed
    // chain differs from one hashed at once, in vLLM too).
    let mut pos = 0;
    let mm: Vec<MmFeature> = case
        .mm
        .iter()
        .take(8)
        .map(|(id, gap, len)| {
            let offset = pos + usize::from(*gap % 40);
            pos = offset + usize::from(*len % 40);
            MmFeature::new(id.clone(), offset, pos - offset)
        })
        .collect();
    let share = |i: usize| {
        case.share
            .get(i)
            .map_or(ExtraObjects::DISTINCT, |&s| u32::from(s % 8))
    };
    let objects = ExtraObjects {
        lora_name: share(0),
        lora_path: share(1),
        cache_salt: share(2),
        mm_identifiers: (0..mm.len()).map(|i| share(3 + i)).collect(),
    };
    let inputs = ExtraKeyInputs {
        lora: case.lora.as_ref().map(|(n, p)| (n.as_str(), p.as_str())),
        mm_features: &mm,
        cache_salt: case.salt.as_deref(),
        prompt_embed_digests: None,
        objects: Some(&objects),
    };
    let root = none_hash(algo, "fuzz");
    let mut hasher = BlockHasher::new(algo);
    let mut whole = Vec::new();
    let n = hasher.extend_chain(&root, &tokens, block_size, 0, &inputs, &mut whole);
    assert_eq!(whole.len(), n * algo.digest_len());

    // In pieces: the chain resumed at each cut equals the chain at once.
    let mut pieces = Vec::new();
    let mut cuts: Vec<usize> = case
        .cuts
        .iter()
        .take(6)
        .map(|&c| usize::from(c) % (tokens.len() + 1))
        .collect();
    cuts.sort_unstable();
    cuts.push(tokens.len());
    for cut in cuts {
        hasher.update_chain(&root, &tokens[..cut], block_size, &inputs, &mut pieces);
    }
    assert_eq!(pieces, whole, "chain in pieces");

    // Block by block through Values (identity included) equals the borrowed path.
    let mut cursor = inputs.mm_cursor(0, block_size);
    let mut parent = root.as_bytes().to_vec();
    let width = algo.digest_len();
    for b in 0..n {
        let keys = inputs
            .block_keys(b, block_size, &mut cursor)
            .expect("no digests, so hashable");
        let value = keys.to_value();
        let block = &tokens[b * block_size..(b + 1) * block_size];
        let digest = hasher.hash_block(&parent, block, value.as_ref());
        assert_eq!(
            digest.as_bytes(),
            &whole[b * width..(b + 1) * width],
            "block {b} via Value"
        );
        parent = digest.as_bytes().to_vec();
    }

    // The encoders take any bounded value without panicking.
    let mut out = Vec::new();
    encode_pickle(&case.value.0, &mut out);
    out.clear();
    encode_cbor(&case.value.0, &mut out);
    let _ = algo.hash_value(&case.value.0);
}
