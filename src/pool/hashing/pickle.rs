//! Pickle protocol 5, byte-for-byte as CPython 3.11's C pickler
//! (`pickle.dumps(value, protocol=5)`) writes the value types of block-hash inputs.
//!
//! What the C pickler does, and so what this module does:
//! - `PROTO 5`, then the body in frames: a frame opens at the first write after
//!   `PROTO` (or after the previous frame closed) with a 9-byte `FRAME` header;
//!   it closes when the pickler *starts* saving an object while the frame holds
//!   at least 64 KiB, and at the end (after `STOP`). A frame with fewer than 4
//!   bytes loses its header. (So a lone 65 000-byte string and its `MEMOIZE`
//!   and `STOP` share one frame.)
//! - A `bytes` or `str` payload of at least 64 KiB closes the open frame and is
//!   written outside any frame (header and payload); the next write opens a new
//!   frame.
//! - Ints: `BININT1` (0..=255), `BININT2` (256..=65535), `BININT` (other values
//!   in `i32`), else `LONG1` with the shortest little-endian two's complement.
//!   (`LONG4` needs more than 255 bytes, beyond [`Value::Int`]'s `i128`.)
//! - `bytes`: `SHORT_BINBYTES` / `BINBYTES` / `BINBYTES8`; `str` (UTF-8):
//!   `SHORT_BINUNICODE` / `BINUNICODE` / `BINUNICODE8`; each followed by `MEMOIZE`.
//! - Tuples: `EMPTY_TUPLE` (not memoized); 1 to 3 items: the items then
//!   `TUPLE1`/`TUPLE2`/`TUPLE3`; more: `MARK`, the items, `TUPLE`; non-empty
//!   tuples are followed by `MEMOIZE`. `None` is `NONE`; ints and `None` are
//!   never memoized.
//!
//! # Object identity
//! The pickler memoizes by object *identity*: when the same `str`, `bytes` or
//! tuple object occurs twice in one pickled value, the second occurrence is a
//! `BINGET` of the first (`LONG_BINGET` from memo index 256 on; the index counts
//! every `MEMOIZE` so far, in pickling order).
//!
//! A [`Value`] says which of its parts are one object with
//! [`Value::Shared`]: [`encode_pickle`] writes the first occurrence of each
//! shared id in full (memoized) and the others as memo references; unwrapped
//! parts are distinct objects. The bindings build values from the caller's
//! Python objects and wrap exactly those that occur more than once, so what
//! CPython shares behind the caller's back (the empty `str`/`bytes`,
//! one-character strings, interned strings, which include every
//! identifier-like string literal) pickles as Python pickles it. CBOR has no
//! such dependence.
//!
//! Block extra keys share objects by construction: their tags (`"lora"`,
//! `"mm"`, `"cache_salt"`, `"prompt_embeds"`) are string literals in vLLM, so a
//! block with two multimodal inputs holds the *same* `"mm"` object twice; the
//! caller's strings may also be one object (a LoRA whose name and path are one
//! `str`, one identifier for two inputs, a name that is the interned `"lora"`).
//! The extra-keys encoder (`BlockExtraKeys`, through [`PickleWriter`]) reads
//! which is which from `ExtraObjects` and memoizes accordingly.

use super::value::Value;

const PROTO: u8 = 0x80;
const FRAME: u8 = 0x95;
const STOP: u8 = b'.';
const NONE: u8 = b'N';
const BININT: u8 = b'J';
const BININT1: u8 = b'K';
const BININT2: u8 = b'M';
const LONG1: u8 = 0x8a;
const SHORT_BINBYTES: u8 = b'C';
const BINBYTES: u8 = b'B';
const BINBYTES8: u8 = 0x8e;
const SHORT_BINUNICODE: u8 = 0x8c;
const BINUNICODE: u8 = b'X';
const BINUNICODE8: u8 = 0x8d;
const EMPTY_TUPLE: u8 = b')';
const MARK: u8 = b'(';
const TUPLE: u8 = b't';
const TUPLE1: u8 = 0x85;
const TUPLE2: u8 = 0x86;
const TUPLE3: u8 = 0x87;
const MEMOIZE: u8 = 0x94;
const BINGET: u8 = b'h';
const LONG_BINGET: u8 = b'j';

/// Size of a `FRAME` opcode with its 8-byte length.
const FRAME_HEADER: usize = 9;
/// Frames with fewer bytes lose their header (`FRAME_SIZE_MIN`).
const FRAME_MIN: usize = 4;
/// A frame closes once it reaches this size, and payloads this large bypass
/// frames (`FRAME_SIZE_TARGET`).
const FRAME_TARGET: usize = 64 * 1024;

/// Appends `pickle.dumps(value, protocol=5)` (CPython 3.11, C pickler) to `out`.
///
/// `out` is not cleared, so one buffer can be reused across calls. Every
/// occurrence of a `str`, `bytes` or tuple is pickled as a distinct object, but
/// for the repeats of a [`Value::Shared`] id, which are memo references (see the
/// module docs on object identity).
///
/// ```
/// use kvpool::pool::hashing::{encode_pickle, Value};
/// let mut out = Vec::new();
/// encode_pickle(&Value::tuple([Value::from(1), Value::from(2)]), &mut out);
/// // PROTO 5, FRAME 7, BININT1 1, BININT1 2, TUPLE2, MEMOIZE, STOP
/// assert_eq!(out, b"\x80\x05\x95\x07\0\0\0\0\0\0\0K\x01K\x02\x86\x94.");
/// ```
pub fn encode_pickle(value: &Value, out: &mut Vec<u8>) {
    let mut w = PickleWriter::begin(out);
    w.value(value);
    w.finish();
}

/// Test reference: [`encode_pickle`] of a value in which every `str` equal to
/// one of `interned` is a single shared object (as a string literal is in
/// Python), so its first occurrence is memoized and the others are `BINGET`s.
/// All other objects are distinct, as in [`encode_pickle`].
#[cfg(test)]
pub(super) fn encode_pickle_interned(value: &Value, interned: &[&str], out: &mut Vec<u8>) {
    fn save(w: &mut PickleWriter<'_>, v: &Value, interned: &[&str], memo: &mut [Option<usize>]) {
        match v {
            Value::Str(s) if interned.contains(&s.as_str()) => {
                let k = interned.iter().position(|t| t == s).unwrap();
                match memo[k] {
                    Some(index) => w.save_memo_get(index),
                    None => memo[k] = Some(w.save_str(s)),
                }
            }
            Value::Tuple(items) => {
                w.begin_tuple(items.len());
                for item in items {
                    save(w, item, interned, memo);
                }
                w.end_tuple(items.len());
            }
            other => w.save(other),
        }
    }
    let mut w = PickleWriter::begin(out);
    save(&mut w, value, interned, &mut vec![None; interned.len()]);
    w.finish();
}

/// Streams one pickle into a buffer, framing exactly as the C pickler does.
///
/// Each `save_*` method writes one complete object, like the pickler's `save()`,
/// and starts with the frame-size check that `save()` starts with. The writer
/// counts `MEMOIZE`s, so a caller that knows two saves are the same Python object
/// can save the second as [`Self::save_memo_get`] of the first's memo index.
pub(super) struct PickleWriter<'a> {
    out: &'a mut Vec<u8>,
    /// Offset of the open frame's header placeholder, if a frame is open.
    frame_start: Option<usize>,
    /// Number of objects memoized so far (the next `MEMOIZE`'s index).
    memo_len: usize,
    /// Memo indices of the [`Value::Shared`] objects saved so far, by id.
    shared: Vec<(u32, usize)>,
}

impl<'a> PickleWriter<'a> {
    /// Writes `PROTO 5` (never framed) and returns the writer.
    #[inline]
    pub(super) fn begin(out: &'a mut Vec<u8>) -> Self {
        out.extend_from_slice(&[PROTO, 5]);
        Self {
            out,
            frame_start: None,
            memo_len: 0,
            shared: Vec::new(),
        }
    }

    /// Writes `STOP` and closes the last frame.
    #[inline]
    pub(super) fn finish(mut self) {
        self.write(&[STOP]);
        self.commit_frame();
    }

    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        if self.frame_start.is_none() {
            self.frame_start = Some(self.out.len());
            self.out.extend_from_slice(&[0; FRAME_HEADER]);
        }
        self.out.extend_from_slice(bytes);
    }

    /// Closes the open frame: fills in its header, or removes the header when
    /// the frame is too small to be worth one.
    fn commit_frame(&mut self) {
        if let Some(start) = self.frame_start.take() {
            let len = self.out.len() - start - FRAME_HEADER;
            if len >= FRAME_MIN {
                self.out[start] = FRAME;
                self.out[start + 1..start + FRAME_HEADER]
                    .copy_from_slice(&(len as u64).to_le_bytes());
            } else {
                self.out.drain(start..start + FRAME_HEADER);
            }
        }
    }

    /// The check `save()` runs before saving any object
    /// (`_Pickler_OpcodeBoundary`; `framer.commit_frame()` in pickle.py).
    #[inline]
    fn start_object(&mut self) {
        if let Some(start) = self.frame_start {
            if self.out.len() - start - FRAME_HEADER >= FRAME_TARGET {
                self.commit_frame();
            }
        }
    }

    /// Writes an opcode header and a payload; large payloads bypass frames.
    fn write_payload(&mut self, header: &[u8], payload: &[u8]) {
        if payload.len() >= FRAME_TARGET {
            self.commit_frame();
            self.out.extend_from_slice(header);
            self.out.extend_from_slice(payload);
        } else {
            self.write(header);
            self.write(payload);
        }
    }

    /// Saves any value.
    pub(super) fn save(&mut self, value: &Value) {
        match value {
            Value::None => self.save_none(),
            Value::Int(v) => self.save_int(*v),
            Value::Bytes(b) => self.save_bytes(b),
            Value::Str(s) => {
                self.save_str(s);
            }
            Value::Tuple(items) => {
                self.begin_tuple(items.len());
                for item in items {
                    self.save(item);
                }
                self.end_tuple(items.len());
            }
            Value::Shared(id, inner) => {
                match self.shared.iter().find(|(k, _)| k == id) {
                    Some(&(_, index)) => self.save_memo_get(index),
                    None => {
                        let before = self.memo_len;
                        self.save(inner);
                        // The inner object was memoized last (a tuple after its items);
                        // ints, None and the empty tuple are never memoized.
                        if self.memo_len > before {
                            self.shared.push((*id, self.memo_len - 1));
                        }
                    }
                }
            }
        }
    }

    /// Alias of [`Self::save`] for call sites that read better with it.
    #[inline]
    pub(super) fn value(&mut self, value: &Value) {
        self.save(value)
    }

    #[inline]
    pub(super) fn save_none(&mut self) {
        self.start_object();
        self.write(&[NONE]);
    }

    /// Saves an int that fits in 64 bits (the token-id fast path).
    #[inline]
    pub(super) fn save_i64(&mut self, v: i64) {
        self.start_object();
        self.write_i64(v);
    }

    #[inline]
    fn write_i64(&mut self, v: i64) {
        if (0..=0xff).contains(&v) {
            self.write(&[BININT1, v as u8]);
        } else if (0..=0xffff).contains(&v) {
            let b = (v as u16).to_le_bytes();
            self.write(&[BININT2, b[0], b[1]]);
        } else if let Ok(v32) = i32::try_from(v) {
            let b = v32.to_le_bytes();
            self.write(&[BININT, b[0], b[1], b[2], b[3]]);
        } else {
            self.write_long1(v.into());
        }
    }

    /// Saves a tuple of 64-bit ints (a block's token ids), the hot path.
    ///
    /// When no frame can fill up inside the tuple, the ints are written as
    /// fixed 16-byte stores with the cursor advanced by their real length;
    /// otherwise item by item, with the pickler's frame checks.
    pub(super) fn save_i64_tuple(&mut self, ints: &[i64]) {
        self.begin_tuple(ints.len());
        // A frame check can only fire if the frame may reach FRAME_TARGET.
        let open = self.frame_start.map_or(0, |start| self.out.len() - start);
        if open + 11 * ints.len() >= FRAME_TARGET {
            for &v in ints {
                self.save_i64(v);
            }
        } else if !ints.is_empty() {
            self.write(&[]); // open the frame, as the first item would
            let start = self.out.len();
            self.out.resize(start + 11 * ints.len() + 16, 0);
            let dst = &mut self.out[start..];
            let mut pos = 0;
            for &v in ints {
                let mut item = [0u8; 16];
                let len = if let Ok(v32) = i32::try_from(v) {
                    // BININT1 / BININT2 / BININT by value, chosen without
                    // branches (token ids straddle 65535 at random); the
                    // shorter forms are prefixes of the little-endian bytes.
                    let u = v32 as u32;
                    let (op, len) = if u <= 0xff {
                        (BININT1, 2)
                    } else if u <= 0xffff {
                        (BININT2, 3)
                    } else {
                        (BININT, 5)
                    };
                    item[0] = op;
                    item[1..5].copy_from_slice(&u.to_le_bytes());
                    len
                } else {
                    let n = long1_len(v.into()); // 5..=8 for an i64 outside i32
                    item[0] = LONG1;
                    item[1] = n as u8;
                    item[2..10].copy_from_slice(&v.to_le_bytes());
                    2 + n
                };
                dst[pos..pos + 16].copy_from_slice(&item);
                pos += len;
            }
            self.out.truncate(start + pos);
        }
        self.end_tuple(ints.len());
    }

    /// Saves any int.
    pub(super) fn save_int(&mut self, v: i128) {
        self.start_object();
        match i64::try_from(v) {
            Ok(small) => self.write_i64(small),
            Err(_) => self.write_long1(v),
        }
    }

    /// `LONG1` with the shortest two's complement that holds `v` (which is
    /// outside `i32`, so at least 5 bytes).
    fn write_long1(&mut self, v: i128) {
        let n = long1_len(v);
        let le = v.to_le_bytes();
        let mut op = [0u8; 2 + 16];
        op[0] = LONG1;
        op[1] = n as u8;
        op[2..2 + n].copy_from_slice(&le[..n]);
        self.write(&op[..2 + n]);
    }

    /// Saves a `bytes` object.
    pub(super) fn save_bytes(&mut self, b: &[u8]) {
        self.start_object();
        let n = b.len();
        if n <= 0xff {
            self.write(&[SHORT_BINBYTES, n as u8]);
            self.write(b);
        } else if let Ok(n32) = u32::try_from(n) {
            let l = n32.to_le_bytes();
            self.write_payload(&[BINBYTES, l[0], l[1], l[2], l[3]], b);
        } else {
            let mut h = [BINBYTES8; 9];
            h[1..].copy_from_slice(&(n as u64).to_le_bytes());
            self.write_payload(&h, b);
        }
        self.memoize();
    }

    /// Saves a `str` object (UTF-8 encoded, as the pickler does); returns its
    /// memo index.
    pub(super) fn save_str(&mut self, s: &str) -> usize {
        self.start_object();
        let b = s.as_bytes();
        let n = b.len();
        if n <= 0xff {
            self.write(&[SHORT_BINUNICODE, n as u8]);
            self.write(b);
        } else if let Ok(n32) = u32::try_from(n) {
            let l = n32.to_le_bytes();
            self.write_payload(&[BINUNICODE, l[0], l[1], l[2], l[3]], b);
        } else {
            let mut h = [BINUNICODE8; 9];
            h[1..].copy_from_slice(&(n as u64).to_le_bytes());
            self.write_payload(&h, b);
        }
        self.memoize()
    }

    /// Writes `MEMOIZE`; returns the index it stores the last object at.
    #[inline]
    fn memoize(&mut self) -> usize {
        self.write(&[MEMOIZE]);
        self.memo_len += 1;
        self.memo_len - 1
    }

    /// Saves another occurrence of the object memoized at `index`, as the
    /// pickler's `save()` does on a memo hit: `BINGET`, or `LONG_BINGET` from
    /// index 256 on.
    pub(super) fn save_memo_get(&mut self, index: usize) {
        self.start_object();
        if let Ok(i) = u8::try_from(index) {
            self.write(&[BINGET, i]);
        } else {
            // The C pickler refuses indices past u32::MAX; reaching one takes
            // over 4 GiB of pickle, so this clamp is never hit in practice.
            let l = u32::try_from(index).unwrap_or(u32::MAX).to_le_bytes();
            self.write(&[LONG_BINGET, l[0], l[1], l[2], l[3]]);
        }
    }

    /// Starts a tuple of `len` items; save the items, then call [`Self::end_tuple`].
    #[inline]
    pub(super) fn begin_tuple(&mut self, len: usize) {
        self.start_object();
        match len {
            0 => self.write(&[EMPTY_TUPLE]),
            1..=3 => {}
            _ => self.write(&[MARK]),
        }
    }

    /// Ends a tuple of `len` items started with [`Self::begin_tuple`].
    #[inline]
    pub(super) fn end_tuple(&mut self, len: usize) {
        let op = match len {
            0 => return, // the empty tuple is not memoized
            1 => TUPLE1,
            2 => TUPLE2,
            3 => TUPLE3,
            _ => TUPLE,
        };
        self.write(&[op, MEMOIZE]);
        self.memo_len += 1;
    }
}

/// Byte length of the shortest two's complement of `v` (what `LONG1` holds).
#[inline]
fn long1_len(v: i128) -> usize {
    // Significant bits of v, not counting the sign; one more bit for the sign.
    let bits = 128
        - if v < 0 {
            (!v).leading_zeros()
        } else {
            v.leading_zeros()
        };
    bits as usize / 8 + 1
}

#[cfg(test)]
mod tests {
    use super::super::vectors::{check_encoding, encoding_vectors, hex, Expected};
    use super::*;

    fn enc(v: &Value) -> Vec<u8> {
        let mut out = Vec::new();
        encode_pickle(v, &mut out);
        out
    }

    #[test]
    fn matches_cpython_vectors() {
        let vectors = encoding_vectors();
        assert!(vectors.len() > 100);
        for v in &vectors {
            check_encoding(v.name, &enc(&(v.build)()), &v.pickle);
        }
    }

    #[test]
    fn small_pickles_are_unframed() {
        assert_eq!(enc(&Value::None), b"\x80\x05N.");
        assert_eq!(enc(&Value::tuple([])), b"\x80\x05).");
        assert_eq!(enc(&Value::Int(5)), b"\x80\x05K\x05.");
    }

    #[test]
    fn i64_tuple_matches_general_path() {
        let edge = [
            0,
            255,
            256,
            65535,
            65536,
            -1,
            i32::MAX as i64,
            i32::MIN as i64,
            1 << 31,
            -(1 << 31) - 1,
            1 << 39,
            -(1 << 39),
            i64::MAX,
            i64::MIN,
        ];
        let long: Vec<i64> = (0..30_000).map(|k| k * 2_654_435_761).collect();
        for ints in [&[][..], &[7], &[1, 2], &[1, 2, 3], &edge[..], &long[..]] {
            let mut fast = Vec::new();
            let mut w = PickleWriter::begin(&mut fast);
            w.save_i64_tuple(ints);
            w.finish();
            assert_eq!(
                fast,
                enc(&Value::tuple(ints.iter().map(|&v| Value::from(v)))),
                "{} ints",
                ints.len()
            );
        }
    }

    #[test]
    fn appends_without_clearing() {
        let mut out = vec![0xaa];
        encode_pickle(&Value::None, &mut out);
        assert_eq!(out, b"\xaa\x80\x05N.");
    }

    #[test]
    fn memo_indices_count_every_memoize() {
        // Python: x = "mm"; pickle.dumps((b"p", (1, 2), ((), x, (x, x), "y", x)), 5)
        let v = Value::tuple([
            Value::bytes(b"p"),
            Value::tuple([Value::from(1), Value::from(2)]),
            Value::tuple([
                Value::tuple([]),
                Value::from("mm"),
                Value::tuple([Value::from("mm"), Value::from("mm")]),
                Value::from("y"),
                Value::from("mm"),
            ]),
        ]);
        let mut out = Vec::new();
        encode_pickle_interned(&v, &["mm"], &mut out);
        assert_eq!(
            hex(&out),
            "8005952200000000000000430170944b014b02869428298c026d6d946802680286948c0179946802749487942e"
        );
    }

    #[test]
    fn long_binget_from_memo_index_256() {
        // Python: x = "mm"; pickle.dumps(tuple((k,) for k in range(256)) + (x, x), 5)
        let mut out = Vec::new();
        let mut w = PickleWriter::begin(&mut out);
        w.begin_tuple(258);
        for k in 0..256 {
            w.begin_tuple(1);
            w.save_i64(k);
            w.end_tuple(1);
        }
        let index = w.save_str("mm");
        assert_eq!(index, 256);
        w.save_memo_get(index);
        w.end_tuple(258);
        w.finish();
        // ... (255,) "mm" LONG_BINGET 256, TUPLE, MEMOIZE, STOP
        assert_eq!(
            hex(&out[out.len() - 19..]),
            "85944bff85948c026d6d946a0001000074942e"
        );
        check_encoding(
            "long binget",
            &out,
            &Expected::Digest {
                len: 1049,
                sha256: "b769f32c90809a8bd1a153ec32abe04db161f800bfbfac82f067f4b5f9f3d733",
            },
        );
    }

    #[test]
    fn long1_edges() {
        // i128 extremes need all 16 bytes.
        let max = enc(&Value::Int(i128::MAX));
        assert_eq!(&max[..4], b"\x80\x05\x95\x13");
        assert_eq!(&max[11..13], b"\x8a\x10");
        let mut le = [0xffu8; 16];
        le[15] = 0x7f;
        assert_eq!(&max[13..29], &le);
        let min = enc(&Value::Int(i128::MIN));
        let mut le = [0u8; 16];
        le[15] = 0x80;
        assert_eq!(&min[13..29], &le);
    }
}
