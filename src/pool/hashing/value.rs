//! The Python values that occur in vLLM block-hash inputs.

/// A Python value as it appears inside a vLLM block-hash input.
///
/// Block hashes are computed over `(parent_hash, tuple(token_ids), extra_keys)`,
/// where `extra_keys` is `None` or a tuple of tagged tuples of strings, bytes and
/// ints. This enum covers exactly those types; it is what the CBOR and pickle
/// encoders accept. Object identity, which only pickle depends on, is explicit:
/// every `str`, `bytes` and tuple pickles as a distinct object unless it is
/// wrapped in [`Value::Shared`] (see the pickle module's notes).
///
/// Values nested deeper than [`MAX_DEPTH`] are rejected where they come from
/// Python; the encoders recurse, so a Rust caller building values should check
/// [`Value::depth`] against it too.
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
    /// One Python object that occurs more than once in the value: every
    /// `Shared` with the same id is the same object, so pickle writes the first
    /// one in full and memoizes it, and the others as memo references, as
    /// Python's pickler does. CBOR writes the inner value each time.
    Shared(u32, Box<Value>),
}

/// Deepest nesting of tuples accepted from Python (a block's hash input is 4
/// levels deep; vLLM's extra keys 2).
pub const MAX_DEPTH: usize = 100;

impl Value {
    /// A tuple of the given items.
    pub fn tuple(items: impl IntoIterator<Item = Value>) -> Self {
        Value::Tuple(items.into_iter().collect())
    }

    /// A `bytes` value copied from `bytes`.
    pub fn bytes(bytes: &[u8]) -> Self {
        Value::Bytes(bytes.to_vec())
    }

    /// The value with [`Value::Shared`] wrappers removed (what CBOR sees).
    pub fn unshared(&self) -> &Value {
        let mut v = self;
        while let Value::Shared(_, inner) = v {
            v = inner;
        }
        v
    }

    /// A copy with every [`Value::Shared`] wrapper removed: the same Python value
    /// built from distinct objects. Recursive: for values at most [`MAX_DEPTH`] deep.
    pub fn without_identity(&self) -> Value {
        match self.unshared() {
            Value::Tuple(items) => {
                Value::Tuple(items.iter().map(Value::without_identity).collect())
            }
            other => other.clone(),
        }
    }

    /// Levels of tuple nesting: 0 for a scalar, 1 for a tuple of scalars. Computed
    /// without recursion, so it is safe on any value.
    pub fn depth(&self) -> usize {
        let mut deepest = 0;
        let mut stack = vec![(self, 0usize)];
        while let Some((v, d)) = stack.pop() {
            match v {
                Value::Tuple(items) => {
                    deepest = deepest.max(d + 1);
                    stack.extend(items.iter().map(|item| (item, d + 1)));
                }
                Value::Shared(_, inner) => stack.push((inner, d)),
                _ => {}
            }
        }
        deepest
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

    #[test]
    fn depth_counts_tuple_levels() {
        assert_eq!(Value::from(1).depth(), 0);
        assert_eq!(Value::tuple([]).depth(), 1);
        let mut v = Value::from("x");
        for _ in 0..10_000 {
            v = Value::tuple([Value::Shared(0, Box::new(v))]);
        }
        assert_eq!(v.depth(), 10_000);
        // Dropping is recursive too: unwind it by hand.
        while let Value::Tuple(mut items) = v {
            v = match items.pop() {
                Some(Value::Shared(_, inner)) => *inner,
                _ => break,
            };
        }
    }
}
