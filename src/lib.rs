//! kvpool: a KV-cache block manager for LLM inference engines.
//!
//! The core ([`pool`]) is plain Rust. With the `python` feature, this file also
//! defines the `kvpool._core` extension module (built by maturin).

pub mod pool;

#[cfg(feature = "python")]
mod bindings;

#[cfg(feature = "python")]
#[pyo3::pymodule]
mod _core {
    use pyo3::prelude::*;

    #[pymodule_export]
    use crate::bindings::block_pool::PyBlockPool;
    #[pymodule_export]
    use crate::bindings::block_tables::PyBlockTables;
    #[pymodule_export]
    use crate::bindings::block_view::{PyBlockView, PyFreeBlockWalk};
    #[pymodule_export]
    use crate::bindings::eviction_args::ghost_fingerprint;
    #[pymodule_export]
    use crate::bindings::group_hit::find_group_hit;
    #[pymodule_export]
    use crate::bindings::group_manager::PyGroupManager;
    #[pymodule_export]
    use crate::bindings::group_tables::PyGroupTables;
    #[pymodule_export]
    use crate::bindings::hashing::{
        compute_none_hash, encode_hash_input, hash_value, PyBlockHashList, PyBlockHasher,
    };
    #[pymodule_export]
    use crate::bindings::manager::PyKVCacheManager;
    #[pymodule_export]
    use crate::bindings::replay_ring::PyReplayRing;
    #[pymodule_export]
    use crate::bindings::step::PyStepResult;
    #[pymodule_export]
    use crate::bindings::tracker::PyComputedBlocksTracker;
    #[pymodule_export]
    use crate::bindings::vllm_calls::PyVllmManagerCalls;
    #[pymodule_export]
    use crate::bindings::vllm_group_calls::PyVllmGroupCalls;
    #[pymodule_export]
    use crate::bindings::zmq_sink::PyZmqSink;

    #[pymodule_init]
    fn init(m: &Bound<'_, PyModule>) -> PyResult<()> {
        m.add("__version__", env!("CARGO_PKG_VERSION"))?;
        // numpy's C API and the id dtype, looked up now, while the import holds the
        // module to one thread: a first lookup in a call could wait on numpy's own
        // once-cell while other threads or re-entrant Python code call kvpool.
        crate::bindings::recycled_ids::int32_descr(m.py());
        // Whether token lists are read in place (`bindings/int_reader.rs`), for tests.
        m.add(
            "_reads_ints_in_place",
            crate::bindings::int_reader::enabled(m.py()),
        )?;
        crate::bindings::errors::register(m)
    }
}
