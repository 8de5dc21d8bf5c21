//! The core's error type: one variant per way a call can be refused.
//!
//! Every fallible operation of [`BlockPool`](super::BlockPool) validates before it
//! mutates, so an `Err` always means the pool is exactly as it was before the call.
//! The Python binding maps each variant to its own exception class under
//! `kvpool.KVPoolError`.

use std::fmt;

/// Why a pool operation was refused. The pool is unchanged whenever one is returned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PoolError {
    /// Fewer free blocks than requested.
    NoFreeBlocks {
        /// Blocks asked for.
        requested: usize,
        /// Blocks free at the time of the call.
        free: usize,
    },
    /// A block id outside `0..num_blocks`.
    InvalidBlockId {
        /// The offending id as the caller gave it.
        block_id: i64,
        /// The pool's size.
        num_blocks: u32,
    },
    /// Freeing a block whose reference count is already 0.
    DoubleFree {
        /// The block.
        block_id: u32,
    },
    /// A block in the wrong state for the operation.
    BlockState {
        /// The block.
        block_id: u32,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A block hash of the wrong width.
    HashWidth {
        /// Width of the offending hash in bytes.
        got: usize,
        /// The pool's width, once fixed; `None` if any width in `1..=32` was acceptable.
        expected: Option<usize>,
    },
    /// An argument out of range or inconsistent with another one.
    InvalidArgument(String),
    /// A prefix-cache operation on a pool built without caching.
    CachingDisabled,
    /// A request id that the manager does not know.
    UnknownRequest(String),
    /// A request id that the manager already tracks.
    DuplicateRequest(String),
    /// Pinning would exceed the pool's budget of pinned blocks.
    PinBudget {
        /// Blocks the call would have pinned.
        requested: usize,
        /// Blocks pinned before the call.
        pinned: usize,
        /// The pool's `max_pinned_blocks`.
        budget: usize,
    },
    /// Memory for `what` (`bytes` bytes) could not be allocated; nothing changed.
    OutOfMemory {
        /// What was being allocated.
        what: &'static str,
        /// How many bytes were asked for.
        bytes: usize,
    },
}

impl fmt::Display for PoolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NoFreeBlocks { requested, free } => {
                write!(
                    f,
                    "cannot get {requested} free blocks from the pool: only {free} are free"
                )
            }
            Self::InvalidBlockId {
                block_id,
                num_blocks,
            } => {
                write!(
                    f,
                    "block id {block_id} is out of range for a pool of {num_blocks} blocks"
                )
            }
            Self::DoubleFree { block_id } => {
                write!(
                    f,
                    "block {block_id} is freed while its reference count is already 0"
                )
            }
            Self::BlockState { block_id, reason } => write!(f, "block {block_id} {reason}"),
            Self::HashWidth {
                got,
                expected: Some(expected),
            } => write!(
                f,
                "block hash is {got} bytes wide but this pool's hashes are {expected} bytes"
            ),
            Self::HashWidth {
                got,
                expected: None,
            } => {
                write!(
                    f,
                    "block hash is {got} bytes wide; a hash must have 1 to 32 bytes"
                )
            }
            Self::InvalidArgument(message) => f.write_str(message),
            Self::CachingDisabled => {
                f.write_str("prefix caching is disabled for this pool (enable_caching=False)")
            }
            Self::UnknownRequest(id) => write!(f, "unknown request id {id}"),
            Self::DuplicateRequest(id) => write!(f, "request id {id} is already tracked"),
            Self::PinBudget {
                requested,
                pinned,
                budget,
            } => write!(
                f,
                "pinning {requested} more blocks would exceed the pin budget: {pinned} of {budget} are pinned (max_pinned_blocks)"
            ),
            Self::OutOfMemory { what, bytes } => {
                write!(f, "cannot allocate {bytes} bytes for {what}")
            }
        }
    }
}

impl std::error::Error for PoolError {}

/// Result alias of the core.
pub type PoolResult<T> = Result<T, PoolError>;
