//! Printing: JSON for scripts, short text for people.

use jiff::Timestamp;
use jiff::tz::TimeZone;
use serde::Serialize;

/// Prints `value` as JSON, or the text `human` renders.
pub(super) fn emit<T: Serialize>(
    json: bool,
    value: &T,
    human: impl FnOnce(&T) -> String,
) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(value)?);
    } else {
        let text = human(value);
        if !text.is_empty() {
            println!("{}", text.trim_end());
        }
    }
    Ok(())
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
