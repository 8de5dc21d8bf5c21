//! `KVCacheManager::schedule_step`: a whole scheduler step in one call, with exactly
//! the results of the one-by-one calls a scheduler would make.

use super::error::PoolResult;
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

/// What a batched step did, per request in order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StepOutcome {
    /// New block ids of every request, back to back.
    pub block_ids: Vec<u32>,
    /// `block_ids[offsets[i]..offsets[i + 1]]` are request `i`'s new blocks.
    pub offsets: Vec<usize>,
    /// Tokens scheduled per request (0 where allocation failed or was not tried).
    pub num_scheduled_tokens: Vec<usize>,
    /// Prefix-hit tokens per request (non-zero only for requests starting now).
    pub num_hit_tokens: Vec<usize>,
    /// Whether each request got its slots.
    pub allocated: Vec<bool>,
}

impl KVCacheManager {
    /// One scheduler step in one call: for each request in order, a request that
    /// has not started first looks up its prefix hit and schedules
    /// `min(num_new_tokens, num_tokens - hit)` tokens; a running one schedules
    /// `num_new_tokens`. Then its slots are allocated as by
    /// [`Self::allocate_slots`]. A request that does not fit is marked and, with
    /// `stop_at_first_failure`, ends the step (vLLM's waiting queue does so).
    /// Unknown ids fail the whole step before anything changes.
    pub fn schedule_step(
        &mut self,
        step: &[StepRequest<'_>],
        stop_at_first_failure: bool,
        out: &mut StepOutcome,
    ) -> PoolResult<()> {
        self.check_known(step.iter().map(|r| r.id))?;
        let Self {
            pool,
            requests,
            stats,
            max_model_len,
            hits_scratch: hits,
            ..
        } = self;
        out.offsets.push(out.block_ids.len());
        let mut stopped = false;
        for req in step {
            let (mut scheduled, mut hit_tokens, mut ok) = (0, 0, false);
            if !stopped {
                let request = requests.get_mut(req.id).ok_or_else(|| unknown(req.id))?;
                hits.clear();
                let mut num_new = req.num_new_tokens;
                if request.waiting() {
                    hit_tokens = request.seq.lookup_computed_blocks(pool, hits)?;
                    num_new = num_new.min(request.seq.num_tokens() - hit_tokens);
                }
                let call = SlotRequest {
                    num_new_tokens: num_new,
                    num_new_computed_tokens: hit_tokens,
                    new_computed_blocks: hits,
                    num_lookahead_tokens: req.num_lookahead_tokens,
                };
                ok = num_new + hit_tokens > 0
                    && Self::allocate(
                        pool,
                        stats,
                        *max_model_len,
                        request,
                        &call,
                        &mut out.block_ids,
                    )?;
                if ok {
                    scheduled = num_new;
                } else {
                    hit_tokens = 0;
                    stopped = stop_at_first_failure;
                }
            }
            out.num_scheduled_tokens.push(scheduled);
            out.num_hit_tokens.push(hit_tokens);
            out.allocated.push(ok);
            out.offsets.push(out.block_ids.len());
        }
        Ok(())
    }
}
