//! The cargo-fuzz targets of `fuzz/` on stable Rust: every input of the seed corpus
//! (`fuzz/corpus/<target>/`), then random inputs for a fixed time per target
//! (`KVPOOL_FUZZ_SECONDS`, default 3). Each harness checks the invariants and "an
//! `Err` changes nothing" after every operation; a failure prints the input as hex
//! so that it can be added to the corpus and replayed under `cargo fuzz run`.

#[path = "../fuzz/src/lib.rs"]
#[allow(dead_code)]
mod harness;

use std::path::Path;
use std::time::{Duration, Instant};

fn seconds() -> Duration {
    let s = std::env::var("KVPOOL_FUZZ_SECONDS")
        .ok()
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or(3.0);
    Duration::from_secs_f64(s)
}

/// A small deterministic generator (xorshift64*), seeded per target.
struct Bytes(u64);

impl Bytes {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn input(&mut self) -> Vec<u8> {
        let len = (self.next() % 2048) as usize;
        (0..len).map(|_| self.next() as u8).collect()
    }
}

fn run(target: &str, f: fn(&[u8])) {
    let check = |data: &[u8]| {
        let result = std::panic::catch_unwind(|| f(data));
        if let Err(e) = result {
            let hex: String = data.iter().map(|b| format!("{b:02x}")).collect();
            eprintln!("{target}: failing input ({} bytes): {hex}", data.len());
            std::panic::resume_unwind(e);
        }
    };
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/corpus")
        .join(target);
    let mut corpus = 0;
    if let Ok(entries) = std::fs::read_dir(&dir) {
        let mut paths: Vec<_> = entries.flatten().map(|e| e.path()).collect();
        paths.sort();
        for path in paths {
            check(&std::fs::read(&path).unwrap());
            corpus += 1;
        }
    }
    let mut rng =
        Bytes(0x9e37_79b9_7f4a_7c15 ^ target.len() as u64 ^ u64::from(target.as_bytes()[0]) << 32);
    let (start, limit) = (Instant::now(), seconds());
    let mut random = 0u64;
    while start.elapsed() < limit {
        check(&rng.input());
        random += 1;
    }
    eprintln!(
        "{target}: {corpus} corpus inputs and {random} random inputs in {:.1} s, all clean",
        start.elapsed().as_secs_f64()
    );
}

#[test]
fn fuzz_pool() {
    run("pool", harness::run_pool);
}

#[test]
fn fuzz_manager() {
    run("manager", harness::run_manager);
}

#[test]
fn fuzz_hashing() {
    run("hashing", harness::run_hashing);
}
