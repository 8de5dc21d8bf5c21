//! The replay buffer of an event publisher: the last batches' payloads, in one ring.
//!
//! Keeping each step's payload is what publishing costs a scheduler step most: a step
//! that stores 4,000 blocks makes a 266 kB payload, and holding on to it means writing
//! 266 kB a step into memory no cache holds. An ordinary copy first reads every line it
//! writes and pushes the step's own data out of the core's cache; [`ReplayRing::append`]
//! writes with non-temporal stores instead (`stream_copy`), which do neither, on the
//! caller's thread. Measured in `docs/events.md`: that adds about 1% to a serving step,
//! where an ordinary copy added 5% and handing the payload to a copier thread on the
//! other core (this ring's first design) 7.5%, because the staging buffer it wrote then
//! sat in the other core's cache.
//!
//! Batches leave oldest first, once more than `max_batches` are held or a new one needs
//! their bytes; a payload larger than the ring is held alone, in a buffer of its own.
//! One lock guards the ring: an append waits at most for one batch being copied out by
//! a reader ([`ReplayRing::batches_from`] copies one batch at a time).

use std::collections::VecDeque;
use std::sync::{Mutex, MutexGuard};

use super::stream_copy::write_at;

/// Where a held batch's bytes are.
#[derive(Debug)]
enum Place {
    /// In the ring, from this offset.
    Ring(usize),
    /// In a buffer of its own: a payload larger than the ring.
    Whole(Vec<u8>),
}

/// A held batch.
#[derive(Debug)]
struct Held {
    seq: u64,
    len: usize,
    place: Place,
}

/// Everything under the ring's lock.
#[derive(Debug)]
struct Inner {
    /// The ring's bytes: reserved at construction, grown into during the first lap.
    ring: Vec<u8>,
    /// Held batches, oldest first (sequence numbers increase). All are in the ring but
    /// a payload larger than it, which is held alone (any other batch with it would put
    /// the bytes held over the bound, so the older of the two goes).
    held: VecDeque<Held>,
    held_bytes: usize,
    /// Where the next payload goes.
    head: usize,
    /// The last batch number appended.
    last_seq: Option<u64>,
    closed: bool,
}

impl Inner {
    /// Why batch `seq` would be refused now, if it would.
    fn refusal(&self, seq: u64) -> Option<AppendError> {
        if self.closed {
            return Some(AppendError::Closed);
        }
        self.last_seq
            .filter(|&last| seq <= last)
            .map(|last| AppendError::OutOfOrder { last })
    }

    /// Whether batch `seq` is held, and where.
    fn find(&self, seq: u64) -> Option<&Held> {
        let i = self.held.binary_search_by_key(&seq, |h| h.seq).ok()?;
        Some(&self.held[i])
    }
}

/// Why [`ReplayRing::append`] refused a batch (nothing changed).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AppendError {
    /// The ring is closed.
    Closed,
    /// Batch numbers must increase; this is the last one appended.
    OutOfOrder { last: u64 },
}

/// The last `max_batches` payloads within `max_bytes` (the newest always held).
#[derive(Debug)]
pub struct ReplayRing {
    inner: Mutex<Inner>,
    capacity: usize,
    max_batches: usize,
}

/// A lock taken even if a thread panicked while holding it: every change here is
/// complete before the next one starts, so the state stays consistent.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl ReplayRing {
    /// A ring of `max_bytes` (reserved; used as batches fill it) holding at most
    /// `max_batches` batches. An error if the room cannot be reserved.
    pub fn new(max_batches: usize, max_bytes: usize) -> std::io::Result<Self> {
        // Reserved, not written: the ring grows into its room during its first lap, so
        // memory is only used as batches need it, and the room never moves.
        let mut ring = Vec::new();
        ring.try_reserve_exact(max_bytes).map_err(|_| {
            std::io::Error::new(
                std::io::ErrorKind::OutOfMemory,
                format!("cannot reserve {max_bytes} bytes for the replay ring"),
            )
        })?;
        Ok(Self {
            inner: Mutex::new(Inner {
                ring,
                held: VecDeque::new(),
                held_bytes: 0,
                head: 0,
                last_seq: None,
                closed: false,
            }),
            capacity: max_bytes,
            max_batches: max_batches.max(1),
        })
    }

    /// Holds a copy of `payload` as batch `seq`, numbered above every batch before it,
    /// letting the oldest batches go as the bounds require. The copy is written with
    /// non-temporal stores (see the module's documentation).
    pub fn append(&self, seq: u64, payload: &[u8]) -> Result<(), AppendError> {
        let len = payload.len();
        let mut inner = lock(&self.inner);
        if let Some(refused) = inner.refusal(seq) {
            return Err(refused);
        }
        inner.last_seq = Some(seq);
        let place = if len <= self.capacity {
            let start = make_room(&mut inner, self.capacity, len);
            write_at(&mut inner.ring, start, payload);
            Place::Ring(start)
        } else {
            Place::Whole(payload.to_vec())
        };
        self.hold(&mut inner, Held { seq, len, place });
        Ok(())
    }

    /// Whether [`append`](Self::append) would take batch `seq` now (the ring is open
    /// and `seq` is above every batch appended): a caller about to consume something
    /// to build the payload checks first.
    pub fn check_next(&self, seq: u64) -> Result<(), AppendError> {
        lock(&self.inner).refusal(seq).map_or(Ok(()), Err)
    }

    /// The held batches numbered `first` or later, oldest first.
    ///
    /// Copies out one batch at a time, so that an append never waits longer than one
    /// batch's copy; a batch let go meanwhile (only the oldest can be) is left out.
    pub fn batches_from(&self, first: u64) -> Vec<(u64, Vec<u8>)> {
        let wanted: Vec<u64> = {
            let inner = lock(&self.inner);
            let from = inner.held.partition_point(|h| h.seq < first);
            inner.held.range(from..).map(|h| h.seq).collect()
        };
        let mut out = Vec::with_capacity(wanted.len());
        for seq in wanted {
            let inner = lock(&self.inner);
            if let Some(held) = inner.find(seq) {
                let bytes = match &held.place {
                    Place::Ring(start) => inner.ring[*start..*start + held.len].to_vec(),
                    Place::Whole(bytes) => bytes.clone(),
                };
                out.push((seq, bytes));
            }
        }
        out
    }

    /// Writes the ring's whole room once, so that no append touches a page for the first
    /// time: by default the room is only reserved, and the first lap faults it in a
    /// batch at a time, on the appending thread (about 20% of a serving step while it
    /// lasts, `docs/events.md`). Bytes already written stay; calling it again does
    /// nothing.
    pub fn prefault(&self) {
        let mut inner = lock(&self.inner);
        let room = self.capacity;
        inner.ring.resize(room, 0); // within the reserved capacity: never moves
    }

    /// The number of the last batch appended (held, or let go since), if any.
    pub fn last_seq(&self) -> Option<u64> {
        lock(&self.inner).last_seq
    }

    /// Batches held.
    pub fn len(&self) -> usize {
        lock(&self.inner).held.len()
    }

    /// True when no batch is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Payload bytes held.
    pub fn num_bytes(&self) -> usize {
        lock(&self.inner).held_bytes
    }

    /// Refuses later appends; what is held stays readable. Idempotent.
    pub fn close(&self) {
        lock(&self.inner).closed = true;
    }

    /// Holds `held`, then lets the oldest go while over a bound (the newest stays).
    fn hold(&self, inner: &mut Inner, held: Held) {
        inner.held_bytes += held.len;
        inner.held.push_back(held);
        while inner.held.len() > self.max_batches
            || (inner.held_bytes > self.capacity && inner.held.len() > 1)
        {
            drop_oldest(inner);
        }
    }
}

/// Frees the ring bytes a payload of `len` (at most `capacity`) goes to: from the head,
/// or from 0 when it does not fit before the end. The ring's batches after the head
/// are its oldest, so they go, oldest first, while they overlap the region (wrapping
/// frees everything from the head to the end too).
fn make_room(inner: &mut Inner, capacity: usize, len: usize) -> usize {
    let start = if inner.head + len <= capacity {
        inner.head
    } else {
        0
    };
    let end = start + len;
    let wrapped = start < inner.head;
    while let Some(&Held {
        len: n,
        place: Place::Ring(at),
        ..
    }) = inner.held.front()
    {
        let in_tail = wrapped && at >= inner.head;
        let overlaps = at < end && at + n > start;
        if !(in_tail || overlaps) {
            break;
        }
        drop_oldest(inner);
    }
    inner.head = end;
    start
}

fn drop_oldest(inner: &mut Inner) {
    if let Some(held) = inner.held.pop_front() {
        inner.held_bytes -= held.len;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn a_prefaulted_ring_holds_and_replays_as_before() {
        let ring = ReplayRing::new(8, 1_000).unwrap();
        ring.append(0, &payload(0, 300)).unwrap();
        let room = lock(&ring.inner).ring.as_ptr();
        ring.prefault();
        assert_eq!(lock(&ring.inner).ring.len(), 1_000);
        assert_eq!(
            lock(&ring.inner).ring.as_ptr(),
            room,
            "the room never moves"
        );
        for seq in 1..10 {
            ring.append(seq, &payload(seq, 300)).unwrap();
        }
        let held = ring.batches_from(0);
        assert_eq!(seqs(&ring), vec![7, 8, 9]);
        for (seq, bytes) in held {
            assert_eq!(bytes, payload(seq, 300));
        }
        ring.prefault();
        assert_eq!(ring.batches_from(9), vec![(9, payload(9, 300))]);
    }

    fn seqs(ring: &ReplayRing) -> Vec<u64> {
        ring.batches_from(0).into_iter().map(|(s, _)| s).collect()
    }

    fn payload(seq: u64, len: usize) -> Vec<u8> {
        (0..len).map(|i| (seq as usize * 31 + i) as u8).collect()
    }

    #[test]
    fn holds_the_newest_batches_that_fit_oldest_first() {
        let ring = ReplayRing::new(8, 100).unwrap();
        for seq in 0..10 {
            assert_eq!(ring.append(seq, &payload(seq, 30)), Ok(()));
        }
        // 100 bytes hold three 30-byte payloads.
        assert_eq!(seqs(&ring), vec![7, 8, 9]);
        assert_eq!((ring.len(), ring.num_bytes()), (3, 90));
        for (seq, bytes) in ring.batches_from(8) {
            assert_eq!(bytes, payload(seq, 30));
        }
        assert_eq!(seqs(&ring).len(), ring.batches_from(7).len());
    }

    #[test]
    fn refusals_change_nothing() {
        let ring = ReplayRing::new(8, 10_000).unwrap();
        for (seq, len) in [(3, 100), (4, 800), (5, 0), (6, 900)] {
            assert_eq!(ring.check_next(seq), Ok(()));
            assert_eq!(ring.append(seq, &payload(seq, len)), Ok(()));
        }
        let held =
            [(3, 100), (4, 800), (5, 0), (6, 900)].map(|(seq, len)| (seq, payload(seq, len)));
        assert_eq!(ring.batches_from(0), held.to_vec());
        // Refused: the number is not above the last one.
        assert_eq!(ring.check_next(6), Err(AppendError::OutOfOrder { last: 6 }));
        assert_eq!(
            ring.append(6, &payload(6, 10)),
            Err(AppendError::OutOfOrder { last: 6 })
        );
        assert_eq!(
            ring.append(2, &payload(2, 10)),
            Err(AppendError::OutOfOrder { last: 6 })
        );
        ring.close();
        ring.close();
        assert_eq!(ring.check_next(7), Err(AppendError::Closed));
        assert_eq!(ring.append(7, &[1]), Err(AppendError::Closed));
        assert_eq!(ring.batches_from(0), held.to_vec());
        assert_eq!((ring.len(), ring.num_bytes()), (4, 1_800));
    }

    #[test]
    fn the_batch_bound_and_mixed_sizes_and_wrapping() {
        let ring = ReplayRing::new(3, 1_000).unwrap();
        let sizes = [
            400, 10, 300, 500, 20, 999, 1, 250, 250, 250, 250, 600, 600, 5, 700, 300, 1_000, 0,
            1_001, 3,
        ];
        for (seq, &len) in sizes.iter().enumerate() {
            ring.append(seq as u64, &payload(seq as u64, len)).unwrap();
            let held = ring.batches_from(0);
            assert!(held.len() <= 3 && held.last().map(|h| h.0) == Some(seq as u64));
            assert!(held.len() == 1 || held.iter().map(|(_, b)| b.len()).sum::<usize>() <= 1_000);
            for (s, bytes) in &held {
                assert_eq!(bytes, &payload(*s, sizes[*s as usize]));
            }
            assert!(
                held.windows(2).all(|w| w[0].0 + 1 == w[1].0),
                "consecutive: {held:?}"
            );
        }
    }

    #[test]
    fn an_impossible_ring_is_an_error_not_an_abort() {
        let err = ReplayRing::new(10, usize::MAX / 2).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::OutOfMemory);
    }

    #[test]
    fn a_payload_larger_than_the_ring_is_held_alone() {
        let ring = ReplayRing::new(10, 50).unwrap();
        ring.append(0, &payload(0, 20)).unwrap();
        ring.append(1, &payload(1, 80)).unwrap();
        assert_eq!(ring.batches_from(0), vec![(1, payload(1, 80))]);
        ring.append(2, &payload(2, 20)).unwrap();
        assert_eq!(ring.batches_from(0), vec![(2, payload(2, 20))]);
        let empty = ReplayRing::new(10, 0).unwrap();
        empty.append(5, b"abc").unwrap();
        empty.append(6, b"de").unwrap();
        empty.append(7, b"").unwrap();
        assert_eq!(empty.batches_from(0), vec![(7, Vec::new())]);
        assert_eq!(empty.num_bytes(), 0);
    }

    #[test]
    fn readers_never_see_a_torn_or_reordered_batch() {
        let ring = Arc::new(ReplayRing::new(64, 10_000).unwrap());
        let reader = {
            let ring = Arc::clone(&ring);
            std::thread::spawn(move || {
                let mut reads = 0;
                while reads < 2_000 {
                    let held = ring.batches_from(0);
                    for (seq, bytes) in &held {
                        let len = 50 + (*seq as usize * 37) % 900;
                        assert_eq!(bytes, &payload(*seq, len), "batch {seq}");
                    }
                    assert!(held.windows(2).all(|w| w[0].0 < w[1].0));
                    reads += 1;
                }
            })
        };
        for seq in 0..5_000u64 {
            ring.append(seq, &payload(seq, 50 + (seq as usize * 37) % 900))
                .unwrap();
        }
        reader.join().unwrap();
        assert_eq!(ring.batches_from(0).last().map(|h| h.0), Some(4_999));
    }
}
