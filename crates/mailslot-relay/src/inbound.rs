//! The relay-wide budget for large frames. A WebSocket message is buffered whole before the
//! session sees it, then parsed, copied for storage and written; without a bound many
//! connections each sending a largest frame (16 MiB of attachments, sealed) could take memory
//! without limit. Every connection reads up to [`SMALL_FRAME`] bytes per frame freely; to
//! read more of one frame it first takes a whole largest frame's share of the budget, which
//! the session takes over when the frame is in and keeps until the frame is done with (a send
//! until its write is on disk, a link's delivery until it is answered), so the budget bounds
//! the large frames being received *and* those being stored. Connections waiting for a share
//! simply stop reading (TCP pushes back on their senders); they never hold part of one, so the
//! waiting cannot deadlock: a share is given back by work that waits for no read.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::PollSemaphore;

/// Bytes of one frame a connection reads without taking from the budget: every frame but
/// those carrying attachments.
pub const SMALL_FRAME: usize = 1024 * 1024;
/// The budget's unit.
const UNIT: usize = 64 * 1024;

/// The shares of the budget, shared by every connection.
#[derive(Clone)]
pub struct ReceiveBudget {
    semaphore: Arc<Semaphore>,
    /// Units one largest frame takes.
    frame_units: u32,
}

impl ReceiveBudget {
    /// A budget of `total_bytes` for frames of up to `max_frame` bytes; always room for one.
    pub fn new(total_bytes: usize, max_frame: usize) -> Self {
        let frame_units = u32::try_from(max_frame.div_ceil(UNIT)).unwrap_or(u32::MAX);
        let units = (total_bytes / UNIT).max(frame_units as usize);
        Self {
            semaphore: Arc::new(Semaphore::new(units.min(Semaphore::MAX_PERMITS))),
            frame_units,
        }
    }

    /// How many largest frames may be received and stored at once.
    pub fn frames_at_once(&self) -> usize {
        self.semaphore.available_permits() / self.frame_units.max(1) as usize
    }

    /// A new connection's meter, and the handle its session takes whole frames' shares with.
    pub fn meter(&self) -> (Meter, FrameDone) {
        let done = FrameDone::default();
        let meter = Meter {
            budget: PollSemaphore::new(self.semaphore.clone()),
            frame_units: self.frame_units,
            read: 0,
            seen: 0,
            done: done.0.clone(),
        };
        (meter, done)
    }
}

/// One connection's count of the bytes read since its last whole frame.
pub struct Meter {
    budget: PollSemaphore,
    frame_units: u32,
    read: usize,
    seen: u64,
    done: Arc<Frames>,
}

impl Meter {
    /// Ready when the connection may read on: past [`SMALL_FRAME`] bytes of one frame, a
    /// share must be held for it.
    pub fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        let done = self.done.count.load(Ordering::Acquire);
        if done != self.seen {
            self.seen = done;
            self.read = 0;
        }
        if self.read < SMALL_FRAME || self.done.holds_share() {
            return Poll::Ready(());
        }
        match self.budget.poll_acquire_many(cx, self.frame_units) {
            Poll::Ready(permit) => {
                // `None` only for a closed semaphore, which this never closes.
                *self.done.lock() = permit.map(|p| Share { _permit: p });
                Poll::Ready(())
            }
            Poll::Pending => Poll::Pending,
        }
    }

    /// Counts `n` bytes read.
    pub fn count(&mut self, n: usize) {
        self.read = self.read.saturating_add(n);
    }
}

/// A large frame's share of the budget: given back when dropped.
#[derive(Debug)]
pub struct Share {
    _permit: OwnedSemaphorePermit,
}

/// The frames a connection's session took in, and the share held for the one being read.
#[derive(Default)]
struct Frames {
    count: AtomicU64,
    share: Mutex<Option<Share>>,
}

impl Frames {
    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Share>> {
        self.share.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn holds_share(&self) -> bool {
        self.lock().is_some()
    }
}

/// Marks that the connection's session took a whole frame in (or an HTTP request began).
#[derive(Clone, Default)]
pub struct FrameDone(Arc<Frames>);

impl FrameDone {
    /// The frame read so far is whole: the next one starts from nothing, and its share (if
    /// it was a large one) is the caller's, to keep until the frame is done with.
    pub fn take(&self) -> Option<Share> {
        let share = self.0.lock().take();
        self.0.count.fetch_add(1, Ordering::Release);
        share
    }

    /// The frame read so far is whole and done with: its share goes back.
    pub fn mark(&self) {
        drop(self.take());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::task::Waker;

    fn poll(meter: &mut Meter) -> bool {
        meter
            .poll_ready(&mut Context::from_waker(Waker::noop()))
            .is_ready()
    }

    #[test]
    fn large_frames_wait_for_a_share_kept_until_the_frame_is_done_with() {
        let budget = ReceiveBudget::new(2 * 4 * 1024 * 1024, 4 * 1024 * 1024);
        assert_eq!(budget.frames_at_once(), 2);
        let (mut a, done_a) = budget.meter();
        let (mut b, _) = budget.meter();
        let (mut c, _) = budget.meter();
        for m in [&mut a, &mut b, &mut c] {
            assert!(poll(m), "small frames read freely");
            m.count(SMALL_FRAME);
        }
        assert!(poll(&mut a) && a.done.holds_share());
        assert!(poll(&mut b) && b.done.holds_share());
        assert!(!poll(&mut c), "a third large frame waits");
        let stored = done_a.take().expect("a's frame was a large one");
        assert!(
            poll(&mut a) && !a.done.holds_share(),
            "the next frame starts from nothing"
        );
        assert!(!poll(&mut c), "a's share is held while its frame is stored");
        drop(stored);
        assert!(poll(&mut c) && c.done.holds_share());
        drop(b);
        assert_eq!(
            budget.frames_at_once(),
            1,
            "a closed socket gives its share back"
        );
    }

    #[test]
    fn a_budget_smaller_than_a_frame_still_admits_one() {
        let budget = ReceiveBudget::new(0, 4 * 1024 * 1024);
        assert_eq!(budget.frames_at_once(), 1);
    }
}
