//! Canonical CBOR, byte-for-byte as `cbor2.dumps(value, canonical=True)` writes
//! the value types of block-hash inputs.
//!
//! cbor2 maps a tuple to an array, `bytes` to a byte string, `str` to a text
//! string, `None` to `0xf6`, and an int to the shortest head that holds it; ints
//! outside `-2**64 ..= 2**64 - 1` become bignums (tag 2 or 3 around the
//! big-endian magnitude, without leading zero bytes). Canonical mode only changes
//! maps, floats and sets, none of which occur here.

use super::value::Value;

const MAJOR_UINT: u8 = 0;
const MAJOR_NEGINT: u8 = 1;
const MAJOR_BYTES: u8 = 2;
const MAJOR_TEXT: u8 = 3;
const MAJOR_ARRAY: u8 = 4;
const TAG_POS_BIGNUM: u8 = 0xc2;
const TAG_NEG_BIGNUM: u8 = 0xc3;
const NONE: u8 = 0xf6;

/// Appends the canonical CBOR encoding of `value` to `out`
/// (`cbor2.dumps(value, canonical=True)`).
///
/// `out` is not cleared, so one buffer can be reused across calls.
///
/// ```
/// use kvpool::pool::hashing::{encode_cbor, Value};
/// let mut out = Vec::new();
/// encode_cbor(&Value::tuple([Value::from(1), Value::None, Value::from("a")]), &mut out);
/// assert_eq!(out, [0x83, 0x01, 0xf6, 0x61, b'a']);
/// ```
pub fn encode_cbor(value: &Value, out: &mut Vec<u8>) {
    match value {
        Value::None => out.push(NONE),
        Value::Int(v) => write_int(out, *v),
        Value::Bytes(b) => write_bytes(out, b),
        Value::Str(s) => write_str(out, s),
        Value::Tuple(items) => {
            write_array_head(out, items.len());
            for item in items {
                encode_cbor(item, out);
            }
        }
        Value::Shared(_, inner) => encode_cbor(inner, out),
    }
}

/// Writes a head: major type `major` with argument `n`, in its shortest form.
#[inline]
fn write_head(out: &mut Vec<u8>, major: u8, n: u64) {
    let m = major << 5;
    if n < 24 {
        out.push(m | n as u8);
    } else if n <= 0xff {
        out.extend_from_slice(&[m | 24, n as u8]);
    } else if n <= 0xffff {
        let b = (n as u16).to_be_bytes();
        out.extend_from_slice(&[m | 25, b[0], b[1]]);
    } else if n <= 0xffff_ffff {
        let b = (n as u32).to_be_bytes();
        out.extend_from_slice(&[m | 26, b[0], b[1], b[2], b[3]]);
    } else {
        out.push(m | 27);
        out.extend_from_slice(&n.to_be_bytes());
    }
}

/// Writes a `None`.
#[inline]
pub(super) fn write_none(out: &mut Vec<u8>) {
    out.push(NONE);
}

/// Writes an array of 64-bit ints (a block's token ids), the hot path.
///
/// Token ids of a vocabulary mix 1-, 2- and 4-byte arguments at random, so the
/// head is chosen by table lookup rather than by (mispredicted) branches, and
/// each int is a fixed 9-byte store with the cursor advanced by its real length.
pub(super) fn write_i64_array(out: &mut Vec<u8>, ints: &[i64]) {
    // By the number of significant bytes of the argument: its encoded length
    // and the head's additional-info bits.
    const ARG_LEN: [usize; 9] = [0, 1, 2, 4, 4, 8, 8, 8, 8];
    const INFO: [u8; 9] = [0, 24, 25, 26, 26, 27, 27, 27, 27];
    write_array_head(out, ints.len());
    let start = out.len();
    out.resize(start + 9 * ints.len() + 9, 0);
    let dst = &mut out[start..];
    let mut pos = 0;
    for &v in ints {
        let sign = (v >> 63) as u64; // all ones when negative
        let n = (v as u64) ^ sign; // the argument: v, or -1 - v
        let major = (sign as u8) & (MAJOR_NEGINT << 5);
        let significant = ((71 - n.leading_zeros()) / 8) as usize;
        let tiny = n < 24;
        let len = if tiny { 0 } else { ARG_LEN[significant] };
        let info = if tiny { n as u8 } else { INFO[significant] };
        let mut item = [0u8; 9];
        item[0] = major | info;
        // Left-align the argument's big-endian bytes after the head byte; when
        // len is 0 they are garbage past the cursor, overwritten or truncated.
        item[1..].copy_from_slice(&n.wrapping_shl(8 * (8 - len as u32)).to_be_bytes());
        dst[pos..pos + 9].copy_from_slice(&item);
        pos += 1 + len;
    }
    out.truncate(start + pos);
}

/// Writes any int, as a bignum when it needs more than 64 bits.
pub(super) fn write_int(out: &mut Vec<u8>, v: i128) {
    let (major, tag, magnitude) = if v >= 0 {
        (MAJOR_UINT, TAG_POS_BIGNUM, v as u128)
    } else {
        (MAJOR_NEGINT, TAG_NEG_BIGNUM, !(v as u128))
    };
    if let Ok(small) = u64::try_from(magnitude) {
        write_head(out, major, small);
    } else {
        let be = magnitude.to_be_bytes();
        let skip = (magnitude.leading_zeros() / 8) as usize;
        out.push(tag);
        write_bytes(out, &be[skip..]);
    }
}

/// Writes a byte string.
#[inline]
pub(super) fn write_bytes(out: &mut Vec<u8>, b: &[u8]) {
    write_head(out, MAJOR_BYTES, b.len() as u64);
    out.extend_from_slice(b);
}

/// Writes a text string.
#[inline]
pub(super) fn write_str(out: &mut Vec<u8>, s: &str) {
    write_head(out, MAJOR_TEXT, s.len() as u64);
    out.extend_from_slice(s.as_bytes());
}

/// Writes the head of an array of `len` items; the caller writes the items.
#[inline]
pub(super) fn write_array_head(out: &mut Vec<u8>, len: usize) {
    write_head(out, MAJOR_ARRAY, len as u64);
}

#[cfg(test)]
mod tests {
    use super::super::vectors::{check_encoding, encoding_vectors};
    use super::*;

    fn enc(v: &Value) -> Vec<u8> {
        let mut out = Vec::new();
        encode_cbor(v, &mut out);
        out
    }

    #[test]
    fn matches_cbor2_vectors() {
        let vectors = encoding_vectors();
        assert!(vectors.len() > 100);
        for v in &vectors {
            check_encoding(v.name, &enc(&(v.build)()), &v.cbor);
        }
    }

    #[test]
    fn i64_array_matches_general_path() {
        let ints = [
            0,
            23,
            24,
            255,
            256,
            65535,
            65536,
            u32::MAX as i64,
            1 << 32,
            i64::MAX,
            -1,
            -24,
            -25,
            -257,
            -65537,
            i64::MIN,
        ];
        let mut fast = vec![0xaa];
        write_i64_array(&mut fast, &ints);
        let mut slow = vec![0xaa];
        encode_cbor(
            &Value::tuple(ints.iter().map(|&v| Value::from(v))),
            &mut slow,
        );
        assert_eq!(fast, slow);
    }

    #[test]
    fn appends_without_clearing() {
        let mut out = vec![0xaa];
        encode_cbor(&Value::None, &mut out);
        assert_eq!(out, [0xaa, 0xf6]);
    }

    #[test]
    fn bignum_edges() {
        assert_eq!(enc(&Value::Int(i128::MAX)), {
            let mut e = vec![0xc2, 0x50, 0x7f];
            e.extend([0xff; 15]);
            e
        });
        assert_eq!(enc(&Value::Int(i128::MIN)), {
            let mut e = vec![0xc3, 0x50, 0x7f];
            e.extend([0xff; 15]);
            e
        });
    }
}
