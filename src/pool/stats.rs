//! Prefix-cache statistics of the manager: totals and a window over recent requests.

use std::collections::VecDeque;

/// Prefix-cache statistics, recorded as vLLM 0.33 records them: when a waiting
/// request is admitted (its first successful allocation), so lookups of requests
/// that stay waiting are not counted; resumed (preempted) requests apart.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PrefixCacheStats {
    /// New requests admitted.
    pub requests: u64,
    /// Their tokens (what was looked up).
    pub queries: u64,
    /// Their tokens found computed in the prefix cache.
    pub hits: u64,
    /// Preempted requests admitted again.
    pub preempted_requests: u64,
    /// Their tokens.
    pub preempted_queries: u64,
    /// Their tokens found computed.
    pub preempted_hits: u64,
}

impl PrefixCacheStats {
    /// `hits / queries`, 0 when nothing was queried.
    pub fn hit_rate(&self) -> f64 {
        if self.queries == 0 {
            0.0
        } else {
            self.hits as f64 / self.queries as f64
        }
    }
}

/// Statistics and their recent window.
#[derive(Debug, Default)]
pub(super) struct StatsRecorder {
    pub(super) all: PrefixCacheStats,
    /// `(queries, hits, resumed)` of the last `window_len` admitted requests.
    window: VecDeque<(u64, u64, bool)>,
    window_len: usize,
}

impl StatsRecorder {
    /// Empty statistics with a window over the last `window_len` admitted requests.
    pub(super) fn new(window_len: usize) -> Self {
        Self {
            window_len,
            ..Self::default()
        }
    }

    /// Counts an admitted request; a resumed (preempted) one apart, as vLLM does.
    pub(super) fn record(&mut self, queries: u64, hits: u64, preempted: bool) {
        if self.window_len > 0 {
            if self.window.len() == self.window_len {
                self.window.pop_front();
            }
            self.window.push_back((queries, hits, preempted));
        }
        if preempted {
            self.all.preempted_requests += 1;
            self.all.preempted_queries += queries;
            self.all.preempted_hits += hits;
            return;
        }
        self.all.requests += 1;
        self.all.queries += queries;
        self.all.hits += hits;
    }

    /// The statistics of the window: new and resumed requests, each in their fields.
    pub(super) fn recent(&self) -> PrefixCacheStats {
        let mut s = PrefixCacheStats::default();
        for &(q, h, resumed) in &self.window {
            if resumed {
                s.preempted_requests += 1;
                s.preempted_queries += q;
                s.preempted_hits += h;
            } else {
                s.requests += 1;
                s.queries += q;
                s.hits += h;
            }
        }
        s
    }

    pub(super) fn clear(&mut self) {
        self.all = PrefixCacheStats::default();
        self.window.clear();
    }
}
