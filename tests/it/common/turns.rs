//! Turns by module. The integration tests were a binary per module, and cargo ran the binaries
//! one after another: a module's tests ran beside each other (libtest's threads), never beside
//! another module's, so no test met another module's load (an abuser's flood, a browser, a
//! gateway) or competed with it for the machine. In one binary they keep that: a test takes its
//! module's turn when it first starts something through the fixtures (a relay, an agent, a
//! relay process, an outside client), waiting while another module holds it, and gives it back
//! when its thread ends. libtest runs every test on a thread of its own named after the test,
//! `module::test`, so that is when the test ends, passed or failed. Tests that start nothing
//! (pure functions, the CLI in a temp home) run beside anything.

use std::cell::RefCell;
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};

/// The module whose tests hold the turn, and how many of them.
struct Turns {
    module: Option<String>,
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

/// Waits for the current test's module to have the turn and holds it until this thread ends;
/// at once when this thread holds it already, or is no test's thread (a runtime's worker).
pub fn take() {
    if HELD.with(|held| held.borrow().is_some()) {
        return;
    }
    let thread = std::thread::current();
    let Some((module, _test)) = thread.name().and_then(|name| name.split_once("::")) else {
        return;
    };
    let mut turns = lock();
    while turns.module.as_ref().is_some_and(|m| m != module) {
        turns = GIVEN_BACK
            .wait(turns)
            .unwrap_or_else(PoisonError::into_inner);
    }
    turns.module = Some(module.to_owned());
    turns.tests += 1;
    drop(turns);
    HELD.with(|held| *held.borrow_mut() = Some(Held));
}
