//! The common block, encoded and hashed on a short path: no extra keys, every token
//! in the 32-bit range, a block small enough for one pickle frame.
//!
//! Such a block serializes to a fixed frame around its token items: for pickle,
//! `PROTO 5, FRAME n, SHORT_BINBYTES parent, MEMOIZE, MARK, items, TUPLE, MEMOIZE,
//! NONE, TUPLE3, MEMOIZE, STOP`; for CBOR, `[parent, [items], None]`. Each item is
//! written as one 8-byte store of its opcode and value, its length chosen without
//! branches (token ids straddle the 1-, 2- and 4-byte forms at random). The general
//! encoders ([`super::pickle`], [`super::cbor`]) produce the same bytes (tested
//! below); they stay the path for everything else.
//!
//! SHA-256 then runs on the buffer padded in place, block by block, without the
//! streaming hasher's staging copy.

use std::ops::Range;

use sha2::digest::generic_array::GenericArray;

use super::algo::{Digest, Encoding, HashAlgo};

/// Bytes the item loop may write past the last item (one 8-byte store).
const SLACK: usize = 8;
/// SHA-256's padding: one `0x80` byte, zeros, the 8-byte bit length, up to one
/// extra 64-byte block.
const SHA_PAD: usize = 72;
/// Blocks of at most this many tokens fit in one pickle frame of under 64 KiB
/// (`FRAME_SIZE_TARGET`), so no frame boundary can fall inside them.
const MAX_PICKLE_TOKENS: usize = 12_000;

/// Where a request's tokens come from, block by block: a slice, or (in the
/// bindings) a Python list read in place.
pub trait TokenSource {
    /// How many tokens there are.
    fn len(&self) -> usize;

    /// True when there are none.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The tokens `start..start + n` (within [`Self::len`]), or `None` when the
    /// source cannot give them here (the caller then takes its general path).
    fn tokens(&mut self, start: usize, n: usize) -> Option<&[i64]>;
}

impl TokenSource for &[i64] {
    fn len(&self) -> usize {
        <[i64]>::len(self)
    }

    #[inline]
    fn tokens(&mut self, start: usize, n: usize) -> Option<&[i64]> {
        self.get(start..start + n)
    }
}

/// Hashes the blocks `blocks` (of `block_size` tokens from `source`) on the short
/// path, chaining from `parent`, and appends the digests to `out`; returns how many
/// it hashed, stopping before the first block that is not plain or that `source`
/// cannot give.
///
/// Two buffers alternate: block `i + 1`'s tokens are encoded right after block
/// `i`'s digest is started, so the processor fills one while SHA-256's long chain of
/// rounds runs on the other (the parent goes in last, once known).
pub(super) fn hash_chain<S: TokenSource + ?Sized>(
    algo: HashAlgo,
    parent: &[u8],
    source: &mut S,
    block_size: usize,
    blocks: Range<usize>,
    bufs: &mut [Vec<u8>; 2],
    out: &mut Vec<u8>,
) -> usize {
    let (encoding, width) = (algo.encoding(), parent.len());
    if blocks.is_empty() || width != algo.digest_len() {
        return 0;
    }
    let Some(offset) = parent_offset(encoding, width) else {
        return 0;
    };
    let encode = |source: &mut S, buf: &mut Vec<u8>, block: usize| {
        let tokens = source.tokens(block * block_size, block_size)?;
        encode_tokens(encoding, buf, width, tokens)
    };
    let Some(mut len) = encode(source, &mut bufs[0], blocks.start) else {
        return 0;
    };
    out.reserve(blocks.len() * width);
    let mut parent = Digest::from_bytes(parent);
    let mut hashed = 0;
    for block in blocks.clone() {
        let (cur, next) = if hashed % 2 == 0 { (0, 1) } else { (1, 0) };
        copy_digest(&mut bufs[cur][offset..offset + width], &parent);
        parent = digest(algo, &mut bufs[cur], len);
        let next_len = if block + 1 < blocks.end {
            encode(source, &mut bufs[next], block + 1)
        } else {
            None
        };
        copy_digest_onto(out, &parent);
        hashed += 1;
        match next_len {
            Some(l) => len = l,
            None => break,
        }
    }
    hashed
}

/// The digest of the message `buf[..len]` (with room for padding after it).
#[inline(always)]
fn digest(algo: HashAlgo, buf: &mut [u8], len: usize) -> Digest {
    match algo {
        HashAlgo::Sha256 | HashAlgo::Sha256Cbor => sha256_in_place(buf, len),
        HashAlgo::Xxhash | HashAlgo::XxhashCbor => algo.digest_bytes(&buf[..len]),
    }
}

/// `dst = src` for a digest, with the two widths as fixed-size copies (no call).
#[inline(always)]
fn copy_digest(dst: &mut [u8], src: &[u8]) {
    match src.len() {
        32 => dst[..32].copy_from_slice(&src[..32]),
        16 => dst[..16].copy_from_slice(&src[..16]),
        _ => dst.copy_from_slice(src),
    }
}

/// Appends a digest to `out` (room already reserved), as [`copy_digest`].
#[inline(always)]
fn copy_digest_onto(out: &mut Vec<u8>, d: &[u8]) {
    match d.len() {
        32 => out.extend_from_slice(&<[u8; 32]>::try_from(&d[..32]).unwrap_or([0; 32])),
        16 => out.extend_from_slice(&<[u8; 16]>::try_from(&d[..16]).unwrap_or([0; 16])),
        _ => out.extend_from_slice(d),
    }
}

/// Where the parent's bytes go in a plain block's encoding, or `None` for a parent
/// of 24 bytes or more in CBOR or 256 or more in pickle (neither is a digest).
fn parent_offset(encoding: Encoding, width: usize) -> Option<usize> {
    match encoding {
        // PROTO 5, FRAME n, SHORT_BINBYTES width
        Encoding::Pickle => (width <= 255).then_some(13),
        // array(3), then a byte string head of one byte (< 24) or two (< 256)
        Encoding::Cbor => match width {
            0..=23 => Some(2),
            24..=255 => Some(3),
            _ => None,
        },
    }
}

/// A plain block's encoding in `buf` (grown as needed, with room after it for
/// SHA-256 padding), all but the parent's bytes, which go at
/// [`parent_offset`]; returns its length. `None` when the block is not plain.
#[inline]
fn encode_tokens(
    encoding: Encoding,
    buf: &mut Vec<u8>,
    width: usize,
    tokens: &[i64],
) -> Option<usize> {
    match encoding {
        Encoding::Pickle => encode_pickle_tokens(buf, width, tokens),
        Encoding::Cbor => encode_cbor_tokens(buf, width, tokens),
    }
}

/// The pickle of `(parent, tuple(tokens), None)` in `buf`, as [`encode_tokens`].
/// Not plain: a token outside `i32`, fewer than 4 tokens (the short tuple opcodes),
/// too many for one frame.
#[inline]
fn encode_pickle_tokens(buf: &mut Vec<u8>, width: usize, tokens: &[i64]) -> Option<usize> {
    let n = tokens.len();
    if !(4..=MAX_PICKLE_TOKENS).contains(&n) || width > 255 {
        return None;
    }
    let header = 13 + width + 2;
    prepare(buf, header + 5 * n + 6 + SLACK + SHA_PAD);
    buf[..2].copy_from_slice(&[0x80, 5]); // PROTO 5
    buf[11] = b'C'; // SHORT_BINBYTES
    buf[12] = width as u8;
    buf[13 + width..header].copy_from_slice(&[0x94, b'(']); // MEMOIZE, MARK
    let mut pos = header;
    for &token in tokens {
        let v = i32::try_from(token).ok()? as u32;
        // BININT1 (0..=255), BININT2 (256..=65535), else BININT: the shorter forms
        // are prefixes of the value's little-endian bytes. The opcode and length
        // are sums of the two comparisons (no table, no branch: token ids straddle
        // the forms at random).
        let (over_1, over_2) = (u32::from(v > 0xff), u32::from(v > 0xffff));
        let op = u32::from(b'K') + 2 * over_1 - 3 * over_2; // 'K', 'M', 'J'
        let word = u64::from(op) | (u64::from(v) << 8);
        buf[pos..pos + 8].copy_from_slice(&word.to_le_bytes());
        pos += (2 + over_1 + 2 * over_2) as usize; // 2, 3, 5
    }
    // TUPLE, MEMOIZE, NONE, TUPLE3, MEMOIZE, STOP
    buf[pos..pos + 6].copy_from_slice(&[b't', 0x94, b'N', 0x87, 0x94, b'.']);
    let len = pos + 6;
    buf[2] = 0x95; // FRAME, with the length of everything after its header
    buf[3..11].copy_from_slice(&((len - 11) as u64).to_le_bytes());
    Some(len)
}

/// The canonical CBOR of `[parent, [tokens], None]` in `buf`, as
/// [`encode_tokens`]. Not plain: a token outside `-2^32..2^32` (the 9-byte
/// integer form).
#[inline]
fn encode_cbor_tokens(buf: &mut Vec<u8>, width: usize, tokens: &[i64]) -> Option<usize> {
    let n = tokens.len();
    let offset = parent_offset(Encoding::Cbor, width)?;
    prepare(buf, offset + width + 5 + 5 * n + 1 + SLACK + SHA_PAD);
    buf[0] = 0x83; // array of 3
    write_head(&mut buf[1..], 0x40, width as u64); // byte string
    let mut pos = offset + width;
    pos += write_head(&mut buf[pos..], 0x80, n as u64);
    for &token in tokens {
        // Major type 0 holds v, major type 1 holds -1 - v; both as the magnitude m.
        let major = ((token >> 63) as u8) & 0x20;
        let m = (token ^ (token >> 63)) as u64;
        let m = u32::try_from(m).ok()?;
        let (over_1, over_2, over_3) = (
            u32::from(m >= 24),
            u32::from(m >= 0x100),
            u32::from(m >= 0x1_0000),
        );
        // Below 24 the value is the head's argument; above, the head (0x18, 0x19,
        // 0x1a) is followed by the value's 1, 2 or 4 big-endian bytes: the top bytes
        // of its byte-swapped form.
        let extra_bytes = over_1 + over_2 + 2 * over_3; // 0, 1, 2, 4
        let be = u64::from(m.swap_bytes()) >> (32 - 8 * extra_bytes);
        let word = if over_1 == 0 {
            u64::from(major | m as u8)
        } else {
            u64::from(major | (0x17 + (over_1 + over_2 + over_3) as u8)) | (be << 8)
        };
        buf[pos..pos + 8].copy_from_slice(&word.to_le_bytes());
        pos += 1 + extra_bytes as usize;
    }
    buf[pos] = 0xf6; // None
    Some(pos + 1)
}

/// A CBOR head of `major` with argument `arg` (shortest form) at the start of
/// `out`; returns its length.
fn write_head(out: &mut [u8], major: u8, arg: u64) -> usize {
    match arg {
        0..=23 => {
            out[0] = major | arg as u8;
            1
        }
        24..=0xff => {
            out[..2].copy_from_slice(&[major | 24, arg as u8]);
            2
        }
        0x100..=0xffff => {
            out[0] = major | 25;
            out[1..3].copy_from_slice(&(arg as u16).to_be_bytes());
            3
        }
        0x1_0000..=0xffff_ffff => {
            out[0] = major | 26;
            out[1..5].copy_from_slice(&(arg as u32).to_be_bytes());
            5
        }
        _ => {
            out[0] = major | 27;
            out[1..9].copy_from_slice(&arg.to_be_bytes());
            9
        }
    }
}

/// `buf` at least `len` bytes long (grown with zeros, never shrunk, so a reused
/// buffer is written in place).
fn prepare(buf: &mut Vec<u8>, len: usize) {
    if buf.len() < len {
        buf.resize(len, 0);
    }
}

/// SHA-256 of `buf[..len]`, padding `buf` in place after the message (the encoders
/// above leave room for it).
pub(super) fn sha256_in_place(buf: &mut [u8], len: usize) -> Digest {
    let padded = (len + 9).div_ceil(64) * 64;
    buf[len] = 0x80;
    buf[len + 1..padded - 8].fill(0);
    buf[padded - 8..padded].copy_from_slice(&((len as u64) * 8).to_be_bytes());
    let mut state = SHA256_INIT;
    for block in buf[..padded].chunks_exact(64) {
        sha2::compress256(
            &mut state,
            std::slice::from_ref(GenericArray::from_slice(block)),
        );
    }
    let mut bytes = [0u8; 32];
    for (out, word) in bytes.chunks_exact_mut(4).zip(state) {
        out.copy_from_slice(&word.to_be_bytes());
    }
    Digest::from_bytes(&bytes)
}

/// SHA-256's initial hash value (FIPS 180-4, 5.3.3).
const SHA256_INIT: [u32; 8] = [
    0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19,
];

#[cfg(test)]
mod tests {
    use super::super::cbor;
    use super::super::pickle::PickleWriter;
    use super::*;
    use proptest::prelude::*;
    use sha2::{Digest as _, Sha256};

    /// A plain block's whole encoding, parent included.
    fn encode(pickle: bool, buf: &mut Vec<u8>, parent: &[u8], tokens: &[i64]) -> Option<usize> {
        let encoding = if pickle {
            Encoding::Pickle
        } else {
            Encoding::Cbor
        };
        let len = encode_tokens(encoding, buf, parent.len(), tokens)?;
        let offset = parent_offset(encoding, parent.len())?;
        buf[offset..offset + parent.len()].copy_from_slice(parent);
        Some(len)
    }

    /// The general encoders' bytes for the same block.
    fn general(parent: &[u8], tokens: &[i64], pickle: bool) -> Vec<u8> {
        let mut buf = Vec::new();
        if pickle {
            let mut w = PickleWriter::begin(&mut buf);
            w.begin_tuple(3);
            w.save_bytes(parent);
            w.save_i64_tuple(tokens);
            w.save_none();
            w.end_tuple(3);
            w.finish();
        } else {
            cbor::write_array_head(&mut buf, 3);
            cbor::write_bytes(&mut buf, parent);
            cbor::write_i64_array(&mut buf, tokens);
            cbor::write_none(&mut buf);
        }
        buf
    }

    /// Values on every boundary of both encodings, and beyond them.
    fn edge_token() -> impl Strategy<Value = i64> {
        prop_oneof![
            -300i64..300,
            prop::sample::select(vec![
                23,
                24,
                255,
                256,
                65_535,
                65_536,
                -24,
                -25,
                -256,
                -257,
                -65_536,
                -65_537,
                i32::MAX as i64,
                i32::MIN as i64,
                i32::MAX as i64 + 1,
                i32::MIN as i64 - 1,
                u32::MAX as i64,
                u32::MAX as i64 + 1,
                -(u32::MAX as i64) - 1,
                -(u32::MAX as i64) - 2,
                i64::MAX,
                i64::MIN,
            ]),
            0i64..200_000,
            any::<i64>(),
        ]
    }

    proptest! {
        #[test]
        fn plain_encodings_equal_the_general_ones(
            tokens in prop::collection::vec(edge_token(), 0..40),
            wide in any::<bool>(),
            reuse in any::<bool>(),
        ) {
            let parent: Vec<u8> = (0..if wide { 32 } else { 16 }).collect();
            // A reused buffer holds stale bytes; they must not leak into the output.
            let mut buf = if reuse { vec![0xaa; 300] } else { Vec::new() };
            for pickle in [true, false] {
                let len = encode(pickle, &mut buf, &parent, &tokens);
                let in_range = tokens.iter().all(|&t| if pickle {
                    i32::try_from(t).is_ok()
                } else {
                    (-(1i64 << 32)..1i64 << 32).contains(&t)
                });
                let short = pickle && tokens.len() < 4;
                prop_assert_eq!(len.is_some(), in_range && !short);
                if let Some(len) = len {
                    prop_assert_eq!(&buf[..len], &general(&parent, &tokens, pickle)[..]);
                    let digest = sha256_in_place(&mut buf, len);
                    let expected = Sha256::digest(general(&parent, &tokens, pickle));
                    prop_assert_eq!(digest.as_bytes(), &expected[..]);
                }
            }
        }
    }

    #[test]
    fn padding_crosses_every_block_boundary() {
        // Messages of every length around the 55/56-byte boundary of a block.
        for len in 0..200 {
            let msg: Vec<u8> = (0..len).map(|i| (i * 7) as u8).collect();
            let mut buf = msg.clone();
            buf.resize(len + SHA_PAD, 0xee);
            let digest = sha256_in_place(&mut buf, len);
            assert_eq!(digest.as_bytes(), &Sha256::digest(&msg)[..], "length {len}");
        }
    }

    #[test]
    fn too_many_tokens_take_the_general_path() {
        let tokens = vec![1i64; MAX_PICKLE_TOKENS + 1];
        assert_eq!(encode(true, &mut Vec::new(), &[0; 32], &tokens), None);
        let tokens = vec![70_000i64; MAX_PICKLE_TOKENS];
        let mut buf = Vec::new();
        let len = encode(true, &mut buf, &[0; 32], &tokens).unwrap();
        assert_eq!(&buf[..len], &general(&[0; 32], &tokens, true)[..]);
    }
}
