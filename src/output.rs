//! Printing: JSON for scripts, short text for people. Everything the owner's commands print
//! to stdout goes through [`line`] (or [`outln!`]), never `println!`, which panics when the
//! reader is gone (`mailslot inbox | head -1`): a closed pipe becomes [`StdoutClosed`], which
//! [`crate::cli::run`] turns into a quiet exit 0, as ripgrep does.

use std::fmt;
use std::io::Write;

use jiff::Timestamp;
use jiff::tz::TimeZone;
use serde::Serialize;

use crate::protocol::AgentName;

/// `println!` that returns an error instead of panicking; see [`line`].
macro_rules! outln {
    ($($arg:tt)*) => {
        $crate::output::line(format_args!($($arg)*))
    };
}
pub(crate) use outln;

/// Prints `value` as JSON, or the text `human` renders.
pub(super) fn emit<T: Serialize>(
    json: bool,
    value: &T,
    human: impl FnOnce(&T) -> String,
) -> anyhow::Result<()> {
    if json {
        outln!("{}", serde_json::to_string_pretty(value)?)?;
    } else {
        let text = human(value);
        if !text.is_empty() {
            outln!("{}", text.trim_end())?;
        }
    }
    Ok(())
}

/// Stdout's reader went away: not a failure, the person saw what they wanted.
#[derive(Debug, thiserror::Error)]
#[error("stdout was closed")]
pub(crate) struct StdoutClosed;

/// Writes `args` and a newline to stdout.
pub(crate) fn line(args: fmt::Arguments<'_>) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    match out
        .write_fmt(args)
        .and_then(|()| out.write_all(b"\n"))
        .and_then(|()| out.flush())
    {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Err(StdoutClosed.into()),
        other => Ok(other?),
    }
}

/// A command line for the person to paste: always with `--agent`, so it acts on `agent`
/// wherever it is pasted (a folder's name or `MAILSLOT_AGENT` may choose another).
pub(super) fn command(agent: &AgentName, args: impl fmt::Display) -> String {
    format!("mailslot --agent {agent} {args}")
}

/// A timestamp in the local time zone, to the minute.
pub(super) fn when(t: Timestamp) -> String {
    t.to_zoned(TimeZone::system())
        .strftime("%Y-%m-%d %H:%M")
        .to_string()
}

/// The first line of `text`, cut to `max` characters with an ellipsis.
pub(super) fn one_line(text: &str, max: usize) -> String {
    let line = text
        .lines()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("")
        .trim();
    if line.chars().count() > max {
        let cut: String = line.chars().take(max.saturating_sub(1)).collect();
        format!("{cut}…")
    } else {
        line.to_owned()
    }
}
