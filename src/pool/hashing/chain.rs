//! The block-hash chain: `hash_i = H((parent, tuple(tokens_i), extra_keys_i))`.
//!
//! `parent` is the previous block's digest (a `bytes`), or `NONE_HASH` for the
//! first block. The 3-tuple is serialized straight from the token slice into one
//! reused buffer, so hashing a block allocates nothing.

use super::algo::{Digest, Encoding, HashAlgo};
use super::cbor;
use super::extra::{BlockExtraKeys, ExtraKeyInputs, MmCursor};
use super::pickle::PickleWriter;
use super::plain::{self, TokenSource};
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
    /// The short path's two alternating buffers ([`plain::hash_chain`]).
    plain_bufs: [Vec<u8>; 2],
}

impl BlockHasher {
    /// A hasher for `algo`.
    pub fn new(algo: HashAlgo) -> Self {
        Self {
            algo,
            buf: Vec::with_capacity(256),
            plain_bufs: [Vec::new(), Vec::new()],
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
    /// inputs as vLLM does when it starts (or resumes) hashing at `start_block`
    /// (see [`super::MmCursor`]). A trailing partial block is not hashed; nor is
    /// any block lacking a prompt-embedding digest (see
    /// [`ExtraKeyInputs::hashable_blocks`]): the chain ends before it.
    ///
    /// A `block_size` of 0 hashes nothing (returns 0); no input panics.
    pub fn extend_chain(
        &mut self,
        parent: &[u8],
        tokens: &[i64],
        block_size: usize,
        start_block: usize,
        extra: &ExtraKeyInputs<'_>,
        out: &mut Vec<u8>,
    ) -> usize {
        self.extend_chain_from(
            parent,
            &mut &tokens[..],
            block_size,
            start_block,
            extra,
            out,
        )
    }

    /// [`Self::extend_chain`] with the tokens read from `source`, one block at a
    /// time: a source that decodes them (a Python list) reads only the blocks hashed.
    /// Stops before the first block `source` cannot give.
    ///
    /// Blocks without extra keys take the short path (`hashing/plain.rs`): a request
    /// without any, block after block; one with some (a cache salt on its first
    /// block, images in a few), on each block that has none.
    pub fn extend_chain_from<S: TokenSource + ?Sized>(
        &mut self,
        parent: &[u8],
        source: &mut S,
        block_size: usize,
        start_block: usize,
        extra: &ExtraKeyInputs<'_>,
        out: &mut Vec<u8>,
    ) -> usize {
        let mut walk = None;
        self.continue_chain_from(
            parent,
            source,
            block_size,
            start_block,
            extra,
            &mut walk,
            out,
        )
    }

    /// [`Self::extend_chain_from`] as one part of a longer walk: `walk` is where the
    /// multimodal cursor stood when a call before this one, for the same request,
    /// stopped before `start_block` (`None`: the walk starts here, as vLLM sets it up
    /// when it resumes a request), and is left where this call stops. Two calls so
    /// chained (the first stopping at a block its source could not give, the second
    /// given the rest) hash exactly what one call would have: a walk resumed afresh
    /// can differ, as vLLM's own does, for inputs that nest or have no tokens.
    #[allow(clippy::too_many_arguments)]
    pub fn continue_chain_from<S: TokenSource + ?Sized>(
        &mut self,
        parent: &[u8],
        source: &mut S,
        block_size: usize,
        start_block: usize,
        extra: &ExtraKeyInputs<'_>,
        walk: &mut Option<MmCursor>,
        out: &mut Vec<u8>,
    ) -> usize {
        if block_size == 0 {
            return 0;
        }
        let end_block = extra.hashable_blocks(source.len() / block_size);
        if start_block >= end_block {
            return 0;
        }
        let width = self.algo.digest_len();
        out.reserve((end_block - start_block) * width);
        let plain = extra.is_empty();
        let mut hashed = 0;
        if plain {
            // The short path, up to the first block it cannot take (if any).
            hashed = self.extend_plain_chain(parent, source, block_size, start_block, out);
        }
        let first = start_block + hashed;
        let mut cursor = walk.unwrap_or_else(|| extra.mm_cursor(first, block_size));
        for block_index in first..end_block {
            // The walk advances on a copy, kept once the block is hashed: a block not
            // hashed leaves it where a call continuing this one must start.
            let mut next = cursor;
            let keys = if plain {
                BlockExtraKeys::NONE
            } else {
                match extra.block_keys(block_index, block_size, &mut next) {
                    Some(keys) => keys,
                    None => break, // no digest (not reached: end_block stops first)
                }
            };
            let last = (hashed > 0).then(|| Digest::from_bytes(&out[out.len() - width..]));
            let p: &[u8] = last.as_ref().map_or(parent, |d| d.as_bytes());
            if keys.is_empty() {
                let one = block_index..block_index + 1;
                let bufs = &mut self.plain_bufs;
                if plain::hash_chain(self.algo, p, source, block_size, one, bufs, out) == 1 {
                    hashed += 1;
                    cursor = next;
                    continue;
                }
            }
            let Some(tokens) = source.tokens(block_index * block_size, block_size) else {
                break;
            };
            let d = self.hash_block_keys(p, tokens, &keys);
            out.extend_from_slice(&d);
            hashed += 1;
            cursor = next;
        }
        *walk = Some(cursor);
        hashed
    }

    /// Hashes blocks `start_block..` of a request without extra keys, reading its
    /// tokens from `source`, on the short path (no extra keys, tokens in the 32-bit
    /// range): appends each digest to `out` and stops before the first block that
    /// is not full, not plain or not given by `source`. Returns how many it hashed;
    /// [`Self::extend_chain`] continues from there.
    ///
    /// `parent` is the digest of block `start_block - 1`, or `NONE_HASH`.
    ///
    /// ```
    /// use kvpool::pool::hashing::{none_hash, BlockHasher, HashAlgo, DEFAULT_NONE_HASH_SEED};
    /// let root = none_hash(HashAlgo::Sha256, DEFAULT_NONE_HASH_SEED);
    /// let tokens: Vec<i64> = (0..40).collect();
    /// let mut out = Vec::new();
    /// let n = BlockHasher::new(HashAlgo::Sha256).extend_plain_chain(&root, &mut &tokens[..], 16, 0, &mut out);
    /// assert_eq!((n, out.len()), (2, 2 * 32));
    /// ```
    pub fn extend_plain_chain<S: TokenSource + ?Sized>(
        &mut self,
        parent: &[u8],
        source: &mut S,
        block_size: usize,
        start_block: usize,
        out: &mut Vec<u8>,
    ) -> usize {
        if block_size == 0 {
            return 0;
        }
        let blocks = start_block..source.len() / block_size;
        plain::hash_chain(
            self.algo,
            parent,
            source,
            block_size,
            blocks,
            &mut self.plain_bufs,
            out,
        )
    }

    /// Like [`Self::extend_chain`], with arbitrary extra keys: `extra(i)` gives
    /// block `i`'s extra keys (`None` for Python `None`), pickled as distinct
    /// objects (see [`super::encode_pickle`]).
    ///
    /// A `block_size` of 0 hashes nothing (returns 0).
    pub fn extend_chain_with<'v>(
        &mut self,
        parent: &[u8],
        tokens: &[i64],
        block_size: usize,
        start_block: usize,
        mut extra: impl FnMut(usize) -> Option<&'v Value>,
        out: &mut Vec<u8>,
    ) -> usize {
        if block_size == 0 {
            return 0;
        }
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
    /// Hashes nothing (returns 0) when `block_size` is 0 or when `hashes.len()`
    /// is not a multiple of the digest length (a list this hasher did not write).
    pub fn update_chain(
        &mut self,
        none_hash: &[u8],
        tokens: &[i64],
        block_size: usize,
        extra: &ExtraKeyInputs<'_>,
        hashes: &mut Vec<u8>,
    ) -> usize {
        let width = self.algo.digest_len();
        if hashes.len() % width != 0 {
            return 0;
        }
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
    use super::super::extra::MmFeature;
    use super::super::pickle::encode_pickle_interned;
    use super::super::vectors::{block_vectors, chain_vectors, hex, none_hash_vectors};
    use super::*;

    /// vLLM's tag literals: one shared object each in a pickled block.
    const TAGS: [&str; 4] = ["lora", "mm", "cache_salt", "prompt_embeds"];

    /// Reference hash of one block, built from [`BlockExtraKeys::to_value`] with
    /// the general encoders (tags shared, all else distinct, as in vLLM).
    fn reference_hash(
        algo: HashAlgo,
        parent: &[u8],
        tokens: &[i64],
        keys: &BlockExtraKeys<'_>,
    ) -> Digest {
        let whole = Value::tuple([
            Value::bytes(parent),
            Value::tuple(tokens.iter().map(|&t| Value::from(t))),
            keys.to_value().unwrap_or(Value::None),
        ]);
        let mut buf = Vec::new();
        match algo.encoding() {
            Encoding::Pickle => encode_pickle_interned(&whole, &TAGS, &mut buf),
            Encoding::Cbor => cbor::encode_cbor(&whole, &mut buf),
        }
        algo.digest_bytes(&buf)
    }

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

    fn inputs_of(v: &super::super::vectors::ChainVector) -> ExtraKeyInputs<'_> {
        ExtraKeyInputs {
            lora: v.lora,
            mm_features: &v.mm_features,
            cache_salt: v.cache_salt,
            prompt_embed_digests: v.prompt_embeds.as_deref(),
            objects: None,
        }
    }

    #[test]
    fn chains_match_python() {
        let vectors = chain_vectors();
        assert!(vectors.len() >= 30);
        for v in &vectors {
            let inputs = inputs_of(v);
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
    fn chain_pickles_match_python() {
        // Byte for byte, every block vLLM hashed, including the BINGETs of
        // repeated "mm" tags.
        let mut blocks = 0;
        for v in chain_vectors().iter().filter(|v| !v.pickles.is_empty()) {
            let inputs = inputs_of(v);
            let algo = HashAlgo::Sha256;
            let mut hasher = BlockHasher::new(algo);
            let mut expected = v.pickles.iter();
            let mut parent = none_hash(algo, DEFAULT_NONE_HASH_SEED);
            let mut next_block = 0;
            for &n in &v.steps {
                let bs = v.block_size;
                let mut cursor = inputs.mm_cursor(next_block, bs);
                while (next_block + 1) * bs <= n {
                    let keys = inputs
                        .block_keys(next_block, bs, &mut cursor)
                        .expect("digest");
                    let tokens = &v.tokens[next_block * bs..(next_block + 1) * bs];
                    hasher.encode(&parent, tokens, Extra::Keys(&keys));
                    let want = expected.next().expect("a pickle per block");
                    assert_eq!(hex(&hasher.buf), *want, "{} block {next_block}", v.name);
                    parent = algo.digest_bytes(&hasher.buf);
                    next_block += 1;
                    blocks += 1;
                }
            }
            assert!(expected.next().is_none(), "{}", v.name);
        }
        assert!(blocks >= 100);
    }

    #[test]
    fn keys_path_equals_reference_path() {
        let f = [
            MmFeature::new("img-0", 3, 40),
            MmFeature::new("img-1", 44, 2),
            MmFeature::new("img-2", 46, 1),
        ];
        let d: Vec<[u8; 32]> = (0..4u8).map(|i| [i; 32]).collect();
        let inputs = ExtraKeyInputs {
            lora: Some(("my-lora", "/adapters/my-lora")),
            mm_features: &f,
            cache_salt: Some("salt"),
            prompt_embed_digests: Some(&d),
            objects: None,
        };
        let tokens: Vec<i64> = (0..64).map(|i| i * 1_000_003).collect();
        for algo in HashAlgo::ALL {
            let root = none_hash(algo, "x");
            let mut fast = Vec::new();
            assert_eq!(
                hash_request_blocks(algo, &root, &tokens, 16, &inputs, &mut fast),
                4
            );
            let mut cursor = inputs.mm_cursor(0, 16);
            let mut slow = Vec::new();
            let mut values = Vec::new();
            for (b, block) in tokens.chunks_exact(16).enumerate() {
                let keys = inputs.block_keys(b, 16, &mut cursor).unwrap();
                let parent = if b == 0 {
                    root.to_vec()
                } else {
                    slow[slow.len() - algo.digest_len()..].to_vec()
                };
                slow.extend_from_slice(&reference_hash(algo, &parent, block, &keys));
                values.push(keys.to_value());
            }
            assert_eq!(fast, slow, "{algo}");
            // Block 2 holds three "mm" tags, one object.
            assert_eq!(
                values[2]
                    .as_ref()
                    .map(|v| matches!(v, Value::Tuple(t) if t.len() == 5)),
                Some(true)
            );
            let mut via_value = Vec::new();
            BlockHasher::new(algo).extend_chain_with(
                &root,
                &tokens,
                16,
                0,
                |b| values[b].as_ref(),
                &mut via_value,
            );
            // The value carries the tags' identity, so every algorithm agrees.
            assert_eq!(via_value, fast, "{algo}");
        }
    }

    #[test]
    fn extending_equals_hashing_at_once_for_sorted_inputs() {
        let f = [
            MmFeature::new("a", 3, 20),
            MmFeature::new("b", 23, 2),
            MmFeature::new("c", 40, 33),
        ];
        let inputs = ExtraKeyInputs {
            lora: Some(("l", "/l")),
            mm_features: &f,
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
            for n in [0, 7, 8, 9, 30, 41, 64, 100] {
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
        assert_eq!(out.len(), 2 * 32);
        // Resuming past the digests hashes nothing.
        let mut hasher = BlockHasher::new(HashAlgo::Sha256);
        assert_eq!(
            hasher.update_chain(b"r", &[0; 64], 16, &inputs, &mut out),
            0
        );
        assert_eq!(
            hasher.extend_chain(b"r", &[0; 64], 16, 3, &inputs, &mut out),
            0
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

    #[test]
    fn large_blocks_with_repeated_tags_cross_pickle_frames() {
        // 20_000 multimodal inputs of one token each in one block: the "mm"
        // BINGETs straddle frame boundaries.
        let f: Vec<MmFeature> = (0..20_000)
            .map(|k| MmFeature::new(format!("{k:06}"), k, 1))
            .collect();
        let inputs = ExtraKeyInputs {
            mm_features: &f,
            ..Default::default()
        };
        let tokens: Vec<i64> = (0..20_000).collect();
        let keys = inputs
            .block_keys(0, 20_000, &mut inputs.mm_cursor(0, 20_000))
            .unwrap();
        assert_eq!(keys.len(), 20_000);
        let mut hasher = BlockHasher::new(HashAlgo::Sha256);
        let fast = hasher.hash_block_keys(b"p", &tokens, &keys);
        assert_eq!(fast, reference_hash(HashAlgo::Sha256, b"p", &tokens, &keys));
    }

    proptest::proptest! {
        #[test]
        fn borrowed_keys_encode_like_the_reference(
            parent in proptest::collection::vec(proptest::num::u8::ANY, 0..40),
            tokens in proptest::collection::vec(proptest::num::i64::ANY, 1..40),
            // Upper case: never equal to a tag, so never shared with one.
            lora in proptest::option::of(("[A-Z\u{e9}\u{20ac}]{0,8}", "[A-Z/]{0,8}")),
            salt in proptest::option::of("[A-Z]{0,8}"),
            feats in proptest::collection::vec((0usize..64, 0usize..20), 0..6),
            embeds in proptest::bool::ANY,
            start_block in 0usize..4,
            block_size in 1usize..20,
        ) {
            let mut feats = feats;
            feats.sort();
            let mm: Vec<MmFeature> = feats.iter().enumerate().map(|(k, &(o, l))| MmFeature::new(format!("f{k}"), o, l)).collect();
            let d: Vec<[u8; 32]> = (0..8u8).map(|k| [k; 32]).collect();
            let inputs = ExtraKeyInputs {
                lora: lora.as_ref().map(|(n, p)| (n.as_str(), p.as_str())),
                mm_features: &mm,
                cache_salt: salt.as_deref(),
                prompt_embed_digests: if embeds { Some(&d) } else { None },
                objects: None,
            };
            let mut cursor = inputs.mm_cursor(start_block, block_size);
            for block_index in start_block..start_block + 4 {
                let keys = inputs.block_keys(block_index, block_size, &mut cursor).unwrap();
                for algo in HashAlgo::ALL {
                    let mut h = BlockHasher::new(algo);
                    let fast = h.hash_block_keys(&parent, &tokens, &keys);
                    proptest::prop_assert_eq!(fast, reference_hash(algo, &parent, &tokens, &keys));
                }
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
            lora: Some(("my-lora-adapter", "/adapters/my-lora-adapter")),
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
    fn zero_block_size_hashes_nothing() {
        let mut out = Vec::new();
        let extra = ExtraKeyInputs::default();
        assert_eq!(
            hash_request_blocks(HashAlgo::Sha256, b"r", &[1, 2], 0, &extra, &mut out),
            0
        );
        let mut hasher = BlockHasher::new(HashAlgo::Sha256);
        assert_eq!(
            hasher.extend_chain(b"r", &[1, 2], 0, 5, &extra, &mut out),
            0
        );
        assert_eq!(hasher.update_chain(b"r", &[1, 2], 0, &extra, &mut out), 0);
        assert_eq!(
            hasher.extend_chain_with(b"r", &[1, 2], 0, 0, |_| None, &mut out),
            0
        );
        assert!(out.is_empty());
    }

    #[test]
    fn ragged_hash_list_hashes_nothing() {
        let mut hashes = vec![0u8; 33];
        let mut hasher = BlockHasher::new(HashAlgo::Sha256);
        let extra = ExtraKeyInputs::default();
        assert_eq!(
            hasher.update_chain(b"r", &[1; 64], 16, &extra, &mut hashes),
            0
        );
        assert_eq!(hashes.len(), 33);
    }

    #[test]
    fn start_block_past_the_end_hashes_nothing() {
        let mut out = Vec::new();
        let mut hasher = BlockHasher::new(HashAlgo::XxhashCbor);
        let extra = ExtraKeyInputs::default();
        assert_eq!(
            hasher.extend_chain(b"r", &[1; 64], 16, usize::MAX, &extra, &mut out),
            0
        );
        assert_eq!(
            hasher.extend_chain(b"r", &[1; 64], usize::MAX, 0, &extra, &mut out),
            0
        );
        assert!(out.is_empty());
    }

    /// A source that cannot give one block (as a Python list holding an int it cannot
    /// read in place), so that its caller stops there and goes on with another.
    struct RefusesBlock<'a> {
        tokens: &'a [i64],
        refused: std::ops::Range<usize>,
    }

    impl TokenSource for RefusesBlock<'_> {
        fn len(&self) -> usize {
            self.tokens.len()
        }

        fn tokens(&mut self, start: usize, n: usize) -> Option<&[i64]> {
            let wanted = start..start + n;
            if wanted.start < self.refused.end && self.refused.start < wanted.end {
                return None;
            }
            self.tokens.get(wanted)
        }
    }

    #[test]
    fn a_walk_continued_after_a_refused_block_hashes_what_one_call_does() {
        // Inputs that overlap, nest and have no tokens, where a walk set up afresh at a
        // later block (vLLM's resume) differs from one carried on.
        let f = [
            MmFeature::new("a", 4, 4),
            MmFeature::new("b", 7, 0),
            MmFeature::new("c", 7, 1),
            MmFeature::new("d", 9, 6),
            MmFeature::new("e", 10, 1),
            MmFeature::new("f", 15, 0),
        ];
        let inputs = ExtraKeyInputs {
            mm_features: &f,
            ..ExtraKeyInputs::default()
        };
        let tokens: Vec<i64> = (0..20).collect();
        let root = none_hash(HashAlgo::Sha256, DEFAULT_NONE_HASH_SEED);
        for block_size in [1, 2, 3] {
            let mut hasher = BlockHasher::new(HashAlgo::Sha256);
            let mut whole = Vec::new();
            let n = hasher.extend_chain_from(
                &root,
                &mut &tokens[..],
                block_size,
                0,
                &inputs,
                &mut whole,
            );
            assert_eq!(n, 20 / block_size);
            for refused in 0..n {
                let mut source = RefusesBlock {
                    tokens: &tokens,
                    refused: refused * block_size..(refused + 1) * block_size,
                };
                let mut walk = None;
                let mut out = Vec::new();
                let first = hasher.continue_chain_from(
                    &root,
                    &mut source,
                    block_size,
                    0,
                    &inputs,
                    &mut walk,
                    &mut out,
                );
                assert_eq!(first, refused);
                let parent = if first == 0 {
                    root.as_bytes().to_vec()
                } else {
                    out[out.len() - 32..].to_vec()
                };
                let rest = hasher.continue_chain_from(
                    &parent,
                    &mut &tokens[..],
                    block_size,
                    first,
                    &inputs,
                    &mut walk,
                    &mut out,
                );
                assert_eq!(first + rest, n);
                assert_eq!(
                    out, whole,
                    "block size {block_size}, block {refused} refused"
                );
            }
        }
    }
}
