//! The block-hash chain: `hash_i = H((parent, tuple(tokens_i), extra_keys_i))`.
//!
//! `parent` is the previous block's digest (a `bytes`), or `NONE_HASH` for the
//! first block. The 3-tuple is serialized straight from the token slice into one
//! reused buffer, so hashing a block allocates nothing.

use super::algo::{Digest, Encoding, HashAlgo};
use super::cbor;
use super::extra::{BlockExtraKeys, ExtraKeyInputs, MmCursor};
use super::pickle::PickleWriter;
use super::value::Value;

/// The seed vLLM derives `NONE_HASH` from when `PYTHONHASHSEED` is unset and
/// the hash is SHA-256 (`kv_cache_utils.DEFAULT_NONE_HASH_SEED`).
pub const DEFAULT_NONE_HASH_SEED: &str = "vllm-none-hash";

/// `NONE_HASH`, the parent of every request's first block: `H(seed)` with the
/// seed as a Python `str`.
///
/// vLLM uses `PYTHONHASHSEED` when set; otherwise [`DEFAULT_NONE_HASH_SEED`] for
/// the SHA-256 variants and a random per-process seed for the xxhash variants
/// (so their hashes only agree across processes that share `PYTHONHASHSEED`).
///
/// ```
/// use kvpool::pool::hashing::{none_hash, HashAlgo, DEFAULT_NONE_HASH_SEED};
/// let h = none_hash(HashAlgo::Sha256, DEFAULT_NONE_HASH_SEED);
/// assert_eq!(h.len(), 32);
/// assert_eq!(none_hash(HashAlgo::XxhashCbor, "0").len(), 16);
/// ```
pub fn none_hash(algo: HashAlgo, seed: &str) -> Digest {
    algo.hash_value(&Value::from(seed))
}

/// What follows the token tuple in the hashed 3-tuple.
#[derive(Clone, Copy)]
enum Extra<'e> {
    Value(Option<&'e Value>),
    Keys(&'e BlockExtraKeys<'e>),
}

/// Hashes blocks with one algorithm and a reused serialization buffer.
///
/// ```
/// use kvpool::pool::hashing::{none_hash, BlockHasher, HashAlgo, DEFAULT_NONE_HASH_SEED};
/// let mut hasher = BlockHasher::new(HashAlgo::Sha256Cbor);
/// let root = none_hash(HashAlgo::Sha256Cbor, DEFAULT_NONE_HASH_SEED);
/// let tokens: Vec<i64> = (0..32).collect();
/// let h0 = hasher.hash_block(&root, &tokens[..16], None);
/// let h1 = hasher.hash_block(&h0, &tokens[16..], None);
/// assert_ne!(h0, h1);
/// ```
#[derive(Clone, Debug)]
pub struct BlockHasher {
    algo: HashAlgo,
    buf: Vec<u8>,
}

impl BlockHasher {
    /// A hasher for `algo`.
    pub fn new(algo: HashAlgo) -> Self {
        Self {
            algo,
            buf: Vec::with_capacity(256),
        }
    }

    /// The algorithm.
    pub fn algo(&self) -> HashAlgo {
        self.algo
    }

    /// `H((parent, tuple(tokens), extra))`, with `None` for Python `None`.
    #[inline]
    pub fn hash_block(&mut self, parent: &[u8], tokens: &[i64], extra: Option<&Value>) -> Digest {
        self.encode(parent, tokens, Extra::Value(extra));
        self.algo.digest_bytes(&self.buf)
    }

    /// `H((parent, tuple(tokens), extra_keys))` with borrowed extra keys
    /// (empty keys hash as `None`); allocates nothing.
    #[inline]
    pub fn hash_block_keys(
        &mut self,
        parent: &[u8],
        tokens: &[i64],
        keys: &BlockExtraKeys<'_>,
    ) -> Digest {
        self.encode(parent, tokens, Extra::Keys(keys));
        self.algo.digest_bytes(&self.buf)
    }

    /// The serialized 3-tuple that [`Self::hash_block`] hashes (for debugging
    /// and cross-checks against Python).
    pub fn encode_block(&mut self, parent: &[u8], tokens: &[i64], extra: Option<&Value>) -> &[u8] {
        self.encode(parent, tokens, Extra::Value(extra));
        &self.buf
    }

    fn encode(&mut self, parent: &[u8], tokens: &[i64], extra: Extra<'_>) {
        let buf = &mut self.buf;
        buf.clear();
        match self.algo.encoding() {
            Encoding::Cbor => {
                buf.reserve(parent.len() + 9 * tokens.len() + 32);
                cbor::write_array_head(buf, 3);
                cbor::write_bytes(buf, parent);
                cbor::write_i64_array(buf, tokens);
                match extra {
                    Extra::Value(Some(v)) => cbor::encode_cbor(v, buf),
                    Extra::Value(None) => cbor::write_none(buf),
                    Extra::Keys(k) => k.write_cbor(buf),
                }
            }
            Encoding::Pickle => {
                buf.reserve(parent.len() + 11 * tokens.len() + 48);
                let mut w = PickleWriter::begin(buf);
                w.begin_tuple(3);
                w.save_bytes(parent);
                w.save_i64_tuple(tokens);
                match extra {
                    Extra::Value(Some(v)) => w.save(v),
                    Extra::Value(None) => w.save_none(),
                    Extra::Keys(k) => k.write_pickle(&mut w),
                }
                w.end_tuple(3);
                w.finish();
            }
        }
    }

    /// Hashes the full blocks `start_block..` of a request whose tokens so far
    /// are `tokens`, appending each digest to `out`; returns how many it hashed.
    ///
    /// `parent` is the digest of block `start_block - 1`, or `NONE_HASH` when
    /// `start_block` is 0. Extra keys come from `extra`, walking multimodal
    /// inputs as vLLM does when it starts (or resumes) hashing at `start_block`.
    /// A trailing partial block is not hashed; nor is any block lacking a
    /// prompt-embedding digest (see [`ExtraKeyInputs::hashable_blocks`]).
    ///
    /// # Panics
    /// If `block_size` is 0.
    pub fn extend_chain(
        &mut self,
        parent: &[u8],
        tokens: &[i64],
        block_size: usize,
        start_block: usize,
        extra: &ExtraKeyInputs<'_>,
        out: &mut Vec<u8>,
    ) -> usize {
        assert!(block_size > 0, "block_size must be positive");
        let end_block = extra.hashable_blocks(tokens.len() / block_size);
        if start_block >= end_block {
            return 0;
        }
        out.reserve((end_block - start_block) * self.algo.digest_len());
        let mut cursor = MmCursor::new(start_block);
        let mut prev: Option<Digest> = None;
        for (i, block) in tokens[start_block * block_size..end_block * block_size]
            .chunks_exact(block_size)
            .enumerate()
        {
            let keys = if extra.is_empty() {
                BlockExtraKeys::NONE
            } else {
                extra.block_keys(start_block + i, block_size, &mut cursor)
            };
            let p: &[u8] = prev.as_ref().map_or(parent, |d| d.as_bytes());
            let d = self.hash_block_keys(p, block, &keys);
            out.extend_from_slice(&d);
            prev = Some(d);
        }
        end_block - start_block
    }

    /// Like [`Self::extend_chain`], with arbitrary extra keys: `extra(i)` gives
    /// block `i`'s extra keys (`None` for Python `None`).
    ///
    /// # Panics
    /// If `block_size` is 0.
    pub fn extend_chain_with<'v>(
        &mut self,
        parent: &[u8],
        tokens: &[i64],
        block_size: usize,
        start_block: usize,
        mut extra: impl FnMut(usize) -> Option<&'v Value>,
        out: &mut Vec<u8>,
    ) -> usize {
        assert!(block_size > 0, "block_size must be positive");
        let end_block = tokens.len() / block_size;
        if start_block >= end_block {
            return 0;
        }
        out.reserve((end_block - start_block) * self.algo.digest_len());
        let mut prev: Option<Digest> = None;
        for (i, block) in tokens[start_block * block_size..end_block * block_size]
            .chunks_exact(block_size)
            .enumerate()
        {
            let p: &[u8] = prev.as_ref().map_or(parent, |d| d.as_bytes());
            let d = self.hash_block(p, block, extra(start_block + i));
            out.extend_from_slice(&d);
            prev = Some(d);
        }
        end_block - start_block
    }

    /// Brings a request's flat hash list up to date: hashes the full blocks of
    /// `tokens` not yet in `hashes` (a concatenation of digests), parenting the
    /// first on the last digest in `hashes`, or on `none_hash` when it is empty.
    /// Returns how many blocks it hashed. This is vLLM's `request_block_hasher`.
    ///
    /// ```
    /// use kvpool::pool::hashing::{none_hash, BlockHasher, ExtraKeyInputs, HashAlgo};
    /// let algo = HashAlgo::XxhashCbor;
    /// let root = none_hash(algo, "0");
    /// let mut hasher = BlockHasher::new(algo);
    /// let tokens: Vec<i64> = (0..40).collect();
    /// let mut hashes = Vec::new();
    /// assert_eq!(hasher.update_chain(&root, &tokens[..20], 16, &ExtraKeyInputs::default(), &mut hashes), 1);
    /// assert_eq!(hasher.update_chain(&root, &tokens, 16, &ExtraKeyInputs::default(), &mut hashes), 1);
    /// assert_eq!(hashes.len(), 2 * 16);
    /// ```
    ///
    /// # Panics
    /// If `block_size` is 0 or `hashes.len()` is not a multiple of the digest length.
    pub fn update_chain(
        &mut self,
        none_hash: &[u8],
        tokens: &[i64],
        block_size: usize,
        extra: &ExtraKeyInputs<'_>,
        hashes: &mut Vec<u8>,
    ) -> usize {
        let width = self.algo.digest_len();
        assert!(
            hashes.len() % width == 0,
            "hash list length {} is not a multiple of {width}",
            hashes.len()
        );
        let start_block = hashes.len() / width;
        let mut parent = [0u8; super::algo::MAX_DIGEST_LEN];
        let parent: &[u8] = if start_block == 0 {
            none_hash
        } else {
            parent[..width].copy_from_slice(&hashes[hashes.len() - width..]);
            &parent[..width]
        };
        self.extend_chain(parent, tokens, block_size, start_block, extra, hashes)
    }
}

/// Hashes every full block of a request from scratch, appending the digests to
/// `out` (`digest_len` bytes each); returns the number of blocks.
///
/// A one-shot wrapper over [`BlockHasher::extend_chain`]; keep a [`BlockHasher`]
/// to reuse its buffer across requests.
///
/// ```
/// use kvpool::pool::hashing::{hash_request_blocks, none_hash, ExtraKeyInputs, HashAlgo, DEFAULT_NONE_HASH_SEED};
/// let root = none_hash(HashAlgo::Sha256, DEFAULT_NONE_HASH_SEED);
/// let tokens: Vec<i64> = (0..50).collect();
/// let mut out = Vec::new();
/// let n = hash_request_blocks(HashAlgo::Sha256, &root, &tokens, 16, &ExtraKeyInputs::default(), &mut out);
/// assert_eq!((n, out.len()), (3, 3 * 32));
/// ```
pub fn hash_request_blocks(
    algo: HashAlgo,
    none_hash: &[u8],
    tokens: &[i64],
    block_size: usize,
    extra: &ExtraKeyInputs<'_>,
    out: &mut Vec<u8>,
) -> usize {
    BlockHasher::new(algo).extend_chain(none_hash, tokens, block_size, 0, extra, out)
}

#[cfg(test)]
mod tests {
    use super::super::vectors::{block_vectors, chain_vectors, hex, none_hash_vectors};
    use super::*;

    #[test]
    fn none_hash_matches_python() {
        for (algo, seed, expected) in none_hash_vectors() {
            assert_eq!(hex(&none_hash(algo, seed)), expected, "{algo} {seed:?}");
        }
    }

    #[test]
    fn single_blocks_match_python() {
        let vectors = block_vectors();
        assert!(vectors.len() >= 80);
        for v in vectors {
            let extra = v.extra.as_ref();
            let mut hasher = BlockHasher::new(v.algo);
            let root = none_hash(v.algo, v.seed);
            assert_eq!(
                hex(&hasher.hash_block(&root, &v.tokens, extra)),
                v.digest,
                "{}",
                v.name
            );
            // The Value path and the general encoder agree on the whole 3-tuple.
            let whole = Value::tuple([
                Value::bytes(&root),
                Value::tuple(v.tokens.iter().map(|&t| Value::from(t))),
                extra.cloned().unwrap_or(Value::None),
            ]);
            let mut expected = Vec::new();
            v.algo.encode(&whole, &mut expected);
            assert_eq!(
                hasher.encode_block(&root, &v.tokens, extra),
                &expected[..],
                "{}",
                v.name
            );
        }
    }

    #[test]
    fn chains_match_python() {
        let vectors = chain_vectors();
        assert!(vectors.len() >= 15);
        for v in vectors {
            let inputs = ExtraKeyInputs {
                lora_name: v.lora_name,
                mm_features: &v.mm_features,
                cache_salt: v.cache_salt,
                prompt_embed_digests: v.prompt_embeds.as_deref(),
            };
            for (algo, seed, expected) in &v.expected {
                let root = none_hash(*algo, seed);
                let mut hasher = BlockHasher::new(*algo);
                let mut hashes = Vec::new();
                // Hash as vLLM did: one hasher call per step, resuming the chain.
                for &n in &v.steps {
                    hasher.update_chain(&root, &v.tokens[..n], v.block_size, &inputs, &mut hashes);
                }
                assert_eq!(hex(&hashes), *expected, "{} {algo}", v.name);
            }
        }
    }

    #[test]
    fn keys_path_equals_value_path() {
        let f = [
            MmFeature::new("img-0", 3, 40),
            MmFeature::new("img-1", 44, 2),
        ];
        let d: Vec<[u8; 32]> = (0..4u8).map(|i| [i; 32]).collect();
        let inputs = ExtraKeyInputs {
            lora_name: Some("lora"),
            mm_features: &f,
            cache_salt: Some("salt"),
            prompt_embed_digests: Some(&d),
        };
        let tokens: Vec<i64> = (0..64).map(|i| i * 1_000_003).collect();
        for algo in HashAlgo::ALL {
            let root = none_hash(algo, "x");
            let mut fast = Vec::new();
            assert_eq!(
                hash_request_blocks(algo, &root, &tokens, 16, &inputs, &mut fast),
                4
            );
            let mut cursor = MmCursor::new(0);
            let values: Vec<Option<Value>> = (0..4)
                .map(|b| inputs.block_keys(b, 16, &mut cursor).to_value())
                .collect();
            let mut slow = Vec::new();
            BlockHasher::new(algo).extend_chain_with(
                &root,
                &tokens,
                16,
                0,
                |b| values[b].as_ref(),
                &mut slow,
            );
            assert_eq!(fast, slow, "{algo}");
        }
    }

    #[test]
    fn extending_equals_hashing_at_once_without_mm() {
        let inputs = ExtraKeyInputs {
            lora_name: Some("l"),
            cache_salt: Some("s"),
            ..Default::default()
        };
        let tokens: Vec<i64> = (0..100).collect();
        for algo in HashAlgo::ALL {
            let root = none_hash(algo, DEFAULT_NONE_HASH_SEED);
            let mut once = Vec::new();
            hash_request_blocks(algo, &root, &tokens, 8, &inputs, &mut once);
            let mut hasher = BlockHasher::new(algo);
            let mut stepwise = Vec::new();
            for n in [0, 7, 8, 9, 30, 64, 100] {
                hasher.update_chain(&root, &tokens[..n], 8, &inputs, &mut stepwise);
            }
            assert_eq!(once, stepwise, "{algo}");
            assert_eq!(once.len(), 12 * algo.digest_len());
        }
    }

    #[test]
    fn missing_embed_digests_stop_the_chain() {
        let d = [[1u8; 32]; 2];
        let inputs = ExtraKeyInputs {
            prompt_embed_digests: Some(&d),
            ..Default::default()
        };
        let mut out = Vec::new();
        assert_eq!(
            hash_request_blocks(HashAlgo::Sha256, b"r", &[0; 64], 16, &inputs, &mut out),
            2
        );
    }

    #[test]
    fn large_blocks_cross_pickle_frames() {
        // A 40_000-token block pickles to more than 64 KiB: the frame splits
        // after a token, exactly as in the general encoder.
        let tokens: Vec<i64> = (0..40_000).map(|i| i * 7919).collect();
        let mut hasher = BlockHasher::new(HashAlgo::Sha256);
        let whole = Value::tuple([
            Value::bytes(b"p"),
            Value::tuple(tokens.iter().map(|&t| Value::from(t))),
            Value::None,
        ]);
        let mut expected = Vec::new();
        super::super::encode_pickle(&whole, &mut expected);
        assert_eq!(hasher.encode_block(b"p", &tokens, None), &expected[..]);
    }

    proptest::proptest! {
        #[test]
        fn borrowed_keys_encode_like_their_value(
            parent in proptest::collection::vec(proptest::num::u8::ANY, 0..40),
            tokens in proptest::collection::vec(proptest::num::i64::ANY, 0..40),
            lora in proptest::option::of("[a-z\u{e9}\u{20ac}]{0,8}"),
            salt in proptest::option::of("[a-z]{0,8}"),
            feats in proptest::collection::vec((0usize..64, 0usize..20), 0..4),
            embeds in proptest::bool::ANY,
            block_index in 0usize..4,
        ) {
            let mut feats = feats;
            feats.sort();
            let mm: Vec<MmFeature> = feats.iter().enumerate().map(|(k, &(o, l))| MmFeature::new(format!("f{k}"), o, l)).collect();
            let d: Vec<[u8; 32]> = (0..4u8).map(|k| [k; 32]).collect();
            let inputs = ExtraKeyInputs {
                lora_name: lora.as_deref(),
                mm_features: &mm,
                cache_salt: salt.as_deref(),
                prompt_embed_digests: if embeds { Some(&d) } else { None },
            };
            let keys = inputs.block_keys(block_index, 16, &mut MmCursor::new(0));
            let value = keys.to_value();
            for algo in HashAlgo::ALL {
                let mut h = BlockHasher::new(algo);
                let fast = h.hash_block_keys(&parent, &tokens, &keys);
                proptest::prop_assert_eq!(fast, h.hash_block(&parent, &tokens, value.as_ref()));
            }
        }
    }

    /// Release-mode timing of the hot path: `cargo test --release -- --ignored --nocapture timing`.
    #[test]
    #[ignore]
    fn timing_1200_tokens() {
        use std::hint::black_box;
        use std::time::Instant;
        let tokens: Vec<i64> = (0..1200).map(|k| (k * 7919) % 152_000).collect();
        let none = ExtraKeyInputs::default();
        let mm = [MmFeature::new("0123456789abcdef0123456789abcdef", 100, 576)];
        let lora = ExtraKeyInputs {
            lora_name: Some("my-lora-adapter"),
            mm_features: &mm,
            cache_salt: Some("tenant"),
            ..Default::default()
        };
        for algo in HashAlgo::ALL {
            for (label, extra) in [("plain", &none), ("lora+mm+salt", &lora)] {
                let root = none_hash(algo, DEFAULT_NONE_HASH_SEED);
                let mut hasher = BlockHasher::new(algo);
                let mut out = Vec::with_capacity(75 * 32);
                let iters = 20_000;
                let mut best = f64::MAX;
                for _ in 0..5 {
                    let t0 = Instant::now();
                    for _ in 0..iters {
                        out.clear();
                        black_box(hasher.extend_chain(
                            &root,
                            black_box(&tokens),
                            16,
                            0,
                            extra,
                            &mut out,
                        ));
                    }
                    best = best.min(t0.elapsed().as_secs_f64() / iters as f64 * 1e6);
                }
                println!(
                    "{algo:<12} {label:<13} 1200 tokens / 75 blocks: {best:7.2} us per request"
                );
            }
        }
    }

    #[test]
    #[should_panic(expected = "block_size")]
    fn zero_block_size_panics() {
        hash_request_blocks(
            HashAlgo::Sha256,
            b"r",
            &[1, 2],
            0,
            &ExtraKeyInputs::default(),
            &mut Vec::new(),
        );
    }

    use super::super::extra::MmFeature;
}
