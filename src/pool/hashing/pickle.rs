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
//! # Object identity: the one known gap
//! The pickler memoizes by object *identity*: when the same `str`, `bytes` or
//! tuple object occurs twice in one pickled value, the second occurrence is a
//! `BINGET` of the first. This encoder works on values and never emits `BINGET`,
//! i.e. it treats every occurrence as a distinct object. That is what vLLM's hash
//! inputs hold in practice (the parent hash, a fresh token tuple, and extra keys
//! built per request), but CPython shares some objects behind the caller's back:
//! the empty `str`/`bytes`, and (depending on how they were made) one-character
//! strings and one-byte `bytes`. So two *equal* such values in one block's hash
//! input (say a LoRA named `"a"` and a cache salt `"a"`) may pickle differently
//! in Python. CBOR has no such dependence. The test vectors are built from
//! distinct objects and checked to contain no `BINGET`.

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

/// Size of a `FRAME` opcode with its 8-byte length.
const FRAME_HEADER: usize = 9;
/// Frames with fewer bytes lose their header (`FRAME_SIZE_MIN`).
const FRAME_MIN: usize = 4;
/// A frame closes once it reaches this size, and payloads this large bypass
/// frames (`FRAME_SIZE_TARGET`).
const FRAME_TARGET: usize = 64 * 1024;

/// Appends `pickle.dumps(value, protocol=5)` (CPython 3.11, C pickler) to `out`.
///
/// `out` is not cleared, so one buffer can be reused across calls. See the
/// module docs for the object-identity gap (this never emits `BINGET`).
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

/// Streams one pickle into a buffer, framing exactly as the C pickler does.
///
/// Each `save_*` method writes one complete object, like the pickler's `save()`,
/// and starts with the frame-size check that `save()` starts with.
pub(super) struct PickleWriter<'a> {
    out: &'a mut Vec<u8>,
    /// Offset of the open frame's header placeholder, if a frame is open.
    frame_start: Option<usize>,
}

impl<'a> PickleWriter<'a> {
    /// Writes `PROTO 5` (never framed) and returns the writer.
    #[inline]
    pub(super) fn begin(out: &'a mut Vec<u8>) -> Self {
        out.extend_from_slice(&[PROTO, 5]);
        Self {
            out,
            frame_start: None,
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
            Value::Str(s) => self.save_str(s),
            Value::Tuple(items) => {
                self.begin_tuple(items.len());
                for item in items {
                    self.save(item);
                }
                self.end_tuple(items.len());
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
        self.write(&[MEMOIZE]);
    }

    /// Saves a `str` object (UTF-8 encoded, as the pickler does).
    pub(super) fn save_str(&mut self, s: &str) {
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
        self.write(&[MEMOIZE]);
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
        match len {
            0 => {}
            1 => self.write(&[TUPLE1, MEMOIZE]),
            2 => self.write(&[TUPLE2, MEMOIZE]),
            3 => self.write(&[TUPLE3, MEMOIZE]),
            _ => self.write(&[TUPLE, MEMOIZE]),
        }
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
    use super::super::vectors::{check_encoding, encoding_vectors};
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
