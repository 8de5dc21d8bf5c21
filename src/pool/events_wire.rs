//! KV-cache events as vLLM 0.33's publisher puts them on the wire: the msgpack of an
//! `EventBatch` (`vllm/distributed/kv_events.py`, encoded by `msgspec`), written
//! straight from the pool's events, with no Python object per event.
//!
//! The batch is an array `[ts, events, data_parallel_rank]` (nil for no rank); each
//! event a map whose first key is `"type"` (the class name), then the fields in vLLM's
//! order, a field equal to its default (`None`) left out. msgspec sizes a struct's map
//! header for all the fields it could write, so `BlockStored` (16 with the tag) always
//! has a map16 header, the other two a fixmap. Hashes go as
//! integers, the last 8 bytes big-endian (vLLM's default
//! `VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES`); a `BlockStored` carries one extra-key entry
//! per block: nil, or an array of the LoRA name, `[identifier, offset]` per multimodal
//! input, the cache salt and the prompt-embeddings digest (bin), as vLLM sends them.
//! `kvpool.wire` (the same in Python, checked against vLLM's encoder) is this module's
//! oracle in the tests.

use super::events::{EventExtraKey, PoolEvent, StoredBlocks};
use super::hash_key::BlockHash;

/// How a batch is labelled: what vLLM's manager and publisher add to the pool's events.
#[derive(Clone, Debug, Default)]
pub struct WireBatch<'a> {
    /// The batch's timestamp.
    pub ts: f64,
    /// The data-parallel rank, if any.
    pub data_parallel_rank: Option<i64>,
    /// The storage medium (`"GPU"`).
    pub medium: &'a str,
    /// Per group index: `kv_cache_spec_kind` and `kv_cache_spec_sliding_window` for the
    /// group's `BlockStored` events (a group not listed gets neither).
    pub group_specs: &'a [(u32, Option<&'a str>, Option<i64>)],
}

/// A msgpack writer for the handful of types the events use, in msgspec's forms (the
/// smallest encoding of each int, str and container length; floats as float64).
struct Writer<'a>(&'a mut Vec<u8>);

impl Writer<'_> {
    fn nil(&mut self) {
        self.0.push(0xc0);
    }

    #[inline]
    fn uint(&mut self, v: u64) {
        let out = &mut *self.0;
        if v < 0x80 {
            out.push(v as u8);
        } else if v <= u8::MAX as u64 {
            out.extend_from_slice(&[0xcc, v as u8]);
        } else if v <= u16::MAX as u64 {
            out.push(0xcd);
            out.extend_from_slice(&(v as u16).to_be_bytes());
        } else if v <= u32::MAX as u64 {
            out.push(0xce);
            out.extend_from_slice(&(v as u32).to_be_bytes());
        } else {
            out.push(0xcf);
            out.extend_from_slice(&v.to_be_bytes());
        }
    }

    fn int(&mut self, v: i64) {
        if v >= 0 {
            return self.uint(v as u64);
        }
        let out = &mut *self.0;
        if v >= -32 {
            out.push(v as i8 as u8);
        } else if v >= i8::MIN as i64 {
            out.extend_from_slice(&[0xd0, v as i8 as u8]);
        } else if v >= i16::MIN as i64 {
            out.push(0xd1);
            out.extend_from_slice(&(v as i16).to_be_bytes());
        } else if v >= i32::MIN as i64 {
            out.push(0xd2);
            out.extend_from_slice(&(v as i32).to_be_bytes());
        } else {
            out.push(0xd3);
            out.extend_from_slice(&v.to_be_bytes());
        }
    }

    fn opt_int(&mut self, v: Option<i64>) {
        match v {
            Some(v) => self.int(v),
            None => self.nil(),
        }
    }

    fn f64(&mut self, v: f64) {
        self.0.push(0xcb);
        self.0.extend_from_slice(&v.to_be_bytes());
    }

    fn str(&mut self, s: &str) {
        let n = s.len();
        let out = &mut *self.0;
        if n < 32 {
            out.push(0xa0 | n as u8);
        } else if n <= u8::MAX as usize {
            out.extend_from_slice(&[0xd9, n as u8]);
        } else if n <= u16::MAX as usize {
            out.push(0xda);
            out.extend_from_slice(&(n as u16).to_be_bytes());
        } else {
            out.push(0xdb);
            out.extend_from_slice(&(n as u32).to_be_bytes());
        }
        out.extend_from_slice(s.as_bytes());
    }

    fn opt_str(&mut self, s: Option<&str>) {
        match s {
            Some(s) => self.str(s),
            None => self.nil(),
        }
    }

    fn len(&mut self, n: usize, fix: u8, x16: u8, x32: u8) {
        let out = &mut *self.0;
        if n < 16 {
            out.push(fix | n as u8);
        } else if n <= u16::MAX as usize {
            out.push(x16);
            out.extend_from_slice(&(n as u16).to_be_bytes());
        } else {
            out.push(x32);
            out.extend_from_slice(&(n as u32).to_be_bytes());
        }
    }

    /// msgpack bin (bin8 for the 32-byte digests it writes).
    fn bin(&mut self, b: &[u8]) {
        match b.len() {
            n if n <= 0xff => self.0.extend_from_slice(&[0xc4, n as u8]),
            n if n <= 0xffff => {
                self.0.push(0xc5);
                self.0.extend_from_slice(&(n as u16).to_be_bytes());
            }
            n => {
                self.0.push(0xc6);
                self.0.extend_from_slice(&(n as u32).to_be_bytes());
            }
        }
        self.0.extend_from_slice(b);
    }

    /// One block's extra keys as vLLM's event carries them: nil or an array of entries.
    fn extra_keys(&mut self, keys: Option<&[EventExtraKey]>) {
        let Some(keys) = keys else {
            return self.nil();
        };
        self.array(keys.len());
        for key in keys {
            match key {
                EventExtraKey::Text(s) => self.str(s),
                EventExtraKey::Mm(identifier, offset) => {
                    self.array(2);
                    self.str(identifier);
                    self.int(*offset);
                }
                EventExtraKey::Digest(d) => self.bin(d),
            }
        }
    }

    fn array(&mut self, n: usize) {
        self.len(n, 0x90, 0xdc, 0xdd);
    }

    fn map(&mut self, n: usize) {
        self.len(n, 0x80, 0xde, 0xdf);
    }

    /// A map16 header, whatever the count (msgspec's for a struct of 16 or more fields).
    fn map16(&mut self, n: usize) {
        self.0.push(0xde);
        self.0.extend_from_slice(&(n as u16).to_be_bytes());
    }

    fn hash(&mut self, h: &BlockHash) {
        self.uint(wire_hash(h.as_bytes()));
    }
}

/// The bytes every `BlockRemoved` starts with: a map of four fields, the tag, and the
/// header of its one-hash array.
const REMOVED_HEAD: &[u8] = b"\x84\xa4type\xacBlockRemoved\xacblock_hashes\x91";

/// A block hash as vLLM puts it on the wire: its last 8 bytes, big-endian.
pub fn wire_hash(hash: &[u8]) -> u64 {
    match hash.last_chunk::<8>() {
        Some(tail) => u64::from_be_bytes(*tail),
        None => hash.iter().fold(0u64, |acc, &b| (acc << 8) | u64::from(b)),
    }
}

/// An upper bound of the bytes [`encode_event_batch`] writes, so that it writes into one
/// allocation.
fn size_bound(events: &[PoolEvent], batch: &WireBatch<'_>) -> usize {
    let fixed = 64 + batch.medium.len();
    // A `BlockStored` names its own group's spec (kind and window), nothing else does.
    let spec_bytes = |group: u32| {
        batch
            .group_specs
            .iter()
            .find(|(g, _, _)| *g == group)
            .map_or(0, |(_, k, _)| k.map_or(0, str::len) + 48)
    };
    events
        .iter()
        .map(|e| match e {
            PoolEvent::BlockStored(stored) => {
                let StoredBlocks {
                    block_hashes,
                    token_ids,
                    lora_name,
                    extra_keys,
                    group_idx,
                    ..
                } = &**stored;
                fixed
                    + spec_bytes(*group_idx)
                    + 9 * token_ids.len()
                    + block_hashes.len() * (10 + lora_name.as_ref().map_or(1, |n| n.len() + 6))
                    + extra_keys.as_ref().map_or(0, |blocks| {
                        blocks
                            .iter()
                            .flatten()
                            .flatten()
                            .map(|k| match k {
                                EventExtraKey::Text(s) => s.len() + 5,
                                EventExtraKey::Mm(s, _) => s.len() + 15,
                                EventExtraKey::Digest(_) => 34,
                            })
                            .sum::<usize>()
                            + 5 * blocks.len()
                    })
            }
            PoolEvent::BlockRemoved { .. } => fixed,
            PoolEvent::AllBlocksCleared => 24,
        })
        .fold(32, usize::saturating_add)
}

/// Appends the msgpack of one `EventBatch` of `events` to `out`.
pub fn encode_event_batch(events: &[PoolEvent], batch: &WireBatch<'_>, out: &mut Vec<u8>) {
    // A hint only: if it cannot be had, the writes grow the buffer as they go.
    let _ = out.try_reserve(size_bound(events, batch));
    let mut w = Writer(out);
    w.array(3);
    w.f64(batch.ts);
    // The pool emits one event per removed hash, as vLLM does.
    w.array(events.len());
    // What follows the hash in each `BlockRemoved`, up to the group index: the same
    // for the whole batch, so written once (with `REMOVED_HEAD`, about 10% of a serving
    // step's encoding, `cargo bench --bench events_wire`).
    let mut removed_tail = Vec::with_capacity(24 + batch.medium.len());
    let mut tail = Writer(&mut removed_tail);
    tail.str("medium");
    tail.str(batch.medium);
    tail.str("group_idx");
    for event in events {
        match event {
            PoolEvent::BlockStored(stored) => {
                let StoredBlocks {
                    block_hashes,
                    parent_block_hash,
                    token_ids,
                    block_size,
                    lora_id,
                    lora_name,
                    group_idx,
                    extra_keys,
                } = &**stored;
                let spec = batch.group_specs.iter().find(|(g, _, _)| g == group_idx);
                let kind = spec.and_then(|s| s.1);
                let window = spec.and_then(|s| s.2);
                // vLLM's `to_event_extra_keys` gives `None` for no blocks, and a field at
                // its default (`None`) is left out.
                let with_extra_keys = !block_hashes.is_empty();
                w.map16(
                    9 + usize::from(with_extra_keys)
                        + usize::from(kind.is_some())
                        + usize::from(window.is_some()),
                );
                w.str("type");
                w.str("BlockStored");
                w.str("block_hashes");
                w.array(block_hashes.len());
                for h in block_hashes {
                    w.hash(h);
                }
                w.str("parent_block_hash");
                match parent_block_hash {
                    Some(h) => w.hash(h),
                    None => w.nil(),
                }
                w.str("token_ids");
                w.array(token_ids.len());
                for &t in token_ids {
                    match t {
                        0..=0x7f => w.0.push(t as u8),
                        0x80..=0xff => w.0.extend_from_slice(&[0xcc, t as u8]),
                        0x100..=0xffff => {
                            let b = (t as u16).to_be_bytes();
                            w.0.extend_from_slice(&[0xcd, b[0], b[1]]);
                        }
                        0x1_0000..=0xffff_ffff => {
                            let b = (t as u32).to_be_bytes();
                            w.0.extend_from_slice(&[0xce, b[0], b[1], b[2], b[3]]);
                        }
                        _ => w.int(t),
                    }
                }
                w.str("block_size");
                w.uint(u64::from(*block_size));
                w.str("lora_id");
                w.opt_int(*lora_id);
                w.str("medium");
                w.str(batch.medium);
                w.str("lora_name");
                w.opt_str(lora_name.as_deref());
                if with_extra_keys {
                    w.str("extra_keys");
                    w.array(block_hashes.len());
                    match extra_keys {
                        Some(blocks) => {
                            for keys in blocks {
                                w.extra_keys(keys.as_deref());
                            }
                        }
                        None => {
                            for _ in block_hashes {
                                match lora_name {
                                    Some(name) => {
                                        w.array(1);
                                        w.str(name);
                                    }
                                    None => w.nil(),
                                }
                            }
                        }
                    }
                }
                w.str("group_idx");
                w.uint(u64::from(*group_idx));
                if let Some(kind) = kind {
                    w.str("kv_cache_spec_kind");
                    w.str(kind);
                }
                if let Some(window) = window {
                    w.str("kv_cache_spec_sliding_window");
                    w.int(window);
                }
            }
            PoolEvent::BlockRemoved {
                block_hash,
                group_idx,
            } => {
                w.0.extend_from_slice(REMOVED_HEAD);
                w.hash(block_hash);
                w.0.extend_from_slice(&removed_tail);
                w.uint(u64::from(*group_idx));
            }
            PoolEvent::AllBlocksCleared => {
                w.map(1);
                w.str("type");
                w.str("AllBlocksCleared");
            }
        }
    }
    w.opt_int(batch.data_parallel_rank);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn enc(f: impl FnOnce(&mut Writer<'_>)) -> Vec<u8> {
        let mut out = Vec::new();
        f(&mut Writer(&mut out));
        out
    }

    #[test]
    fn ints_take_msgpacks_smallest_form() {
        assert_eq!(enc(|w| w.int(5)), [5]);
        assert_eq!(enc(|w| w.int(200)), [0xcc, 200]);
        assert_eq!(enc(|w| w.int(-5)), [0xfb]);
        assert_eq!(enc(|w| w.int(-100)), [0xd0, 0x9c]);
        assert_eq!(enc(|w| w.uint(u64::MAX))[0], 0xcf);
        assert_eq!(enc(|w| w.int(70_000)), [0xce, 0, 1, 0x11, 0x70]);
        assert_eq!(wire_hash(&[1; 32]), 0x0101_0101_0101_0101);
    }

    #[test]
    fn an_empty_batch() {
        let mut out = Vec::new();
        let batch = WireBatch {
            ts: 1.5,
            medium: "GPU",
            ..WireBatch::default()
        };
        encode_event_batch(&[], &batch, &mut out);
        assert_eq!(out, [0x93, 0xcb, 0x3f, 0xf8, 0, 0, 0, 0, 0, 0, 0x90, 0xc0]);
    }
}
