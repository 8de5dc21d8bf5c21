//! Per-block extra keys, as vLLM's `generate_block_hash_extra_keys` builds them.
//!
//! vLLM's `extra_keys` for block `[start, end)` is `None` when empty, else the
//! tuple of, in this order:
//! 1. the LoRA adapter's name, a `str` (`lora_request.lora_name`), on every block
//!    of a LoRA request;
//! 2. one `(identifier, offset - start)` tuple per multimodal input the block
//!    touches, a `str` and an `int` (negative when the input began in an earlier
//!    block);
//! 3. the cache salt, a `str`, on the block starting at token 0 only, and only
//!    when the salt is non-empty;
//! 4. the SHA-256 digest of the block's prompt embeddings, 32 `bytes`, on every
//!    block of a request that has prompt embeddings.
//!
//! The entries are untagged: vLLM puts the bare name, salt and digest in the
//! tuple, not `("lora", ...)`-style pairs.
//!
//! Multimodal inputs are found with vLLM's cursor walk (`_gen_mm_extra_hash_keys`),
//! emulated step for step, including its two quirks: the walk stops at the first
//! input that continues past the block, and when hashing resumes at a block other
//! than the first, vLLM restarts the walk at the *last* input (`start_mm_idx = -1`),
//! so a resumed chain only ever sees the last multimodal input. See [`MmCursor`].
//!
//! [`BlockExtraKeys`] borrows from the request and is encoded straight into the
//! hash input, so computing a block's extra keys allocates nothing.

use std::ops::Range;

use super::cbor;
use super::pickle::PickleWriter;
use super::value::Value;

/// One multimodal input of a request: vLLM's `MultiModalFeatureSpec` reduced to
/// what block hashing reads (`identifier`, `mm_position.offset`, `mm_position.length`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct MmFeature {
    /// The input's identifier (its content hash, or a user-supplied uuid).
    pub identifier: String,
    /// Index of the input's first placeholder token in the request.
    pub offset: usize,
    /// Number of placeholder tokens.
    pub length: usize,
}

impl MmFeature {
    /// A feature spanning `offset .. offset + length`.
    pub fn new(identifier: impl Into<String>, offset: usize, length: usize) -> Self {
        Self {
            identifier: identifier.into(),
            offset,
            length,
        }
    }

    #[inline]
    fn end(&self) -> usize {
        self.offset + self.length
    }
}

/// The request-level inputs to extra keys.
///
/// The default has none of them, so every block's extra keys are `None`.
///
/// ```
/// use kvpool::pool::hashing::{ExtraKeyInputs, MmCursor, MmFeature, Value};
/// let mm = [MmFeature::new("img", 10, 20)];
/// let inputs = ExtraKeyInputs { lora_name: Some("my-lora"), mm_features: &mm, cache_salt: Some("s"), ..Default::default() };
/// let mut cursor = MmCursor::new(0);
/// // block 0 = tokens [0, 16): ("my-lora", ("img", 10), "s")
/// let keys = inputs.block_keys(0, 16, &mut cursor);
/// assert_eq!(keys.to_value(), Some(Value::tuple([
///     Value::from("my-lora"),
///     Value::tuple([Value::from("img"), Value::from(10)]),
///     Value::from("s"),
/// ])));
/// // block 1 = tokens [16, 32): ("my-lora", ("img", -6))
/// let keys = inputs.block_keys(1, 16, &mut cursor);
/// assert_eq!(keys.len(), 2);
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct ExtraKeyInputs<'a> {
    /// The LoRA adapter's name, for a LoRA request.
    pub lora_name: Option<&'a str>,
    /// Multimodal inputs, sorted by offset (as vLLM assumes).
    pub mm_features: &'a [MmFeature],
    /// The cache salt; `Some("")` counts as no salt, as in vLLM.
    pub cache_salt: Option<&'a str>,
    /// For a request with prompt embeddings: the SHA-256 digest of each block's
    /// embeddings (`hashlib.sha256(tensor_data(embeds[start:end])).digest()`),
    /// indexed by block. Blocks past the end of this slice cannot be hashed.
    pub prompt_embed_digests: Option<&'a [[u8; 32]]>,
}

impl<'a> ExtraKeyInputs<'a> {
    /// True when no block can have extra keys.
    pub fn is_empty(&self) -> bool {
        self.lora_name.is_none()
            && self.mm_features.is_empty()
            && self.cache_salt.is_none_or(str::is_empty)
            && self.prompt_embed_digests.is_none()
    }

    /// How many of the first `num_blocks` blocks have every input they need
    /// (all of them, unless a prompt-embedding digest is missing).
    pub fn hashable_blocks(&self, num_blocks: usize) -> usize {
        match self.prompt_embed_digests {
            Some(d) => num_blocks.min(d.len()),
            None => num_blocks,
        }
    }

    /// The extra keys of block `block_index` (tokens
    /// `block_index * block_size .. (block_index + 1) * block_size`), advancing
    /// `cursor` as vLLM advances `curr_mm_idx`. Call it for consecutive blocks
    /// with one cursor.
    ///
    /// # Panics
    /// If the request has prompt embeddings and no digest for this block.
    pub fn block_keys(
        &self,
        block_index: usize,
        block_size: usize,
        cursor: &mut MmCursor,
    ) -> BlockExtraKeys<'a> {
        let start = block_index * block_size;
        let end = start + block_size;
        let mm = cursor.advance(self.mm_features, start, end);
        BlockExtraKeys {
            lora_name: self.lora_name,
            mm_candidates: &self.mm_features[mm],
            block_start: start,
            cache_salt: self.cache_salt.filter(|s| start == 0 && !s.is_empty()),
            prompt_embeds: self.prompt_embed_digests.map(|d| {
                d.get(block_index)
                    .unwrap_or_else(|| panic!("no prompt-embedding digest for block {block_index}"))
            }),
        }
    }
}

/// vLLM's `curr_mm_idx`: where the multimodal walk resumes for the next block.
///
/// vLLM starts at input 0 when it hashes a request from its first block, and at
/// the last input (`start_mm_idx = -1`) when it resumes hashing a request that
/// already has block hashes. [`MmCursor::new`] does the same given the index of
/// the first block to hash, so a resumed chain matches vLLM's even where that
/// differs from hashing the whole request afresh.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MmCursor {
    /// `None` stands for vLLM's `-1` (the last input), resolved on first use.
    next: Option<usize>,
}

impl MmCursor {
    /// The cursor vLLM uses when it starts hashing at block `start_block`.
    pub fn new(start_block: usize) -> Self {
        Self {
            next: if start_block == 0 { Some(0) } else { None },
        }
    }

    /// Runs vLLM's walk for block `[start, end)`; returns the index range of the
    /// inputs it visited. An input in that range is an extra key exactly when it
    /// ends after `start` (the walk visits, but skips, inputs already passed).
    fn advance(&mut self, features: &[MmFeature], start: usize, end: usize) -> Range<usize> {
        let Some(last) = features.last() else {
            return 0..0;
        };
        if last.end() <= start {
            return 0..0;
        }
        let mut idx = self.next.unwrap_or(features.len() - 1);
        let mut first: Option<usize> = None;
        let mut stop = idx;
        while let Some(f) = features.get(idx) {
            if end <= f.offset {
                break; // the block has not reached this input
            }
            if start >= f.end() {
                idx += 1; // the block is past this input
                continue;
            }
            first.get_or_insert(idx);
            stop = idx + 1;
            if end >= f.end() {
                idx += 1; // the input ends in this block; the next may start here too
            } else {
                break; // the input continues into the next block
            }
        }
        self.next = Some(idx);
        match first {
            Some(first) => first..stop,
            None => 0..0,
        }
    }
}

/// The extra keys of one block, borrowed from the request.
///
/// Encoded directly into the hash input by [`super::BlockHasher::hash_block_keys`];
/// [`Self::to_value`] builds the equivalent [`Value`]. Empty keys hash as `None`.
#[derive(Clone, Copy, Debug, Default)]
pub struct BlockExtraKeys<'a> {
    /// The LoRA name, if any.
    pub lora_name: Option<&'a str>,
    /// The multimodal inputs the walk visited; those ending after `block_start` are keys.
    mm_candidates: &'a [MmFeature],
    block_start: usize,
    /// The cache salt, if this block carries it.
    pub cache_salt: Option<&'a str>,
    /// The block's prompt-embedding digest, if any.
    pub prompt_embeds: Option<&'a [u8; 32]>,
}

impl<'a> BlockExtraKeys<'a> {
    /// Keys with no entries (hashes as `None`).
    pub const NONE: BlockExtraKeys<'static> = BlockExtraKeys {
        lora_name: None,
        mm_candidates: &[],
        block_start: 0,
        cache_salt: None,
        prompt_embeds: None,
    };

    /// The multimodal entries: `(identifier, offset of the input relative to the block start)`.
    pub fn mm_entries(&self) -> impl Iterator<Item = (&'a str, i64)> + '_ {
        let start = self.block_start;
        self.mm_candidates
            .iter()
            .filter(move |f| f.end() > start)
            .map(move |f| (f.identifier.as_str(), f.offset as i64 - start as i64))
    }

    /// Number of entries in the tuple.
    pub fn len(&self) -> usize {
        usize::from(self.lora_name.is_some())
            + self.mm_entries().count()
            + usize::from(self.cache_salt.is_some())
            + usize::from(self.prompt_embeds.is_some())
    }

    /// True when the keys are `None`.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The keys as a Python value: `None` when empty, else the tuple.
    pub fn to_value(&self) -> Option<Value> {
        if self.is_empty() {
            return None;
        }
        let mut items = Vec::with_capacity(self.len());
        if let Some(name) = self.lora_name {
            items.push(Value::from(name));
        }
        for (id, off) in self.mm_entries() {
            items.push(Value::tuple([Value::from(id), Value::from(off)]));
        }
        if let Some(salt) = self.cache_salt {
            items.push(Value::from(salt));
        }
        if let Some(d) = self.prompt_embeds {
            items.push(Value::bytes(d));
        }
        Some(Value::Tuple(items))
    }

    /// Appends the CBOR of the keys (or of `None`).
    pub(super) fn write_cbor(&self, out: &mut Vec<u8>) {
        let n = self.len();
        if n == 0 {
            cbor::write_none(out);
            return;
        }
        cbor::write_array_head(out, n);
        if let Some(name) = self.lora_name {
            cbor::write_str(out, name);
        }
        for (id, off) in self.mm_entries() {
            cbor::write_array_head(out, 2);
            cbor::write_str(out, id);
            cbor::write_i64(out, off);
        }
        if let Some(salt) = self.cache_salt {
            cbor::write_str(out, salt);
        }
        if let Some(d) = self.prompt_embeds {
            cbor::write_bytes(out, d);
        }
    }

    /// Saves the keys (or `None`) into a pickle.
    pub(super) fn write_pickle(&self, w: &mut PickleWriter<'_>) {
        let n = self.len();
        if n == 0 {
            w.save_none();
            return;
        }
        w.begin_tuple(n);
        if let Some(name) = self.lora_name {
            w.save_str(name);
        }
        for (id, off) in self.mm_entries() {
            w.begin_tuple(2);
            w.save_str(id);
            w.save_i64(off);
            w.end_tuple(2);
        }
        if let Some(salt) = self.cache_salt {
            w.save_str(salt);
        }
        if let Some(d) = self.prompt_embeds {
            w.save_bytes(d);
        }
        w.end_tuple(n);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys_of(
        inputs: &ExtraKeyInputs<'_>,
        block_size: usize,
        blocks: Range<usize>,
    ) -> Vec<Option<Value>> {
        let mut cursor = MmCursor::new(blocks.start);
        blocks
            .map(|b| inputs.block_keys(b, block_size, &mut cursor).to_value())
            .collect()
    }

    fn mm(id: &str, off: i64) -> Value {
        Value::tuple([Value::from(id), Value::from(off)])
    }

    #[test]
    fn empty_inputs_give_none() {
        let inputs = ExtraKeyInputs::default();
        assert!(inputs.is_empty());
        assert_eq!(keys_of(&inputs, 4, 0..3), vec![None, None, None]);
        assert!(BlockExtraKeys::NONE.is_empty());
    }

    #[test]
    fn order_is_lora_mm_salt_embeds() {
        let f = [MmFeature::new("a", 2, 3)];
        let d = [[7u8; 32], [8u8; 32]];
        let inputs = ExtraKeyInputs {
            lora_name: Some("L"),
            mm_features: &f,
            cache_salt: Some("S"),
            prompt_embed_digests: Some(&d),
        };
        assert_eq!(
            keys_of(&inputs, 4, 0..2),
            vec![
                Some(Value::tuple([
                    Value::from("L"),
                    mm("a", 2),
                    Value::from("S"),
                    Value::bytes(&[7; 32])
                ])),
                Some(Value::tuple([
                    Value::from("L"),
                    mm("a", -2),
                    Value::bytes(&[8; 32])
                ])),
            ]
        );
    }

    #[test]
    fn empty_salt_is_no_salt_but_empty_lora_name_counts() {
        let inputs = ExtraKeyInputs {
            cache_salt: Some(""),
            ..Default::default()
        };
        assert!(inputs.is_empty());
        assert_eq!(keys_of(&inputs, 4, 0..1), vec![None]);
        let inputs = ExtraKeyInputs {
            lora_name: Some(""),
            ..Default::default()
        };
        assert_eq!(
            keys_of(&inputs, 4, 0..1),
            vec![Some(Value::tuple([Value::from("")]))]
        );
    }

    #[test]
    fn mm_walk_spans_and_negative_offsets() {
        // a: [1, 3), b: [3, 9), c: [12, 13)
        let f = [
            MmFeature::new("a", 1, 2),
            MmFeature::new("b", 3, 6),
            MmFeature::new("c", 12, 1),
        ];
        let inputs = ExtraKeyInputs {
            mm_features: &f,
            ..Default::default()
        };
        assert_eq!(
            keys_of(&inputs, 4, 0..5),
            vec![
                Some(Value::tuple([mm("a", 1), mm("b", 3)])),
                Some(Value::tuple([mm("b", -1)])),
                Some(Value::tuple([mm("b", -5)])),
                Some(Value::tuple([mm("c", 0)])),
                None,
            ]
        );
    }

    #[test]
    fn resumed_walk_sees_only_the_last_input() {
        // vLLM quirk: resuming at block 1 starts the walk at the last input, so
        // `a` (which block 1 also touches) is not a key there.
        let f = [MmFeature::new("a", 2, 4), MmFeature::new("b", 5, 1)];
        let inputs = ExtraKeyInputs {
            mm_features: &f,
            ..Default::default()
        };
        assert_eq!(
            keys_of(&inputs, 4, 0..2)[1],
            Some(Value::tuple([mm("a", -2), mm("b", 1)]))
        );
        assert_eq!(
            keys_of(&inputs, 4, 1..2)[0],
            Some(Value::tuple([mm("b", 1)]))
        );
    }

    #[test]
    fn walk_stops_at_an_input_that_continues() {
        // vLLM quirks with nested inputs: `b` lies inside block 0 but the walk
        // stops at `a`, which continues into block 1; and block 1 gets no keys
        // at all, because the early exit only looks at the last input (`b`,
        // which ended before block 1).
        let f = [MmFeature::new("a", 0, 8), MmFeature::new("b", 1, 2)];
        let inputs = ExtraKeyInputs {
            mm_features: &f,
            ..Default::default()
        };
        assert_eq!(
            keys_of(&inputs, 4, 0..2),
            vec![Some(Value::tuple([mm("a", 0)])), None]
        );
    }

    #[test]
    fn hashable_blocks_is_bounded_by_digests() {
        let d = [[0u8; 32]; 2];
        let inputs = ExtraKeyInputs {
            prompt_embed_digests: Some(&d),
            ..Default::default()
        };
        assert_eq!(inputs.hashable_blocks(5), 2);
        assert_eq!(ExtraKeyInputs::default().hashable_blocks(5), 5);
    }
}
