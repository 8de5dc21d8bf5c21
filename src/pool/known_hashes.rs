//! A request's block hashes as the caller's tables have seen them: vLLM's
//! `Request.block_hashes` only grows, so each hash crosses from the caller once
//! and later calls pass only the new ones (`request.block_hashes[n..]`).

use super::block_pool::BlockPool;
use super::error::{PoolError, PoolResult};
use super::hash_key::HashSlice;

/// The hashes known so far, back to back, and their width (0 before the first).
#[derive(Clone, Debug, Default)]
pub struct KnownHashes {
    bytes: Vec<u8>,
    width: usize,
}

impl KnownHashes {
    /// How many hashes are known.
    pub fn len(&self) -> usize {
        self.bytes.len().checked_div(self.width).unwrap_or(0)
    }

    /// True before the first hash is known.
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// The known hashes as a slice.
    pub fn as_slice(&self) -> HashSlice<'_> {
        if self.width == 0 {
            HashSlice::empty()
        } else {
            // Whole digests of one width by construction.
            HashSlice::new(&self.bytes, self.width).unwrap_or_else(|_| HashSlice::empty())
        }
    }

    /// Checks that `hashes`, starting at index `from` of the request's hashes,
    /// leave no gap after the `known` ones and have the width of the pool and of
    /// the known ones.
    pub fn check(
        known: Option<&Self>,
        pool: &BlockPool,
        from: usize,
        hashes: HashSlice<'_>,
    ) -> PoolResult<()> {
        if let Some(w) = pool.hash_width() {
            if !hashes.is_empty() && hashes.width() != w {
                return Err(PoolError::HashWidth {
                    expected: Some(w),
                    got: hashes.width(),
                });
            }
        }
        let len = known.map_or(0, Self::len);
        if from > len {
            return Err(PoolError::InvalidArgument(format!(
                "block hashes from index {from} leave a gap: the tables hold {len}"
            )));
        }
        if let Some(k) = known {
            if k.width != 0 && !hashes.is_empty() && hashes.width() != k.width {
                return Err(PoolError::HashWidth {
                    expected: Some(k.width),
                    got: hashes.width(),
                });
            }
        }
        Ok(())
    }

    /// The hashes known, back to back (each of [`Self::width`] bytes).
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// The last known hash.
    pub fn last(&self) -> Option<&[u8]> {
        let n = self.len();
        (n > 0).then(|| &self.bytes[(n - 1) * self.width..])
    }

    /// The width of the known hashes (0 before the first).
    pub fn width(&self) -> usize {
        self.width
    }

    /// Forgets the hashes from index `n` on: the request's hashes were rewritten
    /// there (vLLM's streaming sessions cut a request's hashes back and grow them
    /// again with other tokens), so they are learnt again.
    pub fn truncate(&mut self, n: usize) {
        self.bytes.truncate(n.saturating_mul(self.width));
    }

    /// How many hashes are known once `hashes`, from index `from`, are learnt.
    pub fn len_after(known: Option<&Self>, from: usize, hashes: HashSlice<'_>) -> usize {
        let len = known.map_or(0, Self::len);
        if hashes.is_empty() {
            len
        } else {
            len.max(from.saturating_add(hashes.len()))
        }
    }

    /// Appends the hashes past the known ones (`hashes` starts at index `from`,
    /// which [`Self::check`] has accepted).
    pub fn learn(&mut self, from: usize, hashes: HashSlice<'_>) {
        if hashes.is_empty() {
            return;
        }
        if self.width == 0 {
            self.width = hashes.width();
        }
        let skip = self.len() - from;
        if skip < hashes.len() {
            self.bytes
                .extend_from_slice(&hashes.as_bytes()[skip * self.width..]);
        }
    }
}

/// A call that caches blocks (with events on, so that `token_ids` feed the events)
/// has the tokens of every block it will cache: those full within `cached_to`
/// tokens, for each block size in `block_sizes`. Checked before anything changes.
pub fn check_event_tokens(
    pool: &BlockPool,
    token_ids: Option<&[i64]>,
    cached_to: usize,
    block_sizes: impl IntoIterator<Item = usize>,
) -> PoolResult<()> {
    let Some(tokens) = token_ids else {
        return Ok(());
    };
    if !pool.config().enable_caching || !pool.config().enable_events {
        return Ok(());
    }
    for bs in block_sizes {
        let need = cached_to / bs * bs;
        if tokens.len() < need {
            return Err(PoolError::InvalidArgument(format!(
                "{} token ids cannot fill the {} blocks of {bs} tokens this call caches",
                tokens.len(),
                cached_to / bs
            )));
        }
    }
    Ok(())
}

/// Tables that keep each request's known hashes (the callers' `block_hashes[n..]`
/// protocol), so that a binding can check them against the request's current ones.
pub trait KnowsHashes {
    /// The request's known hashes (none for an unknown request).
    fn known_hashes_of(&self, id: super::RequestKey<'_>) -> Option<&KnownHashes>;
    /// Forgets the request's known hashes from index `n` on.
    fn forget_known_hashes_from(&mut self, id: super::RequestKey<'_>, n: usize);
}
