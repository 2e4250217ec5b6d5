//! Copies handed from the storage's commit straight to whoever delivers them — an agent's
//! session, a link to another relay — in commit order, so new mail goes out without being
//! read back from the database. The queue is bounded in copies and in bytes: a push that does
//! not fit is dropped and the reader is told it missed one, and then reads the database
//! instead, from the last copy it delivered: in order, never twice, nothing skipped.
//!
//! The reader learns of a drop from [`Pushes::recv`] itself, never from a separate flag it
//! might look at before the drop and act on after it: the flag is raised before any later
//! copy is queued, and `recv` looks at it after taking a copy, so a copy that came after a
//! dropped one is never handed out.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use tokio::sync::{Notify, mpsc};

use super::storage::Committed;
use crate::protocol::Seq;

/// The committing side of one reader's pushes.
pub struct PushSender {
    copies: mpsc::Sender<Committed>,
    bytes: Arc<AtomicUsize>,
    most_bytes: usize,
    missed: Arc<Missed>,
}

/// The reading side: copies in commit order, or word that one was dropped.
pub struct Pushes {
    copies: mpsc::Receiver<Committed>,
    bytes: Arc<AtomicUsize>,
    missed: Arc<Missed>,
}

/// What [`Pushes::recv`] hands out.
#[derive(Debug)]
pub enum Pushed {
    /// The next copy committed for this reader.
    Copy(Committed),
    /// A copy was dropped, or the reader was asked to read the database (mail committed by
    /// another node): read it from the last copy delivered. The copies queued behind the
    /// drop were discarded.
    Missed,
}

/// What a reader does with a pushed copy, given the last copy it delivered.
#[derive(Debug, PartialEq, Eq)]
pub enum Step {
    /// Delivered already (by a read of the database).
    Skip,
    /// Next in order: deliver it.
    Deliver,
    /// A copy before it is not delivered yet (committed by another node, its news still on
    /// the way): read the database from the last delivery, since a cumulative ack of this
    /// one would delete that one unseen.
    Read,
}

/// What to do with `copy` after delivering up to `last_sent`.
pub fn step(copy: &Committed, last_sent: Seq) -> Step {
    if copy.seq <= last_sent {
        Step::Skip
    } else if copy.prev.is_some_and(|prev| prev > last_sent) {
        Step::Read
    } else {
        Step::Deliver
    }
}

/// A queue of at most `copies` copies and `bytes` bytes of envelopes.
pub fn channel(copies: usize, bytes: usize) -> (PushSender, Pushes) {
    let (tx, rx) = mpsc::channel(copies.max(1));
    let held = Arc::new(AtomicUsize::new(0));
    let missed = Arc::new(Missed::default());
    let sender = PushSender {
        copies: tx,
        bytes: held.clone(),
        most_bytes: bytes,
        missed: missed.clone(),
    };
    let pushes = Pushes {
        copies: rx,
        bytes: held,
        missed,
    };
    (sender, pushes)
}

impl PushSender {
    /// Queues `copy`, or drops it and tells the reader to read the database when the queue
    /// is full (in copies or in bytes).
    pub fn push(&self, copy: Committed) {
        let n = copy.envelope.len();
        if self.bytes.fetch_add(n, Ordering::AcqRel) + n > self.most_bytes
            || self.copies.try_send(copy).is_err()
        {
            self.bytes.fetch_sub(n, Ordering::AcqRel);
            self.missed.set();
        }
    }

    /// Tells the reader to read the database: it has mail that was not pushed.
    pub fn miss(&self) {
        self.missed.set();
    }

    /// Whether `pushes` is this sender's reader.
    pub fn feeds(&self, pushes: &Pushes) -> bool {
        Arc::ptr_eq(&self.missed, &pushes.missed)
    }
}

impl Pushes {
    /// The next copy, or [`Pushed::Missed`]. `None` once the sender is gone and the queue is
    /// empty. Cancel-safe: nothing is taken unless it is returned.
    pub async fn recv(&mut self) -> Option<Pushed> {
        loop {
            let copy = tokio::select! {
                biased;
                () = self.missed.wake.notified() => None,
                copy = self.copies.recv() => Some(copy?),
            };
            if let Some(copy) = &copy {
                self.bytes.fetch_sub(copy.envelope.len(), Ordering::AcqRel);
            }
            if self.missed.take() {
                self.clear();
                return Some(Pushed::Missed);
            }
            if let Some(copy) = copy {
                return Some(Pushed::Copy(copy));
            }
        }
    }

    /// Like [`Pushes::recv`], for what is already here; `None` when nothing is.
    pub fn try_recv(&mut self) -> Option<Pushed> {
        let copy = self.copies.try_recv().ok();
        if let Some(copy) = &copy {
            self.bytes.fetch_sub(copy.envelope.len(), Ordering::AcqRel);
        }
        if self.missed.take() {
            self.clear();
            return Some(Pushed::Missed);
        }
        copy.map(Pushed::Copy)
    }

    /// Drops every queued copy: the reader reads them from the database instead.
    pub fn clear(&mut self) {
        while let Ok(copy) = self.copies.try_recv() {
            self.bytes.fetch_sub(copy.envelope.len(), Ordering::AcqRel);
        }
    }
}

/// Raised when a push was dropped; the reader then reads the database.
#[derive(Default)]
struct Missed {
    flag: AtomicBool,
    wake: Notify,
}

impl Missed {
    fn take(&self) -> bool {
        self.flag.swap(false, Ordering::AcqRel)
    }

    fn set(&self) {
        self.flag.store(true, Ordering::Release);
        self.wake.notify_one();
    }
}

/// A copy of `bytes` bytes for `to`, numbered `seq`, for tests of what takes pushes.
#[cfg(test)]
pub fn test_copy(to: &crate::protocol::AgentName, seq: Seq, bytes: usize) -> Committed {
    Committed {
        recipient: to.clone(),
        seq,
        envelope: Arc::from(vec![b'x'; bytes]),
        accepted_at_ms: 0,
        prev: None,
    }
}

#[cfg(test)]
mod tests {
    use futures_util::FutureExt;

    use super::*;
    use crate::protocol::AgentName;

    fn copy(seq: u64, bytes: usize) -> Committed {
        test_copy(&AgentName::new("bob").unwrap(), seq, bytes)
    }

    fn next(pushes: &mut Pushes) -> Option<u64> {
        match pushes.recv().now_or_never()?? {
            Pushed::Copy(c) => Some(c.seq),
            Pushed::Missed => Some(0),
        }
    }

    #[test]
    fn a_push_past_an_undelivered_copy_reads_the_queue_instead() {
        let copy = |seq, prev| Committed {
            prev,
            ..copy(seq, 2)
        };
        assert_eq!(step(&copy(5, Some(4)), 5), Step::Skip, "delivered");
        assert_eq!(step(&copy(6, Some(5)), 5), Step::Deliver, "next");
        // 6 was committed by another node and its wake is still on the way: delivering 7 and
        // taking its ack would delete 6 unseen.
        assert_eq!(step(&copy(7, Some(6)), 5), Step::Read, "a gap");
        assert_eq!(step(&copy(9, None), 5), Step::Deliver, "relay-wide numbers");
    }

    #[test]
    fn copies_arrive_in_commit_order() {
        let (tx, mut rx) = channel(8, 1 << 20);
        (1..=3).for_each(|s| tx.push(copy(s, 10)));
        let seqs: Vec<_> = std::iter::from_fn(|| next(&mut rx)).collect();
        assert_eq!(seqs, [1, 2, 3]);
    }

    #[test]
    fn an_overflow_is_reported_before_anything_behind_it() {
        let (tx, mut rx) = channel(4, 1 << 20);
        (1..=6).for_each(|s| tx.push(copy(s, 10)));
        assert!(matches!(rx.try_recv(), Some(Pushed::Missed)));
        assert!(rx.try_recv().is_none(), "the queued copies were discarded");
        tx.push(copy(7, 10));
        assert_eq!(next(&mut rx), Some(7), "pushes resume after the drop");
    }

    #[test]
    fn a_copy_over_the_byte_bound_alone_is_never_skipped() {
        // Nothing is queued when the large copy is dropped, and the next one fits: the
        // reader must hear of the drop, not get the next copy (a cumulative ack of it would
        // delete the large one unseen).
        let (tx, mut rx) = channel(8, 1000);
        tx.push(copy(1, 2000));
        tx.push(copy(2, 10));
        assert_eq!(next(&mut rx), Some(0), "missed, not copy 2");
        assert_eq!(rx.bytes.load(Ordering::Acquire), 0, "its bytes were freed");
    }

    #[test]
    fn bytes_are_given_back_as_copies_are_taken() {
        let (tx, mut rx) = channel(8, 1000);
        (1..=4).for_each(|s| tx.push(copy(s, 250)));
        assert_eq!(next(&mut rx), Some(1));
        tx.push(copy(5, 250));
        assert_eq!(
            std::iter::from_fn(|| next(&mut rx)).collect::<Vec<_>>(),
            [2, 3, 4, 5],
            "taking one made room for one"
        );
    }

    #[test]
    fn a_wake_is_a_miss() {
        let (tx, mut rx) = channel(8, 1000);
        tx.miss();
        assert_eq!(next(&mut rx), Some(0));
        assert_eq!(next(&mut rx), None, "and only once");
        assert!(tx.feeds(&rx));
    }
}
