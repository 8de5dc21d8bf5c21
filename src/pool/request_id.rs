//! Request (sequence) ids as engines spell them: vLLM uses strings, older
//! schedulers integers. Both are accepted and kept distinct (`"1"` is not `1`).

use std::fmt;
use std::hash::{Hash, Hasher};

/// A request or sequence id.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum RequestId {
    /// An integer id.
    Int(i64),
    /// A string id.
    Str(Box<str>),
}

/// A borrowed request id: finds a [`RequestId`] in a map without building one (the
/// caller's string is not copied). It hashes exactly as the id it stands for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RequestKey<'a> {
    /// An integer id.
    Int(i64),
    /// A string id.
    Str(&'a str),
}

impl RequestId {
    /// The id as a borrowed key.
    pub fn key(&self) -> RequestKey<'_> {
        match self {
            Self::Int(i) => RequestKey::Int(*i),
            Self::Str(s) => RequestKey::Str(s),
        }
    }
}

/// Hashed through its key, so that a [`RequestKey`] finds it.
impl Hash for RequestId {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.key().hash(state);
    }
}

impl hashbrown::Equivalent<RequestId> for RequestKey<'_> {
    fn equivalent(&self, id: &RequestId) -> bool {
        *self == id.key()
    }
}

/// The owned id, made only when a map inserts a key it was looked up with.
impl From<&RequestKey<'_>> for RequestId {
    fn from(key: &RequestKey<'_>) -> Self {
        match *key {
            RequestKey::Int(i) => Self::Int(i),
            RequestKey::Str(s) => Self::Str(s.into()),
        }
    }
}

/// What finds a request in a map keyed by [`RequestId`]: an owned id or a borrowed
/// [`RequestKey`] (which spares a caller holding a `&str` an allocation per lookup).
pub trait RequestLookup: Hash + hashbrown::Equivalent<RequestId> + fmt::Display {}

impl<T: Hash + hashbrown::Equivalent<RequestId> + fmt::Display + ?Sized> RequestLookup for T {}

impl fmt::Display for RequestKey<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Int(i) => write!(f, "{i}"),
            Self::Str(s) => write!(f, "{s:?}"),
        }
    }
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

impl From<&str> for RequestId {
    fn from(id: &str) -> Self {
        Self::Str(id.into())
    }
}

#[cfg(test)]
mod key_tests {
    use super::{RequestId, RequestKey};
    use hashbrown::HashMap;

    #[test]
    fn a_key_finds_the_id_it_stands_for_and_only_that() {
        let ids = [
            RequestId::from("1"),
            RequestId::Int(1),
            RequestId::from(""),
            RequestId::from("req-7f3a"),
            RequestId::Int(-5),
        ];
        let map: HashMap<RequestId, usize> = ids.iter().cloned().zip(0..).collect();
        for (i, id) in ids.iter().enumerate() {
            assert_eq!(map.get(&id.key()), Some(&i));
            assert_eq!(RequestId::from(&id.key()), *id);
        }
        assert_eq!(map.get(&RequestKey::Str("2")), None);
        assert_eq!(map.get(&RequestKey::Int(2)), None);
    }
}
