//! Progress on stderr for long work a person waits for (`sync` of a backlog, `bench`,
//! `relay migrate`). Drawn only when stderr is a terminal: piped or in CI, nothing is
//! written, so output stays clean for scripts.

use std::io::IsTerminal;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// A bar (known total) or spinner (unknown total); cleared when dropped.
pub struct Progress(ProgressBar);

impl Progress {
    /// A bar over `total` steps, labelled `what`.
    pub fn bar(total: u64, what: impl Into<String>) -> Self {
        let bar = ProgressBar::with_draw_target(Some(total), target());
        bar.set_style(
            ProgressStyle::with_template("{msg} [{wide_bar}] {human_pos}/{human_len} {eta}")
                .expect("the template is valid")
                .progress_chars("=> "),
        );
        bar.set_message(what.into());
        Self(bar)
    }

    /// A spinner with the time spent, labelled `what`, for work without a count.
    pub fn spinner(what: impl Into<String>) -> Self {
        let bar = ProgressBar::with_draw_target(None, target());
        bar.set_style(
            ProgressStyle::with_template("{spinner} {msg} ({elapsed})")
                .expect("the template is valid"),
        );
        bar.set_message(what.into());
        bar.enable_steady_tick(Duration::from_millis(120));
        Self(bar)
    }

    /// Sets how many steps are done.
    pub fn set(&self, done: u64) {
        self.0.set_position(done);
    }

    /// Changes the total, when more work turned up.
    pub fn set_total(&self, total: u64) {
        self.0.set_length(total);
    }

    /// Changes the label.
    pub fn say(&self, what: impl Into<String>) {
        self.0.set_message(what.into());
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.0.finish_and_clear();
    }
}

fn target() -> ProgressDrawTarget {
    target_for(std::io::stderr().is_terminal())
}

fn target_for(terminal: bool) -> ProgressDrawTarget {
    if terminal {
        ProgressDrawTarget::stderr()
    } else {
        ProgressDrawTarget::hidden()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nothing_is_drawn_unless_stderr_is_a_terminal() {
        assert!(target_for(false).is_hidden());
    }
}
