//! The replay buffer of an event publisher: the last batches' payloads, copied into
//! one ring by a thread of its own.
//!
//! Keeping each step's payload is what publishing costs a scheduler step most: a step
//! that stores 4,000 blocks makes a 266 kB payload, and holding on to it means writing
//! 266 kB a step into memory no cache holds, which also pushes the step's own data out
//! of the core's cache. Here the publishing thread puts the payload into a staging
//! buffer the ring reuses (copied by [`ReplayRing::append`], or written there in the
//! first place through [`ReplayRing::take_buffer`] and [`ReplayRing::append_owned`])
//! and hands it over; the copier thread copies it into the ring, so the cold writes
//! happen on the other core. (The staging buffer was last read by the copier, so
//! writing it still waits on the other core's cache: measured in `docs/events.md`.)
//! No Python is involved, so the copier never waits for the GIL.
//!
//! Batches leave oldest first, once more than `max_batches` are held or a new one needs
//! their bytes; a payload larger than the ring is held alone, in its staging buffer. A
//! batch waiting for the copier is already held: [`ReplayRing::batches_from`] serves it.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Payloads below this size are held as they are, not copied into the ring: keeping
/// them costs little, and handing each to the copier would cost a thread wake-up.
pub const COPY_MIN: usize = 64 << 10;

/// Staging buffers kept for reuse (more are made while the copier is behind).
const SPARE_STAGING: usize = 2;

/// Where a held batch's bytes are.
#[derive(Debug)]
enum Place {
    /// In the ring, from this offset.
    Ring(usize),
    /// In a buffer of its own: a small payload, or one larger than the ring.
    Whole(Arc<Vec<u8>>),
}

/// A held batch.
#[derive(Debug)]
struct Held {
    seq: u64,
    len: usize,
    place: Place,
}

/// What the threads share under one lock; the ring's bytes have a lock of their own,
/// which the copier takes to write one batch and readers to copy one out.
#[derive(Debug, Default)]
struct State {
    /// Held batches, oldest first (sequence numbers increase).
    held: VecDeque<Held>,
    held_bytes: usize,
    /// The held batches in the ring, `(seq, start, len)`, oldest first.
    in_ring: VecDeque<(u64, usize, usize)>,
    /// Where the next copy goes.
    head: usize,
    /// Batches waiting for the copier, oldest first; the one being copied stays first
    /// until it is held.
    pending: VecDeque<(u64, Arc<Vec<u8>>)>,
    pending_bytes: usize,
    /// Staging buffers free for the next append.
    spare: Vec<Vec<u8>>,
    /// The last batch number appended.
    last_seq: Option<u64>,
    closed: bool,
}

impl State {
    /// Why batch `seq` would be refused now, if it would.
    fn refusal(&self, seq: u64) -> Option<AppendError> {
        if self.closed {
            return Some(AppendError::Closed);
        }
        self.last_seq
            .filter(|&last| seq <= last)
            .map(|last| AppendError::OutOfOrder { last })
    }

    /// Keeps `buffer` as a spare staging buffer if there is room for one.
    fn recycle(&mut self, buffer: Vec<u8>) {
        if self.spare.len() < SPARE_STAGING {
            self.spare.push(buffer);
        }
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

#[derive(Debug)]
struct Shared {
    state: Mutex<State>,
    /// Signalled when a batch is queued for an idle copier, held, or the ring closes.
    changed: Condvar,
    ring: Mutex<Vec<u8>>,
    capacity: usize,
    max_batches: usize,
    copy_min: usize,
}

impl Shared {
    /// Whether a payload of `len` bytes goes into the ring (else it is held whole).
    fn copied(&self, len: usize) -> bool {
        (self.copy_min..=self.capacity).contains(&len)
    }
}

/// The last `max_batches` payloads within `max_bytes` (the newest always held).
#[derive(Debug)]
pub struct ReplayRing {
    shared: Arc<Shared>,
    copier: Mutex<Option<JoinHandle<()>>>,
}

/// A lock taken even if a thread panicked while holding it: every change here is
/// complete before the next one starts, so the state stays consistent.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl ReplayRing {
    /// A ring of `max_bytes` (reserved; used as batches fill it) holding at most
    /// `max_batches` batches, and its copier thread. An error if the room cannot be
    /// reserved or the thread cannot start.
    pub fn new(max_batches: usize, max_bytes: usize) -> std::io::Result<Self> {
        Self::with_copy_min(max_batches, max_bytes, COPY_MIN)
    }

    /// [`new`](Self::new), copying into the ring the payloads of `copy_min` bytes or
    /// more (and at most the ring's size) instead of [`COPY_MIN`].
    pub fn with_copy_min(
        max_batches: usize,
        max_bytes: usize,
        copy_min: usize,
    ) -> std::io::Result<Self> {
        // Reserved, not written: the ring grows into its room during its first lap, so
        // memory is only used as batches need it, and the room never moves.
        let mut ring = Vec::new();
        ring.try_reserve_exact(max_bytes).map_err(|_| {
            std::io::Error::new(
                std::io::ErrorKind::OutOfMemory,
                format!("cannot reserve {max_bytes} bytes for the replay ring"),
            )
        })?;
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            changed: Condvar::new(),
            ring: Mutex::new(ring),
            capacity: max_bytes,
            max_batches: max_batches.max(1),
            copy_min,
        });
        let for_copier = Arc::clone(&shared);
        let copier = std::thread::Builder::new()
            .name("kvpool-replay-ring".into())
            .spawn(move || copy_loop(&for_copier))?;
        Ok(Self {
            shared,
            copier: Mutex::new(Some(copier)),
        })
    }

    /// Holds `payload` as batch `seq`, numbered above every batch before it. Returns
    /// at once: one copy, into a reused staging buffer for a payload the copier puts
    /// in the ring (see [`append_owned`](Self::append_owned) to skip even that).
    pub fn append(&self, seq: u64, payload: &[u8]) -> Result<(), AppendError> {
        let mut staging = self.take_buffer();
        staging.extend_from_slice(payload);
        self.append_owned(seq, staging).map_err(|(e, _)| e)
    }

    /// An empty buffer for the next payload: one of the ring's spare staging buffers
    /// (whose room is already there) when one is free, else a new one. Fill it and
    /// hand it to [`append_owned`](Self::append_owned), and a payload is held with no
    /// copy on the caller's thread.
    pub fn take_buffer(&self) -> Vec<u8> {
        let mut buffer = lock(&self.shared.state).spare.pop().unwrap_or_default();
        buffer.clear();
        buffer
    }

    /// [`append`](Self::append) of a payload the caller has put in a buffer of its
    /// own (best one from [`take_buffer`](Self::take_buffer)): the buffer itself is
    /// queued for the copier, or held, so nothing is copied on this thread. A refused
    /// batch gives its buffer back with the reason.
    pub fn append_owned(
        &self,
        seq: u64,
        mut payload: Vec<u8>,
    ) -> Result<(), (AppendError, Vec<u8>)> {
        let shared = &*self.shared;
        let len = payload.len();
        if !shared.copied(len) && payload.capacity() > 2 * len + 4096 {
            // Held whole for as long as it is kept: not in a staging buffer's room.
            let tight = payload.as_slice().to_vec();
            lock(&shared.state).recycle(std::mem::replace(&mut payload, tight));
        }
        // One lock section for the order check and the queueing, so batches queue in
        // the order their numbers were checked in.
        let mut state = lock(&shared.state);
        if let Some(refused) = state.refusal(seq) {
            return Err((refused, payload));
        }
        state.last_seq = Some(seq);
        if !shared.copied(len) && state.pending.is_empty() {
            let place = Place::Whole(Arc::new(payload));
            hold(shared, &mut state, Held { seq, len, place });
            return Ok(());
        }
        // A payload for the ring waits for the copier in its own buffer; one held
        // whole but behind batches still to be copied waits with them, held in order
        // by the copier.
        let idle = state.pending.is_empty();
        state.pending_bytes += len;
        state.pending.push_back((seq, Arc::new(payload)));
        drop(state);
        if idle {
            shared.changed.notify_all();
        }
        Ok(())
    }

    /// Whether [`append`](Self::append) would take batch `seq` now (the ring is open
    /// and `seq` is above every batch appended): a caller about to consume something
    /// to build the payload checks first.
    pub fn check_next(&self, seq: u64) -> Result<(), AppendError> {
        lock(&self.shared.state).refusal(seq).map_or(Ok(()), Err)
    }

    /// The held batches numbered `first` or later, oldest first.
    ///
    /// Copies out one batch at a time, so that neither the publishing thread nor the
    /// copier waits longer than one batch's copy; a batch let go meanwhile (only the
    /// oldest can be) is left out.
    pub fn batches_from(&self, first: u64) -> Vec<(u64, Vec<u8>)> {
        enum Source {
            Ring { start: usize, len: usize },
            Whole(Arc<Vec<u8>>),
        }
        let wanted: Vec<(u64, Source)> = {
            let state = lock(&self.shared.state);
            let held = state.held.iter().filter(|h| h.seq >= first).map(|h| {
                let source = match &h.place {
                    Place::Whole(b) => Source::Whole(Arc::clone(b)),
                    Place::Ring(start) => Source::Ring {
                        start: *start,
                        len: h.len,
                    },
                };
                (h.seq, source)
            });
            let pending = state
                .pending
                .iter()
                .filter(|(seq, _)| *seq >= first)
                .map(|(seq, b)| (*seq, Source::Whole(Arc::clone(b))));
            held.chain(pending).collect()
        };
        let mut out = Vec::with_capacity(wanted.len());
        for (seq, source) in wanted {
            match source {
                Source::Whole(bytes) => out.push((seq, bytes.to_vec())),
                Source::Ring { start, len } => {
                    // The ring's lock first, then whether the batch is still held: the
                    // copier lets a batch go before it takes the ring's lock to write.
                    let ring = lock(&self.shared.ring);
                    if self.is_held_at(seq, start) {
                        out.push((seq, ring[start..start + len].to_vec()));
                    }
                }
            }
        }
        out
    }

    /// Whether batch `seq` is held in the ring at `start`.
    fn is_held_at(&self, seq: u64, start: usize) -> bool {
        let state = lock(&self.shared.state);
        state
            .held
            .binary_search_by_key(&seq, |h| h.seq)
            .is_ok_and(|i| matches!(state.held[i].place, Place::Ring(s) if s == start))
    }

    /// Batches held, those waiting for the copier included.
    pub fn len(&self) -> usize {
        let state = lock(&self.shared.state);
        state.held.len() + state.pending.len()
    }

    /// True when no batch is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Payload bytes held, those waiting for the copier included.
    pub fn num_bytes(&self) -> usize {
        let state = lock(&self.shared.state);
        state.held_bytes + state.pending_bytes
    }

    /// Waits until the copier has held every queued batch; false on timeout.
    pub fn drain(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut state = lock(&self.shared.state);
        while !state.pending.is_empty() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            state = self
                .shared
                .changed
                .wait_timeout(state, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        true
    }

    /// Stops the copier once it has copied what is queued, and waits for it; later
    /// appends are refused. Idempotent.
    pub fn close(&self) {
        lock(&self.shared.state).closed = true;
        self.shared.changed.notify_all();
        if let Some(copier) = lock(&self.copier).take() {
            let _ = copier.join();
        }
    }
}

impl Drop for ReplayRing {
    fn drop(&mut self) {
        self.close();
    }
}

/// The copier: makes room for the oldest queued batch, copies it, holds it.
fn copy_loop(shared: &Shared) {
    loop {
        let (staging, start) = {
            let mut state = lock(&shared.state);
            while state.pending.is_empty() && !state.closed {
                state = shared
                    .changed
                    .wait(state)
                    .unwrap_or_else(|p| p.into_inner());
            }
            let Some((_, staging)) = state.pending.front().cloned() else {
                return; // closed, and nothing left
            };
            let len = staging.len();
            if !shared.copied(len) {
                hold_first_pending(shared, &mut state, Place::Whole(staging));
                drop(state);
                shared.changed.notify_all();
                continue;
            }
            let start = make_room(&mut state, shared.capacity, len);
            (staging, start)
        };
        // The region belongs to no held batch, so no reader copies it out meanwhile;
        // the batch stays first in `pending` (served from there) until it is held.
        let len = staging.len();
        {
            let mut ring = lock(&shared.ring);
            if ring.len() < start + len {
                // Still growing into its reserved room (which `start + len` never exceeds).
                ring.resize(start + len, 0);
            }
            ring[start..start + len].copy_from_slice(&staging);
        }
        let mut state = lock(&shared.state);
        hold_first_pending(shared, &mut state, Place::Ring(start));
        if let Ok(buffer) = Arc::try_unwrap(staging) {
            state.recycle(buffer);
        }
        drop(state);
        shared.changed.notify_all();
    }
}

/// Moves the first pending batch, whose bytes are now at `place`, to the held ones.
fn hold_first_pending(shared: &Shared, state: &mut State, place: Place) {
    if let Some((seq, staging)) = state.pending.pop_front() {
        let len = staging.len();
        state.pending_bytes -= len;
        hold(shared, state, Held { seq, len, place });
    }
}

/// Holds `held`, then lets the oldest go while over a bound (the newest stays).
fn hold(shared: &Shared, state: &mut State, held: Held) {
    state.held_bytes += held.len;
    if let Place::Ring(start) = held.place {
        state.in_ring.push_back((held.seq, start, held.len));
    }
    state.held.push_back(held);
    while state.held.len() > shared.max_batches
        || (state.held_bytes > shared.capacity && state.held.len() > 1)
    {
        drop_oldest(state);
    }
}

/// Frees the ring bytes a payload of `len` (at most `capacity`) goes to: from the head,
/// or from 0 when it does not fit before the end. The ring's batches after the head
/// are its oldest, so they go while they overlap the region (wrapping frees everything
/// from the head to the end too), each with every batch older than it.
fn make_room(state: &mut State, capacity: usize, len: usize) -> usize {
    let start = if state.head + len <= capacity {
        state.head
    } else {
        0
    };
    let end = start + len;
    let wrapped = start < state.head;
    while let Some(&(seq, at, n)) = state.in_ring.front() {
        let in_tail = wrapped && at >= state.head;
        let overlaps = at < end && at + n > start;
        if !(in_tail || overlaps) {
            break;
        }
        while state.held.front().is_some_and(|h| h.seq <= seq) {
            drop_oldest(state);
        }
    }
    state.head = end;
    start
}

fn drop_oldest(state: &mut State) {
    if let Some(held) = state.held.pop_front() {
        state.held_bytes -= held.len;
        if let Place::Ring(_) = held.place {
            state.in_ring.pop_front();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seqs(ring: &ReplayRing) -> Vec<u64> {
        ring.batches_from(0).into_iter().map(|(s, _)| s).collect()
    }

    fn payload(seq: u64, len: usize) -> Vec<u8> {
        (0..len).map(|i| (seq as usize * 31 + i) as u8).collect()
    }

    #[test]
    fn holds_the_newest_batches_that_fit_oldest_first() {
        let ring = ReplayRing::with_copy_min(8, 100, 0).unwrap();
        for seq in 0..10 {
            assert_eq!(ring.append(seq, &payload(seq, 30)), Ok(()));
        }
        assert!(ring.drain(Duration::from_secs(5)));
        // 100 bytes hold three 30-byte payloads.
        assert_eq!(seqs(&ring), vec![7, 8, 9]);
        assert_eq!((ring.len(), ring.num_bytes()), (3, 90));
        for (seq, bytes) in ring.batches_from(8) {
            assert_eq!(bytes, payload(seq, 30));
        }
        assert_eq!(seqs(&ring).len(), ring.batches_from(7).len());
    }

    #[test]
    fn owned_buffers_are_held_as_given_and_refusals_hand_them_back() {
        // Small payloads are held whole, large ones copied: both through owned buffers.
        let ring = ReplayRing::with_copy_min(8, 10_000, 500).unwrap();
        for (seq, len) in [(3, 100), (4, 800), (5, 50), (6, 900)] {
            let mut buffer = ring.take_buffer();
            assert!(buffer.is_empty());
            buffer.extend_from_slice(&payload(seq, len));
            assert_eq!(ring.check_next(seq), Ok(()));
            assert_eq!(ring.append_owned(seq, buffer), Ok(()));
        }
        assert!(ring.drain(Duration::from_secs(5)));
        let held = ring.batches_from(0);
        assert_eq!(
            held,
            [(3, 100), (4, 800), (5, 50), (6, 900)]
                .map(|(seq, len)| (seq, payload(seq, len)))
                .to_vec()
        );
        // A spare staging buffer comes back empty, whatever it held.
        assert!(ring.take_buffer().is_empty());
        // Refused: the number is not above the last one; the buffer comes back whole.
        assert_eq!(ring.check_next(6), Err(AppendError::OutOfOrder { last: 6 }));
        let refused = ring.append_owned(6, payload(6, 10)).unwrap_err();
        assert_eq!(
            refused,
            (AppendError::OutOfOrder { last: 6 }, payload(6, 10))
        );
        ring.close();
        assert_eq!(ring.check_next(7), Err(AppendError::Closed));
        assert_eq!(
            ring.append_owned(7, vec![1]).unwrap_err(),
            (AppendError::Closed, vec![1])
        );
        assert_eq!(ring.len(), 4);
    }

    #[test]
    fn the_batch_bound_and_mixed_sizes_and_wrapping() {
        // Copy thresholds: everything into the ring; only 200 bytes and more; nothing.
        for copy_min in [0, 200, usize::MAX] {
            bounded_mixed_sizes(copy_min);
        }
    }

    fn bounded_mixed_sizes(copy_min: usize) {
        let ring = ReplayRing::with_copy_min(3, 1_000, copy_min).unwrap();
        let sizes = [
            400, 10, 300, 500, 20, 999, 1, 250, 250, 250, 250, 600, 600, 5, 700, 300,
        ];
        for (seq, &len) in sizes.iter().enumerate() {
            ring.append(seq as u64, &payload(seq as u64, len)).unwrap();
            assert!(ring.drain(Duration::from_secs(5)));
            let held = ring.batches_from(0);
            assert!(held.len() <= 3 && held.last().map(|h| h.0) == Some(seq as u64));
            assert!(held.iter().map(|(_, b)| b.len()).sum::<usize>() <= 1_000);
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
        let ring = ReplayRing::with_copy_min(10, 50, 0).unwrap();
        ring.append(0, &payload(0, 20)).unwrap();
        ring.append(1, &payload(1, 80)).unwrap();
        assert!(ring.drain(Duration::from_secs(5)));
        assert_eq!(ring.batches_from(0), vec![(1, payload(1, 80))]);
        ring.append(2, &payload(2, 20)).unwrap();
        assert!(ring.drain(Duration::from_secs(5)));
        assert_eq!(ring.batches_from(0), vec![(2, payload(2, 20))]);
        let empty = ReplayRing::new(10, 0).unwrap();
        empty.append(5, b"abc").unwrap();
        empty.append(6, b"de").unwrap();
        // Numbers must increase; a refused batch changes nothing.
        assert_eq!(
            empty.append(6, b"x"),
            Err(AppendError::OutOfOrder { last: 6 })
        );
        assert_eq!(
            empty.append(2, b"x"),
            Err(AppendError::OutOfOrder { last: 6 })
        );
        assert!(empty.drain(Duration::from_secs(5)));
        assert_eq!(empty.batches_from(0), vec![(6, b"de".to_vec())]);
    }

    #[test]
    fn queued_batches_are_served_and_closing_copies_them_first() {
        let ring = ReplayRing::with_copy_min(100, 1 << 20, 500).unwrap();
        for seq in 0..50 {
            // Alternately copied and held whole: order is kept across the two.
            ring.append(seq, &payload(seq, if seq % 2 == 0 { 1000 } else { 100 }))
                .unwrap();
        }
        // Whatever the copier has reached, every batch is there, in order.
        assert_eq!(seqs(&ring), (0..50).collect::<Vec<_>>());
        ring.close();
        assert_eq!(ring.append(50, b"late"), Err(AppendError::Closed));
        assert_eq!(ring.len(), 50);
        assert!(ring.drain(Duration::from_millis(1)));
    }

    #[test]
    fn readers_never_see_a_torn_or_reordered_batch() {
        let ring = Arc::new(ReplayRing::with_copy_min(64, 10_000, 100).unwrap());
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
        assert!(ring.drain(Duration::from_secs(5)));
        assert_eq!(ring.batches_from(0).last().map(|h| h.0), Some(4_999));
    }
}
