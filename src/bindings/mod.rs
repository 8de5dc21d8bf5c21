//! The PyO3 binding layer: conversions, exceptions and one file per Python class.
//! It converts types and errors and nothing else; the work is in [`crate::pool`].

pub mod array_reader;
pub mod block_pool;
pub mod block_tables;
pub mod block_view;
pub mod bytes_reader;
pub mod convert;
pub mod errors;
pub mod events;
pub mod eviction_args;
pub mod group_hit;
pub mod group_manager;
pub mod group_tables;
pub mod hash_list;
pub mod hashing;
pub mod int_reader;
pub mod locking;
pub mod manager;
pub mod recycled_ids;
pub mod replay_ring;
pub mod requests;
pub mod step;
pub mod tracker;
pub mod vllm_calls;
pub mod vllm_group_calls;
pub mod zmq_sink;
