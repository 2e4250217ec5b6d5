//! Turns at outside clients. The tests that drive Claude Code, Codex, OpenClaw, the interop
//! clients or Chromium each lived in a test binary of their own, and cargo runs binaries one
//! after another: a module's tests ran beside each other, never beside another module's. In
//! one binary they keep that: a test takes its module's turn, waiting while another module
//! holds it, and gives it back when its thread ends (libtest runs every test on a thread of
//! its own, so that is when the test ends, passed or failed).

use std::cell::RefCell;
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};

/// The module whose tests hold the turn, and how many of them.
struct Turns {
    module: Option<&'static str>,
    tests: usize,
}

static TURNS: Mutex<Turns> = Mutex::new(Turns {
    module: None,
    tests: 0,
});
static GIVEN_BACK: Condvar = Condvar::new();

thread_local! {
    static HELD: RefCell<Option<Held>> = const { RefCell::new(None) };
}

/// One test's share of its module's turn.
struct Held;

impl Drop for Held {
    fn drop(&mut self) {
        let mut turns = lock();
        turns.tests -= 1;
        if turns.tests == 0 {
            turns.module = None;
            GIVEN_BACK.notify_all();
        }
    }
}

/// A failed test's panic must not stop the others from taking turns.
fn lock() -> MutexGuard<'static, Turns> {
    TURNS.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Waits for `module`'s turn and holds it until this thread ends; at once when this thread
/// holds it already.
pub fn take(module: &'static str) {
    if HELD.with(|held| held.borrow().is_some()) {
        return;
    }
    let mut turns = lock();
    while turns.module.is_some_and(|m| m != module) {
        turns = GIVEN_BACK
            .wait(turns)
            .unwrap_or_else(PoisonError::into_inner);
    }
    turns.module = Some(module);
    turns.tests += 1;
    drop(turns);
    HELD.with(|held| *held.borrow_mut() = Some(Held));
}
