//! Request (sequence) ids as engines spell them: vLLM uses strings, older
//! schedulers integers. Both are accepted and kept distinct (`"1"` is not `1`).

use std::fmt;

/// A request or sequence id.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RequestId {
    /// An integer id.
    Int(i64),
    /// A string id.
    Str(Box<str>),
}

impl fmt::Display for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Int(i) => write!(f, "{i}"),
            Self::Str(s) => write!(f, "{s:?}"),
        }
    }
}

impl From<i64> for RequestId {
    fn from(id: i64) -> Self {
        Self::Int(id)
    }
}

/// A copy, made only when a map inserts a key it was looked up with
/// (`HashMap::entry_ref`).
impl From<&RequestId> for RequestId {
    fn from(id: &RequestId) -> Self {
        id.clone()
    }
}

impl From<&str> for RequestId {
    fn from(id: &str) -> Self {
        Self::Str(id.into())
    }
}
