#!/usr/bin/env python3
"""Generate kvpool's block-hashing reference vectors: src/hashing/vectors.rs.

Run with CPython 3.11 (its C pickler is the reference for `sha256`/`xxhash`),
cbor2 and xxhash installed:

    python3 gen_vectors.py > src/hashing/vectors.rs

Three kinds of vectors:
- encodings: values with their `cbor2.dumps(v, canonical=True)` and
  `pickle.dumps(v, protocol=5)` bytes (hex when short, else length + sha256);
- block hashes: NONE_HASH for some seeds, and single blocks with and without
  extra keys, under all four vLLM hash functions;
- chains: whole requests (LoRA, cache salt, multimodal inputs, prompt
  embeddings) hashed by a transcription of vLLM's `request_block_hasher`, in
  the steps vLLM would take (prompt first, then appended tokens).

Every value is built from distinct objects and its pickle is checked to contain
no BINGET (the Rust encoder never emits one; see pickle.rs).
"""

import hashlib
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

# --- vLLM's block hashing (vllm/v1/core/kv_cache_utils.py), transcribed ------


class Feature:
    def __init__(self, identifier, offset, length):
        self.identifier, self.offset, self.length = identifier, offset, length


class Request:
    def __init__(self, tokens, lora_name=None, cache_salt=None, mm=(), embeds=None):
        self.all_token_ids = tokens
        self.lora_name = lora_name
        self.cache_salt = cache_salt
        self.mm_features = list(mm)
        self.embed_digests = embeds  # per-block sha256 of the prompt embeddings
        self.block_hashes = []


def gen_mm_extra_hash_keys(request, start_token_idx, end_token_idx, start_mm_idx):
    extra_keys = []
    mm_features = request.mm_features
    if not mm_features:
        return extra_keys, start_mm_idx
    last = mm_features[-1]
    if last.offset + last.length <= start_token_idx:
        return extra_keys, start_mm_idx
    if start_mm_idx < 0:
        start_mm_idx = len(mm_features) + start_mm_idx
    curr_mm_idx = start_mm_idx
    while mm_features and curr_mm_idx < len(mm_features):
        f = mm_features[curr_mm_idx]
        offset, length = f.offset, f.length
        if end_token_idx > offset:
            if start_token_idx >= offset + length:
                curr_mm_idx += 1
                continue
            extra_keys.append((f.identifier, offset - start_token_idx))
            if end_token_idx >= offset + length:
                curr_mm_idx += 1
            else:
                break
        else:
            break
    return extra_keys, curr_mm_idx


def generate_block_hash_extra_keys(request, start_token_idx, end_token_idx, start_mm_idx):
    mm_keys, new_start_mm_idx = gen_mm_extra_hash_keys(request, start_token_idx, end_token_idx, start_mm_idx)
    lora_keys = [request.lora_name] if request.lora_name is not None else []
    salt_keys = [request.cache_salt] if (start_token_idx == 0 and request.cache_salt) else []
    embeds_keys = []
    if request.embed_digests is not None:
        embeds_keys = [request.embed_digests[start_token_idx // BLOCK_SIZE[0]]]
    extra_keys = lora_keys + mm_keys + salt_keys + embeds_keys
    if not extra_keys:
        return None, new_start_mm_idx
    return tuple(extra_keys), new_start_mm_idx


def hash_block_tokens(hash_function, none_hash, parent_block_hash, curr_block_token_ids, extra_keys):
    if not parent_block_hash:
        parent_block_hash = none_hash
    return hash_function((parent_block_hash, tuple(curr_block_token_ids), extra_keys))


BLOCK_SIZE = [16]  # set per chain vector; read by generate_block_hash_extra_keys


def request_block_hasher(request, block_size, hash_fn, none_hash):
    start_token_idx = len(request.block_hashes) * block_size
    num_tokens = len(request.all_token_ids)
    if start_token_idx + block_size > num_tokens:
        return []
    curr_mm_idx = -1 if start_token_idx > 0 else 0
    prev = request.block_hashes[-1] if request.block_hashes else None
    new = []
    while True:
        end_token_idx = start_token_idx + block_size
        if end_token_idx > num_tokens:
            break
        extra_keys, curr_mm_idx = generate_block_hash_extra_keys(request, start_token_idx, end_token_idx, curr_mm_idx)
        h = hash_block_tokens(hash_fn, none_hash, prev, request.all_token_ids[start_token_idx:end_token_idx], extra_keys)
        new.append(h)
        start_token_idx += block_size
        prev = h
    return new


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
    # A fresh object every time: slicing a longer string copies it.
    fresh = (text + "\0")[:-1] if text else text
    return V(fresh, f"s({rs_str(text)})")


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


def no_binget(py):
    ops = {op.name for op, _, _ in pickletools.genops(pickle.dumps(py, protocol=5))}
    return not ({"BINGET", "LONG_BINGET", "GET"} & ops)


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
        ("vllm-like extra keys", t(s("my-lora"), t(s("mm-hash-0"), i(3)), t(s("mm-hash-1"), i(-5)), s("salt"), b(hashlib.sha256(b"e").digest()))),
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
    pub lora_name: Option<&'static str>,
    pub cache_salt: Option<&'static str>,
    pub mm_features: Vec<MmFeature>,
    pub prompt_embeds: Option<Vec<[u8; 32]>>,
    /// (algo, NONE_HASH seed, all block hashes concatenated, hex).
    pub expected: Vec<(HashAlgo, &'static str, &'static str)>,
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
    embed = hashlib.sha256(b"prompt-embeds-block-0").digest()
    extras = [
        ("no extra keys", None),
        ("lora only", t(s("my-lora"))),
        ("all kinds", t(s("my-lora"), t(s("0123456789abcdef0123456789abcdef"), i(3)), t(s("fedcba"), i(-5)), s("tenant-salt"), b(embed))),
        ("unicode salt", t(s("s\u00e9l \u20ac \U0001f600"))),
        ("many mm", t(*[t(s(f"img{k}"), i(k - 2)) for k in range(6)])),
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
                    none_hash = fn(seed)
                    ex_py = extra.py if extra else None
                    assert no_binget((none_hash, tuple(tokens), ex_py))
                    d = hash_block_tokens(fn, none_hash, None, tokens, ex_py)
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
    return [
        # name, tokens, block_size, steps, lora, salt, mm, embeds
        ("plain prompt", toks[:100], 16, [100], None, None, [], None),
        ("plain, decode steps", toks[:140], 16, [100, 111, 112, 113, 128, 140], None, None, [], None),
        ("lora + salt", toks[:100], 16, [100], "lora-x", "tenant-1", [], None),
        ("empty salt", toks[:40], 16, [40], None, "", [], None),
        ("multimodal", toks[:100], 16, [100], None, None, feats, None),
        ("everything", toks[:100], 16, [100], "lora-x", "tenant-1", feats, embeds),
        ("everything, decode steps", toks[:160], 16, [70, 100, 130, 160], "lora-x", "tenant-1", feats, embeds),
        # vLLM resumes the mm walk at the last input: block [96, 112) gets only img-late-b.
        ("mm resume quirk", toks[:130], 16, [110, 130], None, None, [("img-late-a", 100, 3), ("img-late-b", 105, 5)], None),
        ("nested mm inputs", toks[:64], 16, [64], None, None, [("outer", 0, 40), ("inner", 5, 3)], None),
        ("mm feature spanning blocks", toks[:200], 8, [200], None, None, [("long", 3, 150), ("after", 160, 8)], None),
        ("block size 1", toks[:5], 1, [5], "l", "s", [("m", 1, 2)], None),
        ("block size 2", toks[:9], 2, [9], None, None, [], None),
        ("block size 3", toks[:9], 3, [4, 9], "l", None, [], None),
        ("block size 64", toks[:300], 64, [300], None, None, [], None),
        ("no full block", toks[:10], 16, [10], None, None, [], None),
    ]


def emit_chains(out):
    out.append("/// The 300 token ids the chain vectors take prefixes of.")
    out.append(f"const CHAIN_TOKENS: [i64; 300] = {rs_tokens(chain_tokens()).replace('vec!', '')};\n")
    out.append("pub(super) fn chain_vectors() -> Vec<ChainVector> {\n    vec![")
    for name, tokens, bs, steps, lora, salt, mm, embeds in chain_cases():
        BLOCK_SIZE[0] = bs
        exp = []
        for algo, fn in ALGOS:
            for seed in SEEDS[:1]:
                none_hash = fn(seed)
                req = Request([], (lora + "\0")[:-1] if lora else lora, (salt + "\0")[:-1] if salt else salt,
                              [Feature((ident + "\0")[:-1], o, l) for ident, o, l in mm], embeds)
                for n_tok in steps:
                    req.all_token_ids = tokens[:n_tok]
                    req.block_hashes.extend(request_block_hasher(req, bs, fn, none_hash))
                flat = b"".join(req.block_hashes)
                exp.append(f"(HashAlgo::{algo}, {rs_str(seed)}, \"{flat.hex()}\")")
        mm_rs = "vec![" + ", ".join(f"MmFeature::new({rs_str(ident)}, {o}, {l})" for ident, o, l in mm) + "]"
        assert embeds is None or embeds == [hashlib.sha256(f"embeds-{k}".encode()).digest() for k in range(len(embeds))]
        emb_rs = "None" if embeds is None else f"Some(embed_digests({len(embeds)}))"
        assert tokens == chain_tokens()[: len(tokens)]
        opt = lambda x: "None" if x is None else f"Some({rs_str(x)})"
        out.append(
            f"        ChainVector {{ name: {rs_str(name)}, tokens: chain_tokens({len(tokens)}), block_size: {bs}, "
            f"steps: vec!{steps}, lora_name: {opt(lora)}, cache_salt: {opt(salt)}, mm_features: {mm_rs}, "
            f"prompt_embeds: {emb_rs}, expected: vec![{', '.join(exp)}] }},"
        )
    out.append("    ]\n}\n")


def main():
    out = [HEADER]
    emit_encodings(out)
    emit_none_hashes(out)
    emit_blocks(out)
    emit_chains(out)
    sys.stdout.write("\n".join(out))


if __name__ == "__main__":
    main()
