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

/// Statistics and their recent windows.
#[derive(Debug, Default)]
pub(super) struct StatsRecorder {
    pub(super) all: PrefixCacheStats,
    /// `(queries, hits)` of the last `window_len` new requests admitted: vLLM's
    /// `CachingMetrics` window, which resumed requests do not enter.
    new: VecDeque<(u64, u64)>,
    /// The same for the last `window_len` resumed (preempted) requests.
    resumed: VecDeque<(u64, u64)>,
    window_len: usize,
}

impl StatsRecorder {
    /// Empty statistics with windows over the last `window_len` new and resumed requests.
    pub(super) fn new(window_len: usize) -> Self {
        Self {
            window_len,
            ..Self::default()
        }
    }

    /// Counts an admitted request; a resumed (preempted) one apart, as vLLM does.
    pub(super) fn record(&mut self, queries: u64, hits: u64, preempted: bool) {
        let window = if preempted {
            &mut self.resumed
        } else {
            &mut self.new
        };
        if self.window_len > 0 {
            if window.len() == self.window_len {
                window.pop_front();
            }
            window.push_back((queries, hits));
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

    /// The statistics of the windows: new and resumed requests, each in their fields.
    pub(super) fn recent(&self) -> PrefixCacheStats {
        let sum = |w: &VecDeque<(u64, u64)>| {
            w.iter()
                .fold((w.len() as u64, 0, 0), |(n, q, h), &(dq, dh)| {
                    (n, q + dq, h + dh)
                })
        };
        let (requests, queries, hits) = sum(&self.new);
        let (preempted_requests, preempted_queries, preempted_hits) = sum(&self.resumed);
        PrefixCacheStats {
            requests,
            queries,
            hits,
            preempted_requests,
            preempted_queries,
            preempted_hits,
        }
    }

    pub(super) fn clear(&mut self) {
        self.all = PrefixCacheStats::default();
        self.new.clear();
        self.resumed.clear();
    }
}
