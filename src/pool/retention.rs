//! Which of a sliding-window group's newly full blocks enter the prefix cache
//! (vLLM 0.33's `SlidingWindowManager.reachable_block_mask`, without EAGLE).
//!
//! A sliding-window hit needs only the `need` blocks just before the hit's end
//! (`GroupSpec::contiguous_blocks_for_hit`), and hits end on multiples of the
//! scheduler block size; a block that can never be in such a tail is not worth a
//! cache entry. The retention interval thins the tails further: `None` keeps one
//! at every aligned boundary (every block, unless the window is wider than the
//! alignment step), `Some(n)` one per `n`-token segment, `Some(0)` none; the
//! tails ending at the reachable boundaries (where a resent prompt's hit would
//! stop, and a shared-prefix junction) are kept whenever an interval is set.

use super::kv_groups::GroupSpec;

/// Where a later request resending this prompt could resume: `num_prompt - 1`
/// (its last token is always recomputed). vLLM's `replay_boundaries` without
/// EAGLE.
pub fn replay_boundary(num_prompt_tokens: usize) -> usize {
    num_prompt_tokens.saturating_sub(1)
}

/// The mask for blocks `start_block..end_block` of a sliding-window group, or
/// `None` to cache them all. `reachable_boundaries` are token positions whose
/// tails must be kept under sparse retention.
pub fn reachable_block_mask(
    spec: &GroupSpec,
    start_block: usize,
    end_block: usize,
    alignment_tokens: usize,
    retention_interval: Option<usize>,
    reachable_boundaries: &[usize],
) -> Option<Vec<bool>> {
    let bs = spec.block_size;
    if alignment_tokens % bs != 0 {
        return None;
    }
    let need = spec.contiguous_blocks_for_hit();
    let mut mask = vec![false; end_block.saturating_sub(start_block)];
    let segment_tokens = match retention_interval {
        None => Some(alignment_tokens),
        Some(0) => None,
        Some(n) => Some(n),
    };
    if let Some(segment) = segment_tokens {
        let per_segment = segment / bs;
        if need >= per_segment {
            return None; // every block is in some tail
        }
        for i in start_block..end_block {
            if i % per_segment >= per_segment - need {
                mask[i - start_block] = true;
            }
        }
    }
    if retention_interval.is_some() {
        for &boundary in reachable_boundaries {
            let end = boundary / alignment_tokens * alignment_tokens / bs;
            for j in start_block.max(end.saturating_sub(need))..end_block.min(end) {
                mask[j - start_block] = true;
            }
        }
    }
    Some(mask)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dense_retention_keeps_every_block_of_a_wide_window() {
        // Window 8, block 4: a hit needs 2 blocks; the alignment step is 1 block.
        let spec = GroupSpec::sliding_window(4, 8);
        assert_eq!(reachable_block_mask(&spec, 0, 6, 4, None, &[]), None);
    }

    #[test]
    fn sparse_retention_keeps_segment_tails_and_the_replay_tail() {
        // Window 5, block 4: 1 block per hit; segments of 16 tokens (4 blocks).
        let spec = GroupSpec::sliding_window(4, 5);
        let mask = reachable_block_mask(&spec, 0, 8, 4, Some(16), &[]).unwrap();
        assert_eq!(mask, [false, false, false, true, false, false, false, true]);
        // A prompt of 22 tokens: a resend stops at 21 -> block boundary 20 -> block 4.
        let mask = reachable_block_mask(&spec, 0, 8, 4, Some(16), &[replay_boundary(22)]).unwrap();
        assert_eq!(mask, [false, false, false, true, true, false, false, true]);
        // Interval 0: only the replay tail.
        let mask = reachable_block_mask(&spec, 2, 8, 4, Some(0), &[21]).unwrap();
        assert_eq!(mask, [false, false, true, false, false, false]);
    }
}
