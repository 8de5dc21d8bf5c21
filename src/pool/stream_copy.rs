//! Writing a large payload into memory no cache holds, with non-temporal stores.
//!
//! An ordinary copy into cold memory first reads every destination line into the
//! core's cache (to own it), then writes it, and the lines it brings in push the
//! caller's own data out. Non-temporal stores (`movntdq`, SSE2, so on every x86-64)
//! go to memory through write-combining buffers: no read, no cache line taken. For a
//! replay buffer, written once a step and read only when a subscriber asks, that is
//! the right kind of write. Other targets copy as usual.
//!
//! One of the crate's modules with `unsafe` code. The writes are sound because
//! [`write_at`] checks that the region lies within the vector's allocation and that it
//! starts within (or at the end of) its initialised bytes, so that after the copy every
//! byte up to the new length has been written; each store's address is 16-byte aligned
//! (the head up to the first aligned address is copied bytewise) and in bounds.

#![allow(unsafe_code)]

/// Writes `src` into `buf[start..start + src.len()]`, growing `buf`'s length into its
/// reserved capacity when the region runs past it (never reallocating).
///
/// # Panics
/// If `start` is past `buf.len()` or the region past `buf.capacity()`.
pub fn write_at(buf: &mut Vec<u8>, start: usize, src: &[u8]) {
    let end = start
        .checked_add(src.len())
        .expect("region end overflows usize");
    assert!(
        start <= buf.len(),
        "write_at leaves a gap: {start} > {}",
        buf.len()
    );
    assert!(
        end <= buf.capacity(),
        "write_at runs past the capacity: {end}"
    );
    // SAFETY: `start..end` is within the allocation (asserted), and `dst` is the only
    // reference to it while `buf` is borrowed mutably here.
    let dst = unsafe { buf.as_mut_ptr().add(start) };
    // SAFETY: as above; `src` cannot overlap `buf`'s spare capacity or the bytes it
    // borrows mutably.
    unsafe { copy_nontemporal(dst, src) };
    if end > buf.len() {
        // SAFETY: bytes `..start` were initialised (start <= len) and `start..end` have
        // just been written.
        unsafe { buf.set_len(end) };
    }
}

/// Copies `src` to `dst` with non-temporal stores where the target has them.
///
/// # Safety
/// `dst..dst + src.len()` must be valid for writes and not overlap `src`.
#[cfg(target_arch = "x86_64")]
unsafe fn copy_nontemporal(dst: *mut u8, src: &[u8]) {
    use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_sfence, _mm_stream_si128};
    const LANE: usize = 16;
    const UNROLL: usize = 4 * LANE; // one cache line per iteration
    let len = src.len();
    let head = dst.align_offset(LANE).min(len);
    // SAFETY (for the block): every offset below stays under `len`; `dst + head` is
    // 16-byte aligned, so each stream store is aligned; loads are unaligned.
    unsafe {
        std::ptr::copy_nonoverlapping(src.as_ptr(), dst, head);
        let s = src.as_ptr().add(head);
        let d = dst.add(head);
        let body = len - head;
        let lines = body / UNROLL * UNROLL;
        let mut i = 0;
        while i < lines {
            let a = _mm_loadu_si128(s.add(i).cast::<__m128i>());
            let b = _mm_loadu_si128(s.add(i + LANE).cast::<__m128i>());
            let c = _mm_loadu_si128(s.add(i + 2 * LANE).cast::<__m128i>());
            let e = _mm_loadu_si128(s.add(i + 3 * LANE).cast::<__m128i>());
            _mm_stream_si128(d.add(i).cast::<__m128i>(), a);
            _mm_stream_si128(d.add(i + LANE).cast::<__m128i>(), b);
            _mm_stream_si128(d.add(i + 2 * LANE).cast::<__m128i>(), c);
            _mm_stream_si128(d.add(i + 3 * LANE).cast::<__m128i>(), e);
            i += UNROLL;
        }
        while i + LANE <= body {
            let a = _mm_loadu_si128(s.add(i).cast::<__m128i>());
            _mm_stream_si128(d.add(i).cast::<__m128i>(), a);
            i += LANE;
        }
        std::ptr::copy_nonoverlapping(s.add(i), d.add(i), body - i);
        // Later loads and stores (another thread's, after a lock handover) see these.
        _mm_sfence();
    }
}

/// Copies `src` to `dst` (targets without non-temporal stores in `std::arch`'s stable
/// baseline).
///
/// # Safety
/// `dst..dst + src.len()` must be valid for writes and not overlap `src`.
#[cfg(not(target_arch = "x86_64"))]
unsafe fn copy_nontemporal(dst: *mut u8, src: &[u8]) {
    // SAFETY: the caller's contract.
    unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst, src.len()) };
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(n: usize, salt: u8) -> Vec<u8> {
        (0..n)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(salt))
            .collect()
    }

    #[test]
    fn every_length_and_alignment_lands_exactly() {
        for start in 0..40 {
            for len in [0, 1, 15, 16, 17, 63, 64, 65, 100, 255, 256, 1000, 4099] {
                let mut buf = Vec::with_capacity(start + len + 50);
                buf.resize(start, 0xAA);
                let src = bytes(len + 3, start as u8);
                // An unaligned source too.
                write_at(&mut buf, start, &src[3..]);
                assert_eq!(buf.len(), start + len);
                assert!(buf[..start].iter().all(|&b| b == 0xAA));
                assert_eq!(&buf[start..], &src[3..]);
            }
        }
    }

    #[test]
    fn overwrites_inside_and_grows_past_the_length() {
        let mut buf = Vec::with_capacity(300);
        write_at(&mut buf, 0, &bytes(200, 1));
        write_at(&mut buf, 50, &bytes(100, 2));
        assert_eq!(buf.len(), 200);
        assert_eq!(&buf[50..150], &bytes(100, 2)[..]);
        assert_eq!(&buf[150..], &bytes(200, 1)[150..]);
        write_at(&mut buf, 150, &bytes(150, 3));
        assert_eq!(buf.len(), 300);
        assert_eq!(&buf[150..], &bytes(150, 3)[..]);
    }

    #[test]
    #[should_panic(expected = "gap")]
    fn a_gap_is_refused() {
        let mut buf = Vec::with_capacity(100);
        write_at(&mut buf, 10, &[1, 2, 3]);
    }

    #[test]
    #[should_panic(expected = "capacity")]
    fn past_the_capacity_is_refused() {
        let mut buf = Vec::with_capacity(10);
        write_at(&mut buf, 0, &[0; 11]);
    }
}
