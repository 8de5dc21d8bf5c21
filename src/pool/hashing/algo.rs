//! The four vLLM prefix-cache hash functions and their fixed-size digests.

use std::fmt;
use std::ops::Deref;

use sha2::{Digest as _, Sha256};

use super::cbor::encode_cbor;
use super::pickle::encode_pickle;
use super::value::Value;

/// The widest digest (SHA-256).
pub const MAX_DIGEST_LEN: usize = 32;

/// How a hash function serializes its input before hashing it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Encoding {
    /// `pickle.dumps(x, protocol=5)` (CPython 3.11's C pickler).
    Pickle,
    /// `cbor2.dumps(x, canonical=True)`.
    Cbor,
}

/// A vLLM prefix-caching hash function (`--prefix-caching-hash-algo`).
///
/// | algo          | vLLM definition                                                  | digest |
/// |---------------|------------------------------------------------------------------|--------|
/// | `sha256`      | `hashlib.sha256(pickle.dumps(x, protocol=5)).digest()`           | 32 B   |
/// | `sha256_cbor` | `hashlib.sha256(cbor2.dumps(x, canonical=True)).digest()`        | 32 B   |
/// | `xxhash`      | `xxhash.xxh3_128_digest(pickle.dumps(x, protocol=5))`            | 16 B   |
/// | `xxhash_cbor` | `xxhash.xxh3_128_digest(cbor2.dumps(x, canonical=True))`         | 16 B   |
///
/// `xxh3_128_digest` is the 128-bit hash in big-endian byte order.
///
/// ```
/// use kvpool::pool::hashing::HashAlgo;
/// let algo = HashAlgo::from_name("sha256_cbor").unwrap();
/// assert_eq!(algo.name(), "sha256_cbor");
/// assert_eq!(algo.digest_len(), 32);
/// assert_eq!(HashAlgo::XxhashCbor.digest_len(), 16);
/// assert_eq!(HashAlgo::from_name("md5"), None);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum HashAlgo {
    /// SHA-256 of the pickle (vLLM's default).
    #[default]
    Sha256,
    /// SHA-256 of the canonical CBOR.
    Sha256Cbor,
    /// xxh3-128 of the pickle.
    Xxhash,
    /// xxh3-128 of the canonical CBOR.
    XxhashCbor,
}

impl HashAlgo {
    /// Every algorithm, in declaration order.
    pub const ALL: [HashAlgo; 4] = [
        HashAlgo::Sha256,
        HashAlgo::Sha256Cbor,
        HashAlgo::Xxhash,
        HashAlgo::XxhashCbor,
    ];

    /// The algorithm vLLM calls `name`, if any.
    pub fn from_name(name: &str) -> Option<Self> {
        Some(match name {
            "sha256" => HashAlgo::Sha256,
            "sha256_cbor" => HashAlgo::Sha256Cbor,
            "xxhash" => HashAlgo::Xxhash,
            "xxhash_cbor" => HashAlgo::XxhashCbor,
            _ => return None,
        })
    }

    /// vLLM's name for the algorithm.
    pub const fn name(self) -> &'static str {
        match self {
            HashAlgo::Sha256 => "sha256",
            HashAlgo::Sha256Cbor => "sha256_cbor",
            HashAlgo::Xxhash => "xxhash",
            HashAlgo::XxhashCbor => "xxhash_cbor",
        }
    }

    /// Digest width in bytes: 32 for SHA-256, 16 for xxh3-128.
    pub const fn digest_len(self) -> usize {
        match self {
            HashAlgo::Sha256 | HashAlgo::Sha256Cbor => 32,
            HashAlgo::Xxhash | HashAlgo::XxhashCbor => 16,
        }
    }

    /// How the input is serialized before hashing.
    pub const fn encoding(self) -> Encoding {
        match self {
            HashAlgo::Sha256 | HashAlgo::Xxhash => Encoding::Pickle,
            HashAlgo::Sha256Cbor | HashAlgo::XxhashCbor => Encoding::Cbor,
        }
    }

    /// Hashes already-serialized bytes (the last step of the vLLM function).
    #[inline]
    pub fn digest_bytes(self, data: &[u8]) -> Digest {
        match self {
            HashAlgo::Sha256 | HashAlgo::Sha256Cbor => {
                let mut bytes = [0u8; MAX_DIGEST_LEN];
                bytes.copy_from_slice(&Sha256::digest(data));
                Digest { bytes, len: 32 }
            }
            HashAlgo::Xxhash | HashAlgo::XxhashCbor => {
                let mut bytes = [0u8; MAX_DIGEST_LEN];
                bytes[..16].copy_from_slice(&xxhash_rust::xxh3::xxh3_128(data).to_be_bytes());
                Digest { bytes, len: 16 }
            }
        }
    }

    /// The vLLM hash function applied to `value`: serialize, then hash.
    ///
    /// Allocates a scratch buffer; use [`super::BlockHasher`] on hot paths.
    ///
    /// ```
    /// use kvpool::pool::hashing::{HashAlgo, Value};
    /// // xxhash.xxh3_128_digest(cbor2.dumps("abc", canonical=True)).hex()
    /// let d = HashAlgo::XxhashCbor.hash_value(&Value::from("abc"));
    /// assert_eq!(d.len(), 16);
    /// ```
    pub fn hash_value(self, value: &Value) -> Digest {
        let mut buf = Vec::new();
        self.encode(value, &mut buf);
        self.digest_bytes(&buf)
    }

    /// Appends the serialization of `value` this algorithm hashes.
    pub fn encode(self, value: &Value, out: &mut Vec<u8>) {
        match self.encoding() {
            Encoding::Pickle => encode_pickle(value, out),
            Encoding::Cbor => encode_cbor(value, out),
        }
    }
}

impl fmt::Display for HashAlgo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.name())
    }
}

/// A digest of 16 or 32 bytes, stored inline (no heap).
///
/// Dereferences to its bytes.
///
/// ```
/// use kvpool::pool::hashing::HashAlgo;
/// let d = HashAlgo::Sha256.digest_bytes(b"");
/// assert_eq!(d.len(), 32);
/// assert_eq!(d[0], 0xe3); // sha256(b"") starts e3b0c442...
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Digest {
    bytes: [u8; MAX_DIGEST_LEN],
    len: u8,
}

impl Digest {
    /// A digest of `bytes` (16 or 32 of them).
    #[inline]
    pub(super) fn from_bytes(bytes: &[u8]) -> Self {
        let mut inline = [0u8; MAX_DIGEST_LEN];
        inline[..bytes.len()].copy_from_slice(bytes);
        Self {
            bytes: inline,
            len: bytes.len() as u8,
        }
    }

    /// The digest bytes.
    #[inline]
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.len as usize]
    }
}

impl Deref for Digest {
    type Target = [u8];
    #[inline]
    fn deref(&self) -> &[u8] {
        self.as_bytes()
    }
}

impl AsRef<[u8]> for Digest {
    fn as_ref(&self) -> &[u8] {
        self.as_bytes()
    }
}

impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Digest(")?;
        for b in self.as_bytes() {
            write!(f, "{b:02x}")?;
        }
        write!(f, ")")
    }
}

#[cfg(test)]
mod tests {
    use super::super::vectors::hex;
    use super::*;

    #[test]
    fn names_round_trip() {
        for algo in HashAlgo::ALL {
            assert_eq!(HashAlgo::from_name(algo.name()), Some(algo));
            assert_eq!(algo.to_string(), algo.name());
        }
        assert_eq!(HashAlgo::from_name("SHA256"), None);
        assert_eq!(HashAlgo::default(), HashAlgo::Sha256);
    }

    #[test]
    fn xxh3_128_digest_is_big_endian() {
        // xxhash.xxh3_128_digest(b"abc").hex(); intdigest is 0x06b05ab6...
        assert_eq!(
            hex(&HashAlgo::Xxhash.digest_bytes(b"abc")),
            "06b05ab6733a618578af5f94892f3950"
        );
    }

    #[test]
    fn sha256_known_answer() {
        assert_eq!(
            hex(&HashAlgo::Sha256Cbor.digest_bytes(b"abc")),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn digest_debug_is_hex() {
        let d = HashAlgo::Xxhash.digest_bytes(b"abc");
        assert_eq!(format!("{d:?}"), "Digest(06b05ab6733a618578af5f94892f3950)");
    }
}
