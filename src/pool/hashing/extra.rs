//! Per-block extra keys, as vLLM 0.33's `generate_block_hash_extra_keys` builds them.
//!
//! vLLM's `extra_keys` for block `[start, end)` is `None` when empty, else a tuple
//! of *tagged* tuples, in this order:
//! 1. `("lora", lora_name, lora_path)`, three `str`s, on every block of a LoRA
//!    request (`_gen_lora_extra_hash_keys`; the path is part of the key so that
//!    re-pointing a LoRA name at another adapter does not reuse its KV);
//! 2. `("mm", identifier, offset - start)`, two `str`s and an `int`, for each
//!    multimodal input the block touches (the offset is negative when the input
//!    began in an earlier block);
//! 3. `("cache_salt", salt)`, two `str`s, on the block starting at token 0 only,
//!    and only when the salt is non-empty;
//! 4. `("prompt_embeds", digest)`, a `str` and 32 `bytes` (the SHA-256 digest of
//!    the block's prompt embeddings), on every block of a request that has prompt
//!    embeddings.
//!
//! (vLLM's KV events still publish the older untagged shapes, converted by
//! `to_event_extra_keys`; hashing always uses the tagged ones.)
//!
//! The tags are string literals in vLLM, so each is one (interned) Python object:
//! a block touching two multimodal inputs holds the *same* `"mm"` object twice,
//! and `pickle` writes the second as a `BINGET` of the first. The pickle encoder
//! here does the same for every repeated tag (see the pickle module's notes on
//! object identity); the names, paths, identifiers and salts are treated as
//! distinct objects. CBOR has no object identity.
//!
//! Multimodal inputs are found with vLLM's cursor walk (`_gen_mm_extra_hash_keys`),
//! emulated step for step, including its quirks: the walk stops at the first
//! input that continues past the block, and it skips a block outright when the
//! *last* input ended before the block starts. Where the walk starts when
//! hashing resumes at a later block is transcribed from vLLM 0.33's
//! `request_block_hasher` and `get_mm_features_in_window`; see [`MmCursor`].
//!
//! [`BlockExtraKeys`] borrows from the request and is encoded straight into the
//! hash input, so computing a block's extra keys allocates nothing.
//!
//! Token positions are compared as `u128`, so `offset + length` and
//! `block_index * block_size` never overflow (Python's ints do not either), and
//! nothing here panics on any input.

use std::ops::Range;

use super::super::events::EventExtraKey;
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

    /// `mm_position.offset`, as a position.
    #[inline]
    fn start(&self) -> u128 {
        self.offset as u128
    }

    /// `mm_position.offset + mm_position.length`, without overflow.
    #[inline]
    fn end(&self) -> u128 {
        self.offset as u128 + self.length as u128
    }
}

/// The request-level inputs to extra keys.
///
/// The default has none of them, so every block's extra keys are `None`.
///
/// ```
/// use kvpool::pool::hashing::{ExtraKeyInputs, MmFeature, Value};
/// let mm = [MmFeature::new("img", 10, 20)];
/// let inputs = ExtraKeyInputs {
///     lora: Some(("my-lora", "/adapters/my-lora")),
///     mm_features: &mm,
///     cache_salt: Some("s"),
///     ..Default::default()
/// };
/// let mut cursor = inputs.mm_cursor(0, 16);
/// // block 0 = tokens [0, 16):
/// // (("lora", "my-lora", "/adapters/my-lora"), ("mm", "img", 10), ("cache_salt", "s"))
/// let keys = inputs.block_keys(0, 16, &mut cursor).unwrap();
/// // (`to_value` marks vLLM's tag literals as shared objects; compare without that)
/// assert_eq!(keys.to_value().map(|v| v.without_identity()), Some(Value::tuple([
///     Value::tuple([Value::from("lora"), Value::from("my-lora"), Value::from("/adapters/my-lora")]),
///     Value::tuple([Value::from("mm"), Value::from("img"), Value::from(10)]),
///     Value::tuple([Value::from("cache_salt"), Value::from("s")]),
/// ])));
/// // block 1 = tokens [16, 32): (("lora", "my-lora", "/adapters/my-lora"), ("mm", "img", -6))
/// let keys = inputs.block_keys(1, 16, &mut cursor).unwrap();
/// assert_eq!(keys.len(), 2);
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct ExtraKeyInputs<'a> {
    /// The LoRA adapter's `(lora_name, lora_path)`, for a LoRA request.
    pub lora: Option<(&'a str, &'a str)>,
    /// Multimodal inputs, sorted by offset (as vLLM assumes).
    pub mm_features: &'a [MmFeature],
    /// The cache salt; `Some("")` counts as no salt, as in vLLM.
    pub cache_salt: Option<&'a str>,
    /// For a request with prompt embeddings: the SHA-256 digest of each block's
    /// embeddings (`hashlib.sha256(tensor_data(embeds[start:end])).digest()`),
    /// indexed by block. Blocks past the end of this slice cannot be hashed.
    pub prompt_embed_digests: Option<&'a [[u8; 32]]>,
    /// Which of the strings above are one Python object (for pickle's memo);
    /// `None`: all distinct, as if each were a fresh object.
    pub objects: Option<&'a ExtraObjects>,
}

/// A Python object's identity within one request's extra keys: equal ids are the
/// same object. Ids below [`ExtraObjects::FIRST_FREE`] are vLLM's tag literals.
pub type ObjectId = u32;

/// Which of a request's extra-key strings are one Python object, and which are one
/// of vLLM's tag literals (interned strings: a LoRA named `"lora"` holds the very
/// object vLLM's `"lora"` tag is).
///
/// Only pickle depends on it: the pickler writes an object seen before in the same
/// pickle as a memo reference. The default says every string is its own object.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ExtraObjects {
    /// The LoRA name's object.
    pub lora_name: ObjectId,
    /// The LoRA path's object.
    pub lora_path: ObjectId,
    /// The cache salt's object.
    pub cache_salt: ObjectId,
    /// Each multimodal identifier's object, by feature (missing ones: distinct).
    pub mm_identifiers: Vec<ObjectId>,
}

impl ExtraObjects {
    /// The `"lora"` tag.
    pub const LORA_TAG: ObjectId = 0;
    /// The `"mm"` tag.
    pub const MM_TAG: ObjectId = 1;
    /// The `"cache_salt"` tag.
    pub const CACHE_SALT_TAG: ObjectId = 2;
    /// The `"prompt_embeds"` tag.
    pub const PROMPT_EMBEDS_TAG: ObjectId = 3;
    /// The first id for the caller's own objects.
    pub const FIRST_FREE: ObjectId = 4;
    /// An object shared with nothing else.
    pub const DISTINCT: ObjectId = ObjectId::MAX;

    fn mm(&self, index: usize) -> ObjectId {
        self.mm_identifiers
            .get(index)
            .copied()
            .unwrap_or(Self::DISTINCT)
    }
}

impl Default for ExtraObjects {
    fn default() -> Self {
        Self {
            lora_name: Self::DISTINCT,
            lora_path: Self::DISTINCT,
            cache_salt: Self::DISTINCT,
            mm_identifiers: Vec::new(),
        }
    }
}

impl<'a> ExtraKeyInputs<'a> {
    /// True when no block can have extra keys.
    pub fn is_empty(&self) -> bool {
        self.lora.is_none()
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

    /// The multimodal cursor vLLM starts with when it hashes this request from
    /// block `start_block` on: [`MmCursor::new`] over [`Self::mm_features`].
    pub fn mm_cursor(&self, start_block: usize, block_size: usize) -> MmCursor {
        MmCursor::new(self.mm_features, start_block, block_size)
    }

    /// The extra keys of block `block_index` (tokens
    /// `block_index * block_size .. (block_index + 1) * block_size`), advancing
    /// `cursor` as vLLM advances `curr_mm_idx`. Call it for consecutive blocks
    /// with one cursor, starting with [`Self::mm_cursor`] for the first.
    ///
    /// Returns `None`, leaving `cursor` as it was, when the block cannot be
    /// hashed: the request has prompt embeddings but no digest for this block
    /// (exactly the blocks from [`Self::hashable_blocks`] on).
    pub fn block_keys(
        &self,
        block_index: usize,
        block_size: usize,
        cursor: &mut MmCursor,
    ) -> Option<BlockExtraKeys<'a>> {
        let prompt_embeds = match self.prompt_embed_digests {
            Some(digests) => Some(digests.get(block_index)?),
            None => None,
        };
        let start = block_index as u128 * block_size as u128;
        let end = start + block_size as u128;
        let mm = cursor.advance(self.mm_features, start, end);
        Some(BlockExtraKeys {
            lora: self.lora,
            mm_first: mm.start,
            mm_candidates: self.mm_features.get(mm).unwrap_or(&[]),
            objects: self.objects,
            block_start: start,
            cache_salt: self.cache_salt.filter(|s| start == 0 && !s.is_empty()),
            prompt_embeds,
        })
    }
}

/// vLLM's `curr_mm_idx`: the multimodal input where the walk starts for the
/// next block.
///
/// [`MmCursor::new`] transcribes how vLLM 0.33's `request_block_hasher` sets it
/// up when it starts hashing at token `start = start_block * block_size`:
///
/// ```python
/// curr_mm_idx = 0
/// if start_token_idx > 0 and mm_features:
///     last_mm_pos = mm_features[-1].mm_position
///     if last_mm_pos.offset + last_mm_pos.length > start_token_idx:
///         curr_mm_idx, _ = get_mm_features_in_window(
///             mm_features, start_token_idx, start_token_idx + hash_block_size)
/// ```
///
/// where `get_mm_features_in_window` returns `lo = bisect_left(mm_features,
/// start + 1, key=offset + length)` (its `hi` is discarded). For inputs sorted by
/// offset with sorted ends (non-overlapping, as vLLM assumes) that is the first
/// input ending after `start`, exactly where a walk from block 0 would be, so a
/// resumed chain equals one hashed at once. For nested inputs the ends are not
/// sorted and the binary search can land past an input that still spans the
/// block, which is then not a key of the resumed blocks although it is when the
/// request is hashed from block 0; the cursor reproduces that.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MmCursor {
    next: usize,
}

impl MmCursor {
    /// The cursor vLLM's `request_block_hasher` starts with when the first block
    /// it hashes is `start_block` (`len(request.block_hashes)`), over the
    /// request's multimodal inputs `features`.
    pub fn new(features: &[MmFeature], start_block: usize, block_size: usize) -> Self {
        let start = start_block as u128 * block_size as u128;
        let mut next = 0;
        if start > 0 {
            if let Some(last) = features.last() {
                if last.end() > start {
                    next = mm_features_in_window(features, start, start + block_size as u128).0;
                }
            }
        }
        Self { next }
    }

    /// Runs vLLM's walk (`_gen_mm_extra_hash_keys`) for block `[start, end)`;
    /// returns the index range of the inputs it visited. An input in that range
    /// is an extra key exactly when it ends after `start` (the walk visits, but
    /// skips, inputs already passed).
    fn advance(&mut self, features: &[MmFeature], start: u128, end: u128) -> Range<usize> {
        let Some(last) = features.last() else {
            return 0..0;
        };
        if last.end() <= start {
            return 0..0; // the cursor stays where it is
        }
        // (`start_mm_idx == -1` no longer occurs: vLLM 0.33 never passes it.)
        let mut idx = self.next;
        let mut first: Option<usize> = None;
        let mut stop = idx;
        while let Some(f) = features.get(idx) {
            if end <= f.start() {
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
        self.next = idx;
        match first {
            Some(first) => first..stop,
            None => 0..0,
        }
    }
}

/// vLLM's `get_mm_features_in_window(mm_features, start, end)`
/// (`vllm/multimodal/utils.py`): `(lo, hi)` with
/// `lo = bisect_left(mm_features, start + 1, key=lambda f: offset + length)` and
/// `hi = bisect_left(mm_features, end, key=lambda f: offset)`. The binary
/// searches are transcribed as CPython's `bisect_left` runs them, so the result
/// is the same even when the keys are not sorted.
fn mm_features_in_window(features: &[MmFeature], start: u128, end: u128) -> (usize, usize) {
    let lo = bisect_left(features, start + 1, MmFeature::end);
    let hi = bisect_left(features, end, MmFeature::start);
    (lo, hi)
}

/// CPython's `bisect.bisect_left(a, x, key=key)`.
fn bisect_left(a: &[MmFeature], x: u128, key: fn(&MmFeature) -> u128) -> usize {
    let (mut lo, mut hi) = (0, a.len());
    while lo < hi {
        let mid = lo + (hi - lo) / 2; // == (lo + hi) // 2
        match a.get(mid) {
            Some(f) if key(f) < x => lo = mid + 1,
            _ => hi = mid,
        }
    }
    lo
}

/// The four tags of vLLM's extra keys, string literals in vLLM.
#[derive(Clone, Copy)]
enum Tag {
    Lora,
    Mm,
    CacheSalt,
    PromptEmbeds,
}

impl Tag {
    const fn as_str(self) -> &'static str {
        match self {
            Tag::Lora => "lora",
            Tag::Mm => "mm",
            Tag::CacheSalt => "cache_salt",
            Tag::PromptEmbeds => "prompt_embeds",
        }
    }
}

/// Memo indices of the objects already saved in one pickle, by [`ObjectId`]: the
/// pickler memoizes an object on its first save and writes every later occurrence
/// as a memo reference. Up to 8 objects without allocating.
#[derive(Default)]
struct ObjectMemo {
    inline: [(ObjectId, usize); 8],
    len: usize,
    spill: Vec<(ObjectId, usize)>,
}

impl ObjectMemo {
    fn get(&self, id: ObjectId) -> Option<usize> {
        self.inline[..self.len]
            .iter()
            .chain(&self.spill)
            .find(|(k, _)| *k == id)
            .map(|&(_, index)| index)
    }

    /// Saves string `s`, the object `id`, in full or as a memo reference.
    #[inline]
    fn save_str(&mut self, w: &mut PickleWriter<'_>, id: ObjectId, s: &str) {
        if id == ExtraObjects::DISTINCT {
            w.save_str(s);
            return;
        }
        match self.get(id) {
            Some(index) => w.save_memo_get(index),
            None => {
                let index = w.save_str(s);
                if self.len < self.inline.len() {
                    self.inline[self.len] = (id, index);
                    self.len += 1;
                } else {
                    self.spill.push((id, index));
                }
            }
        }
    }
}

/// The extra keys of one block, borrowed from the request.
///
/// Encoded directly into the hash input by [`super::BlockHasher::hash_block_keys`];
/// [`Self::to_value`] builds the equivalent [`Value`]. Empty keys hash as `None`.
#[derive(Clone, Copy, Debug, Default)]
pub struct BlockExtraKeys<'a> {
    /// The LoRA adapter's `(name, path)`, if any.
    pub lora: Option<(&'a str, &'a str)>,
    /// The multimodal inputs the walk visited; those ending after `block_start` are keys.
    mm_candidates: &'a [MmFeature],
    /// Index of `mm_candidates[0]` among the request's features.
    mm_first: usize,
    /// Which strings are one object (`None`: all distinct).
    objects: Option<&'a ExtraObjects>,
    block_start: u128,
    /// The cache salt, if this block carries it.
    pub cache_salt: Option<&'a str>,
    /// The block's prompt-embedding digest, if any.
    pub prompt_embeds: Option<&'a [u8; 32]>,
}

impl<'a> BlockExtraKeys<'a> {
    /// Keys with no entries (hashes as `None`).
    pub const NONE: BlockExtraKeys<'static> = BlockExtraKeys {
        lora: None,
        mm_candidates: &[],
        mm_first: 0,
        objects: None,
        block_start: 0,
        cache_salt: None,
        prompt_embeds: None,
    };

    /// The multimodal entries `("mm", identifier, offset)`, as `(identifier,
    /// offset)` with the input's offset relative to the block start.
    pub fn mm_entries(&self) -> impl Iterator<Item = (&'a str, i128)> + '_ {
        let start = self.block_start;
        self.mm_candidates
            .iter()
            .filter(move |f| f.end() > start)
            // start < end <= 2 * usize::MAX here, so both fit in an i128.
            .map(move |f| (f.identifier.as_str(), f.start() as i128 - start as i128))
    }

    /// The keys as a `BlockStored` event carries them (vLLM's `to_event_extra_keys`: the
    /// LoRA name, `(identifier, offset)` per multimodal input, the cache salt, the
    /// prompt-embeddings digest, in that order); `None` when there are none.
    pub fn event_keys(&self) -> Option<Vec<EventExtraKey>> {
        if self.is_empty() {
            return None;
        }
        let mut keys = Vec::with_capacity(self.len());
        if let Some((name, _)) = self.lora {
            keys.push(EventExtraKey::Text(name.to_owned()));
        }
        for (identifier, offset) in self.mm_entries() {
            let offset =
                i64::try_from(offset).unwrap_or(if offset < 0 { i64::MIN } else { i64::MAX });
            keys.push(EventExtraKey::Mm(identifier.to_owned(), offset));
        }
        if let Some(salt) = self.cache_salt {
            keys.push(EventExtraKey::Text(salt.to_owned()));
        }
        if let Some(digest) = self.prompt_embeds {
            keys.push(EventExtraKey::Digest(*digest));
        }
        Some(keys)
    }

    /// Number of entries (tagged tuples) in the keys.
    pub fn len(&self) -> usize {
        usize::from(self.lora.is_some())
            + self.mm_entries().count()
            + usize::from(self.cache_salt.is_some())
            + usize::from(self.prompt_embeds.is_some())
    }

    /// True when the keys are `None`.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The keys as a Python value: `None` when empty, else the tuple of tagged
    /// tuples, with the tags and the caller's shared strings as [`Value::Shared`],
    /// so that its pickle ([`super::encode_pickle`]) and its CBOR are the keys'.
    pub fn to_value(&self) -> Option<Value> {
        if self.is_empty() {
            return None;
        }
        let default_objects = ExtraObjects::default();
        let objects = self.objects.unwrap_or(&default_objects);
        let object = |id: ObjectId, s: &str| match id {
            ExtraObjects::DISTINCT => Value::from(s),
            id => Value::Shared(id, Box::new(Value::from(s))),
        };
        let tag = |id: ObjectId, t: Tag| object(id, t.as_str());
        let mut items = Vec::with_capacity(self.len());
        if let Some((name, path)) = self.lora {
            items.push(Value::tuple([
                tag(ExtraObjects::LORA_TAG, Tag::Lora),
                object(objects.lora_name, name),
                object(objects.lora_path, path),
            ]));
        }
        let start = self.block_start;
        for (i, f) in self.mm_candidates.iter().enumerate() {
            if f.end() <= start {
                continue;
            }
            items.push(Value::tuple([
                tag(ExtraObjects::MM_TAG, Tag::Mm),
                object(objects.mm(self.mm_first + i), &f.identifier),
                Value::Int(f.start() as i128 - start as i128),
            ]));
        }
        if let Some(salt) = self.cache_salt {
            items.push(Value::tuple([
                tag(ExtraObjects::CACHE_SALT_TAG, Tag::CacheSalt),
                object(objects.cache_salt, salt),
            ]));
        }
        if let Some(d) = self.prompt_embeds {
            items.push(Value::tuple([
                tag(ExtraObjects::PROMPT_EMBEDS_TAG, Tag::PromptEmbeds),
                Value::bytes(d),
            ]));
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
        if let Some((name, path)) = self.lora {
            cbor::write_array_head(out, 3);
            cbor::write_str(out, Tag::Lora.as_str());
            cbor::write_str(out, name);
            cbor::write_str(out, path);
        }
        for (id, off) in self.mm_entries() {
            cbor::write_array_head(out, 3);
            cbor::write_str(out, Tag::Mm.as_str());
            cbor::write_str(out, id);
            cbor::write_int(out, off);
        }
        if let Some(salt) = self.cache_salt {
            cbor::write_array_head(out, 2);
            cbor::write_str(out, Tag::CacheSalt.as_str());
            cbor::write_str(out, salt);
        }
        if let Some(d) = self.prompt_embeds {
            cbor::write_array_head(out, 2);
            cbor::write_str(out, Tag::PromptEmbeds.as_str());
            cbor::write_bytes(out, d);
        }
    }

    /// Saves the keys (or `None`) into a pickle, the tags memoized as vLLM's
    /// shared tag objects are.
    pub(super) fn write_pickle(&self, w: &mut PickleWriter<'_>) {
        let n = self.len();
        if n == 0 {
            w.save_none();
            return;
        }
        let default_objects = ExtraObjects::default();
        let objects = self.objects.unwrap_or(&default_objects);
        let mut memo = ObjectMemo::default();
        w.begin_tuple(n);
        if let Some((name, path)) = self.lora {
            w.begin_tuple(3);
            memo.save_str(w, ExtraObjects::LORA_TAG, Tag::Lora.as_str());
            memo.save_str(w, objects.lora_name, name);
            memo.save_str(w, objects.lora_path, path);
            w.end_tuple(3);
        }
        let start = self.block_start;
        for (i, f) in self.mm_candidates.iter().enumerate() {
            if f.end() <= start {
                continue;
            }
            w.begin_tuple(3);
            memo.save_str(w, ExtraObjects::MM_TAG, Tag::Mm.as_str());
            memo.save_str(w, objects.mm(self.mm_first + i), &f.identifier);
            // start < end <= 2 * usize::MAX here, so both fit in an i128.
            w.save_int(f.start() as i128 - start as i128);
            w.end_tuple(3);
        }
        if let Some(salt) = self.cache_salt {
            w.begin_tuple(2);
            memo.save_str(w, ExtraObjects::CACHE_SALT_TAG, Tag::CacheSalt.as_str());
            memo.save_str(w, objects.cache_salt, salt);
            w.end_tuple(2);
        }
        if let Some(d) = self.prompt_embeds {
            w.begin_tuple(2);
            memo.save_str(
                w,
                ExtraObjects::PROMPT_EMBEDS_TAG,
                Tag::PromptEmbeds.as_str(),
            );
            w.save_bytes(d);
            w.end_tuple(2);
        }
        w.end_tuple(n);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The extra keys of `blocks`, hashed as one `request_block_hasher` call
    /// that starts at `blocks.start`.
    fn keys_of(
        inputs: &ExtraKeyInputs<'_>,
        block_size: usize,
        blocks: Range<usize>,
    ) -> Vec<Option<Value>> {
        let mut cursor = inputs.mm_cursor(blocks.start, block_size);
        blocks
            .map(|b| {
                inputs
                    .block_keys(b, block_size, &mut cursor)
                    .expect("hashable block")
                    .to_value()
                    .map(|v| v.without_identity())
            })
            .collect()
    }

    fn lora(name: &str, path: &str) -> Value {
        Value::tuple([Value::from("lora"), Value::from(name), Value::from(path)])
    }

    fn mm(id: &str, off: i64) -> Value {
        Value::tuple([Value::from("mm"), Value::from(id), Value::from(off)])
    }

    fn salt(s: &str) -> Value {
        Value::tuple([Value::from("cache_salt"), Value::from(s)])
    }

    fn embeds(d: &[u8; 32]) -> Value {
        Value::tuple([Value::from("prompt_embeds"), Value::bytes(d)])
    }

    fn mm_only(f: &[MmFeature]) -> ExtraKeyInputs<'_> {
        ExtraKeyInputs {
            mm_features: f,
            ..Default::default()
        }
    }

    #[test]
    fn empty_inputs_give_none() {
        let inputs = ExtraKeyInputs::default();
        assert!(inputs.is_empty());
        assert_eq!(keys_of(&inputs, 4, 0..3), vec![None, None, None]);
        assert!(BlockExtraKeys::NONE.is_empty());
        assert_eq!(BlockExtraKeys::NONE.to_value(), None);
    }

    #[test]
    fn order_is_lora_mm_salt_embeds() {
        let f = [MmFeature::new("a", 2, 3)];
        let d = [[7u8; 32], [8u8; 32]];
        let inputs = ExtraKeyInputs {
            lora: Some(("L", "/p/L")),
            mm_features: &f,
            cache_salt: Some("S"),
            prompt_embed_digests: Some(&d),
            objects: None,
        };
        assert_eq!(
            keys_of(&inputs, 4, 0..2),
            vec![
                Some(Value::tuple([
                    lora("L", "/p/L"),
                    mm("a", 2),
                    salt("S"),
                    embeds(&[7; 32])
                ])),
                Some(Value::tuple([
                    lora("L", "/p/L"),
                    mm("a", -2),
                    embeds(&[8; 32])
                ])),
            ]
        );
        let mut cursor = inputs.mm_cursor(0, 4);
        assert_eq!(inputs.block_keys(0, 4, &mut cursor).unwrap().len(), 4);
        assert_eq!(inputs.block_keys(1, 4, &mut cursor).unwrap().len(), 3);
    }

    #[test]
    fn empty_salt_is_no_salt_but_empty_lora_strings_count() {
        let inputs = ExtraKeyInputs {
            cache_salt: Some(""),
            ..Default::default()
        };
        assert!(inputs.is_empty());
        assert_eq!(keys_of(&inputs, 4, 0..1), vec![None]);
        let inputs = ExtraKeyInputs {
            lora: Some(("", "")),
            ..Default::default()
        };
        assert_eq!(
            keys_of(&inputs, 4, 0..1),
            vec![Some(Value::tuple([lora("", "")]))]
        );
    }

    #[test]
    fn salt_only_on_block_zero() {
        let inputs = ExtraKeyInputs {
            cache_salt: Some("S"),
            ..Default::default()
        };
        assert_eq!(
            keys_of(&inputs, 4, 0..2),
            vec![Some(Value::tuple([salt("S")])), None]
        );
        // Resuming at block 1 never sees the salt.
        assert_eq!(keys_of(&inputs, 4, 1..3), vec![None, None]);
    }

    #[test]
    fn mm_walk_spans_and_negative_offsets() {
        // a: [1, 3), b: [3, 9), c: [12, 13)
        let f = [
            MmFeature::new("a", 1, 2),
            MmFeature::new("b", 3, 6),
            MmFeature::new("c", 12, 1),
        ];
        assert_eq!(
            keys_of(&mm_only(&f), 4, 0..5),
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
    fn resumed_walk_equals_walk_from_block_zero_for_sorted_inputs() {
        // vLLM 0.33 resumes at the first input ending after the resume point
        // (older vLLM resumed at the last input and lost `a` in block 1).
        let f = [
            MmFeature::new("a", 2, 4),
            MmFeature::new("b", 5, 1),
            MmFeature::new("c", 9, 9),
        ];
        let inputs = mm_only(&f);
        let whole = keys_of(&inputs, 4, 0..6);
        assert_eq!(whole[1], Some(Value::tuple([mm("a", -2), mm("b", 1)])));
        for start in 1..6 {
            assert_eq!(
                keys_of(&inputs, 4, start..6),
                whole[start..],
                "resume at {start}"
            );
        }
    }

    #[test]
    fn resume_cursor_follows_vllm() {
        let f = [
            MmFeature::new("a", 5, 20),
            MmFeature::new("b", 40, 10),
            MmFeature::new("c", 58, 4),
            MmFeature::new("d", 62, 2),
        ];
        let at = |block| MmCursor::new(&f, block, 16).next;
        // From block 0, and once the last input has ended: index 0.
        assert_eq!([at(0), at(4), at(9)], [0, 0, 0]);
        // Else the first input ending after the resume point.
        assert_eq!([at(1), at(2), at(3)], [0, 1, 1]);
        assert_eq!(MmCursor::new(&[], 3, 16).next, 0);
        assert_eq!(MmCursor::new(&f, 1, 0).next, 0);
    }

    #[test]
    fn resume_bisects_past_an_outer_input() {
        // vLLM quirk with nested inputs: the ends (100, 15, 25) are not sorted,
        // so the binary search at token 16 lands on `c` and the resumed block 1
        // misses `outer`, which a walk from block 0 reports there.
        let f = [
            MmFeature::new("outer", 0, 100),
            MmFeature::new("b", 10, 5),
            MmFeature::new("c", 20, 5),
        ];
        let inputs = mm_only(&f);
        assert_eq!(
            keys_of(&inputs, 16, 0..3),
            vec![
                Some(Value::tuple([mm("outer", 0)])),
                Some(Value::tuple([mm("outer", -16)])),
                None, // the last input ended before token 32: no walk at all
            ]
        );
        assert_eq!(
            keys_of(&inputs, 16, 1..3),
            vec![Some(Value::tuple([mm("c", 4)])), None]
        );
    }

    #[test]
    fn window_matches_vllm() {
        // (lo, hi) as vLLM's get_mm_features_in_window returns them.
        let feats = |spans: &[(usize, usize)]| -> Vec<MmFeature> {
            spans
                .iter()
                .map(|&(o, l)| MmFeature::new("x", o, l))
                .collect()
        };
        type Spans = &'static [(usize, usize)];
        let cases: [(Spans, u128, u128, (usize, usize)); 6] = [
            (&[(0, 100), (10, 5), (20, 5)], 16, 32, (2, 3)),
            (&[(5, 20), (40, 10), (58, 4), (62, 2)], 48, 64, (1, 4)),
            (&[(5, 20), (40, 10), (58, 4), (62, 2)], 25, 41, (1, 2)),
            (&[(0, 8), (1, 2)], 4, 8, (2, 2)),
            (&[], 0, 4, (0, 0)),
            (&[(3, 0), (3, 0), (9, 1)], 3, 6, (2, 2)),
        ];
        for (spans, start, end, expected) in cases {
            assert_eq!(
                mm_features_in_window(&feats(spans), start, end),
                expected,
                "{spans:?} {start} {end}"
            );
        }
    }

    #[test]
    fn walk_stops_at_an_input_that_continues() {
        // vLLM quirks with nested inputs: `b` lies inside block 0 but the walk
        // stops at `a`, which continues into block 1; and block 1 gets no keys
        // at all, because the early exit only looks at the last input (`b`,
        // which ended before block 1).
        let f = [MmFeature::new("a", 0, 8), MmFeature::new("b", 1, 2)];
        let inputs = mm_only(&f);
        assert_eq!(
            keys_of(&inputs, 4, 0..2),
            vec![Some(Value::tuple([mm("a", 0)])), None]
        );
        assert_eq!(keys_of(&inputs, 4, 1..2), vec![None]);
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

    #[test]
    fn missing_digest_gives_no_keys_and_keeps_the_cursor() {
        let f = [MmFeature::new("a", 0, 100)];
        let d = [[0u8; 32]; 2];
        let inputs = ExtraKeyInputs {
            mm_features: &f,
            prompt_embed_digests: Some(&d),
            ..Default::default()
        };
        let mut cursor = inputs.mm_cursor(0, 16);
        assert!(inputs.block_keys(0, 16, &mut cursor).is_some());
        let before = cursor;
        assert!(inputs.block_keys(2, 16, &mut cursor).is_none());
        assert_eq!(cursor, before);
    }

    #[test]
    fn extreme_positions_do_not_overflow() {
        let f = [
            MmFeature::new("x", usize::MAX - 1, usize::MAX),
            MmFeature::new("y", usize::MAX, usize::MAX),
        ];
        let inputs = mm_only(&f);
        // Block `usize::MAX / 4` of size 4 starts at token usize::MAX - 3.
        let block = usize::MAX / 4;
        let mut cursor = inputs.mm_cursor(block, 4);
        assert_eq!(cursor.next, 0);
        let keys = inputs.block_keys(block, 4, &mut cursor).unwrap();
        assert_eq!(
            keys.mm_entries().collect::<Vec<_>>(),
            vec![("x", 2)] // `x` continues past the block
        );
        // Absurd block indices and sizes neither panic nor find inputs.
        for (b, size) in [(usize::MAX, usize::MAX), (usize::MAX, 1), (1, usize::MAX)] {
            let mut cursor = inputs.mm_cursor(b, size);
            let keys = inputs.block_keys(b, size, &mut cursor).unwrap();
            assert!(keys.len() <= 2);
        }
        // A cursor made for other (longer) features is harmless.
        let mut foreign = MmCursor { next: 7 };
        assert!(inputs.block_keys(0, 4, &mut foreign).unwrap().is_empty());
    }

    #[test]
    fn pickle_memoizes_repeated_tags() {
        let f = [
            MmFeature::new("a", 0, 2),
            MmFeature::new("b", 2, 1),
            MmFeature::new("c", 3, 1),
        ];
        let inputs = ExtraKeyInputs {
            lora: Some(("mm", "lora")), // equal to tags, but not the tag objects
            mm_features: &f,
            ..Default::default()
        };
        let keys = inputs
            .block_keys(0, 4, &mut inputs.mm_cursor(0, 4))
            .unwrap();
        let mut fast = Vec::new();
        let mut w = PickleWriter::begin(&mut fast);
        keys.write_pickle(&mut w);
        w.finish();
        // The tags are memoized at 0 ("lora") and 4 ("mm", after the lora
        // name, path and tuple); the second and third "mm" are `BINGET 4`.
        assert_eq!(fast.windows(2).filter(|p| p == b"h\x04").count(), 2);
        assert_eq!(fast.windows(2).filter(|p| p[0] == b'h').count(), 2);
    }

    proptest::proptest! {
        #[test]
        fn resuming_equals_walking_from_block_zero_when_ends_are_sorted(
            gaps in proptest::collection::vec((0usize..6, 0usize..9), 0..6),
            block_size in 1usize..7,
        ) {
            // Inputs sorted by offset with sorted ends (they may touch, and be
            // empty): what vLLM assumes, and where its resume is exact.
            let mut pos = 0;
            let f: Vec<MmFeature> = gaps.iter().enumerate().map(|(k, &(gap, len))| {
                pos += gap;
                let feature = MmFeature::new(format!("f{k}"), pos, len);
                pos += len;
                feature
            }).collect();
            let inputs = mm_only(&f);
            let blocks = pos / block_size + 2;
            let whole = keys_of(&inputs, block_size, 0..blocks);
            for start in 1..blocks {
                proptest::prop_assert_eq!(&keys_of(&inputs, block_size, start..blocks)[..], &whole[start..]);
            }
        }

        #[test]
        fn arbitrary_positions_never_panic(
            feats in proptest::collection::vec((proptest::num::usize::ANY, proptest::num::usize::ANY), 0..5),
            block_index in proptest::num::usize::ANY,
            block_size in proptest::num::usize::ANY,
            start_block in proptest::num::usize::ANY,
        ) {
            let f: Vec<MmFeature> = feats.iter().map(|&(o, l)| MmFeature::new("x", o, l)).collect();
            let d = [[0u8; 32]; 3];
            let inputs = ExtraKeyInputs {
                lora: Some(("n", "p")),
                mm_features: &f,
                cache_salt: Some("s"),
                prompt_embed_digests: Some(&d),
                objects: None,
            };
            let mut cursor = inputs.mm_cursor(start_block, block_size);
            for b in [block_index, block_index.wrapping_add(1), 0, 1, 2] {
                if let Some(keys) = inputs.block_keys(b, block_size, &mut cursor) {
                    let value = keys.to_value();
                    proptest::prop_assert_eq!(value.is_some(), !keys.is_empty());
                    let mut out = Vec::new();
                    keys.write_cbor(&mut out);
                    let mut w = PickleWriter::begin(&mut out);
                    keys.write_pickle(&mut w);
                    w.finish();
                }
            }
        }
    }
}
