//! The relay-wide budget for large frames being received. A WebSocket message is buffered
//! whole before the session sees it, so without a bound many connections each sending a
//! largest frame (16 MiB of attachments, sealed) could take memory without limit. Every
//! connection reads up to [`SMALL_FRAME`] bytes per frame freely; to read more of one frame
//! it first takes a whole largest frame's share of the budget, and gives it back when the
//! session has taken the frame in (or the socket closes). Connections waiting for a share
//! simply stop reading (TCP pushes back on their senders); they never hold part of one, so
//! the waiting cannot deadlock.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
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

    /// How many largest frames may be received at once.
    pub fn frames_at_once(&self) -> usize {
        self.semaphore.available_permits() / self.frame_units.max(1) as usize
    }

    /// A new connection's meter, and the handle its session marks whole frames with.
    pub fn meter(&self) -> (Meter, FrameDone) {
        let done = FrameDone::default();
        let meter = Meter {
            budget: PollSemaphore::new(self.semaphore.clone()),
            frame_units: self.frame_units,
            read: 0,
            seen: 0,
            done: done.0.clone(),
            held: None,
        };
        (meter, done)
    }
}

/// One connection's count of the bytes read since its last whole frame, and the share it
/// holds for a large one.
pub struct Meter {
    budget: PollSemaphore,
    frame_units: u32,
    read: usize,
    seen: u64,
    done: Arc<AtomicU64>,
    held: Option<OwnedSemaphorePermit>,
}

impl Meter {
    /// Ready when the connection may read on: a whole frame since the last read gives its
    /// share back; past [`SMALL_FRAME`] bytes of one frame, a share must be held.
    pub fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        let done = self.done.load(Ordering::Acquire);
        if done != self.seen {
            self.seen = done;
            self.read = 0;
            self.held = None;
        }
        if self.read < SMALL_FRAME || self.held.is_some() {
            return Poll::Ready(());
        }
        match self.budget.poll_acquire_many(cx, self.frame_units) {
            Poll::Ready(permit) => {
                // `None` only for a closed semaphore, which this never closes.
                self.held = permit;
                Poll::Ready(())
            }
            Poll::Pending => Poll::Pending,
        }
    }

    /// Counts `n` bytes read.
    pub fn count(&mut self, n: usize) {
        self.read = self.read.saturating_add(n);
    }

    /// Whether this connection holds a share now.
    #[cfg(test)]
    fn holds_share(&self) -> bool {
        self.held.is_some()
    }
}

/// Marks that the connection's session took a whole frame in (or an HTTP request began).
#[derive(Clone, Default)]
pub struct FrameDone(Arc<AtomicU64>);

impl FrameDone {
    /// The frame read so far is whole: its share goes back at the next read.
    pub fn mark(&self) {
        self.0.fetch_add(1, Ordering::Release);
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
    fn large_frames_wait_for_a_share_and_give_it_back_when_whole() {
        let budget = ReceiveBudget::new(2 * 4 * 1024 * 1024, 4 * 1024 * 1024);
        assert_eq!(budget.frames_at_once(), 2);
        let (mut a, done_a) = budget.meter();
        let (mut b, _) = budget.meter();
        let (mut c, _) = budget.meter();
        for m in [&mut a, &mut b, &mut c] {
            assert!(poll(m), "small frames read freely");
            m.count(SMALL_FRAME);
        }
        assert!(poll(&mut a) && a.holds_share());
        assert!(poll(&mut b) && b.holds_share());
        assert!(!poll(&mut c), "a third large frame waits");
        done_a.mark();
        assert!(
            poll(&mut a) && !a.holds_share(),
            "a whole frame gives its share back"
        );
        assert!(poll(&mut c) && c.holds_share());
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
