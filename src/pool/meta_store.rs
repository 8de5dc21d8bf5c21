//! Writing a block's metadata in one 16-byte store.
//!
//! A block freed onto the free queue's stack gets `{0, index, STACKED, NIL}`: one
//! field from a register, three constants. Written as a struct, the compiler emits
//! three stores (a 4-byte count, a 4-byte index, the two constants as 8 bytes),
//! and a free pass is bound by its stores: with the slot the block takes on the
//! stack, four a block. [`BlockMeta::store`] builds the 16 bytes in a vector
//! register and writes them at once (SSE2, on every x86-64): allocate+free of 44
//! blocks through Python took 0.84-0.97x of the time before (`benches/ab_builds.py`;
//! in `cargo bench` the gain is within code placement's noise, see
//! `docs/benchmarks.md`, eleventh sitting). Other targets assign the struct.
//!
//! One of the crate's modules with `unsafe` code: one unaligned vector store into a
//! `&mut BlockMeta`, which is exactly 16 bytes (`#[repr(C)]`, four `u32`, checked
//! below at compile time), so the store covers the referenced value and nothing else.

#![allow(unsafe_code)]

use super::slab::BlockMeta;

const _: () = assert!(std::mem::size_of::<BlockMeta>() == 16);

impl BlockMeta {
    /// Overwrites this metadata with `value` in one 16-byte store (see the module).
    #[inline(always)]
    pub fn store(&mut self, value: BlockMeta) {
        #[cfg(all(target_arch = "x86_64", target_feature = "sse2"))]
        {
            use std::arch::x86_64::{__m128i, _mm_set_epi32, _mm_storeu_si128};
            // SAFETY: `self` is a valid, exclusive reference to 16 bytes (`BlockMeta`
            // is `repr(C)`, four `u32`, asserted above); `_mm_storeu_si128` writes
            // exactly 16 bytes and needs no alignment; SSE2, which both intrinsics
            // need, is part of x86-64.
            unsafe {
                // The fields in memory order, lowest first (`_mm_set_epi32` takes the
                // highest lane first); the `as i32` casts keep every bit.
                let lanes = _mm_set_epi32(
                    value.key_slot as i32,
                    value.next as i32,
                    value.prev as i32,
                    value.ref_cnt as i32,
                );
                _mm_storeu_si128(std::ptr::from_mut(self).cast::<__m128i>(), lanes);
            }
        }
        #[cfg(not(all(target_arch = "x86_64", target_feature = "sse2")))]
        {
            *self = value;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool::slab::NIL;

    #[test]
    fn store_writes_every_field() {
        let mut metas = [BlockMeta::EMPTY; 3];
        let value = BlockMeta {
            ref_cnt: 0x8000_0001,
            prev: 7,
            next: NIL - 1,
            key_slot: 0xdead_beef,
        };
        metas[1].store(value);
        assert_eq!(metas[1], value);
        // The neighbours are untouched.
        assert_eq!(metas[0], BlockMeta::EMPTY);
        assert_eq!(metas[2], BlockMeta::EMPTY);
        metas[1].store(BlockMeta::stacked(u32::MAX));
        assert_eq!(metas[1], BlockMeta::stacked(u32::MAX));
    }
}
