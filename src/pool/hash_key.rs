//! Fixed-size, allocation-free representations of block hashes and prefix-map keys.

use super::error::{PoolError, PoolResult};

/// The widest block hash the pool stores (SHA-256).
pub const MAX_HASH_WIDTH: usize = 32;

/// One block hash of 1 to 32 bytes, stored inline.
///
/// ```
/// use kvpool::pool::BlockHash;
/// let h = BlockHash::new(b"0123456789abcdef").unwrap();
/// assert_eq!(h.as_bytes(), b"0123456789abcdef");
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct BlockHash {
    bytes: [u8; MAX_HASH_WIDTH],
    len: u8,
}

impl BlockHash {
    /// Copies `hash`; fails unless it has 1 to 32 bytes.
    pub fn new(hash: &[u8]) -> PoolResult<Self> {
        if hash.is_empty() || hash.len() > MAX_HASH_WIDTH {
            return Err(PoolError::HashWidth {
                got: hash.len(),
                expected: None,
            });
        }
        let mut bytes = [0u8; MAX_HASH_WIDTH];
        bytes[..hash.len()].copy_from_slice(hash);
        Ok(Self {
            bytes,
            len: hash.len() as u8,
        })
    }

    /// The hash bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.len as usize]
    }

    /// Width in bytes.
    pub fn width(&self) -> usize {
        self.len as usize
    }

    /// The 32 bytes (zero-padded past the width) as four little-endian words.
    #[inline]
    pub fn words(&self) -> [u64; 4] {
        let b = &self.bytes;
        let word = |i: usize| {
            u64::from_le_bytes([
                b[i],
                b[i + 1],
                b[i + 2],
                b[i + 3],
                b[i + 4],
                b[i + 5],
                b[i + 6],
                b[i + 7],
            ])
        };
        [word(0), word(8), word(16), word(24)]
    }
}

/// A prefix-map key: a block hash within one KV-cache group.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct BlockHashKey {
    /// The block's hash.
    pub hash: BlockHash,
    /// The KV-cache group the block belongs to.
    pub group: u32,
}

impl BlockHashKey {
    /// The key of `hash` in `group`.
    pub fn new(hash: BlockHash, group: u32) -> Self {
        Self { hash, group }
    }
}

/// A borrowed list of equally wide block hashes, stored back to back.
///
/// This is how hashes cross into the core: from a list of Python `bytes` copied
/// once into a flat buffer, or straight from a hash list computed in Rust.
#[derive(Clone, Copy, Debug)]
pub struct HashSlice<'a> {
    bytes: &'a [u8],
    width: usize,
}

impl<'a> HashSlice<'a> {
    /// Views `bytes` as `bytes.len() / width` hashes of `width` bytes.
    pub fn new(bytes: &'a [u8], width: usize) -> PoolResult<Self> {
        if width == 0 || width > MAX_HASH_WIDTH {
            return Err(PoolError::HashWidth {
                got: width,
                expected: None,
            });
        }
        if bytes.len() % width != 0 {
            return Err(PoolError::InvalidArgument(format!(
                "a flat hash buffer of {} bytes is not a whole number of {width}-byte hashes",
                bytes.len()
            )));
        }
        Ok(Self { bytes, width })
    }

    /// No hashes (of width 32, which no check will ever look at).
    pub fn empty() -> Self {
        Self {
            bytes: &[],
            width: MAX_HASH_WIDTH,
        }
    }

    /// The number of hashes.
    pub fn len(&self) -> usize {
        self.bytes.len() / self.width
    }

    /// True when there are no hashes.
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// Width of each hash in bytes.
    pub fn width(&self) -> usize {
        self.width
    }

    /// All hashes back to back.
    pub fn as_bytes(&self) -> &'a [u8] {
        self.bytes
    }

    /// The view at a `scale` times coarser block size (vLLM's
    /// `BlockHashListWithBlockSize`): its hash `i` is hash `(i + 1) * scale - 1`, the
    /// chained hash at the end of the coarser block. `self` itself when `scale` is 1;
    /// otherwise the hashes are copied into `buf`.
    pub fn every<'b>(&self, scale: usize, buf: &'b mut Vec<u8>) -> HashSlice<'b>
    where
        'a: 'b,
    {
        if scale <= 1 {
            return *self;
        }
        buf.clear();
        for i in (scale - 1..self.len()).step_by(scale) {
            buf.extend_from_slice(self.get(i));
        }
        HashSlice {
            bytes: buf,
            width: self.width,
        }
    }

    /// Hash `i`.
    pub fn get(&self, i: usize) -> &'a [u8] {
        &self.bytes[i * self.width..(i + 1) * self.width]
    }

    /// Hash `i` as a [`BlockHash`].
    #[inline]
    pub fn block_hash(&self, i: usize) -> BlockHash {
        let hash = self.get(i);
        let mut bytes = [0u8; MAX_HASH_WIDTH];
        // The common widths (SHA-256 digests, 8-byte ids) as fixed-size copies, which
        // compile to a few moves; any other width copies its length.
        match self.width {
            MAX_HASH_WIDTH => bytes.copy_from_slice(hash),
            8 => bytes[..8].copy_from_slice(hash),
            width => bytes[..width].copy_from_slice(hash),
        }
        BlockHash {
            bytes,
            len: self.width as u8,
        }
    }

    /// The first `n` hashes.
    pub fn prefix(&self, n: usize) -> Self {
        Self {
            bytes: &self.bytes[..n.min(self.len()) * self.width],
            width: self.width,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hash_width_is_checked() {
        assert!(BlockHash::new(b"").is_err());
        assert!(BlockHash::new(&[1u8; 33]).is_err());
        assert_eq!(BlockHash::new(&[7u8; 32]).unwrap().width(), 32);
    }

    #[test]
    fn keys_differ_by_group_and_width() {
        let a = BlockHashKey::new(BlockHash::new(b"abcd").unwrap(), 0);
        let b = BlockHashKey::new(BlockHash::new(b"abcd").unwrap(), 1);
        let c = BlockHashKey::new(BlockHash::new(b"abcd\0").unwrap(), 0);
        assert_ne!(a, b);
        assert_ne!(a, c);
    }

    #[test]
    fn hash_slice_views_flat_bytes() {
        let flat = [1u8, 1, 2, 2, 3, 3];
        let s = HashSlice::new(&flat, 2).unwrap();
        assert_eq!(s.len(), 3);
        assert_eq!(s.get(1), &[2, 2]);
        assert_eq!(s.prefix(2).len(), 2);
        assert!(HashSlice::new(&flat, 4).is_err());
        assert!(HashSlice::new(&flat, 0).is_err());
    }
}
