//! The computed-blocks tracker: per sequence, its tokens as they grow, its block
//! hashes (incremental) and how many of its tokens are already computed in the
//! prefix cache, so a scheduler charges only uncached tokens.
//!
//! The seven invariants (`docs/semantics.md`, "Computed-blocks tracker") and how
//! this file keeps them:
//! 1. Full blocks only, block-aligned, never the last token: the lookup is capped
//!    at `(num_tokens - 1) / block_size` blocks.
//! 2. A prefix: the count comes from the pool's longest-cache-hit scan, which
//!    stops at the first miss.
//! 3. Only blocks whose KV is present or will be written before it is read: the
//!    pool's prefix map holds exactly blocks cached at allocation time, which the
//!    allocating request's step writes before any later step reads them.
//! 4. Fixed when the sequence's prefill starts ([`ComputedBlocksTracker::start`]),
//!    and *recomputed on every query until then*, so blocks other sequences
//!    computed while this one waited do count; its own chunks, cached after it
//!    started, never inflate it. (The historic bug memoised the first answer of a
//!    waiting sequence: after a first pass with no hits, every later pass said 0.)
//! 5. Hashes are extended, never recomputed, with the pool's own hash chain.
//! 6. [`ComputedBlocksTracker::reset`] (preemption) and
//!    [`ComputedBlocksTracker::remove`] (free) drop the fixed count.
//! 7. The tracker only reads the pool (`&BlockPool`), so it cannot change counts.
//!
//! The per-sequence logic lives on [`Sequence`] and [`SequenceHasher`], so the
//! manager keeps each request's sequence inside its own request record (one map, one
//! lookup per call); [`ComputedBlocksTracker`] is the id-keyed form for engines
//! that keep block tables themselves.

use hashbrown::HashMap;

use super::block_pool::BlockPool;
use super::error::{PoolError, PoolResult};
use super::hash_key::HashSlice;
use super::hashing::{
    none_hash, BlockHasher, Digest, ExtraKeyInputs, ExtraObjects, HashAlgo, MmFeature,
};
use super::request_id::RequestId;

/// A sequence's request-level inputs to its block hashes' extra keys (owned).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SequenceExtras {
    /// LoRA adapter `(name, path)`.
    pub lora: Option<(String, String)>,
    /// Cache salt (keys the first block only).
    pub cache_salt: Option<String>,
    /// Multimodal inputs, sorted by offset.
    pub mm_features: Vec<MmFeature>,
    /// Per-block SHA-256 digests of prompt embeddings, for prompt-embeds requests.
    pub prompt_embed_digests: Option<Vec<[u8; 32]>>,
    /// Which of the strings above are one Python object (for pickle's memo).
    pub objects: ExtraObjects,
}

impl SequenceExtras {
    /// The borrowed view the hasher reads.
    pub fn inputs(&self) -> ExtraKeyInputs<'_> {
        ExtraKeyInputs {
            lora: self
                .lora
                .as_ref()
                .map(|(name, path)| (name.as_str(), path.as_str())),
            mm_features: &self.mm_features,
            cache_salt: self.cache_salt.as_deref(),
            prompt_embed_digests: self.prompt_embed_digests.as_deref(),
            objects: Some(&self.objects),
        }
    }

    /// Fails if the multimodal inputs are not sorted by offset (vLLM assumes it).
    pub fn validate(&self) -> PoolResult<()> {
        if self
            .mm_features
            .windows(2)
            .any(|w| w[0].offset > w[1].offset)
        {
            return Err(PoolError::InvalidArgument(
                "multimodal features must be sorted by offset".into(),
            ));
        }
        Ok(())
    }
}

/// One tracked sequence: its tokens, its block hashes, its fixed computed count.
#[derive(Clone, Debug)]
pub struct Sequence {
    /// The token ids, kept only while something reads them (see
    /// [`SequenceHasher::keeps_tokens`]).
    tokens: Vec<i64>,
    num_tokens: usize,
    num_prompt_tokens: usize,
    hashes: Vec<u8>,
    width: usize,
    block_size: usize,
    extras: SequenceExtras,
    /// Computed tokens, fixed when the prefill started; `None` while waiting.
    started_with: Option<usize>,
}

impl Sequence {
    /// All token ids so far (prompt, then appended tokens); empty for a sequence
    /// that keeps only its count (a manager without prefix caching).
    pub fn tokens(&self) -> &[i64] {
        &self.tokens
    }

    /// Number of tokens so far.
    pub fn num_tokens(&self) -> usize {
        self.num_tokens
    }

    /// Number of prompt tokens (the tokens given when the sequence was added).
    pub fn num_prompt_tokens(&self) -> usize {
        self.num_prompt_tokens
    }

    /// The request-level extra-key inputs.
    pub fn extras(&self) -> &SequenceExtras {
        &self.extras
    }

    /// The block hashes so far (full blocks only).
    pub fn block_hashes(&self) -> HashSlice<'_> {
        HashSlice::new(&self.hashes, self.width).unwrap_or_else(|_| HashSlice::empty())
    }

    /// Whether the prefill has started (the computed count is fixed).
    pub fn is_started(&self) -> bool {
        self.started_with.is_some()
    }

    /// The longest run of the sequence's blocks cached in `pool` (group 0), never
    /// covering its last token, appended to `out`; returns the computed tokens.
    /// Ignores whether the sequence has started.
    pub fn lookup_computed_blocks(
        &self,
        pool: &BlockPool,
        out: &mut Vec<u32>,
    ) -> PoolResult<usize> {
        if !pool.config().enable_caching || self.num_tokens == 0 {
            return Ok(0);
        }
        let max_blocks = (self.num_tokens - 1) / self.block_size;
        let hits = pool.find_longest_cache_hit(self.block_hashes(), 0, Some(max_blocks), out)?;
        Ok(hits * self.block_size)
    }

    /// Tokens already computed: fixed once started, else looked up afresh (invariant 4).
    pub fn num_computed_tokens(&self, pool: &BlockPool) -> PoolResult<usize> {
        match self.started_with {
            Some(n) => Ok(n),
            None => self.lookup_computed_blocks(pool, &mut Vec::new()),
        }
    }

    /// Marks the prefill as started with `num_computed_tokens`, unless it already started.
    pub fn start_with(&mut self, num_computed_tokens: usize) {
        self.started_with.get_or_insert(num_computed_tokens);
    }

    /// Preemption: forgets the fixed count. Tokens and hashes stay (they are a
    /// function of the tokens).
    pub fn reset(&mut self) {
        self.started_with = None;
    }
}

/// Tokens handed to a sequence: their ids, or only how many there are (for a
/// sequence that keeps no ids, see [`SequenceHasher::keeps_tokens`]).
#[derive(Clone, Copy, Debug)]
pub enum TokenIds<'a> {
    /// The token ids.
    Values(&'a [i64]),
    /// A number of tokens whose ids nothing will read.
    Count(usize),
}

impl TokenIds<'_> {
    /// Number of tokens.
    pub fn len(&self) -> usize {
        match self {
            TokenIds::Values(t) => t.len(),
            TokenIds::Count(n) => *n,
        }
    }

    /// True when there are none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// What every sequence of a tracker or manager shares: the block size and the hash
/// chain (algorithm, `NONE_HASH`, a reused encoding buffer).
#[derive(Debug)]
pub struct SequenceHasher {
    block_size: usize,
    hasher: BlockHasher,
    none_hash: Digest,
    /// False for a manager without prefix caching: nothing would read the hashes.
    hashing: bool,
}

impl SequenceHasher {
    /// Hashes `block_size`-token blocks with `algo`, seeded with `seed`
    /// (`NONE_HASH = H(seed)`; vLLM's default seed is `"vllm-none-hash"`).
    pub fn new(block_size: usize, algo: HashAlgo, seed: &str) -> PoolResult<Self> {
        if block_size == 0 {
            return Err(PoolError::InvalidArgument(
                "block_size must be at least 1".into(),
            ));
        }
        Ok(Self {
            block_size,
            hasher: BlockHasher::new(algo),
            none_hash: none_hash(algo, seed),
            hashing: true,
        })
    }

    /// Stops hashing blocks (for a pool without prefix caching, where no hash is
    /// ever read): sequences then have no block hashes and never a computed token.
    pub fn disable_hashing(&mut self) {
        self.hashing = false;
    }

    /// Tokens per block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// The hash algorithm.
    pub fn algo(&self) -> HashAlgo {
        self.hasher.algo()
    }

    /// `NONE_HASH`, the parent of every first block.
    pub fn none_hash(&self) -> &[u8] {
        &self.none_hash
    }

    /// Whether sequences keep their token ids: only while blocks are hashed. A
    /// manager without prefix caching reads nothing but the counts, so its
    /// sequences keep just those and callers may pass [`TokenIds::Count`].
    pub fn keeps_tokens(&self) -> bool {
        self.hashing
    }

    /// The ids a sequence must keep of `tokens`: all of them while hashing (a bare
    /// count is then an error), none otherwise.
    fn ids_to_keep<'a>(&self, tokens: TokenIds<'a>) -> PoolResult<Option<&'a [i64]>> {
        match tokens {
            TokenIds::Values(ids) if self.hashing => Ok(Some(ids)),
            TokenIds::Count(_) if self.hashing => Err(PoolError::InvalidArgument(
                "a sequence whose blocks are hashed needs its token ids, not a count".into(),
            )),
            _ => Ok(None),
        }
    }

    /// A new sequence with its prompt, its full blocks hashed.
    pub fn new_sequence(
        &mut self,
        prompt: TokenIds<'_>,
        extras: SequenceExtras,
    ) -> PoolResult<Sequence> {
        extras.validate()?;
        let num_prompt_tokens = prompt.len();
        let tokens = match self.ids_to_keep(prompt)? {
            // Room for the tokens a decode adds, so the first appends do not copy the
            // prompt.
            Some(prompt) => {
                let mut tokens = Vec::with_capacity(prompt.len() + (prompt.len() / 2).max(64));
                tokens.extend_from_slice(prompt);
                tokens
            }
            None => Vec::new(),
        };
        let mut seq = Sequence {
            tokens,
            num_tokens: num_prompt_tokens,
            num_prompt_tokens,
            hashes: Vec::new(),
            width: self.algo().digest_len(),
            block_size: self.block_size,
            extras,
            started_with: None,
        };
        self.rehash(&mut seq);
        Ok(seq)
    }

    /// Appends tokens (a prefill chunk's or decode's) and hashes the blocks they
    /// fill; returns how many new block hashes there are. A count is accepted only
    /// where [`keeps_tokens`](Self::keeps_tokens) is false.
    pub fn append_tokens(&mut self, seq: &mut Sequence, tokens: TokenIds<'_>) -> PoolResult<usize> {
        if let Some(ids) = self.ids_to_keep(tokens)? {
            seq.tokens.extend_from_slice(ids);
        }
        seq.num_tokens = seq.num_tokens.saturating_add(tokens.len());
        Ok(self.rehash(seq))
    }

    /// Hashes the sequence's full blocks not hashed yet.
    fn rehash(&mut self, seq: &mut Sequence) -> usize {
        if !self.hashing {
            return 0;
        }
        let inputs = seq.extras.inputs();
        self.hasher.update_chain(
            &self.none_hash,
            &seq.tokens,
            self.block_size,
            &inputs,
            &mut seq.hashes,
        )
    }
}

/// Tracks sequences' block hashes and computed-token counts against a pool, by id.
#[derive(Debug)]
pub struct ComputedBlocksTracker {
    hasher: SequenceHasher,
    seqs: HashMap<RequestId, Sequence>,
}

impl ComputedBlocksTracker {
    /// A tracker hashing `block_size`-token blocks with `algo`, seeded with `seed`
    /// (`NONE_HASH = H(seed)`; vLLM's default seed is `"vllm-none-hash"`).
    pub fn new(block_size: usize, algo: HashAlgo, seed: &str) -> PoolResult<Self> {
        Ok(Self {
            hasher: SequenceHasher::new(block_size, algo, seed)?,
            seqs: HashMap::new(),
        })
    }

    /// Tokens per block.
    pub fn block_size(&self) -> usize {
        self.hasher.block_size()
    }

    /// The hash algorithm.
    pub fn algo(&self) -> HashAlgo {
        self.hasher.algo()
    }

    /// `NONE_HASH`, the parent of every first block.
    pub fn none_hash(&self) -> &[u8] {
        self.hasher.none_hash()
    }

    /// Number of tracked sequences.
    pub fn len(&self) -> usize {
        self.seqs.len()
    }

    /// True when no sequence is tracked.
    pub fn is_empty(&self) -> bool {
        self.seqs.is_empty()
    }

    /// Whether `id` is tracked.
    pub fn contains(&self, id: &RequestId) -> bool {
        self.seqs.contains_key(id)
    }

    /// Fails on the first id that is not tracked (batched calls check all ids first).
    pub fn check_known(&self, ids: &[RequestId]) -> PoolResult<()> {
        match ids.iter().find(|id| !self.seqs.contains_key(*id)) {
            Some(id) => Err(PoolError::UnknownRequest(id.to_string())),
            None => Ok(()),
        }
    }

    /// A tracked sequence.
    pub fn get(&self, id: &RequestId) -> PoolResult<&Sequence> {
        self.seqs
            .get(id)
            .ok_or_else(|| PoolError::UnknownRequest(id.to_string()))
    }

    fn get_mut(&mut self, id: &RequestId) -> PoolResult<&mut Sequence> {
        self.seqs
            .get_mut(id)
            .ok_or_else(|| PoolError::UnknownRequest(id.to_string()))
    }

    /// Starts tracking a sequence with its prompt; hashes its full blocks.
    pub fn add_sequence(
        &mut self,
        id: RequestId,
        prompt: &[i64],
        extras: SequenceExtras,
    ) -> PoolResult<()> {
        if self.seqs.contains_key(&id) {
            return Err(PoolError::DuplicateRequest(id.to_string()));
        }
        let seq = self.hasher.new_sequence(TokenIds::Values(prompt), extras)?;
        self.seqs.insert(id, seq);
        Ok(())
    }

    /// Appends tokens and hashes the blocks they fill; returns how many new block
    /// hashes there are.
    pub fn append_tokens(&mut self, id: &RequestId, tokens: &[i64]) -> PoolResult<usize> {
        let seq = self
            .seqs
            .get_mut(id)
            .ok_or_else(|| PoolError::UnknownRequest(id.to_string()))?;
        self.hasher.append_tokens(seq, TokenIds::Values(tokens))
    }

    /// The sequence's block hashes so far (full blocks only).
    pub fn block_hashes(&self, id: &RequestId) -> PoolResult<HashSlice<'_>> {
        Ok(self.get(id)?.block_hashes())
    }

    /// See [`Sequence::lookup_computed_blocks`].
    pub fn lookup_computed_blocks(
        &self,
        id: &RequestId,
        pool: &BlockPool,
        out: &mut Vec<u32>,
    ) -> PoolResult<usize> {
        self.get(id)?.lookup_computed_blocks(pool, out)
    }

    /// Tokens of the sequence already computed: fixed once started, else looked up
    /// afresh in `pool` (invariant 4).
    pub fn num_computed_tokens(&self, id: &RequestId, pool: &BlockPool) -> PoolResult<usize> {
        self.get(id)?.num_computed_tokens(pool)
    }

    /// Marks the sequence's prefill as started with the count the pool gives now,
    /// and returns it; a started sequence keeps its count.
    pub fn start(&mut self, id: &RequestId, pool: &BlockPool) -> PoolResult<usize> {
        let seq = self
            .seqs
            .get_mut(id)
            .ok_or_else(|| PoolError::UnknownRequest(id.to_string()))?;
        let n = seq.num_computed_tokens(pool)?;
        seq.start_with(n);
        Ok(n)
    }

    /// Marks the sequence's prefill as started with `num_computed_tokens` (what the
    /// scheduler used), unless it already started.
    pub fn start_with(&mut self, id: &RequestId, num_computed_tokens: usize) -> PoolResult<()> {
        self.get_mut(id)?.start_with(num_computed_tokens);
        Ok(())
    }

    /// Preemption: forgets the fixed count; the next query looks up afresh. Tokens
    /// and hashes stay (they are a function of the tokens).
    pub fn reset(&mut self, id: &RequestId) -> PoolResult<()> {
        self.get_mut(id)?.reset();
        Ok(())
    }

    /// Stops tracking the sequence.
    pub fn remove(&mut self, id: &RequestId) -> PoolResult<Sequence> {
        self.seqs
            .remove(id)
            .ok_or_else(|| PoolError::UnknownRequest(id.to_string()))
    }
}
