//! cargo-fuzz target: [`kvpool_fuzz::run_hashing`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| kvpool_fuzz::run_hashing(data));
