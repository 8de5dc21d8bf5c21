//! cargo-fuzz target: [`kvpool_fuzz::run_pool`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| kvpool_fuzz::run_pool(data));
