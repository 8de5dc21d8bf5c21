//! `schedule_step`: a whole scheduler step in one call, with exactly the results of
//! the one-by-one calls a scheduler would make, optionally under vLLM's step limits
//! (a token budget, a cap on scheduled requests, preemption of the newest running
//! requests when the pool is short).
//!
//! The driver here is the one implementation of those rules; [`super::KVCacheManager`]
//! and [`super::GroupManager`] provide [`StepManager`], the per-request part.

use super::error::{PoolError, PoolResult};
use super::manager::{unknown, KVCacheManager, SlotRequest};
use super::request_id::RequestId;

/// One request's part in a batched step.
#[derive(Clone, Debug)]
pub struct StepRequest<'a> {
    /// The request.
    pub id: &'a RequestId,
    /// Tokens to schedule. For a request that has not started: the most to compute
    /// beyond its prefix hit (the manager looks the hit up first).
    pub num_new_tokens: usize,
    /// Speculative slots to allocate beyond them (never cached).
    pub num_lookahead_tokens: usize,
}

/// The limits of one step beyond each request's own token count. The default (no
/// budget, no cap, no stop, no preemption) is the one-by-one calls in order.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StepLimits {
    /// Tokens the whole step may schedule (prefix hits are free): each request gets at
    /// most what is left (a waiting request's prefill is chunked to it), and once
    /// it is spent the rest get [`StepStatus::TokenBudget`].
    pub token_budget: Option<usize>,
    /// Requests the step may schedule; the rest get [`StepStatus::RequestCap`].
    pub max_num_requests: Option<usize>,
    /// The first request that fails ([`StepStatus::NoBlocks`] or
    /// [`StepStatus::NoTokens`]) ends the step: the rest get [`StepStatus::Skipped`]
    /// (vLLM's waiting queue does so).
    pub stop_at_first_failure: bool,
    /// A running request that does not fit preempts running requests from the end of
    /// the step, newest first, until it fits, or itself when none is left (vLLM's
    /// FCFS rule); after a preemption no waiting request is admitted in the step.
    /// The request ids must then be distinct.
    pub preempt: bool,
}

/// What happened to one request of a step.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StepStatus {
    /// Its slots were allocated.
    Scheduled = 0,
    /// The pool could not hold it; nothing changed for it.
    NoBlocks = 1,
    /// It had nothing to schedule (no new tokens and no hit).
    NoTokens = 2,
    /// The step's token budget was spent before it.
    TokenBudget = 3,
    /// The step had already scheduled `max_num_requests` requests.
    RequestCap = 4,
    /// Not tried: an earlier failure ended the step, or (a waiting request) the step
    /// preempted.
    Skipped = 5,
    /// Preempted to make room for an earlier request (or for itself): its blocks are
    /// freed and it restarts from zero computed tokens.
    Preempted = 6,
}

/// What a batched step did, per request in order. With `G` groups (1 for
/// [`KVCacheManager`]), request `i`'s group-`g` new blocks are
/// `block_ids[offsets[i * G + g]..offsets[i * G + g + 1]]`, and its prefix hit's blocks
/// are cut from `hit_block_ids` by `hit_offsets` the same way.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StepOutcome {
    /// New block ids of every request, back to back.
    pub block_ids: Vec<u32>,
    /// `n * G + 1` offsets into `block_ids`.
    pub offsets: Vec<usize>,
    /// The blocks of every admitted request's prefix hit, back to back.
    pub hit_block_ids: Vec<u32>,
    /// `n * G + 1` offsets into `hit_block_ids`.
    pub hit_offsets: Vec<usize>,
    /// Tokens scheduled per request (0 unless scheduled).
    pub num_scheduled_tokens: Vec<usize>,
    /// Prefix-hit tokens per request (non-zero only for requests admitted now).
    pub num_hit_tokens: Vec<usize>,
    /// Whether each request got its slots (`status == Scheduled`).
    pub allocated: Vec<bool>,
    /// What happened to each request.
    pub status: Vec<StepStatus>,
}

/// The outcome of trying one request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Attempt {
    /// Allocated: tokens scheduled and prefix-hit tokens.
    Scheduled(usize, usize),
    /// Nothing to schedule.
    NoTokens,
    /// Does not fit; nothing changed.
    NoBlocks,
}

/// The per-request part of a step, provided by each manager.
/// The largest token count a request may reach (computed, scheduled or held): counts
/// cross to Python as `int64`, so a call that would take one past `2**63 - 1` is refused
/// before it changes anything, instead of saturating or wrapping negative in a getter.
pub const MAX_TOKEN_COUNT: usize = i64::MAX as usize;

/// `counts` added up, or `None` past [`MAX_TOKEN_COUNT`].
pub(super) fn token_sum(counts: &[usize]) -> Option<usize> {
    counts
        .iter()
        .try_fold(0usize, |sum, &n| sum.checked_add(n))
        .filter(|&sum| sum <= MAX_TOKEN_COUNT)
}

pub(super) trait StepManager {
    /// KV-cache groups per request table.
    fn num_groups(&self) -> usize;
    /// Whether the request is known.
    fn knows(&self, id: &RequestId) -> bool;
    /// Whether the known request has not started (no blocks, nothing computed).
    fn is_waiting(&self, id: &RequestId) -> bool;
    /// Tries to schedule at most `max_new` of `req.num_new_tokens` tokens (a waiting
    /// request looks its hit up first and schedules at most the rest of its tokens).
    /// On success appends its new blocks and `G` end offsets to `out.block_ids` /
    /// `out.offsets`, and its hit likewise to `out.hit_block_ids` / `out.hit_offsets`;
    /// otherwise leaves `out` as it was.
    fn try_schedule(
        &mut self,
        req: &StepRequest<'_>,
        max_new: usize,
        out: &mut StepOutcome,
    ) -> PoolResult<Attempt>;
    /// Preempts a known request.
    fn preempt_request(&mut self, id: &RequestId) -> PoolResult<()>;
    /// The tokens known request `id` has (computed and prefix-hit tokens are at most this).
    fn num_tokens_of(&self, id: &RequestId) -> usize;
    /// The known request's computed tokens.
    fn num_computed_of(&self, id: &RequestId) -> usize;
    /// An estimate of the new block ids `step` may add (at most the pool's size), to
    /// reserve their room once instead of growing it by doubling; 0 for no estimate.
    fn new_blocks_hint(&self, _step: &[StepRequest<'_>]) -> usize {
        0
    }
}

/// Runs one step on `m` under `limits`, appending to `out` (see [`StepOutcome`]).
/// Unknown ids (and, with preemption, repeated ids) fail the whole step before
/// anything changes.
pub(super) fn run_step<M: StepManager>(
    m: &mut M,
    step: &[StepRequest<'_>],
    limits: StepLimits,
    out: &mut StepOutcome,
) -> PoolResult<()> {
    if let Some(r) = step.iter().find(|r| !m.knows(r.id)) {
        return Err(unknown(r.id));
    }
    // Each request's counts add up (its tokens bound the computed and hit ones), checked
    // here so that a step that would fail on them fails before any request is scheduled.
    // Bounded by every new and lookahead token of the step, as a request listed twice
    // (without preemption) is scheduled twice; a hit is at most the request's tokens.
    let step_tokens = step
        .iter()
        .try_fold(0usize, |sum, r| {
            token_sum(&[sum, r.num_new_tokens, r.num_lookahead_tokens])
        })
        .unwrap_or(usize::MAX);
    if let Some(r) = step.iter().find(|r| {
        token_sum(&[m.num_tokens_of(r.id), m.num_computed_of(r.id), step_tokens]).is_none()
    }) {
        return Err(PoolError::InvalidArgument(format!(
            "request {}: its tokens and computed tokens and the step's new and lookahead tokens add up past 2**63 - 1",
            r.id
        )));
    }
    if limits.preempt && step.len() > 1 {
        let mut seen = hashbrown::HashSet::with_capacity(step.len());
        if let Some(r) = step.iter().find(|r| !seen.insert(r.id)) {
            return Err(PoolError::InvalidArgument(format!(
                "request {} appears twice in a step with preemption",
                r.id
            )));
        }
    }
    let groups = m.num_groups();
    let n = step.len();
    out.offsets.reserve(n * groups + 1);
    out.hit_offsets.reserve(n * groups + 1);
    out.num_scheduled_tokens.reserve(n);
    out.num_hit_tokens.reserve(n);
    out.allocated.reserve(n);
    out.status.reserve(n);
    out.block_ids.reserve(m.new_blocks_hint(step));
    out.offsets.push(out.block_ids.len());
    out.hit_offsets.push(out.hit_block_ids.len());
    let mut budget = limits.token_budget.unwrap_or(MAX_TOKEN_COUNT);
    let cap = limits.max_num_requests.unwrap_or(usize::MAX);
    let (mut num_scheduled, mut stopped, mut preempted_any) = (0, false, false);
    let mut preempted: Vec<bool> = Vec::new();
    for (i, req) in step.iter().enumerate() {
        let status = if preempted.get(i).copied().unwrap_or(false) {
            StepStatus::Preempted
        } else if stopped {
            StepStatus::Skipped
        } else if budget == 0 {
            StepStatus::TokenBudget
        } else if num_scheduled >= cap {
            StepStatus::RequestCap
        } else if preempted_any && m.is_waiting(req.id) {
            StepStatus::Skipped
        } else {
            loop {
                match m.try_schedule(req, budget, out)? {
                    Attempt::Scheduled(tokens, hit) => {
                        budget -= tokens;
                        num_scheduled += 1;
                        out.num_scheduled_tokens.push(tokens);
                        out.num_hit_tokens.push(hit);
                        break StepStatus::Scheduled;
                    }
                    Attempt::NoTokens => break StepStatus::NoTokens,
                    Attempt::NoBlocks if !limits.preempt || m.is_waiting(req.id) => {
                        break StepStatus::NoBlocks
                    }
                    Attempt::NoBlocks => {
                        preempted.resize(step.len(), false);
                        preempted_any = true;
                        let victim = (i + 1..step.len())
                            .rev()
                            .find(|&j| !preempted[j] && !m.is_waiting(step[j].id));
                        match victim {
                            Some(j) => {
                                m.preempt_request(step[j].id)?;
                                preempted[j] = true;
                            }
                            None => {
                                m.preempt_request(req.id)?;
                                break StepStatus::Preempted;
                            }
                        }
                    }
                }
            }
        };
        if status != StepStatus::Scheduled {
            stopped |= limits.stop_at_first_failure
                && matches!(status, StepStatus::NoBlocks | StepStatus::NoTokens);
            let (end, hit_end) = (out.block_ids.len(), out.hit_block_ids.len());
            out.offsets.extend(std::iter::repeat_n(end, groups));
            out.hit_offsets.extend(std::iter::repeat_n(hit_end, groups));
            out.num_scheduled_tokens.push(0);
            out.num_hit_tokens.push(0);
        }
        out.allocated.push(status == StepStatus::Scheduled);
        out.status.push(status);
    }
    Ok(())
}

impl StepManager for KVCacheManager {
    fn num_groups(&self) -> usize {
        1
    }

    fn new_blocks_hint(&self, step: &[StepRequest<'_>]) -> usize {
        let block_size = self.block_size();
        step.iter()
            .map(|r| {
                r.num_new_tokens
                    .saturating_add(r.num_lookahead_tokens)
                    .div_ceil(block_size)
                    .saturating_add(1)
            })
            .fold(0usize, usize::saturating_add)
            .min(self.pool.num_blocks() as usize)
    }

    fn knows(&self, id: &RequestId) -> bool {
        self.requests.contains_key(id)
    }

    fn num_tokens_of(&self, id: &RequestId) -> usize {
        self.requests.get(id).map_or(0, |r| r.seq.num_tokens())
    }

    fn num_computed_of(&self, id: &RequestId) -> usize {
        self.requests.get(id).map_or(0, |r| r.num_computed_tokens)
    }

    fn is_waiting(&self, id: &RequestId) -> bool {
        self.requests.get(id).is_some_and(|r| r.waiting())
    }

    fn try_schedule(
        &mut self,
        req: &StepRequest<'_>,
        max_new: usize,
        out: &mut StepOutcome,
    ) -> PoolResult<Attempt> {
        let Self {
            pool,
            requests,
            stats,
            max_model_len,
            ..
        } = self;
        let request = requests.get_mut(req.id).ok_or_else(|| unknown(req.id))?;
        let hit_start = out.hit_block_ids.len();
        let mut num_new = req.num_new_tokens.min(max_new);
        let mut hit_tokens = 0;
        if request.waiting() {
            hit_tokens = request
                .seq
                .lookup_computed_blocks(pool, &mut out.hit_block_ids)?;
            num_new = num_new.min(request.seq.num_tokens() - hit_tokens);
        }
        if num_new + hit_tokens == 0 {
            out.hit_block_ids.truncate(hit_start);
            return Ok(Attempt::NoTokens);
        }
        let call = SlotRequest {
            num_new_tokens: num_new,
            num_new_computed_tokens: hit_tokens,
            new_computed_blocks: &out.hit_block_ids[hit_start..],
            num_lookahead_tokens: req.num_lookahead_tokens,
        };
        if Self::allocate(
            pool,
            stats,
            *max_model_len,
            request,
            &call,
            &mut out.block_ids,
        )? {
            out.offsets.push(out.block_ids.len());
            out.hit_offsets.push(out.hit_block_ids.len());
            Ok(Attempt::Scheduled(num_new, hit_tokens))
        } else {
            out.hit_block_ids.truncate(hit_start);
            Ok(Attempt::NoBlocks)
        }
    }

    fn preempt_request(&mut self, id: &RequestId) -> PoolResult<()> {
        self.preempt(id)
    }
}

impl KVCacheManager {
    /// One scheduler step in one call: for each request in order, a request that
    /// has not started first looks up its prefix hit and schedules
    /// `min(num_new_tokens, num_tokens - hit)` tokens; a running one schedules
    /// `num_new_tokens`. Then its slots are allocated as by
    /// [`Self::allocate_slots`]. `limits` adds vLLM's step rules (see
    /// [`StepLimits`]); with the default limits this is exactly the one-by-one calls.
    /// Unknown ids fail the whole step before anything changes.
    pub fn schedule_step(
        &mut self,
        step: &[StepRequest<'_>],
        limits: StepLimits,
        out: &mut StepOutcome,
    ) -> PoolResult<()> {
        run_step(self, step, limits, out)
    }
}
