//! Block hashing from Python: `BlockHasher` (the chain, batched), the request
//! extra keys, and the encoders for tests. The hash list is in `hash_list.rs`.

use std::sync::Mutex;

use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyList, PyString, PyTuple};

use super::convert::{extract_i64s, int_arg, opt_str_arg, str_arg, type_name, utf8_str, with_i64s};
use super::errors::{error, ErrorKind};
pub use super::hash_list::PyBlockHashList;
use super::int_reader::ListTokens;
use super::locking::{lock_if_free, with_detached, with_lock};
use crate::pool::hashing::{
    self, none_hash, BlockHasher, ExtraObjects, HashAlgo, MmFeature, ObjectId, Offset, TokenSource,
    Value, MAX_DEPTH,
};
use crate::pool::{HashSlice, SequenceExtras};

/// Resolves a hash algorithm name (`None`: `sha256_cbor`).
pub fn algo_arg(py: Python<'_>, name: Option<&Bound<'_, PyAny>>) -> PyResult<HashAlgo> {
    let name = opt_str_arg(name, "hash_algo")?.unwrap_or_else(|| "sha256_cbor".to_owned());
    HashAlgo::from_name(&name).ok_or_else(|| {
        error(
            py,
            ErrorKind::InvalidArgument,
            format!("unknown hash_algo {name:?}: expected one of sha256, sha256_cbor, xxhash, xxhash_cbor"),
        )
    })
}

/// The `NONE_HASH` seed: the caller's, else vLLM's deterministic default.
pub fn seed_arg(seed: Option<&Bound<'_, PyAny>>) -> PyResult<String> {
    Ok(opt_str_arg(seed, "seed")?.unwrap_or_else(|| hashing::DEFAULT_NONE_HASH_SEED.to_owned()))
}

/// Reads the extra-key inputs of a request from Python values.
pub fn extract_extras(
    py: Python<'_>,
    lora: Option<&Bound<'_, PyAny>>,
    cache_salt: Option<&Bound<'_, PyAny>>,
    mm_features: Option<&Bound<'_, PyAny>>,
    prompt_embed_digests: Option<&Bound<'_, PyAny>>,
) -> PyResult<SequenceExtras> {
    fn some<'a, 'py>(o: Option<&'a Bound<'py, PyAny>>) -> Option<&'a Bound<'py, PyAny>> {
        o.filter(|o| !o.is_none())
    }
    let mut extras = SequenceExtras::default();
    if [lora, cache_salt, mm_features, prompt_embed_digests]
        .iter()
        .all(|o| some(*o).is_none())
    {
        // The common case: no extra keys, and no tag strings to look up.
        return Ok(extras);
    }
    let mut objects = ObjectIds::new(py);
    if let Some(lora) = some(lora) {
        let pair = lora
            .cast::<PyTuple>()
            .ok()
            .filter(|t| t.len() == 2)
            .and_then(|t| {
                let (name, path) = (t.get_item(0).ok()?, t.get_item(1).ok()?);
                (name.is_instance_of::<PyString>() && path.is_instance_of::<PyString>())
                    .then_some((name, path))
            })
            .ok_or_else(|| {
                error(
                    py,
                    ErrorKind::Dtype,
                    format!(
                        "lora must be a (name, path) tuple of str, got {}",
                        type_name(lora)
                    ),
                )
            })?;
        extras.objects.lora_name = objects.id(&pair.0);
        extras.objects.lora_path = objects.id(&pair.1);
        extras.lora = Some((
            str_arg(&pair.0, "lora name")?,
            str_arg(&pair.1, "lora path")?,
        ));
    }
    if let Some(salt) = some(cache_salt) {
        extras.cache_salt = opt_str_arg(Some(salt), "cache_salt")?;
        extras.objects.cache_salt = objects.id(salt);
    }
    if let Some(mm) = some(mm_features) {
        for item in mm
            .try_iter()
            .map_err(|_| error(py, ErrorKind::Dtype, "mm_features must be a sequence"))?
        {
            let item = item?;
            let (identifier, offset, length): (Bound<'_, PyString>, Bound<'_, PyAny>, Bound<'_, PyAny>) =
                item.extract().map_err(|_| {
                    error(
                        py,
                        ErrorKind::Dtype,
                        format!(
                            "each mm feature must be an (identifier: str, offset: int, length: int) tuple, got {}",
                            type_name(&item)
                        ),
                    )
                })?;
            let offset = int_arg(&offset, "mm feature offset", 0, i64::MAX)?;
            let length = int_arg(&length, "mm feature length", 0, i64::MAX)?;
            extras.objects.mm_identifiers.push(objects.id(&identifier));
            extras.mm_features.push(MmFeature::new(
                str_arg(&identifier, "an mm feature identifier")?,
                offset as usize,
                length as usize,
            ));
        }
    }
    if let Some(digests) = some(prompt_embed_digests) {
        let mut out = Vec::new();
        for item in digests.try_iter().map_err(|_| {
            error(
                py,
                ErrorKind::Dtype,
                "prompt_embed_digests must be a sequence of bytes",
            )
        })? {
            let item = item?;
            let b = item.cast::<PyBytes>().map_err(|_| {
                error(
                    py,
                    ErrorKind::Dtype,
                    format!(
                        "prompt embed digests must be bytes, got {}",
                        type_name(&item)
                    ),
                )
            })?;
            let d: [u8; 32] = b.as_bytes().try_into().map_err(|_| {
                error(
                    py,
                    ErrorKind::HashWidth,
                    format!(
                        "a prompt embed digest must be 32 bytes, got {}",
                        b.as_bytes().len()
                    ),
                )
            })?;
            out.push(d);
        }
        extras.prompt_embed_digests = Some(out);
    }
    extras.validate().map_err(|e| super::errors::to_py(py, e))?;
    Ok(extras)
}

/// Numbers the caller's `str` objects by identity for pickle's memo: vLLM's tag
/// literals (interned strings) get their [`ExtraObjects`] ids, other objects ids
/// of their own; a subclass instance, which kvpool copies, is distinct.
struct ObjectIds<'py> {
    tags: [(Bound<'py, PyString>, ObjectId); 4],
    seen: hashbrown::HashMap<usize, ObjectId>,
}

impl<'py> ObjectIds<'py> {
    fn new(py: Python<'py>) -> Self {
        Self {
            tags: [
                (PyString::intern(py, "lora"), ExtraObjects::LORA_TAG),
                (PyString::intern(py, "mm"), ExtraObjects::MM_TAG),
                (
                    PyString::intern(py, "cache_salt"),
                    ExtraObjects::CACHE_SALT_TAG,
                ),
                (
                    PyString::intern(py, "prompt_embeds"),
                    ExtraObjects::PROMPT_EMBEDS_TAG,
                ),
            ],
            seen: hashbrown::HashMap::new(),
        }
    }

    fn id(&mut self, obj: &Bound<'_, PyAny>) -> ObjectId {
        if !obj.is_exact_instance_of::<PyString>() {
            return ExtraObjects::DISTINCT;
        }
        let addr = obj.as_ptr() as usize;
        if let Some((_, id)) = self.tags.iter().find(|(t, _)| t.as_ptr() as usize == addr) {
            return *id;
        }
        let next = ExtraObjects::FIRST_FREE + self.seen.len() as ObjectId;
        *self.seen.entry(addr).or_insert(next)
    }
}

/// A Python value as a hash-input [`Value`]: None, int, bytes, str and tuples of
/// them, at most [`MAX_DEPTH`] tuples deep (deeper is an `InvalidArgumentError`).
///
/// Object identity is kept for pickle: a `str`, `bytes` or tuple object that occurs
/// more than once becomes [`Value::Shared`], so it pickles as Python's pickler writes
/// it (in full once, then memo references). Subclass instances are made plain,
/// i.e. fresh objects, and so is a tuple holding any.
pub fn to_value(obj: &Bound<'_, PyAny>) -> PyResult<Value> {
    let mut seen = Vec::new();
    let (plain, _) = convert_value(obj, 0, &mut Identity::Record(&mut seen))?;
    seen.sort_unstable();
    let mut repeated: Vec<usize> = seen
        .windows(2)
        .filter(|w| w[0] == w[1])
        .map(|w| w[0])
        .collect();
    if repeated.is_empty() {
        return Ok(plain);
    }
    repeated.dedup();
    Ok(convert_value(obj, 0, &mut Identity::Wrap(&repeated))?.0)
}

/// What [`convert_value`] does with the addresses of the objects it keeps.
enum Identity<'a> {
    /// Collects them, in visiting order.
    Record(&'a mut Vec<usize>),
    /// Wraps those listed (sorted) in [`Value::Shared`], numbered by position.
    Wrap(&'a [usize]),
}

impl Identity<'_> {
    fn keep(&mut self, obj: &Bound<'_, PyAny>, value: Value) -> Value {
        let addr = obj.as_ptr() as usize;
        match self {
            Identity::Record(seen) => {
                seen.push(addr);
                value
            }
            Identity::Wrap(repeated) => match repeated.binary_search(&addr) {
                Ok(i) => Value::Shared(i as u32, Box::new(value)),
                Err(_) => value,
            },
        }
    }
}

/// `obj` as a [`Value`], and whether it is the caller's object itself (exact
/// types) rather than a plain copy.
fn convert_value(
    obj: &Bound<'_, PyAny>,
    depth: usize,
    identity: &mut Identity<'_>,
) -> PyResult<(Value, bool)> {
    let py = obj.py();
    if obj.is_none() {
        return Ok((Value::None, true));
    }
    if obj.is_instance_of::<PyBool>() {
        return Err(error(
            py,
            ErrorKind::Dtype,
            "bool is not a supported hash-input value",
        ));
    }
    if let Ok(b) = obj.cast::<PyBytes>() {
        let value = Value::bytes(b.as_bytes());
        return Ok(if obj.is_exact_instance_of::<PyBytes>() {
            (identity.keep(obj, value), true)
        } else {
            (value, false)
        });
    }
    if let Ok(s) = obj.cast::<PyString>() {
        let value = Value::Str(utf8_str(s, "a hash-input str")?.to_owned());
        return Ok(if obj.is_exact_instance_of::<PyString>() {
            (identity.keep(obj, value), true)
        } else {
            (value, false)
        });
    }
    if let Ok(t) = obj.cast::<PyTuple>() {
        if depth >= MAX_DEPTH {
            return Err(error(
                py,
                ErrorKind::InvalidArgument,
                format!("hash inputs may nest tuples at most {MAX_DEPTH} levels deep"),
            ));
        }
        let mut items = Vec::with_capacity(t.len());
        let mut all_kept = obj.is_exact_instance_of::<PyTuple>();
        for item in t.iter() {
            let (value, kept) = convert_value(&item, depth + 1, identity)?;
            all_kept &= kept;
            items.push(value);
        }
        let value = Value::Tuple(items);
        // The empty tuple is one shared object that pickle never memoizes.
        return Ok(if all_kept && !t.is_empty() {
            (identity.keep(obj, value), true)
        } else {
            (value, all_kept)
        });
    }
    if obj.is_instance_of::<pyo3::types::PyInt>() {
        let v = obj.extract::<i128>().map_err(|_| {
            error(
                py,
                ErrorKind::InvalidArgument,
                "hash-input ints must fit in 128 bits",
            )
        })?;
        return Ok((
            Value::Int(v),
            obj.is_exact_instance_of::<pyo3::types::PyInt>(),
        ));
    }
    Err(error(
        py,
        ErrorKind::Dtype,
        format!(
            "hash inputs may be None, int, bytes, str or tuples of them, not {}",
            type_name(obj)
        ),
    ))
}

/// Hashes token blocks into chains of vLLM-compatible block hashes.
///
/// ``BlockHasher(block_size, hash_algo="sha256_cbor", seed=None)``: ``hash_algo`` is
/// one of ``sha256``, ``sha256_cbor``, ``xxhash``, ``xxhash_cbor``; ``NONE_HASH`` is
/// ``H(seed)``, the seed defaulting to vLLM's ``"vllm-none-hash"``.
#[pyclass(frozen, module = "kvpool", name = "BlockHasher")]
pub struct PyBlockHasher {
    hasher: Mutex<BlockHasher>,
    none_hash: Vec<u8>,
    block_size: usize,
    algo: HashAlgo,
}

impl PyBlockHasher {
    /// Appends to `out` the hashes of the full blocks of `token_ids` from block `start`
    /// on, the first chained to `parent`; reads only the tokens from block `start` on.
    /// A list is read in place (only the blocks hashed), with no Python code run, so
    /// the lock may be held; where that stops (an item that is not a plain int), the
    /// rest is converted and hashing continues from there. Long inputs are hashed with
    /// the GIL released, on a copy the caller cannot change.
    fn chain_into(
        &self,
        py: Python<'_>,
        parent: &[u8],
        token_ids: &Bound<'_, PyAny>,
        start: usize,
        extras: &SequenceExtras,
        out: &mut Vec<u8>,
    ) -> PyResult<()> {
        let (bs, width) = (self.block_size, self.algo.digest_len());
        let mut done = 0;
        // The multimodal walk, carried from the list's pass to the general one, so the
        // two passes hash what one would.
        let mut walk = None;
        if let Some(mut source) = token_ids
            .cast::<PyList>()
            .ok()
            .filter(|list| list.len() <= 4096)
            .and_then(ListTokens::new)
        {
            done = with_lock(py, &self.hasher, |hasher| {
                let inputs = extras.inputs();
                hasher.continue_chain_from(parent, &mut source, bs, start, &inputs, &mut walk, out)
            });
            // Done when every block was hashed and the partial tail holds plain ints
            // too (the general path would refuse anything else).
            let full = extras.inputs().hashable_blocks(source.len() / bs);
            let from = start.saturating_mul(bs).min(source.len()).max(full * bs);
            if start + done >= full && source.tokens(from, source.len() - from).is_some() {
                return Ok(());
            }
        }
        let next_parent = if done > 0 {
            out[out.len() - width..].to_vec()
        } else {
            parent.to_vec()
        };
        // (No sequence is longer than isize::MAX: a start beyond it skips everything.)
        let skip = start.saturating_mul(bs).min(isize::MAX as usize);
        let rest = if skip == 0 {
            token_ids.clone()
        } else {
            token_ids
                .get_item(pyo3::types::PySlice::new(py, skip as isize, isize::MAX, 1))
                .map_err(|_| {
                    error(
                        py,
                        ErrorKind::Dtype,
                        format!(
                            "token_ids must be a 1-D numpy integer array or a sequence of ints, got {}",
                            type_name(token_ids)
                        ),
                    )
                })?
        };
        let chain = |hasher: &mut BlockHasher, tokens: &[i64], out: &mut Vec<u8>| {
            let mut source = Offset::new(tokens, skip);
            let inputs = extras.inputs();
            let mut walk = walk;
            hasher.continue_chain_from(
                &next_parent,
                &mut source,
                bs,
                start + done,
                &inputs,
                &mut walk,
                out,
            )
        };
        // The tokens are converted (or an int64 array borrowed) before the lock is taken.
        // A borrowed array is only safe while the GIL is kept, so the lock is waited for
        // (which gives the GIL up) only with a copy, the borrow let go.
        let copied = with_i64s(&rest, "token_ids", |tokens| {
            if tokens.len() > 4096 {
                return Some(tokens.to_vec());
            }
            match lock_if_free(&self.hasher) {
                Some(mut hasher) => {
                    chain(&mut hasher, tokens, out);
                    None
                }
                None => Some(tokens.to_vec()),
            }
        })?;
        if let Some(tokens) = copied {
            if tokens.len() > 4096 {
                with_detached(py, &self.hasher, |hasher| chain(hasher, &tokens, out));
            } else {
                with_lock(py, &self.hasher, |hasher| chain(hasher, &tokens, out));
            }
        }
        Ok(())
    }
}

#[pymethods]
impl PyBlockHasher {
    #[new]
    #[pyo3(signature = (block_size, *, hash_algo=None, seed=None))]
    fn new(
        py: Python<'_>,
        block_size: &Bound<'_, PyAny>,
        hash_algo: Option<&Bound<'_, PyAny>>,
        seed: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let block_size = int_arg(block_size, "block_size", 1, u32::MAX as i64)? as usize;
        let algo = algo_arg(py, hash_algo)?;
        Ok(Self {
            hasher: Mutex::new(BlockHasher::new(algo)),
            none_hash: none_hash(algo, &seed_arg(seed)?).to_vec(),
            block_size,
            algo,
        })
    }

    /// Tokens per block.
    #[getter]
    fn block_size(&self) -> usize {
        self.block_size
    }

    /// The algorithm's name.
    #[getter]
    fn hash_algo(&self) -> &'static str {
        self.algo.name()
    }

    /// ``NONE_HASH``, the parent of every first block.
    #[getter]
    fn none_hash<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.none_hash)
    }

    /// Hashes every full block of ``token_ids`` (numpy int array or list), with the
    /// request's extra keys. Returns a ``BlockHashList``.
    #[pyo3(signature = (token_ids, *, lora=None, cache_salt=None, mm_features=None, prompt_embed_digests=None))]
    fn hash_tokens(
        &self,
        py: Python<'_>,
        token_ids: &Bound<'_, PyAny>,
        lora: Option<&Bound<'_, PyAny>>,
        cache_salt: Option<&Bound<'_, PyAny>>,
        mm_features: Option<&Bound<'_, PyAny>>,
        prompt_embed_digests: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyBlockHashList> {
        let extras = extract_extras(py, lora, cache_salt, mm_features, prompt_embed_digests)?;
        let mut out = Vec::new();
        self.chain_into(py, &self.none_hash, token_ids, 0, &extras, &mut out)?;
        Ok(PyBlockHashList::new(out, self.algo))
    }

    /// Hashes several requests' tokens in one call; returns one ``BlockHashList`` each.
    fn hash_tokens_many(
        &self,
        py: Python<'_>,
        token_lists: &Bound<'_, PyAny>,
    ) -> PyResult<Vec<PyBlockHashList>> {
        let mut all = Vec::new();
        for item in token_lists
            .try_iter()
            .map_err(|_| error(py, ErrorKind::Dtype, "token_lists must be a sequence"))?
        {
            let mut tokens = Vec::new();
            extract_i64s(&item?, "token_ids", &mut tokens)?;
            all.push(tokens);
        }
        let (none, bs, algo) = (&self.none_hash, self.block_size, self.algo);
        let extras = SequenceExtras::default();
        let lists = with_detached(py, &self.hasher, |hasher| {
            all.iter()
                .map(|tokens| {
                    let mut out = Vec::new();
                    hasher.update_chain(none, tokens, bs, &extras.inputs(), &mut out);
                    out
                })
                .collect::<Vec<_>>()
        });
        Ok(lists
            .into_iter()
            .map(|b| PyBlockHashList::new(b, algo))
            .collect())
    }

    /// The hashes of the full blocks of ``token_ids`` (a request's tokens so far) from
    /// block ``start_block`` on, the first chained to ``parent`` (the hash of block
    /// ``start_block - 1``; None: this hasher's ``NONE_HASH``), as a list of ``bytes``:
    /// what vLLM's ``request_block_hasher`` appends to ``request.block_hashes``.
    /// Multimodal inputs are walked from ``start_block`` as vLLM's hasher resumes.
    /// Only the tokens from block ``start_block`` on are read (a list's in place).
    #[pyo3(signature = (parent, token_ids, start_block, *, lora=None, cache_salt=None, mm_features=None, prompt_embed_digests=None))]
    #[allow(clippy::too_many_arguments)]
    fn hash_blocks_from<'py>(
        &self,
        py: Python<'py>,
        parent: Option<&Bound<'py, PyAny>>,
        token_ids: &Bound<'py, PyAny>,
        start_block: &Bound<'py, PyAny>,
        lora: Option<&Bound<'py, PyAny>>,
        cache_salt: Option<&Bound<'py, PyAny>>,
        mm_features: Option<&Bound<'py, PyAny>>,
        prompt_embed_digests: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyList>> {
        let start = int_arg(start_block, "start_block", 0, i64::MAX)? as usize;
        let parent: Vec<u8> = match parent.filter(|p| !p.is_none()) {
            None => self.none_hash.clone(),
            Some(p) => {
                let b = p.cast::<PyBytes>().map_err(|_| {
                    error(
                        py,
                        ErrorKind::Dtype,
                        format!("parent must be bytes or None, got {}", type_name(p)),
                    )
                })?;
                let b = b.as_bytes();
                if b.is_empty() || b.len() > hashing::MAX_DIGEST_LEN {
                    return Err(error(
                        py,
                        ErrorKind::HashWidth,
                        format!(
                            "parent is {} bytes wide; a hash must have 1 to 32 bytes",
                            b.len()
                        ),
                    ));
                }
                b.to_vec()
            }
        };
        let extras = extract_extras(py, lora, cache_salt, mm_features, prompt_embed_digests)?;
        let mut out = Vec::new();
        self.chain_into(py, &parent, token_ids, start, &extras, &mut out)?;
        hash_list(py, &out, self.algo.digest_len())
    }

    /// Appends to ``hashes`` the hashes of the full blocks of ``token_ids`` (all of
    /// the request's tokens so far) that it lacks; the old blocks are not rehashed.
    /// Returns the number of new hashes.
    #[pyo3(signature = (hashes, token_ids, *, lora=None, cache_salt=None, mm_features=None, prompt_embed_digests=None))]
    #[allow(clippy::too_many_arguments)]
    fn extend(
        &self,
        py: Python<'_>,
        hashes: &Bound<'_, PyAny>,
        token_ids: &Bound<'_, PyAny>,
        lora: Option<&Bound<'_, PyAny>>,
        cache_salt: Option<&Bound<'_, PyAny>>,
        mm_features: Option<&Bound<'_, PyAny>>,
        prompt_embed_digests: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<usize> {
        let list = hashes
            .cast::<PyBlockHashList>()
            .map_err(|_| {
                error(
                    py,
                    ErrorKind::Dtype,
                    format!("hashes must be a BlockHashList, got {}", type_name(hashes)),
                )
            })?
            .get();
        if list.algo() != self.algo {
            return Err(error(
                py,
                ErrorKind::HashWidth,
                format!(
                    "hash list is {} but this hasher is {}",
                    list.algo().name(),
                    self.algo.name()
                ),
            ));
        }
        let extras = extract_extras(py, lora, cache_salt, mm_features, prompt_embed_digests)?;
        let mut tokens = Vec::new();
        extract_i64s(token_ids, "token_ids", &mut tokens)?;
        // Locks in the order hasher, then list (a leaf lock); nothing else takes both.
        Ok(with_lock(py, &self.hasher, |hasher| {
            list.with_bytes(|flat| {
                hasher.update_chain(
                    &self.none_hash,
                    &tokens,
                    self.block_size,
                    &extras.inputs(),
                    flat,
                )
            })
        }))
    }

    /// One block's hash: ``H((parent or NONE_HASH, tuple(token_ids), extra_keys))``,
    /// ``extra_keys`` any None/int/bytes/str/tuple value (vLLM's tagged tuples). For the
    /// pickle algorithms, objects the caller shares (the same str twice, vLLM's tag
    /// literals) are memo references, as in Python's pickle.
    #[pyo3(signature = (parent, token_ids, extra_keys=None))]
    fn hash_block<'py>(
        &self,
        py: Python<'py>,
        parent: Option<&Bound<'py, PyAny>>,
        token_ids: &Bound<'py, PyAny>,
        extra_keys: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let mut tokens = Vec::new();
        extract_i64s(token_ids, "token_ids", &mut tokens)?;
        let extra_keys = extra_keys.filter(|e| !e.is_none());
        let parent_obj = parent.filter(|p| !p.is_none());
        let parent = match parent_obj {
            None => None,
            Some(p) => Some(p.cast::<PyBytes>().map_err(|_| {
                error(
                    py,
                    ErrorKind::Dtype,
                    format!("parent must be bytes or None, got {}", type_name(p)),
                )
            })?),
        };
        let parent = match parent.map(|p| p.as_bytes()) {
            None => &self.none_hash[..],
            Some(p) if !p.is_empty() && p.len() <= crate::pool::MAX_HASH_WIDTH => p,
            Some(p) => {
                return Err(error(
                    py,
                    ErrorKind::HashWidth,
                    format!(
                    "parent is {} bytes wide; a hash must have 1 to 32 bytes (None for no parent)",
                    p.len()
                ),
                ))
            }
        };
        // The parent is the pickle's first object: if the extra keys hold that very
        // object, pickle writes it there as a memo reference, so the identities are
        // taken over both, and the whole triple is hashed as one value.
        let (parent_value, extra) = match (parent_obj, extra_keys) {
            (Some(p), Some(e)) => match to_value(PyTuple::new(py, [p, e])?.as_any())? {
                Value::Tuple(mut pair) if pair.len() == 2 => {
                    let e = pair.pop();
                    (pair.pop().filter(|p| matches!(p, Value::Shared(..))), e)
                }
                _ => {
                    return Err(error(
                        py,
                        ErrorKind::InvalidArgument,
                        "unconvertible hash input",
                    ))
                }
            },
            (_, e) => (None, e.map(to_value).transpose()?),
        };
        let digest = match parent_value {
            Some(parent_value) => {
                let tokens = Value::tuple(tokens.iter().map(|&t| Value::from(t)));
                let whole = Value::tuple([parent_value, tokens, extra.unwrap_or(Value::None)]);
                self.algo.hash_value(&whole)
            }
            None => with_lock(py, &self.hasher, |hasher| {
                hasher.hash_block(parent, &tokens, extra.as_ref())
            }),
        };
        Ok(PyBytes::new(py, &digest))
    }

    fn __repr__(&self) -> String {
        format!(
            "BlockHasher(block_size={}, hash_algo={:?})",
            self.block_size,
            self.algo.name()
        )
    }
}

/// ``NONE_HASH`` of ``hash_algo`` for ``seed`` (vLLM's default seed when None).
#[pyfunction]
#[pyo3(signature = (hash_algo=None, seed=None))]
pub fn compute_none_hash<'py>(
    py: Python<'py>,
    hash_algo: Option<&Bound<'py, PyAny>>,
    seed: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyBytes>> {
    let algo = algo_arg(py, hash_algo)?;
    Ok(PyBytes::new(py, &none_hash(algo, &seed_arg(seed)?)))
}

/// The bytes ``hash_algo`` hashes for ``value``: ``cbor2.dumps(value, canonical=True)``
/// or ``pickle.dumps(value, protocol=5)``, encoded in Rust. For pickle, every str, bytes
/// and tuple is written as a distinct object; where the caller passes the *same* object
/// twice, Python's pickler writes a memo reference instead, and the bytes differ.
#[pyfunction]
#[pyo3(signature = (value, hash_algo=None))]
pub fn encode_hash_input<'py>(
    py: Python<'py>,
    value: &Bound<'py, PyAny>,
    hash_algo: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyBytes>> {
    let algo = algo_arg(py, hash_algo)?;
    let mut out = Vec::new();
    algo.encode(&to_value(value)?, &mut out);
    Ok(PyBytes::new(py, &out))
}

/// ``H(value)`` with ``hash_algo``, as vLLM's hash functions compute it.
#[pyfunction]
#[pyo3(signature = (value, hash_algo=None))]
pub fn hash_value<'py>(
    py: Python<'py>,
    value: &Bound<'py, PyAny>,
    hash_algo: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyBytes>> {
    let algo = algo_arg(py, hash_algo)?;
    Ok(PyBytes::new(py, &algo.hash_value(&to_value(value)?)))
}

/// The core's view of a hash list given from Python: a `BlockHashList`, a sequence
/// of `bytes`, or a numpy integer array (8-byte big-endian ids).
pub fn hash_slice_of(flat: &[u8], width: usize) -> HashSlice<'_> {
    if width == 0 {
        HashSlice::empty()
    } else {
        HashSlice::new(flat, width).unwrap_or_else(|_| HashSlice::empty())
    }
}

/// Flat digests of `width` bytes as a list of `bytes`.
fn hash_list<'py>(py: Python<'py>, flat: &[u8], width: usize) -> PyResult<Bound<'py, PyList>> {
    PyList::new(py, flat.chunks_exact(width).map(|d| PyBytes::new(py, d)))
}
