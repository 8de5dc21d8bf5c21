//! Block hashing from Python: `BlockHasher` (the chain, batched), the request
//! extra keys, and the encoders for tests. The hash list is in `hash_list.rs`.

use std::sync::Mutex;

use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyString, PyTuple};

use super::convert::{extract_i64s, int_arg, opt_str_arg, type_name, with_i64s};
use super::errors::{error, ErrorKind};
pub use super::hash_list::PyBlockHashList;
use super::locking::{with_detached, with_lock};
use crate::pool::hashing::{self, none_hash, BlockHasher, Encoding, HashAlgo, MmFeature, Value};
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
    if let Some(lora) = some(lora) {
        let pair: (String, String) = lora.extract().map_err(|_| {
            error(
                py,
                ErrorKind::Dtype,
                format!(
                    "lora must be a (name, path) tuple of str, got {}",
                    type_name(lora)
                ),
            )
        })?;
        extras.lora = Some(pair);
    }
    extras.cache_salt = opt_str_arg(cache_salt, "cache_salt")?;
    if let Some(mm) = some(mm_features) {
        for item in mm
            .try_iter()
            .map_err(|_| error(py, ErrorKind::Dtype, "mm_features must be a sequence"))?
        {
            let item = item?;
            let (identifier, offset, length): (String, Bound<'_, PyAny>, Bound<'_, PyAny>) =
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
            extras
                .mm_features
                .push(MmFeature::new(identifier, offset as usize, length as usize));
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

/// A Python value as a hash-input [`Value`]: None, int, bytes, str and tuples of them.
pub fn to_value(obj: &Bound<'_, PyAny>) -> PyResult<Value> {
    let py = obj.py();
    if obj.is_none() {
        return Ok(Value::None);
    }
    if obj.is_instance_of::<PyBool>() {
        return Err(error(
            py,
            ErrorKind::Dtype,
            "bool is not a supported hash-input value",
        ));
    }
    if let Ok(b) = obj.cast::<PyBytes>() {
        return Ok(Value::bytes(b.as_bytes()));
    }
    if let Ok(s) = obj.cast::<PyString>() {
        return Ok(Value::Str(s.to_str()?.to_owned()));
    }
    if let Ok(t) = obj.cast::<PyTuple>() {
        return t
            .iter()
            .map(|item| to_value(&item))
            .collect::<PyResult<Vec<_>>>()
            .map(Value::Tuple);
    }
    if obj.is_instance_of::<pyo3::types::PyInt>() {
        return obj.extract::<i128>().map(Value::Int).map_err(|_| {
            error(
                py,
                ErrorKind::InvalidArgument,
                "hash-input ints must fit in 128 bits",
            )
        });
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
        let (none, bs, width) = (&self.none_hash, self.block_size, self.algo.digest_len());
        let chain = |hasher: &mut BlockHasher, tokens: &[i64]| {
            let mut out = Vec::with_capacity(tokens.len() / bs * width);
            hasher.update_chain(none, tokens, bs, &extras.inputs(), &mut out);
            out
        };
        // The tokens are converted (or an int64 array borrowed) before the lock is taken.
        let out = with_i64s(token_ids, "token_ids", |tokens| {
            if tokens.len() > 4096 {
                // Long: hashed with the GIL released, on a copy the caller cannot change.
                let tokens = tokens.to_vec();
                with_detached(py, &self.hasher, |hasher| chain(hasher, &tokens))
            } else {
                with_lock(py, &self.hasher, |hasher| chain(hasher, tokens))
            }
        })?;
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
    /// ``extra_keys`` any None/int/bytes/str/tuple value (vLLM's tagged tuples). With a
    /// pickle-based algorithm and extra keys, Python's pickler encodes: pickle's memo
    /// depends on which of the caller's objects are shared, which only it can see.
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
        let extra = extra_keys.map(to_value).transpose()?;
        let parent = match parent.filter(|p| !p.is_none()) {
            None => None,
            Some(p) => Some(p.cast::<PyBytes>().map_err(|_| {
                error(
                    py,
                    ErrorKind::Dtype,
                    format!("parent must be bytes or None, got {}", type_name(p)),
                )
            })?),
        };
        let parent = parent
            .map(|p| p.as_bytes())
            .filter(|p| !p.is_empty())
            .unwrap_or(&self.none_hash);
        if let (Some(keys), Encoding::Pickle) = (extra_keys, self.algo.encoding()) {
            // pickle memoizes by object identity (vLLM's tag strings are shared interned
            // objects): only Python's own pickler knows which of the caller's objects are
            // shared, so it encodes and Rust hashes.
            let tuple = (PyBytes::new(py, parent), PyTuple::new(py, &tokens)?, keys);
            let bytes = py.import("pickle")?.call_method1("dumps", (tuple, 5))?;
            let bytes = bytes.cast::<PyBytes>()?;
            return Ok(PyBytes::new(py, &self.algo.digest_bytes(bytes.as_bytes())));
        }
        let digest = with_lock(py, &self.hasher, |hasher| {
            hasher.hash_block(parent, &tokens, extra.as_ref())
        });
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
