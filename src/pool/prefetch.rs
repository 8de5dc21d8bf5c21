//! Prefetch hints: ask the processor for a cache line ahead of its use.
//!
//! The adaptive policy's ghost table is spread over megabytes, and each evicted
//! block writes one of its lines and each newly cached key reads one: misses that
//! cost most of what the policy adds to LRU's time. The pool knows which lines a
//! call will touch as soon as it has a key's fingerprint, so it names them then,
//! while the prefix map's own misses are in flight, and touches them afterwards.
//! A prefetch only moves data between memory and the caches: it changes no value
//! and no result, and it cannot fault.
//!
//! One of the crate's modules with `unsafe` code (see `Cargo.toml`): the
//! intrinsic. A read of the line instead (what a safe prefetch would be) holds the
//! processor's retirement until the line arrives, so the misses of a batch overlap
//! less: measured in `docs/eviction.md` ("Cost").

#![allow(unsafe_code)]

/// Asks for the cache line holding `items[index]`, to be read or written soon;
/// nothing if `index` is out of range (or on processors other than x86-64).
#[inline(always)]
pub(super) fn prefetch<T>(items: &[T], index: usize) {
    #[cfg(target_arch = "x86_64")]
    if let Some(item) = items.get(index) {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        // SAFETY: a prefetch reads no value and cannot fault, whatever the address
        // (here one inside `items`); SSE, which has it, is part of x86-64.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(std::ptr::from_ref(item).cast::<i8>()) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (items, index);
}

#[cfg(test)]
mod tests {
    use super::prefetch;

    #[test]
    fn a_prefetch_changes_nothing_in_or_out_of_range() {
        let items = vec![7u64; 16];
        for index in [0, 8, 15, 16, usize::MAX] {
            prefetch(&items, index);
        }
        prefetch::<u8>(&[], 0);
        assert_eq!(items, vec![7u64; 16]);
    }
}
