//! The time rows and records are stamped with.

/// Now, in milliseconds since the Unix epoch.
pub(super) fn now_ms() -> i64 {
    jiff::Timestamp::now().as_millisecond()
}
