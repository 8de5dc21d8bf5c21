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
//! SHA-256 runs on the buffer padded in place, one 64-byte block at a time. A chain
//! is serial (each block's message holds its parent's digest), and SHA-256's rounds
//! are one long dependency chain the processor mostly waits on; so the next block's
//! tokens are read and encoded in pieces between the current block's compressions,
//! where they run in that wait. Measured on its own, the encoding then costs almost
//! nothing beyond the compressions (`docs/benchmarks.md`). The compressions are a
//! [`Compressor`]: `sha2`'s, or on x86-64 processors with the SHA extensions
//! [`super::sha_ni`], which keeps the chain's digest in registers.

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

    /// Calls `f` on the tokens `start..start + n` in order; false (having called it
    /// on some of them, or none) when the source cannot give them all. A source that
    /// decodes its tokens (a Python list) does it here without storing them.
    #[inline(always)]
    fn for_each(&mut self, start: usize, n: usize, mut f: impl FnMut(i64)) -> bool {
        match self.tokens(start, n) {
            Some(tokens) => {
                // A loop, not `Iterator::for_each`, which need not inline into the
                // SHA extensions' chain.
                for &t in tokens {
                    f(t);
                }
                true
            }
            None => false,
        }
    }

    /// [`Self::for_each`] for a caller that takes only tokens in `i32` (pickle's
    /// integer items): false, as when the source cannot give them all, when one is
    /// outside it (`f` may have seen it truncated: the caller drops what it made). A
    /// source whose tokens mostly come known to fit (a Python list's one-digit ints)
    /// checks only the others: a check a token less in the SHA chain's loop.
    #[inline(always)]
    fn for_each_i32(&mut self, start: usize, n: usize, mut f: impl FnMut(i32)) -> bool {
        // Nonzero once a token is outside `i32`: `t + 2^31` is below 2^32 exactly
        // for the others. Checked after the loop, which then has no exit of its own.
        let mut beyond = 0u64;
        let given = self.for_each(start, n, |token| {
            beyond |= (token as u64).wrapping_add(1 << 31) >> 32;
            f(token as i32);
        });
        given && beyond == 0
    }
}

impl TokenSource for &[i64] {
    fn len(&self) -> usize {
        <[i64]>::len(self)
    }

    #[inline]
    fn tokens(&mut self, start: usize, n: usize) -> Option<&[i64]> {
        self.get(start..start.checked_add(n)?)
    }
}

/// A request's tokens from token `offset` on (the ones before are not given): hashing
/// resumed at a later block reads no earlier token.
///
/// ```
/// use kvpool::pool::hashing::{Offset, TokenSource};
/// let rest = [7i64, 8, 9];
/// let mut source = Offset::new(&rest[..], 4);
/// assert_eq!(source.len(), 7);
/// assert_eq!(source.tokens(4, 2), Some(&[7, 8][..]));
/// assert_eq!(source.tokens(3, 2), None);
/// ```
pub struct Offset<'a> {
    tokens: &'a [i64],
    offset: usize,
}

impl<'a> Offset<'a> {
    /// `tokens` as the request's tokens `offset..`.
    pub fn new(tokens: &'a [i64], offset: usize) -> Self {
        Self { tokens, offset }
    }
}

impl TokenSource for Offset<'_> {
    fn len(&self) -> usize {
        self.tokens.len().saturating_add(self.offset)
    }

    #[inline]
    fn tokens(&mut self, start: usize, n: usize) -> Option<&[i64]> {
        let start = start.checked_sub(self.offset)?;
        self.tokens.get(start..start.checked_add(n)?)
    }
}

/// Hashes the blocks `blocks` (of `block_size` tokens from `source`) on the short
/// path, chaining from `parent`, and appends the digests to `out`; returns how many
/// it hashed, stopping before the first block that is not plain or that `source`
/// cannot give.
///
/// Two buffers alternate: while one block's message is hashed, the next block's is
/// written into the other (its parent goes in last, once known).
pub(super) fn hash_chain<S: TokenSource + ?Sized>(
    algo: HashAlgo,
    parent: &[u8],
    source: &mut S,
    block_size: usize,
    blocks: Range<usize>,
    bufs: &mut [Vec<u8>; 2],
    out: &mut Vec<u8>,
) -> usize {
    let width = parent.len();
    if blocks.is_empty() || width != algo.digest_len() || block_size == 0 {
        return 0;
    }
    let Some(layout) = Layout::new(algo.encoding(), width) else {
        return 0;
    };
    if matches!(algo, HashAlgo::Sha256 | HashAlgo::Sha256Cbor) {
        #[cfg(target_arch = "x86_64")]
        if let Some(sha_ni) = super::sha_ni::ShaNi::detect() {
            return sha_ni.hash_chain(layout, parent, source, block_size, blocks, bufs, out);
        }
        return sha_chain(
            Portable, layout, parent, source, block_size, blocks, bufs, out,
        );
    }
    let [even, odd] = bufs;
    let Some(mut len) = layout.encode(even, source, blocks.start * block_size, block_size) else {
        return 0;
    };
    out.reserve(blocks.len() * width);
    let mut parent = Digest::from_bytes(parent);
    let mut hashed = 0;
    for block in blocks.clone() {
        let (cur, next) = if hashed % 2 == 0 {
            (&mut *even, &mut *odd)
        } else {
            (&mut *odd, &mut *even)
        };
        let offset = layout.parent_offset;
        copy_digest(&mut cur[offset..offset + width], &parent);
        parent = algo.digest_bytes(&cur[..len]);
        copy_digest_onto(out, &parent);
        hashed += 1;
        let next_start = (block + 1 < blocks.end).then_some((block + 1) * block_size);
        match next_start.and_then(|start| layout.encode(next, source, start, block_size)) {
            Some(l) => len = l,
            None => break,
        }
    }
    hashed
}

/// SHA-256's compression function as [`sha_chain`] drives it: a message's first
/// 64-byte piece with its parent's digest spliced in, then the other pieces, then
/// the digest. Two implementations: [`Portable`] (`sha2`), and on x86-64 processors
/// with the SHA extensions `sha_ni::ShaNi`, which keeps the digest in registers
/// from one message to the next.
pub(super) trait Compressor: Copy {
    /// A digest in the form the next message takes it.
    type Parent: Copy;
    /// A message's running state.
    type State;

    /// The chain's first parent, from its 32 bytes.
    fn parent(&self, bytes: &[u8]) -> Self::Parent;

    /// Starts a message: compresses its first 64 bytes, `piece`, whose parent's 32
    /// bytes at `offset` are not written yet (an implementation may write them).
    /// `head` holds the bytes before the parent as words ([`Layout::head_words`]),
    /// also written in `piece`.
    fn first(
        &self,
        piece: &mut [u8],
        offset: usize,
        head: [u32; 4],
        parent: Self::Parent,
    ) -> Self::State;

    /// Compresses the message's next 64 bytes.
    fn next(&self, state: &mut Self::State, piece: &[u8]);

    /// Appends the finished message's digest to `out` and returns it as a parent.
    fn finish(&self, state: Self::State, out: &mut Vec<u8>) -> Self::Parent;
}

/// [`Compressor`] on `sha2::compress256`, everywhere.
#[derive(Clone, Copy)]
pub(super) struct Portable;

impl Compressor for Portable {
    type Parent = [u8; 32];
    type State = [u32; 8];

    #[inline(always)]
    fn parent(&self, bytes: &[u8]) -> [u8; 32] {
        let mut parent = [0u8; 32];
        parent.copy_from_slice(&bytes[..32]);
        parent
    }

    #[inline(always)]
    fn first(&self, piece: &mut [u8], offset: usize, _: [u32; 4], parent: [u8; 32]) -> [u32; 8] {
        piece[offset..offset + 32].copy_from_slice(&parent);
        let mut state = SHA256_INIT;
        self.next(&mut state, piece);
        state
    }

    #[inline(always)]
    fn next(&self, state: &mut [u32; 8], piece: &[u8]) {
        let block = GenericArray::from_slice(&piece[..64]);
        sha2::compress256(state, std::slice::from_ref(block));
    }

    #[inline(always)]
    fn finish(&self, state: [u32; 8], out: &mut Vec<u8>) -> [u8; 32] {
        let mut digest = [0u8; 32];
        for (bytes, word) in digest.chunks_exact_mut(4).zip(state) {
            bytes.copy_from_slice(&word.to_be_bytes());
        }
        out.extend_from_slice(&digest);
        digest
    }
}

/// [`hash_chain`] for the two SHA-256 algorithms (a 32-byte parent), on compressor
/// `c`.
///
/// SHA-256's rounds are one long dependency chain the processor mostly waits on, so
/// the next block's items are written in one share per 64-byte piece of this
/// block's message, each right after that piece's compression is issued, where
/// they run in that wait.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub(super) fn sha_chain<C: Compressor, S: TokenSource + ?Sized>(
    c: C,
    layout: Layout,
    parent: &[u8],
    source: &mut S,
    block_size: usize,
    blocks: Range<usize>,
    bufs: &mut [Vec<u8>; 2],
    out: &mut Vec<u8>,
) -> usize {
    let [even, odd] = bufs;
    let Some(mut len) = layout.encode(even, source, blocks.start * block_size, block_size) else {
        return 0;
    };
    out.reserve(blocks.len() * 32);
    let mut parent = c.parent(parent);
    let mut hashed = 0;
    for block in blocks.clone() {
        let (cur, next) = if hashed % 2 == 0 {
            (&mut *even, &mut *odd)
        } else {
            (&mut *odd, &mut *even)
        };
        let next_start = (block + 1 < blocks.end).then_some((block + 1) * block_size);
        let padded = pad_sha256(cur, len);
        let mut pos = next_start.and_then(|_| layout.begin(next, block_size));
        // The next block's items in share `k` of `pieces` (the work in a function,
        // which inlines into the SHA extensions' loop where a closure's body did not).
        let mut share = |k: usize, pieces: usize| {
            items_share(
                layout, next, &mut pos, source, next_start, block_size, k, pieces,
            )
        };
        let head = layout.head_words(len);
        let mut state = c.first(&mut cur[..64], layout.parent_offset, head, parent);
        // Two and three pieces (16 tokens pickle to 85-133 bytes) written out with
        // constant bounds: 1-9% faster a 1,200-token request than one loop over the
        // pieces (`benches/ab_builds.py`, two runs; docs/benchmarks.md).
        match padded / 64 {
            2 => {
                share(0, 2);
                c.next(&mut state, &cur[64..128]);
                share(1, 2);
            }
            3 => {
                share(0, 3);
                c.next(&mut state, &cur[64..128]);
                share(1, 3);
                c.next(&mut state, &cur[128..192]);
                share(2, 3);
            }
            pieces => {
                share(0, pieces);
                for k in 1..pieces {
                    c.next(&mut state, &cur[k * 64..(k + 1) * 64]);
                    share(k, pieces);
                }
            }
        }
        parent = c.finish(state, out);
        hashed += 1;
        match pos.map(|p| layout.finish(next, p)) {
            Some(l) => len = l,
            None => break,
        }
    }
    hashed
}

/// Writes share `k` of `pieces` of the items of the block of `block_size` tokens
/// from `start` into `buf` at `pos`, as [`Layout::items`] (nothing once `pos` or
/// `start` is `None`).
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn items_share<S: TokenSource + ?Sized>(
    layout: Layout,
    buf: &mut [u8],
    pos: &mut Option<usize>,
    source: &mut S,
    start: Option<usize>,
    block_size: usize,
    k: usize,
    pieces: usize,
) {
    if let (Some(p), Some(start)) = (*pos, start) {
        let (lo, hi) = (k * block_size / pieces, (k + 1) * block_size / pieces);
        *pos = layout.items(buf, p, source, start + lo, hi - lo);
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

/// A plain block's encoding for one serialization and parent width, written in
/// three steps ([`Self::begin`], [`Self::items`] any number of times,
/// [`Self::finish`]) so that the items can be written in pieces. Everything but the
/// parent's bytes, which go at `parent_offset`.
#[derive(Clone, Copy)]
pub(super) struct Layout {
    encoding: Encoding,
    width: usize,
    parent_offset: usize,
}

impl Layout {
    /// `None` for a parent of 256 bytes or more, or of fewer than 3 in pickle
    /// (none is a digest; below 3 the 16 head bytes [`Self::finish`] writes would
    /// reach the opcodes after the parent).
    fn new(encoding: Encoding, width: usize) -> Option<Self> {
        let parent_offset = match (encoding, width) {
            // PROTO 5, FRAME n, SHORT_BINBYTES width
            (Encoding::Pickle, 3..=255) => 13,
            // array(3), then a byte string head of one byte (< 24) or two (< 256)
            (Encoding::Cbor, 0..=23) => 2,
            (Encoding::Cbor, 24..=255) => 3,
            _ => return None,
        };
        Some(Self {
            encoding,
            width,
            parent_offset,
        })
    }

    /// The whole encoding of the `n` tokens from `start`; returns its length.
    #[inline]
    fn encode<S: TokenSource + ?Sized>(
        self,
        buf: &mut Vec<u8>,
        source: &mut S,
        start: usize,
        n: usize,
    ) -> Option<usize> {
        let pos = self.begin(buf, n)?;
        let pos = self.items(buf, pos, source, start, n)?;
        Some(self.finish(buf, pos))
    }

    /// Grows `buf` for `n` items (and SHA-256 padding) and writes what comes before
    /// the items; returns where they start. `None` when `n` items are not plain:
    /// fewer than 4 (pickle's short tuple opcodes) or too many for one pickle frame.
    #[inline(always)]
    fn begin(self, buf: &mut Vec<u8>, n: usize) -> Option<usize> {
        let w = self.width;
        match self.encoding {
            Encoding::Pickle => {
                if !(4..=MAX_PICKLE_TOKENS).contains(&n) {
                    return None;
                }
                prepare(buf, 15 + w + 5 * n + 6 + SLACK + SHA_PAD);
                // What comes before the parent is written by `finish`, once the
                // frame's length is known.
                buf[13 + w..15 + w].copy_from_slice(&[0x94, b'(']); // MEMOIZE, MARK
                Some(15 + w)
            }
            Encoding::Cbor => {
                prepare(
                    buf,
                    self.parent_offset + w + 9 + 5 * n + 1 + SLACK + SHA_PAD,
                );
                write_words(buf, self.head_words(0));
                let items = self.parent_offset + w;
                Some(items + write_head(&mut buf[items..], 0x80, n as u64))
            }
        }
    }

    /// Writes the items of the `n` tokens from `start` at `pos` (within the room
    /// [`Self::begin`] made); returns where the next item goes, or `None` when the
    /// source cannot give them or a token is out of the plain range (pickle: `i32`;
    /// CBOR: `-2^32..2^32`).
    #[inline(always)]
    fn items<S: TokenSource + ?Sized>(
        self,
        buf: &mut [u8],
        pos: usize,
        source: &mut S,
        start: usize,
        n: usize,
    ) -> Option<usize> {
        let room = buf.get_mut(pos..pos + 5 * n + SLACK)?;
        let written = match self.encoding {
            Encoding::Pickle => pickle_items(room, source, start, n)?,
            Encoding::Cbor => cbor_items(room, source, start, n)?,
        };
        Some(pos + written)
    }

    /// What comes before the parent in a message of `len` bytes, as the big-endian
    /// words of its first 16 bytes with every later byte zero: for pickle `PROTO 5,
    /// FRAME len - 11, SHORT_BINBYTES width` (13 bytes), for CBOR an array of 3 and
    /// the byte string's head (2 or 3 bytes; `len` unused). [`Self::begin`] (CBOR)
    /// and [`Self::finish`] (pickle) write these bytes from here; a [`Compressor`]
    /// may take the words as they are instead of reading them back.
    #[inline(always)]
    fn head_words(self, len: usize) -> [u32; 4] {
        let w = self.width as u32; // below 256 (`Layout::new`)
        match self.encoding {
            Encoding::Pickle => {
                // The frame counts the bytes after its 9-byte opcode (11 in all with
                // PROTO's two), as 8 little-endian bytes from the fourth byte on.
                let frame = len.saturating_sub(11) as u64;
                [
                    0x8005_9500 | (frame as u32 & 0xFF), // PROTO 5, FRAME
                    ((frame >> 8) as u32).swap_bytes(),
                    ((frame >> 40) as u32).swap_bytes() | u32::from(b'C'), // SHORT_BINBYTES
                    w << 24,
                ]
            }
            // An array of 3, then a byte string of `w` bytes (its length in the head
            // below 24, else in one more byte).
            Encoding::Cbor if w < 24 => [0x8340_0000 | (w << 16), 0, 0, 0],
            Encoding::Cbor => [0x8358_0000 | (w << 8), 0, 0, 0],
        }
    }

    /// Writes what follows the items at `pos`; returns the encoding's length.
    #[inline]
    fn finish(self, buf: &mut [u8], pos: usize) -> usize {
        match self.encoding {
            Encoding::Pickle => {
                // TUPLE, MEMOIZE, NONE, TUPLE3, MEMOIZE, STOP
                buf[pos..pos + 6].copy_from_slice(&[b't', 0x94, b'N', 0x87, 0x94, b'.']);
                let len = pos + 6;
                write_words(buf, self.head_words(len));
                len
            }
            Encoding::Cbor => {
                buf[pos] = 0xf6; // None
                pos + 1
            }
        }
    }
}

/// Pickle items of the `n` tokens from `start` at the start of `room` (5 bytes
/// each at most, plus [`SLACK`]); returns their length, or `None` when the source
/// cannot give them or a token is outside `i32`.
#[inline(always)]
fn pickle_items<S: TokenSource + ?Sized>(
    room: &mut [u8],
    source: &mut S,
    start: usize,
    n: usize,
) -> Option<usize> {
    let mut pos = 0u32; // 32-bit, so that `pos + 8` needs no overflow check
    let given = source.for_each_i32(start, n, |token| {
        let v = token as u32;
        let form = pickle_int_form(v);
        // The opcode, then the value's little-endian bytes: the shorter forms are
        // prefixes of them (the 8 bytes written reach past the item; the next item
        // or the tail `Layout::finish` writes covers them).
        let word = (u64::from(v) << 8) | u64::from(form & 0xFF);
        let p = pos as usize;
        room[p..p + 8].copy_from_slice(&word.to_le_bytes());
        pos += form >> 8;
    });
    given.then_some(pos as usize)
}

/// Pickle's shortest integer item for a token whose `i32` bits are `v`: its opcode
/// in the low byte and its length (opcode included) above: `BININT1` (`K`, 2 bytes)
/// below 256, `BININT2` (`M`, 3) below 65,536, else `BININT` (`J`, 5; negative
/// tokens too), from a table indexed by two comparisons. Fewer instructions a token
/// than the opcode and length as sums of the comparisons, which the SHA chain's
/// loop felt; and no `bsr` (from a bit length), whose output depends on its
/// destination register's old value, which cost the xxhash path a third when the
/// compiler picked a register in use (docs/benchmarks.md, fifteenth sitting).
#[inline(always)]
fn pickle_int_form(v: u32) -> u32 {
    /// The forms by the number of the two bounds `v` is above.
    const FORMS: [u32; 3] = [0x024B, 0x034D, 0x054A];
    FORMS[usize::from(v > 0xFF) + usize::from(v > 0xFFFF)]
}

/// CBOR items of the `n` tokens from `start` at the start of `room`, as
/// [`pickle_items`]; `None` for a token outside `-2^32..2^32` (the 9-byte integer
/// form).
#[inline(always)]
fn cbor_items<S: TokenSource + ?Sized>(
    room: &mut [u8],
    source: &mut S,
    start: usize,
    n: usize,
) -> Option<usize> {
    let mut pos = 0u32;
    let mut beyond = 0u64;
    let given = source.for_each(start, n, |token| {
        // Major type 0 holds v, major type 1 holds -1 - v; both as the magnitude m.
        let major = ((token >> 63) as u8) & 0x20;
        let magnitude = (token ^ (token >> 63)) as u64;
        beyond |= magnitude >> 32;
        let m = magnitude as u32;
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
        let p = pos as usize;
        room[p..p + 8].copy_from_slice(&word.to_le_bytes());
        pos += 1 + extra_bytes;
    });
    (given && beyond == 0).then_some(pos as usize)
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

/// Writes big-endian `words` over the first 16 bytes of `buf` (one fixed-size
/// write; zeros where a parent goes, written after).
#[inline(always)]
fn write_words(buf: &mut [u8], words: [u32; 4]) {
    let mut bytes = [0u8; 16];
    for (out, word) in bytes.chunks_exact_mut(4).zip(words) {
        out.copy_from_slice(&word.to_be_bytes());
    }
    buf[..16].copy_from_slice(&bytes);
}

/// `buf` at least `len` bytes long (grown with zeros, never shrunk, so a reused
/// buffer is written in place).
fn prepare(buf: &mut Vec<u8>, len: usize) {
    if buf.len() < len {
        buf.resize(len, 0);
    }
}

/// Pads the message `buf[..len]` for SHA-256 in place (the encoders leave room:
/// [`SHA_PAD`] bytes); returns the padded length, a multiple of 64.
#[inline(always)]
fn pad_sha256(buf: &mut [u8], len: usize) -> usize {
    let padded = (len + 9).div_ceil(64) * 64;
    // `0x80` and the zeros after it as one write of a fixed 64 bytes (a `fill` of
    // the exact length is a call to `memset`); the bit length, at most 72 bytes
    // past `len`, goes over or after them.
    let mut tail = [0u8; 64];
    tail[0] = 0x80;
    buf[len..len + 64].copy_from_slice(&tail);
    buf[padded - 8..padded].copy_from_slice(&((len as u64) * 8).to_be_bytes());
    padded
}

/// SHA-256 of `buf[..len]`, padding `buf` in place after the message (the
/// portable compressor, piece by piece).
#[cfg(test)]
fn sha256_in_place(buf: &mut [u8], len: usize) -> Digest {
    let padded = pad_sha256(buf, len);
    let mut state = SHA256_INIT;
    for piece in buf[..padded].chunks_exact(64) {
        Portable.next(&mut state, piece);
    }
    let mut digest = Vec::new();
    Portable.finish(state, &mut digest);
    Digest::from_bytes(&digest)
}

/// SHA-256's initial hash value (FIPS 180-4, 5.3.3).
pub(super) const SHA256_INIT: [u32; 8] = [
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
        let layout = Layout::new(encoding, parent.len())?;
        let len = layout.encode(buf, &mut &tokens[..], 0, tokens.len())?;
        let offset = layout.parent_offset;
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

    /// A source that cannot give tokens at or past `fail_at`.
    struct Failing<'a> {
        tokens: &'a [i64],
        fail_at: usize,
    }

    impl TokenSource for Failing<'_> {
        fn len(&self) -> usize {
            self.tokens.len()
        }

        fn tokens(&mut self, start: usize, n: usize) -> Option<&[i64]> {
            (start + n <= self.fail_at).then(|| &self.tokens[start..start + n])
        }
    }

    proptest! {
        #[test]
        fn chains_equal_block_by_block_hashing_and_stop_where_the_source_does(
            tokens in prop::collection::vec(edge_token(), 0..200),
            block_size in 1usize..40,
            algo in prop::sample::select(HashAlgo::ALL.to_vec()),
            fail_at in 0usize..220,
            first in 0usize..3,
        ) {
            let root = super::super::none_hash(algo, "seed");
            let full = tokens.len() / block_size;
            let mut general = super::super::BlockHasher::new(algo);
            let mut expected = Vec::new();
            let mut parent = root;
            for block in tokens.chunks_exact(block_size).skip(first) {
                parent = general.hash_block(&parent, block, None);
                expected.push(parent);
            }
            let plain = |t: &[i64]| {
                let short = algo.encoding() == Encoding::Pickle && t.len() < 4;
                let range = if algo.encoding() == Encoding::Pickle {
                    i64::from(i32::MIN)..=i64::from(i32::MAX)
                } else {
                    -(1i64 << 32)..=(1i64 << 32) - 1
                };
                !short && t.iter().all(|v| range.contains(v))
            };
            // The chain stops before the first block that is not plain or not given.
            let stop = (first..full)
                .find(|&b| {
                    let t = &tokens[b * block_size..(b + 1) * block_size];
                    !plain(t) || (b + 1) * block_size > fail_at
                })
                .unwrap_or(full.max(first));
            let mut bufs = [Vec::new(), Vec::new()];
            let mut out = Vec::new();
            let mut source = Failing { tokens: &tokens, fail_at };
            let hashed = hash_chain(algo, &root, &mut source, block_size, first..full, &mut bufs, &mut out);
            prop_assert_eq!(hashed, stop - first.min(stop));
            let width = algo.digest_len();
            for (i, digest) in out.chunks_exact(width).enumerate() {
                prop_assert_eq!(digest, expected[i].as_bytes());
            }
            // Each SHA-256 compressor on its own (`hash_chain` takes one of them):
            // the same digests, stopping at the same block.
            if algo.digest_len() == 32 && first < full {
                let layout = Layout::new(algo.encoding(), 32).unwrap();
                for (name, chain) in sha_backends() {
                    let mut source = Failing { tokens: &tokens, fail_at };
                    let mut again = Vec::new();
                    let n = chain(layout, &root, &mut source, block_size, first..full, &mut bufs, &mut again);
                    prop_assert_eq!((name, n), (name, hashed));
                    prop_assert_eq!(&again, &out, "{}", name);
                }
            }
        }
    }

    /// `sha_chain` on a `Failing` source, as a plain function.
    type ShaChain = fn(
        Layout,
        &[u8],
        &mut Failing<'_>,
        usize,
        Range<usize>,
        &mut [Vec<u8>; 2],
        &mut Vec<u8>,
    ) -> usize;

    /// The SHA-256 compressors this machine can run, by name.
    fn sha_backends() -> Vec<(&'static str, ShaChain)> {
        let mut backends: Vec<(&'static str, ShaChain)> = vec![(
            "portable",
            |layout, parent, source, bs, blocks, bufs, out| {
                sha_chain(Portable, layout, parent, source, bs, blocks, bufs, out)
            },
        )];
        #[cfg(target_arch = "x86_64")]
        if super::super::sha_ni::ShaNi::detect().is_some() {
            backends.push(("sha_ni", |layout, parent, source, bs, blocks, bufs, out| {
                let sha_ni = super::super::sha_ni::ShaNi::detect().unwrap();
                sha_ni.hash_chain(layout, parent, source, bs, blocks, bufs, out)
            }));
        }
        backends
    }

    #[test]
    fn long_blocks_hash_as_the_general_path_on_each_compressor() {
        // Frames of 256 bytes and more (a nonzero second length byte in the head
        // words), up to the largest block the short path takes.
        let tokens: Vec<i64> = (0..36_000).map(|t| (t * 7919) % 151_000 - 1_000).collect();
        for algo in [HashAlgo::Sha256, HashAlgo::Sha256Cbor] {
            let root = super::super::none_hash(algo, "seed");
            for block_size in [100, 300, 1_000, 5_461, MAX_PICKLE_TOKENS] {
                let blocks = tokens.len() / block_size;
                let mut general = super::super::BlockHasher::new(algo);
                let mut expected = Vec::new();
                let mut parent = root;
                for block in tokens.chunks_exact(block_size) {
                    parent = general.hash_block(&parent, block, None);
                    expected.extend_from_slice(&parent);
                }
                let layout = Layout::new(algo.encoding(), 32).unwrap();
                for (name, chain) in sha_backends() {
                    let mut source = Failing {
                        tokens: &tokens,
                        fail_at: usize::MAX,
                    };
                    let (mut bufs, mut out) = ([Vec::new(), Vec::new()], Vec::new());
                    let n = chain(
                        layout,
                        &root,
                        &mut source,
                        block_size,
                        0..blocks,
                        &mut bufs,
                        &mut out,
                    );
                    assert_eq!(n, blocks, "{name} {algo:?} {block_size}");
                    assert_eq!(out, expected, "{name} {algo:?} {block_size}");
                }
            }
        }
    }

    #[test]
    fn short_pickle_parents_take_the_general_path() {
        for width in 0..3 {
            assert!(Layout::new(Encoding::Pickle, width).is_none());
        }
        assert!(Layout::new(Encoding::Pickle, 3).is_some());
    }

    #[test]
    fn head_words_are_the_bytes_before_the_parent() {
        for (encoding, width) in [
            (Encoding::Pickle, 32),
            (Encoding::Pickle, 16),
            (Encoding::Pickle, 3),
            (Encoding::Cbor, 32),
            (Encoding::Cbor, 16),
            (Encoding::Cbor, 1),
        ] {
            let layout = Layout::new(encoding, width).unwrap();
            let tokens: Vec<i64> = (0..700).map(|t| t * 997).collect();
            for n in [4, 16, 300, 700] {
                let mut buf = Vec::new();
                let len = layout.encode(&mut buf, &mut &tokens[..], 0, n).unwrap();
                let words = layout.head_words(len);
                let mut bytes = [0u8; 16];
                for (out, word) in bytes.chunks_exact_mut(4).zip(words) {
                    out.copy_from_slice(&word.to_be_bytes());
                }
                let before = layout.parent_offset;
                assert_eq!(&bytes[..before], &buf[..before], "{encoding:?} {width} {n}");
                assert!(
                    bytes[before..].iter().all(|&b| b == 0),
                    "{encoding:?} {width} {n}"
                );
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
