//! The Python values that occur in vLLM block-hash inputs.

/// A Python value as it appears inside a vLLM block-hash input.
///
/// Block hashes are computed over `(parent_hash, tuple(token_ids), extra_keys)`,
/// where `extra_keys` is `None` or a tuple of tagged tuples of strings, bytes and
/// ints. This enum covers exactly those types; it is what the CBOR and pickle
/// encoders accept. It has no object identity: every `str`, `bytes` and tuple
/// in it pickles as a distinct object (see the pickle module's notes).
///
/// ```
/// use kvpool::pool::hashing::Value;
/// // (("lora", "my-lora", "/adapters/my-lora"), ("mm", "image-hash", 3))
/// let keys = Value::tuple([
///     Value::tuple([Value::from("lora"), Value::from("my-lora"), Value::from("/adapters/my-lora")]),
///     Value::tuple([Value::from("mm"), Value::from("image-hash"), Value::from(3)]),
/// ]);
/// assert!(matches!(keys, Value::Tuple(ref items) if items.len() == 2));
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Value {
    /// Python `None`.
    None,
    /// A Python `int` (this covers every int vLLM puts in a hash input).
    Int(i128),
    /// A Python `bytes` object.
    Bytes(Vec<u8>),
    /// A Python `str`.
    Str(String),
    /// A Python `tuple` (lists are never part of hash inputs).
    Tuple(Vec<Value>),
}

impl Value {
    /// A tuple of the given items.
    pub fn tuple(items: impl IntoIterator<Item = Value>) -> Self {
        Value::Tuple(items.into_iter().collect())
    }

    /// A `bytes` value copied from `bytes`.
    pub fn bytes(bytes: &[u8]) -> Self {
        Value::Bytes(bytes.to_vec())
    }
}

impl From<i128> for Value {
    fn from(v: i128) -> Self {
        Value::Int(v)
    }
}

impl From<i64> for Value {
    fn from(v: i64) -> Self {
        Value::Int(v.into())
    }
}

impl From<i32> for Value {
    fn from(v: i32) -> Self {
        Value::Int(v.into())
    }
}

impl From<u64> for Value {
    fn from(v: u64) -> Self {
        Value::Int(v.into())
    }
}

impl From<usize> for Value {
    fn from(v: usize) -> Self {
        Value::Int(v as i128)
    }
}

impl From<&str> for Value {
    fn from(v: &str) -> Self {
        Value::Str(v.to_owned())
    }
}

impl From<String> for Value {
    fn from(v: String) -> Self {
        Value::Str(v)
    }
}

impl From<Vec<u8>> for Value {
    fn from(v: Vec<u8>) -> Self {
        Value::Bytes(v)
    }
}

impl From<Option<Value>> for Value {
    /// `None` maps to Python `None`.
    fn from(v: Option<Value>) -> Self {
        v.unwrap_or(Value::None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conversions() {
        assert_eq!(Value::from(7i64), Value::Int(7));
        assert_eq!(Value::from(u64::MAX), Value::Int(u64::MAX as i128));
        assert_eq!(Value::from("a"), Value::Str("a".into()));
        assert_eq!(Value::from(None), Value::None);
        assert_eq!(Value::bytes(b"xy"), Value::Bytes(vec![b'x', b'y']));
        assert_eq!(Value::tuple([]), Value::Tuple(vec![]));
    }
}
