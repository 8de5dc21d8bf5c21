//! SHA-256 on the x86 SHA extensions, with a chain's state kept in registers.
//!
//! A block's message holds its parent's digest, so a chain is serial, and the time
//! of a compression is the latency of its 32 `sha256rnds2` steps. The portable path
//! ([`super::plain`] with `sha2::compress256`) adds to each block the digest's way
//! through memory: the state stored by one call and loaded by the next, the digest
//! written into the message at byte 13 (pickle) or 3 (CBOR), then loaded as 16-byte
//! words over stores of other sizes, which cannot be forwarded and wait for the
//! cache. Here the digest stays in two vector registers and is spliced into the
//! message words with shifts, and a message's pieces are compressed without
//! leaving the registers. On the benchmark's 1,200-token requests (150 compressions)
//! this takes a chain from about 41 to 36 ns a compression, the latency of the
//! rounds themselves (`docs/benchmarks.md`, twelfth sitting).
//!
//! One of the crate's modules with `unsafe` code (see `Cargo.toml`): the intrinsics.
//! They need the `sha`, `ssse3` and `sse4.1` features, which [`ShaNi::detect`]
//! checks at run time; a [`ShaNi`] exists only where they are present, and the chain
//! runs in a function compiled with them enabled ([`ShaNi::hash_chain`]). Every
//! load and store is of a 16-byte array or within a slice checked for its length.

#![allow(unsafe_code)]

use std::arch::x86_64::{
    __m128i, _mm_add_epi32, _mm_alignr_epi8, _mm_and_si128, _mm_blend_epi16, _mm_loadu_si128,
    _mm_or_si128, _mm_set_epi32, _mm_set_epi64x, _mm_sha256msg1_epu32, _mm_sha256msg2_epu32,
    _mm_sha256rnds2_epu32, _mm_shuffle_epi32, _mm_shuffle_epi8, _mm_slli_epi32, _mm_slli_si128,
    _mm_srli_epi32, _mm_srli_si128, _mm_storeu_si128,
};
use std::ops::Range;

use super::plain::{sha_chain, Compressor, Layout, TokenSource, SHA256_INIT};

/// SHA-256's round constants (FIPS 180-4, 4.2.2).
const K: [u32; 64] = [
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
];

/// Proof that this processor has the SHA extensions (and SSSE3, SSE4.1): made
/// only by [`ShaNi::detect`].
#[derive(Clone, Copy, Debug)]
pub(super) struct ShaNi(());

/// A digest as eight big-endian words: `[H0..H3]`, `[H4..H7]` (lane 0 first).
#[derive(Clone, Copy)]
pub(super) struct Words(__m128i, __m128i);

/// A message's running state in the order `sha256rnds2` takes it: `ABEF`, `CDGH`.
#[derive(Clone, Copy)]
pub(super) struct State(__m128i, __m128i);

impl ShaNi {
    /// The extensions, if this processor has them (the check is cached by std).
    #[inline]
    pub(super) fn detect() -> Option<Self> {
        (std::is_x86_feature_detected!("sha")
            && std::is_x86_feature_detected!("ssse3")
            && std::is_x86_feature_detected!("sse4.1"))
        .then_some(Self(()))
    }

    /// [`super::plain`]'s SHA-256 chain on this compressor, compiled with the
    /// extensions enabled so that the rounds and the chain's loop inline together.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn hash_chain<S: TokenSource + ?Sized>(
        self,
        layout: Layout,
        parent: &[u8],
        source: &mut S,
        block_size: usize,
        blocks: Range<usize>,
        bufs: &mut [Vec<u8>; 2],
        out: &mut Vec<u8>,
    ) -> usize {
        // SAFETY: `self` proves the features `chain` is compiled with are present.
        unsafe { chain(self, layout, parent, source, block_size, blocks, bufs, out) }
    }
}

#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "sha,sse2,ssse3,sse4.1")]
unsafe fn chain<S: TokenSource + ?Sized>(
    ni: ShaNi,
    layout: Layout,
    parent: &[u8],
    source: &mut S,
    block_size: usize,
    blocks: Range<usize>,
    bufs: &mut [Vec<u8>; 2],
    out: &mut Vec<u8>,
) -> usize {
    sha_chain(ni, layout, parent, source, block_size, blocks, bufs, out)
}

/// The 16 bytes at `at` in `bytes` (checked).
#[inline(always)]
fn sixteen(bytes: &[u8], at: usize) -> &[u8; 16] {
    bytes[at..at + 16].try_into().expect("16 bytes")
}

/// Four words from a `u32` array of 4.
#[inline(always)]
fn load_u32x4(words: &[u32; 4]) -> __m128i {
    // SAFETY: a 16-byte unaligned load of a 16-byte array; SSE2 is part of x86-64.
    unsafe { _mm_loadu_si128(words.as_ptr().cast()) }
}

/// The steps that need the extensions, methods of the proof that they are present.
impl ShaNi {
    /// 16 message bytes as four big-endian words.
    #[inline(always)]
    fn load_words(self, bytes: &[u8; 16]) -> __m128i {
        // SAFETY: a 16-byte unaligned load of a 16-byte array; SSSE3 (the shuffle)
        // is present (`self`).
        unsafe {
            let swap = _mm_set_epi64x(0x0C0D_0E0F_0809_0A0B, 0x0405_0607_0001_0203);
            _mm_shuffle_epi8(_mm_loadu_si128(bytes.as_ptr().cast()), swap)
        }
    }

    /// Four rounds on `w` (the message words `4 i..4 i + 4`), `i < 16`.
    #[inline(always)]
    fn rounds4(self, abef: &mut __m128i, cdgh: &mut __m128i, w: __m128i, i: usize) {
        let k: &[u32; 4] = K[4 * i..4 * i + 4].try_into().expect("4 words");
        // SAFETY: the SHA extensions are present (`self`).
        unsafe {
            let t1 = _mm_add_epi32(w, load_u32x4(k));
            *cdgh = _mm_sha256rnds2_epu32(*cdgh, *abef, t1);
            let t2 = _mm_shuffle_epi32::<0x0E>(t1);
            *abef = _mm_sha256rnds2_epu32(*abef, *cdgh, t2);
        }
    }

    /// The next four schedule words from the last sixteen (`w0` oldest).
    #[inline(always)]
    fn schedule(self, w0: __m128i, w1: __m128i, w2: __m128i, w3: __m128i) -> __m128i {
        // SAFETY: the SHA extensions and SSSE3 are present (`self`).
        unsafe {
            let t1 = _mm_sha256msg1_epu32(w0, w1);
            let t2 = _mm_alignr_epi8::<4>(w3, w2);
            _mm_sha256msg2_epu32(_mm_add_epi32(t1, t2), w3)
        }
    }

    /// One compression of the message words `w` (four vectors of four) into `state`.
    #[inline(always)]
    fn compress(self, state: &mut State, w: [__m128i; 4]) {
        let State(mut abef, mut cdgh) = *state;
        let [mut w0, mut w1, mut w2, mut w3] = w;
        self.rounds4(&mut abef, &mut cdgh, w0, 0);
        self.rounds4(&mut abef, &mut cdgh, w1, 1);
        self.rounds4(&mut abef, &mut cdgh, w2, 2);
        self.rounds4(&mut abef, &mut cdgh, w3, 3);
        for i in (4..16).step_by(4) {
            w0 = self.schedule(w0, w1, w2, w3);
            self.rounds4(&mut abef, &mut cdgh, w0, i);
            w1 = self.schedule(w1, w2, w3, w0);
            self.rounds4(&mut abef, &mut cdgh, w1, i + 1);
            w2 = self.schedule(w2, w3, w0, w1);
            self.rounds4(&mut abef, &mut cdgh, w2, i + 2);
            w3 = self.schedule(w3, w0, w1, w2);
            self.rounds4(&mut abef, &mut cdgh, w3, i + 3);
        }
        // SAFETY: SSE2 is part of x86-64.
        unsafe {
            *state = State(_mm_add_epi32(abef, state.0), _mm_add_epi32(cdgh, state.1));
        }
    }

    /// SHA-256's initial state in `ABEF`, `CDGH` order.
    #[inline(always)]
    fn initial_state(self) -> State {
        let lo: &[u32; 4] = SHA256_INIT[..4].try_into().expect("4 words");
        let hi: &[u32; 4] = SHA256_INIT[4..].try_into().expect("4 words");
        // SAFETY: SSSE3 (`alignr`) and SSE4.1 (`blend`) are present (`self`).
        unsafe {
            let cdab = _mm_shuffle_epi32::<0xB1>(load_u32x4(lo));
            let efgh = _mm_shuffle_epi32::<0x1B>(load_u32x4(hi));
            State(
                _mm_alignr_epi8::<8>(cdab, efgh),
                _mm_blend_epi16::<0xF0>(efgh, cdab),
            )
        }
    }

    /// The digest's 32 bytes.
    #[inline(always)]
    fn store(&self, words: Words, digest: &mut [u8; 32]) {
        // SAFETY: two 16-byte unaligned stores into a 32-byte array (SSE2); the
        // byte swap needs SSSE3, present (`self`).
        unsafe {
            let swap = _mm_set_epi64x(0x0C0D_0E0F_0809_0A0B, 0x0405_0607_0001_0203);
            let (lo, hi) = digest.split_at_mut(16);
            _mm_storeu_si128(lo.as_mut_ptr().cast(), _mm_shuffle_epi8(words.0, swap));
            _mm_storeu_si128(hi.as_mut_ptr().cast(), _mm_shuffle_epi8(words.1, swap));
        }
    }
}

impl Compressor for ShaNi {
    type Parent = Words;
    type State = State;

    #[inline(always)]
    fn parent(&self, bytes: &[u8]) -> Words {
        Words(
            self.load_words(sixteen(bytes, 0)),
            self.load_words(sixteen(bytes, 16)),
        )
    }

    /// The first piece's words with the parent spliced in where the encoding puts
    /// it: byte 13 (pickle: `W3..W11`, one byte off the digest's words) or byte 3
    /// (CBOR: `W0..W8`, three bytes off). Any other place goes through memory.
    #[inline(always)]
    fn first(&self, piece: &mut [u8], offset: usize, head: [u32; 4], parent: Words) -> State {
        let Words(a, b) = parent; // [H0..H3], [H4..H7]
        let loaded = |at: usize| self.load_words(sixteen(piece, at));
        // SAFETY: SSSE3 (`alignr`) is present (`self`); the rest is SSE2.
        let w = unsafe {
            // The head from registers, not read back from the bytes `piece` has just
            // had written (a 16-byte load over smaller stores waits for the cache).
            let [h0, h1, h2, h3] = head;
            let head_vector = _mm_set_epi32(h3 as i32, h2 as i32, h1 as i32, h0 as i32);
            match offset {
                13 => {
                    // W3 = 0x20 | H0 >> 8; W4..W10 = H(k) << 24 | H(k+1) >> 8;
                    // W11 = H7 << 24 | the three bytes after the parent.
                    let w0 =
                        _mm_or_si128(head_vector, _mm_slli_si128::<12>(_mm_srli_epi32::<8>(a)));
                    let w1 = _mm_or_si128(
                        _mm_slli_epi32::<24>(a),
                        _mm_srli_epi32::<8>(_mm_alignr_epi8::<4>(b, a)),
                    );
                    let w2 = _mm_or_si128(
                        _mm_or_si128(
                            _mm_slli_epi32::<24>(b),
                            _mm_srli_epi32::<8>(_mm_srli_si128::<4>(b)),
                        ),
                        _mm_and_si128(loaded(32), _mm_set_epi32(0x00FF_FFFF, 0, 0, 0)),
                    );
                    [w0, w1, w2, loaded(48)]
                }
                3 => {
                    // W0 = the three head bytes | H0 >> 24; W1..W7 = H(k) << 8 |
                    // H(k+1) >> 24; W8 = H7 << 8 | the byte after the parent.
                    let w0 = _mm_or_si128(
                        head_vector,
                        _mm_or_si128(
                            _mm_slli_epi32::<8>(_mm_slli_si128::<4>(a)),
                            _mm_srli_epi32::<24>(a),
                        ),
                    );
                    let w1 = _mm_or_si128(
                        _mm_slli_epi32::<8>(_mm_alignr_epi8::<12>(b, a)),
                        _mm_srli_epi32::<24>(b),
                    );
                    let w2 = _mm_or_si128(
                        _mm_and_si128(loaded(32), _mm_set_epi32(-1, -1, -1, 0xFF)),
                        _mm_slli_epi32::<8>(_mm_srli_si128::<12>(b)),
                    );
                    [w0, w1, w2, loaded(48)]
                }
                _ => {
                    let mut digest = [0u8; 32];
                    self.store(parent, &mut digest);
                    piece[offset..offset + 32].copy_from_slice(&digest);
                    let word = |at: usize| self.load_words(sixteen(piece, at));
                    [word(0), word(16), word(32), word(48)]
                }
            }
        };
        let mut state = self.initial_state();
        self.compress(&mut state, w);
        state
    }

    #[inline(always)]
    fn next(&self, state: &mut State, piece: &[u8]) {
        let word = |at: usize| self.load_words(sixteen(piece, at));
        self.compress(state, [word(0), word(16), word(32), word(48)]);
    }

    #[inline(always)]
    fn finish(&self, state: State, out: &mut Vec<u8>) -> Words {
        let State(abef, cdgh) = state;
        // SAFETY: SSSE3 (`alignr`) and SSE4.1 (`blend`) are present (`self`).
        let words = unsafe {
            let feba = _mm_shuffle_epi32::<0x1B>(abef);
            let dchg = _mm_shuffle_epi32::<0xB1>(cdgh);
            Words(
                _mm_blend_epi16::<0xF0>(feba, dchg),
                _mm_alignr_epi8::<8>(dchg, feba),
            )
        };
        let mut digest = [0u8; 32];
        self.store(words, &mut digest);
        out.extend_from_slice(&digest);
        words
    }
}

#[cfg(test)]
mod tests {
    use super::super::plain::{Compressor, Portable};
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// A message of two pieces, its parent at any place in the first: the same
        /// digest as the portable compressor's (bytes 13 and 3 are spliced in
        /// registers, the others written and read back).
        #[test]
        fn messages_hash_as_the_portable_compressor_does(
            message in prop::collection::vec(any::<u8>(), 128),
            parent in prop::collection::vec(any::<u8>(), 32),
            offset in prop::sample::select(vec![0usize, 1, 3, 5, 13, 16, 31, 32]),
        ) {
            let Some(sha_ni) = ShaNi::detect() else {
                return Ok(());
            };
            // The bytes before the parent in the first 16, as `head` words (the
            // encodings write and hand over the same).
            let mut head = [0u32; 4];
            for (i, word) in head.iter_mut().enumerate() {
                let mut bytes = [0u8; 4];
                for (j, b) in bytes.iter_mut().enumerate() {
                    let at = 4 * i + j;
                    *b = if at < offset { message[at] } else { 0 };
                }
                *word = u32::from_be_bytes(bytes);
            }
            let run = |c: &dyn Fn(&mut [u8], &mut Vec<u8>)| {
                let mut piece = message.clone();
                let mut out = Vec::new();
                c(&mut piece, &mut out);
                out
            };
            let portable = run(&|piece, out| {
                let mut state = Portable.first(&mut piece[..64], offset, head, Portable.parent(&parent));
                Portable.next(&mut state, &piece[64..]);
                Portable.finish(state, out);
            });
            let spliced = run(&|piece, out| {
                let mut state = sha_ni.first(&mut piece[..64], offset, head, sha_ni.parent(&parent));
                sha_ni.next(&mut state, &piece[64..]);
                sha_ni.finish(state, out);
            });
            prop_assert_eq!(spliced, portable);
        }
    }
}
