#!/usr/bin/env python3
"""Generate kvpool's block-hashing reference vectors: src/hashing/vectors.rs.

Run with CPython 3.11 (its C pickler is the reference for `sha256`/`xxhash`),
cbor2 and xxhash installed:

    python3 gen_vectors.py > src/hashing/vectors.rs

Three kinds of vectors:
- encodings: values with their `cbor2.dumps(v, canonical=True)` and
  `pickle.dumps(v, protocol=5)` bytes (hex when short, else length + sha256);
- block hashes: NONE_HASH for some seeds, and single blocks with and without
  extra keys (as `Value`s), under all four vLLM hash functions;
- chains: whole requests (LoRA, cache salt, multimodal inputs, prompt
  embeddings) hashed by a transcription of vLLM 0.33's `request_block_hasher`
  (tagged extra keys, resuming the multimodal walk with
  `get_mm_features_in_window`), in the steps vLLM would take (prompt first,
  then appended tokens); with the block hashes under all four functions and the
  exact pickle of every hashed block.

The encoding and single-block values are built from distinct objects, and their
pickles are checked to contain no BINGET: the Rust `Value` encoder never emits
one (see pickle.rs). The chains are built as vLLM builds them, so their extra
keys share the tag literals and a block with several multimodal inputs pickles
the repeated "mm" as a BINGET, which the Rust extra-keys encoder reproduces.
"""

import bisect
import hashlib
import os
import pickle
import pickletools
import random
import sys

import cbor2
import xxhash

assert sys.version_info[:2] == (3, 11), "the C pickler of CPython 3.11 is the reference"

# --- vLLM's hash functions (vllm/utils/hashing.py) --------------------------


def sha256(x):
    return hashlib.sha256(pickle.dumps(x, protocol=5)).digest()


def sha256_cbor(x):
    return hashlib.sha256(cbor2.dumps(x, canonical=True)).digest()


def xxhash_pickle(x):
    return xxhash.xxh3_128_digest(pickle.dumps(x, protocol=5))


def xxhash_cbor(x):
    return xxhash.xxh3_128_digest(cbor2.dumps(x, canonical=True))


ALGOS = [
    ("Sha256", sha256),
    ("Sha256Cbor", sha256_cbor),
    ("Xxhash", xxhash_pickle),
    ("XxhashCbor", xxhash_cbor),
]

# --- vLLM 0.33's block hashing, transcribed ----------------------------------
#
# From vllm/v1/core/kv_cache_utils.py (`resolve_none_hash_seed`, `init_none_hash`,
# `_gen_mm_extra_hash_keys`, `_gen_lora_extra_hash_keys`,
# `_gen_prompt_embeds_extra_hash_keys`, `generate_block_hash_extra_keys`,
# `hash_block_tokens`, `get_request_block_hasher` without the hash-lookahead
# variant) and vllm/multimodal/utils.py (`get_mm_features_in_window`), statement
# for statement. The request and its parts are reduced to the attributes these
# functions read. As in vLLM, the tags ("lora", "mm", "cache_salt",
# "prompt_embeds") are string literals, i.e. one interned object each, so a
# block with two multimodal inputs pickles its second "mm" as a BINGET.

DEFAULT_NONE_HASH_SEED = "vllm-none-hash"
_NON_CRYPTO_HASH_FUNCTIONS = frozenset({xxhash_pickle, xxhash_cbor})
NONE_HASH = None


def resolve_none_hash_seed(hash_fn, environ):
    # vLLM reads os.getenv("PYTHONHASHSEED"); `environ` stands in for os.environ.
    hash_seed = environ.get("PYTHONHASHSEED")
    if hash_seed is not None:
        return hash_seed
    if hash_fn in _NON_CRYPTO_HASH_FUNCTIONS:
        return os.urandom(32).hex()
    return DEFAULT_NONE_HASH_SEED


def init_none_hash(hash_fn, environ):
    global NONE_HASH
    NONE_HASH = hash_fn(resolve_none_hash_seed(hash_fn, environ))
    return NONE_HASH


class PlaceholderRange:
    def __init__(self, offset, length):
        self.offset, self.length = offset, length


class MultiModalFeatureSpec:
    def __init__(self, identifier, offset, length):
        self.identifier = identifier
        self.mm_position = PlaceholderRange(offset, length)


class LoRARequest:
    def __init__(self, lora_name, lora_path):
        self.lora_name, self.lora_path = lora_name, lora_path


def fresh(text):
    """A new str object equal to `text` (slicing a longer string copies it)."""
    return (text + "\0")[:-1]


class Request:
    def __init__(self, block_size, lora=None, cache_salt=None, mm=(), embeds=None):
        self.all_token_ids = []
        # Every user string is its own object, as vLLM's request parsing makes them.
        self.lora_request = LoRARequest(fresh(lora[0]), fresh(lora[1])) if lora else None
        self.cache_salt = fresh(cache_salt) if cache_salt else cache_salt
        self.mm_features = [MultiModalFeatureSpec(fresh(ident), o, l) for ident, o, l in mm]
        # We have no embedding tensors, only each block's digest; they go in the
        # per-block cache that vLLM consults before hashing the tensor itself.
        self.prompt_embeds = None if embeds is None else "stand-in for the tensor"
        self._prompt_embeds_per_block_hashes = {
            (k * block_size, (k + 1) * block_size): d for k, d in enumerate(embeds or [])
        }
        self.block_hashes = []

    @property
    def num_tokens(self):
        return len(self.all_token_ids)


def get_mm_features_in_window(mm_features, start, end):
    lo = bisect.bisect_left(
        mm_features,
        start + 1,
        key=lambda f: f.mm_position.offset + f.mm_position.length,
    )
    hi = bisect.bisect_left(
        mm_features,
        end,
        key=lambda f: f.mm_position.offset,
    )
    return lo, hi


def _gen_mm_extra_hash_keys(request, start_token_idx, end_token_idx, start_mm_idx):
    extra_keys = []

    mm_features = request.mm_features
    if not mm_features:
        return extra_keys, start_mm_idx

    last_pos = mm_features[-1].mm_position
    if last_pos.offset + last_pos.length <= start_token_idx:
        return extra_keys, start_mm_idx

    if start_mm_idx < 0:
        assert -start_mm_idx <= len(mm_features)
        start_mm_idx = len(mm_features) + start_mm_idx

    curr_mm_idx = start_mm_idx
    while mm_features and curr_mm_idx < len(mm_features):
        mm_feature = mm_features[curr_mm_idx]
        assert mm_feature.identifier is not None
        offset = mm_feature.mm_position.offset
        length = mm_feature.mm_position.length
        if end_token_idx > offset:
            if start_token_idx >= offset + length:
                curr_mm_idx += 1
                continue
            extra_keys.append(("mm", mm_feature.identifier, offset - start_token_idx))
            if end_token_idx >= offset + length:
                curr_mm_idx += 1
            else:
                break
        else:
            break
    return extra_keys, curr_mm_idx


def _gen_lora_extra_hash_keys(request):
    lora_request = request.lora_request
    if not lora_request:
        return []
    return [("lora", lora_request.lora_name, lora_request.lora_path)]


def _gen_prompt_embeds_extra_hash_keys(request, start_token_idx, end_token_idx):
    if request.prompt_embeds is None:
        return []
    block_range = (start_token_idx, end_token_idx)
    embeds_hash = request._prompt_embeds_per_block_hashes.get(block_range)
    if embeds_hash is None:
        # vLLM hashes request.prompt_embeds[start:end] here; the vectors give
        # every block's digest, and the Rust chain ends at a missing one.
        raise AssertionError(f"no prompt-embeds digest for block {block_range}")
    return [("prompt_embeds", embeds_hash)]


def generate_block_hash_extra_keys(request, start_token_idx, end_token_idx, start_mm_idx):
    mm_extra_keys, new_start_mm_idx = _gen_mm_extra_hash_keys(
        request, start_token_idx, end_token_idx, start_mm_idx
    )
    lora_extra_keys = _gen_lora_extra_hash_keys(request)
    cache_salt_keys = (
        [("cache_salt", request.cache_salt)]
        if (start_token_idx == 0 and request.cache_salt)
        else []
    )
    prompt_embeds_keys = _gen_prompt_embeds_extra_hash_keys(
        request, start_token_idx, end_token_idx
    )

    extra_keys = lora_extra_keys + mm_extra_keys + cache_salt_keys + prompt_embeds_keys

    if not extra_keys:
        return None, new_start_mm_idx

    return tuple(extra_keys), new_start_mm_idx


def hash_block_tokens(hash_function, parent_block_hash, curr_block_token_ids, extra_keys=None):
    if not parent_block_hash:
        parent_block_hash = NONE_HASH

    curr_block_token_ids_tuple = tuple(curr_block_token_ids)
    return hash_function((parent_block_hash, curr_block_token_ids_tuple, extra_keys))


def get_request_block_hasher(hash_block_size, caching_hash_fn):
    def request_block_hasher(request):
        start_token_idx = len(request.block_hashes) * hash_block_size
        num_tokens = request.num_tokens

        if start_token_idx + hash_block_size > num_tokens:
            return []

        curr_mm_idx = 0
        mm_features = request.mm_features
        if start_token_idx > 0 and mm_features:
            last_mm_pos = mm_features[-1].mm_position
            if last_mm_pos.offset + last_mm_pos.length > start_token_idx:
                curr_mm_idx, _ = get_mm_features_in_window(
                    mm_features,
                    start_token_idx,
                    start_token_idx + hash_block_size,
                )

        prev_block_hash_value = request.block_hashes[-1] if request.block_hashes else None
        new_block_hashes = []
        while True:
            end_token_idx = start_token_idx + hash_block_size
            if end_token_idx > num_tokens:
                break

            extra_keys, curr_mm_idx = generate_block_hash_extra_keys(
                request, start_token_idx, end_token_idx, curr_mm_idx
            )

            block_tokens = request.all_token_ids[start_token_idx:end_token_idx]
            block_hash = hash_block_tokens(
                caching_hash_fn, prev_block_hash_value, block_tokens, extra_keys
            )

            new_block_hashes.append(block_hash)
            start_token_idx += hash_block_size
            prev_block_hash_value = block_hash

        return new_block_hashes

    return request_block_hasher


# --- Values with their Rust spelling ------------------------------------------


class V:
    """A Python value and the Rust expression that builds the same `Value`."""

    def __init__(self, py, rs):
        self.py, self.rs = py, rs


def rs_str(s):
    out = []
    for ch in s:
        c = ord(ch)
        if ch in '"\\':
            out.append("\\" + ch)
        elif 0x20 <= c < 0x7F:
            out.append(ch)
        else:
            out.append("\\u{%x}" % c)
    return '"' + "".join(out) + '"'


def none():
    return V(None, "n()")


def i(n):
    return V(n, f"i({n})")


def s(text):
    # A fresh object every time (but CPython shares "" and 1-character strings).
    return V(fresh(text) if text else text, f"s({rs_str(text)})")


def b(data):
    fresh = bytes(bytearray(data))
    return V(fresh, f'b("{data.hex()}")')


def t(*items):
    return V(tuple(x.py for x in items), "t(vec![" + ", ".join(x.rs for x in items) + "])")


def big_bytes(n):
    return V(bytes(k % 251 for k in range(n)), f"big_bytes({n})")


def ascii_str(n):
    return V("".join(chr(97 + k % 26) for k in range(n)), f"ascii_str({n})")


def uni_str(n):
    # n characters of 1 to 4 UTF-8 bytes each.
    cycle = ["a", "\u00e9", "\u20ac", "\U0001f600", "z"]
    return V("".join(cycle[k % 5] for k in range(n)), f"uni_str({n})")


def int_range(lo, hi):
    return V(tuple(range(lo, hi)), f"int_range({lo}, {hi})")


def str_seq(n, m):
    return V(tuple(f"{k:05d}" + "q" * (m - 5) for k in range(n)), f"str_seq({n}, {m})")


def pairs(n):
    return V(tuple((f"{k:04d}", k * 1000003) for k in range(n)), f"pairs({n})")


def nones(n):
    return V((None,) * n, f"nones({n})")


def binget_count(data):
    return sum(op.name in ("BINGET", "LONG_BINGET", "GET") for op, _, _ in pickletools.genops(data))


def no_binget(py):
    return binget_count(pickle.dumps(py, protocol=5)) == 0


INT_EDGES = [
    0, 1, 23, 24, 127, 128, 255, 256, 65535, 65536, 2**31 - 1, 2**31, 2**32 - 1, 2**32,
    2**39, 2**40 - 1, 2**63 - 1, 2**63, 2**64 - 1, 2**64, 2**100, 2**127 - 1,
    -1, -23, -24, -25, -128, -129, -255, -256, -257, -32768, -65536, -65537,
    -2**31, -2**31 - 1, -2**32, -2**32 - 1, -2**39, -2**39 - 1, -2**40,
    -2**63, -2**63 - 1, -2**64, -2**64 - 1, -2**100, -2**127,
]


def encoding_cases():
    cases = [("none", none())]
    cases += [(f"int {n}", i(n)) for n in INT_EDGES]
    for n in [0, 1, 23, 24, 255, 256, 65535, 65536, 70000]:
        cases.append((f"ascii_str {n}", ascii_str(n) if n else s("")))
    for n in [1, 3, 100, 1000, 20000]:
        cases.append((f"uni_str {n}", uni_str(n)))
    cases += [("str e-acute", s("\u00e9")), ("str euro", s("\u20ac")), ("str emoji", s("\U0001f600")), ("str quote", s('a"b\\c\n'))]
    for n in [0, 1, 23, 24, 255, 256, 65535, 65536, 70000]:
        cases.append((f"bytes {n}", big_bytes(n)))
    cases.append(("bytes zero", b(b"\0")))
    # Tuples of every opcode shape.
    for n in [0, 1, 2, 3, 4, 5, 23, 24, 255, 256, 300, 70000]:
        cases.append((f"int_range {n}", int_range(0, n)))
    cases.append(("int_range big ints", int_range(2**31 - 3, 2**31 + 3)))
    cases += [
        ("nested empties", t(t(), t(t()), t(t(), t()))),
        ("nested mixed", t(t(i(1), t(i(2), t(i(3), none()))), b(b"x"), s("y"))),
        ("vllm-like extra keys", t(
            t(s("lora"), s("my-lora"), s("/adapters/my-lora")),
            t(s("mm"), s("mm-hash-0"), i(3)),
            t(s("mm"), s("mm-hash-1"), i(-5)),
            t(s("cache_salt"), s("salt")),
            t(s("prompt_embeds"), b(hashlib.sha256(b"e").digest())),
        )),
        ("equal strings, distinct objects", t(s("abc"), s("abc"), b(b"xy"), b(b"xy"))),
        ("four items", t(none(), i(-1), s("four"), b(b"4"))),
    ]
    # Frame edges: large payloads leave frames; frames close at 64 KiB.
    cases += [
        ("big bytes inside tuple", t(b(b"ab"), big_bytes(70000), s("cd"))),
        ("big str inside tuple", t(s("ab"), ascii_str(70000), s("cd"))),
        ("big bytes then 4 bytes", t(big_bytes(70000))),
        ("two big payloads", t(big_bytes(65536), ascii_str(65536), i(1))),
        ("frame closes after memoize", t(ascii_str(65530), ascii_str(10), i(1))),
        ("frame closes mid tuple", t(ascii_str(65533), none(), none(), none(), none())),
        ("many strs", str_seq(2000, 40)),
        ("many tuples", pairs(3000)),
        ("many nones", nones(70000)),
        ("just under frame", t(big_bytes(65535 - 9))),
        ("full frame before tuple end", t(ascii_str(65531))),
        ("full frame in nested tuple end", t(t(ascii_str(65531)), i(5))),
    ]
    return cases


def random_value(rng, depth=0):
    kind = rng.choice(["none", "int", "int", "str", "bytes", "tuple", "tuple"] if depth < 3 else ["none", "int", "str", "bytes"])
    if kind == "none":
        return none()
    if kind == "int":
        if rng.random() < 0.5:
            return i(rng.choice(INT_EDGES) + rng.randint(-2, 2))
        bits = rng.randint(0, 126)
        return i(rng.randint(-(2**bits), 2**bits))
    if kind == "str":
        n = rng.choice([0, 1, 2, 5, 30, 130])
        chars = []
        for _ in range(n):
            r = rng.random()
            if r < 0.7:
                chars.append(chr(rng.randint(0x20, 0x7E)))
            elif r < 0.85:
                chars.append(chr(rng.randint(0xA0, 0x7FF)))
            elif r < 0.95:
                chars.append(chr(rng.choice([rng.randint(0x800, 0xD7FF), rng.randint(0xE000, 0xFFFF)])))
            else:
                chars.append(chr(rng.randint(0x10000, 0x10FFFF)))
        return s("".join(chars))
    if kind == "bytes":
        n = rng.choice([0, 1, 2, 16, 32, 255, 256])
        return b(bytes(rng.randrange(256) for _ in range(n)))
    n = rng.choice([0, 1, 2, 3, 4, 5, 8, 30])
    return t(*[random_value(rng, depth + 1) for _ in range(n)])


def expected(data, short=400):
    if len(data) <= short:
        return f'Hex("{data.hex()}")'
    return f'Digest {{ len: {len(data)}, sha256: "{hashlib.sha256(data).hexdigest()}" }}'


# --- Emit -------------------------------------------------------------------------

HEADER = '''\
//! Reference vectors from CPython 3.11, cbor2 5.9 and xxhash 3.8.
//!
//! GENERATED by `gen_vectors.py` (see its docstring); do not edit by hand.
#![allow(clippy::all, clippy::pedantic)]

use super::algo::HashAlgo;
use super::extra::MmFeature;
use super::value::Value;

/// Lower-case hex of `bytes`.
pub(super) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len()).step_by(2).map(|k| u8::from_str_radix(&s[k..k + 2], 16).unwrap()).collect()
}

fn sha256_hex(data: &[u8]) -> String {
    use sha2::Digest as _;
    hex(&sha2::Sha256::digest(data))
}

/// An expected encoding: its bytes, or for long ones its length and SHA-256.
pub(super) enum Expected {
    Hex(&'static str),
    Digest { len: usize, sha256: &'static str },
}

/// Asserts that `got` is the expected encoding.
pub(super) fn check_encoding(name: &str, got: &[u8], expected: &Expected) {
    match expected {
        Expected::Hex(h) => assert_eq!(hex(got), *h, "{name}"),
        Expected::Digest { len, sha256 } => {
            assert_eq!(got.len(), *len, "{name}: length");
            assert_eq!(sha256_hex(got), *sha256, "{name}: sha256");
        }
    }
}

pub(super) struct EncVector {
    pub name: &'static str,
    pub build: fn() -> Value,
    pub cbor: Expected,
    pub pickle: Expected,
}

pub(super) struct BlockVector {
    pub name: &'static str,
    pub algo: HashAlgo,
    pub seed: &'static str,
    pub tokens: Vec<i64>,
    pub extra: Option<Value>,
    pub digest: &'static str,
}

pub(super) struct ChainVector {
    pub name: &'static str,
    pub tokens: Vec<i64>,
    pub block_size: usize,
    /// Token counts at each hasher call (vLLM hashes the prompt, then appended tokens).
    pub steps: Vec<usize>,
    /// The LoRA adapter's (name, path).
    pub lora: Option<(&'static str, &'static str)>,
    pub cache_salt: Option<&'static str>,
    pub mm_features: Vec<MmFeature>,
    pub prompt_embeds: Option<Vec<[u8; 32]>>,
    /// (algo, NONE_HASH seed, all block hashes concatenated, hex).
    pub expected: Vec<(HashAlgo, &'static str, &'static str)>,
    /// The pickle of each hashed `(parent, tokens, extra_keys)` under `sha256`
    /// (seed `vllm-none-hash`), in hashing order, hex; empty for the random chains.
    pub pickles: Vec<&'static str>,
}

fn n() -> Value {
    Value::None
}
fn i(v: i128) -> Value {
    Value::Int(v)
}
fn s(v: &str) -> Value {
    Value::Str(v.to_owned())
}
fn b(h: &str) -> Value {
    Value::Bytes(unhex(h))
}
fn t(items: Vec<Value>) -> Value {
    Value::Tuple(items)
}
fn big_bytes(n: usize) -> Value {
    Value::Bytes((0..n).map(|k| (k % 251) as u8).collect())
}
fn ascii_str(n: usize) -> Value {
    Value::Str((0..n).map(|k| (b'a' + (k % 26) as u8) as char).collect())
}
fn uni_str(n: usize) -> Value {
    const CYCLE: [char; 5] = ['a', '\\u{e9}', '\\u{20ac}', '\\u{1f600}', 'z'];
    Value::Str((0..n).map(|k| CYCLE[k % 5]).collect())
}
fn int_range(lo: i128, hi: i128) -> Value {
    Value::Tuple((lo..hi).map(Value::Int).collect())
}
fn str_seq(n: usize, m: usize) -> Value {
    Value::Tuple((0..n).map(|k| Value::Str(format!("{k:05}{}", "q".repeat(m - 5)))).collect())
}
fn pairs(n: i128) -> Value {
    Value::Tuple((0..n).map(|k| t(vec![Value::Str(format!("{k:04}")), i(k * 1000003)])).collect())
}
fn nones(n: usize) -> Value {
    Value::Tuple(vec![Value::None; n])
}
fn chain_tokens(n: usize) -> Vec<i64> {
    CHAIN_TOKENS[..n].to_vec()
}
/// `hashlib.sha256(f"embeds-{k}".encode()).digest()` for k in 0..n.
fn embed_digests(n: usize) -> Vec<[u8; 32]> {
    use sha2::Digest as _;
    (0..n).map(|k| sha2::Sha256::digest(format!("embeds-{k}").as_bytes()).into()).collect()
}
'''


def emit_encodings(out):
    cases = encoding_cases()
    rng = random.Random(20240601)
    k = 0
    while k < 100:
        v = random_value(rng)
        if no_binget(v.py):
            cases.append((f"random {k}", v, 64))
            k += 1
    out.append("pub(super) fn encoding_vectors() -> Vec<EncVector> {\n    vec![")
    for case in cases:
        name, v, short = case if len(case) == 3 else (*case, 400)
        assert no_binget(v.py), name
        c = cbor2.dumps(v.py, canonical=True)
        p = pickle.dumps(v.py, protocol=5)
        out.append(
            f"        EncVector {{ name: {rs_str(name)}, build: || {v.rs}, "
            f"cbor: Expected::{expected(c, short)}, pickle: Expected::{expected(p, short)} }},"
        )
    out.append("    ]\n}\n")


SEEDS = ["vllm-none-hash", "0", "12345"]
TOKENS16 = [1, 2, 3, 100, 255, 256, 65535, 65536, 151643, 2**31 - 1, 2**31, 2**32 + 5, 2**40, 2**63 - 1, 0, 7]


def emit_none_hashes(out):
    out.append("pub(super) fn none_hash_vectors() -> Vec<(HashAlgo, &'static str, &'static str)> {\n    vec![")
    for algo, fn in ALGOS:
        for seed in SEEDS:
            out.append(f"        (HashAlgo::{algo}, {rs_str(seed)}, \"{fn(seed).hex()}\"),")
    out.append("    ]\n}\n")


def rs_tokens(tokens):
    return "vec![" + ", ".join(str(x) for x in tokens) + "]"


def emit_blocks(out):
    # Tagged extra keys as `Value`s: every tag is a distinct object here (no
    # BINGET); the chains cover vLLM's shared tag objects.
    embed = hashlib.sha256(b"prompt-embeds-block-0").digest()
    extras = [
        ("no extra keys", None),
        ("lora only", t(t(s("lora"), s("my-lora"), s("/adapters/my-lora")))),
        ("all kinds", t(
            t(s("lora"), s("my-lora"), s("/adapters/my-lora")),
            t(s("mm"), s("0123456789abcdef0123456789abcdef"), i(3)),
            t(s("mm"), s("fedcba"), i(-5)),
            t(s("cache_salt"), s("tenant-salt")),
            t(s("prompt_embeds"), b(embed)),
        )),
        ("unicode salt", t(t(s("cache_salt"), s("s\u00e9l \u20ac \U0001f600")))),
        ("many mm", t(*[t(s("mm"), s(f"img{k}"), i(k - 2)) for k in range(6)])),
    ]
    token_sets = [
        ("16 tokens", TOKENS16, rs_tokens(TOKENS16)),
        ("negative tokens", [-1, -(2**31), -(2**63), 5], rs_tokens([-1, -(2**31), -(2**63), 5])),
        ("1 token", [42], "vec![42]"),
        ("2 tokens", [42, 43], "vec![42, 43]"),
        ("3 tokens", [42, 43, 44], "vec![42, 43, 44]"),
        ("40000 tokens", [k * 7919 for k in range(40000)], "(0..40000).map(|k| k * 7919).collect()"),
    ]
    out.append("pub(super) fn block_vectors() -> Vec<BlockVector> {\n    vec![")
    for algo, fn in ALGOS:
        for tname, tokens, trs in token_sets:
            for ename, extra in extras:
                if tname != "16 tokens" and ename not in ("no extra keys", "all kinds"):
                    continue
                for seed in SEEDS[:2] if tname == "16 tokens" else SEEDS[:1]:
                    none_hash = init_none_hash(fn, {"PYTHONHASHSEED": seed})
                    ex_py = extra.py if extra else None
                    assert no_binget((none_hash, tuple(tokens), ex_py))
                    d = hash_block_tokens(fn, None, tokens, ex_py)
                    ex_rs = f"Some({extra.rs})" if extra else "None"
                    name = f"{algo} {tname}, {ename}, seed {seed!r}"
                    out.append(
                        f"        BlockVector {{ name: {rs_str(name)}, algo: HashAlgo::{algo}, seed: {rs_str(seed)}, "
                        f"tokens: {trs}, extra: {ex_rs}, digest: \"{d.hex()}\" }},"
                    )
    out.append("    ]\n}\n")


def chain_tokens():
    rng = random.Random(7)
    toks = [rng.randrange(0, 152000) for _ in range(300)]
    toks[50] = 2**33  # one id beyond 32 bits
    return toks


def chain_cases():
    toks = chain_tokens()
    embeds = [hashlib.sha256(f"embeds-{k}".encode()).digest() for k in range(40)]
    feats = [("img-a", 5, 20), ("img-b", 40, 10), ("img-c", 58, 4), ("img-d", 62, 2)]
    lora = ("lora-x", "/adapters/lora-x")
    nested = [("outer", 0, 100), ("b", 10, 5), ("c", 20, 5)]
    cases = [
        # name, tokens, block_size, steps, lora, salt, mm, embeds
        ("plain prompt", toks[:100], 16, [100], None, None, [], None),
        ("plain, decode steps", toks[:140], 16, [100, 111, 112, 113, 128, 140], None, None, [], None),
        ("lora + salt", toks[:100], 16, [100], lora, "tenant-1", [], None),
        ("lora, decode steps", toks[:64], 16, [20, 33, 64], lora, None, [], None),
        ("empty salt", toks[:40], 16, [40], None, "", [], None),
        ("multimodal", toks[:100], 16, [100], None, None, feats, None),
        ("everything", toks[:100], 16, [100], lora, "tenant-1", feats, embeds),
        ("everything, decode steps", toks[:160], 16, [70, 100, 130, 160], lora, "tenant-1", feats, embeds),
        ("three mm in one block", toks[:64], 16, [64], None, None, [("a", 2, 3), ("b", 6, 2), ("c", 9, 4), ("d", 20, 30)], None),
        ("many mm in one block", toks[:64], 32, [64], lora, "s", [(f"m{k:02d}", 2 * k, 1) for k in range(14)], None),
        # User strings equal to the tags are not the tag objects: no BINGET for them.
        ("strings equal to tags", toks[:40], 16, [40], ("mm", "lora"), "cache_salt", [("mm", 3, 2), ("prompt_embeds", 6, 1)], None),
        # Resuming inside an input: the walk restarts at the first input ending after the resume point.
        ("mm resume mid-input", toks[:130], 16, [110, 130], None, None, [("img-late-a", 100, 3), ("img-late-b", 105, 5)], None),
        ("mm resume after the last input", toks[:64], 16, [20, 64], None, None, [("early", 2, 5)], None),
        ("mm resume, many steps", toks[:200], 8, [50, 57, 64, 120, 121, 200], None, None, [("long", 3, 150), ("after", 160, 8)], None),
        ("mm feature spanning blocks", toks[:200], 8, [200], None, None, [("long", 3, 150), ("after", 160, 8)], None),
        # Nested inputs: resuming at token 16 bisects past "outer" (vLLM quirk) ...
        ("nested mm, resumed", toks[:64], 16, [20, 64], None, None, nested, None),
        # ... which hashing at once reports in block 1.
        ("nested mm, at once", toks[:64], 16, [64], None, None, nested, None),
        ("nested mm inputs", toks[:64], 16, [64], None, None, [("outer", 0, 40), ("inner", 5, 3)], None),
        ("block size 1", toks[:5], 1, [5], ("l", "p"), "s", [("m", 1, 2)], None),
        ("block size 1, resumed", toks[:6], 1, [2, 3, 6], ("l", "p"), "s", [("m", 1, 2), ("n", 3, 2)], None),
        ("block size 2", toks[:9], 2, [9], None, None, [], None),
        ("block size 3", toks[:9], 3, [4, 9], ("l", "p"), None, [], None),
        ("block size 64", toks[:300], 64, [300], None, None, [], None),
        ("no full block", toks[:10], 16, [10], None, None, [], None),
    ]
    # Random requests: inputs sorted by offset (possibly overlapping or nested),
    # random block sizes and steps.
    rng = random.Random(33)
    for k in range(12):
        n = rng.randint(20, 150)
        bs = rng.choice([2, 3, 4, 5, 8, 16])
        mm = sorted(
            ((f"r{k}-{j}", rng.randrange(n), rng.randint(0, 40)) for j in range(rng.randint(0, 6))),
            key=lambda f: f[1],
        )
        steps = sorted(rng.sample(range(1, n), rng.randint(0, 4))) + [n]
        lo = ("r-lora", "/r/lora") if rng.random() < 0.5 else None
        salt = "r-salt" if rng.random() < 0.5 else None
        emb = embeds if bs == 16 and rng.random() < 0.5 else None
        cases.append((f"random {k}", toks[:n], bs, steps, lo, salt, mm, emb))
    return cases


def run_chain(fn, environ, tokens, bs, steps, lora, salt, mm, embeds, log=None):
    """Hashes a request as vLLM does: one `request_block_hasher` call per step."""
    init_none_hash(fn, environ)
    hash_fn = fn
    if log is not None:
        def hash_fn(x):
            log.append(pickle.dumps(x, protocol=5))
            return fn(x)
    hasher = get_request_block_hasher(bs, hash_fn)
    req = Request(bs, lora, salt, mm, embeds)
    for n_tok in steps:
        req.all_token_ids = tokens[:n_tok]
        req.block_hashes.extend(hasher(req))
    return NONE_HASH, req.block_hashes


# The NONE_HASH environment per algorithm: the SHA-256 variants use the fixed
# default seed; the xxhash ones need PYTHONHASHSEED to be reproducible.
CHAIN_ENV = {
    "Sha256": {},
    "Sha256Cbor": {},
    "Xxhash": {"PYTHONHASHSEED": "0"},
    "XxhashCbor": {"PYTHONHASHSEED": "0"},
}


def emit_chains(out):
    assert resolve_none_hash_seed(sha256, {}) == DEFAULT_NONE_HASH_SEED
    assert resolve_none_hash_seed(xxhash_cbor, {}) != resolve_none_hash_seed(xxhash_cbor, {})
    out.append("/// The 300 token ids the chain vectors take prefixes of.")
    out.append(f"const CHAIN_TOKENS: [i64; 300] = {rs_tokens(chain_tokens()).replace('vec!', '')};\n")
    out.append("pub(super) fn chain_vectors() -> Vec<ChainVector> {\n    vec![")
    results = {}
    bingets = 0
    for name, tokens, bs, steps, lora, salt, mm, embeds in chain_cases():
        exp = []
        for algo, fn in ALGOS:
            env = CHAIN_ENV[algo]
            seed = resolve_none_hash_seed(fn, env)
            _, hashes = run_chain(fn, env, tokens, bs, steps, lora, salt, mm, embeds)
            flat = b"".join(hashes)
            results[(name, algo)] = flat
            exp.append(f"(HashAlgo::{algo}, {rs_str(seed)}, \"{flat.hex()}\")")
        log = []
        _, hashes = run_chain(sha256, CHAIN_ENV["Sha256"], tokens, bs, steps, lora, salt, mm, embeds, log)
        assert [hashlib.sha256(p).digest() for p in log] == hashes
        for p in log:
            # Only the tag "mm" ever repeats in a block, so vLLM's pickle has one
            # BINGET per multimodal entry after the first.
            extra_keys = pickle.loads(p)[2] or ()
            n_mm = sum(1 for key in extra_keys if key[0] == "mm")
            assert binget_count(p) == max(0, n_mm - 1), (name, n_mm)
            bingets += binget_count(p)
        # (Not spelled out for the random chains, to keep this file small.)
        pickles_rs = "vec![]" if name.startswith("random") else "vec![" + ", ".join(f'"{p.hex()}"' for p in log) + "]"
        mm_rs = "vec![" + ", ".join(f"MmFeature::new({rs_str(ident)}, {o}, {l})" for ident, o, l in mm) + "]"
        assert embeds is None or embeds == [hashlib.sha256(f"embeds-{k}".encode()).digest() for k in range(len(embeds))]
        emb_rs = "None" if embeds is None else f"Some(embed_digests({len(embeds)}))"
        assert tokens == chain_tokens()[: len(tokens)]
        opt = lambda x: "None" if x is None else f"Some({rs_str(x)})"
        lora_rs = "None" if lora is None else f"Some(({rs_str(lora[0])}, {rs_str(lora[1])}))"
        out.append(
            f"        ChainVector {{ name: {rs_str(name)}, tokens: chain_tokens({len(tokens)}), block_size: {bs}, "
            f"steps: vec!{steps}, lora: {lora_rs}, cache_salt: {opt(salt)}, mm_features: {mm_rs}, "
            f"prompt_embeds: {emb_rs}, expected: vec![{', '.join(exp)}], pickles: {pickles_rs} }},"
        )
    out.append("    ]\n}\n")
    # The quirk vectors really differ, and shared "mm" tags really occur.
    assert results[("nested mm, resumed", "Sha256")] != results[("nested mm, at once", "Sha256")]
    assert results[("mm resume, many steps", "Sha256")] == results[("mm feature spanning blocks", "Sha256")]
    assert bingets >= 5, bingets


def main():
    out = [HEADER]
    emit_encodings(out)
    emit_none_hashes(out)
    emit_blocks(out)
    emit_chains(out)
    sys.stdout.write("\n".join(out))


if __name__ == "__main__":
    main()
