//! The prefix map's table hash: keyed, with full avalanche over every byte of a key.
//!
//! Block hashes are usually digests, but callers also pass structured ids: integers
//! in 8-, 16- or 32-byte keys, big- or little-endian, sequential or strided. A table
//! hash that only carries bits upward (one multiply) leaves such keys with the same
//! low bits, hashbrown picks buckets from the low bits, and every operation walks one
//! long probe sequence. This hash folds each 64x64 -> 128-bit product back onto
//! itself (the top half carries what the bottom half lost), and its multipliers
//! are per-process random, so keys cannot be crafted to collide without knowing them.
//! Nothing observable depends on the table's order, so the randomness is invisible.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::sync::OnceLock;

use super::hash_key::BlockHashKey;

/// `a * b` as 128 bits, the two halves xored together.
#[inline(always)]
fn folded_multiply(a: u64, b: u64) -> u64 {
    let full = u128::from(a) * u128::from(b);
    (full as u64) ^ ((full >> 64) as u64)
}

/// Constants from the digits of pi, mixed into the seeds so no seed word is zero-ish.
const PI: [u64; 6] = [
    0x243F_6A88_85A3_08D3,
    0x1319_8A2E_0370_7344,
    0xA409_3822_299F_31D0,
    0x082E_FA98_EC4E_6C89,
    0x4528_21E6_38D0_1377,
    0xBE54_66CF_34E9_0C6C,
];

/// A keyed hash of [`BlockHashKey`]s for the prefix map's table.
///
/// ```
/// use kvpool::pool::{BlockHash, BlockHashKey, KeyHasher};
/// let h = KeyHasher::with_seed(7);
/// let a = BlockHashKey::new(BlockHash::new(&1u64.to_be_bytes()).unwrap(), 0);
/// let b = BlockHashKey::new(BlockHash::new(&2u64.to_be_bytes()).unwrap(), 0);
/// assert_ne!(h.hash(&a) & 0xFFFF, h.hash(&b) & 0xFFFF);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KeyHasher {
    seeds: [u64; 6],
}

impl KeyHasher {
    /// The process's hasher: seeded once from the OS's randomness (through std's
    /// `RandomState`), the same for every pool of the process.
    pub fn process() -> Self {
        static PROCESS: OnceLock<KeyHasher> = OnceLock::new();
        *PROCESS.get_or_init(|| {
            let state = RandomState::new();
            let mut h = state.build_hasher();
            h.write_u64(0x6b76_706f_6f6c); // "kvpool"
            Self::with_seed(h.finish())
        })
    }

    /// A hasher with fixed seeds derived from `seed` (for tests and reproducible runs).
    pub fn with_seed(seed: u64) -> Self {
        let mut seeds = [0u64; 6];
        let mut s = seed;
        for (out, pi) in seeds.iter_mut().zip(PI) {
            // splitmix64: distinct, well-mixed words from one seed.
            s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = s;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            *out = (z ^ (z >> 31)) ^ pi;
        }
        Self { seeds }
    }

    /// The 64-bit table hash of `key`: all 32 hash bytes, the width and the group.
    #[inline]
    pub fn hash(&self, key: &BlockHashKey) -> u64 {
        let [w0, w1, w2, w3] = key.hash.words();
        let s = &self.seeds;
        let tail = (key.hash.width() as u64) << 32 | u64::from(key.group);
        let a = folded_multiply(w0 ^ s[0], w1 ^ s[1]);
        let b = folded_multiply(w2 ^ s[2], w3 ^ s[3]);
        folded_multiply(a ^ tail ^ s[4], b ^ s[5])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool::hash_key::BlockHash;

    /// `n` keys of `width` bytes holding `first + i * stride`, big- or little-endian,
    /// right-aligned (big-endian) or left-aligned (little-endian) as callers write them.
    fn int_keys(
        n: u64,
        first: u64,
        stride: u64,
        width: usize,
        big_endian: bool,
    ) -> Vec<BlockHashKey> {
        (0..n)
            .map(|i| {
                let v = first.wrapping_add(i.wrapping_mul(stride));
                let mut bytes = vec![0u8; width];
                if big_endian {
                    bytes[width - 8..].copy_from_slice(&v.to_be_bytes());
                } else {
                    bytes[..8].copy_from_slice(&v.to_le_bytes());
                }
                BlockHashKey::new(BlockHash::new(&bytes).unwrap(), 0)
            })
            .collect()
    }

    /// Fails unless `keys` spread over 2^16 buckets (the low bits) and over the 128
    /// tags (the top 7 bits) about as uniformly random keys would.
    fn assert_spread(hasher: &KeyHasher, keys: &[BlockHashKey], what: &str) {
        const BUCKETS: usize = 1 << 16;
        let mut buckets = vec![0u32; BUCKETS];
        let mut tags = [0u32; 128];
        for k in keys {
            let h = hasher.hash(k);
            buckets[(h as usize) & (BUCKETS - 1)] += 1;
            tags[(h >> 57) as usize] += 1;
        }
        // 65,536 random keys in 65,536 buckets: about 63% of the buckets are used and
        // the fullest holds about 8. A one-multiply hash of these keys fills 1 bucket.
        let used = buckets.iter().filter(|&&c| c > 0).count();
        let fullest = *buckets.iter().max().unwrap();
        assert!(
            used > BUCKETS * 55 / 100,
            "{what}: only {used} of {BUCKETS} buckets used"
        );
        assert!(fullest <= 16, "{what}: a bucket holds {fullest} keys");
        let expected = keys.len() as f64 / 128.0;
        for (tag, &c) in tags.iter().enumerate() {
            let dev = (c as f64 - expected).abs() / expected;
            assert!(
                dev < 0.25,
                "{what}: tag {tag} holds {c} keys, expected about {expected}"
            );
        }
    }

    #[test]
    fn structured_integer_keys_spread_over_buckets_and_tags() {
        for seed in [0, 1, 0xDEAD_BEEF] {
            let hasher = KeyHasher::with_seed(seed);
            for width in [8, 16, 32] {
                for big_endian in [true, false] {
                    for (first, stride) in [(0, 1), (1 << 40, 1), (0, 64), (0, 1 << 32), (7, 4096)]
                    {
                        let keys = int_keys(1 << 16, first, stride, width, big_endian);
                        let what = format!(
                            "seed {seed}, {width}-byte {} keys from {first} by {stride}",
                            if big_endian {
                                "big-endian"
                            } else {
                                "little-endian"
                            }
                        );
                        assert_spread(&hasher, &keys, &what);
                    }
                }
            }
        }
    }

    #[test]
    fn width_and_group_change_the_hash() {
        let h = KeyHasher::with_seed(3);
        let a = BlockHashKey::new(BlockHash::new(b"abcd").unwrap(), 0);
        let b = BlockHashKey::new(BlockHash::new(b"abcd").unwrap(), 1);
        let c = BlockHashKey::new(BlockHash::new(b"abcd\0").unwrap(), 0);
        assert_ne!(h.hash(&a), h.hash(&b));
        assert_ne!(h.hash(&a), h.hash(&c));
    }

    #[test]
    fn seeds_differ_and_the_process_hasher_is_stable() {
        assert_ne!(KeyHasher::with_seed(1), KeyHasher::with_seed(2));
        assert_eq!(KeyHasher::with_seed(1), KeyHasher::with_seed(1));
        assert_eq!(KeyHasher::process(), KeyHasher::process());
    }
}
