//! Timestamps are stored as integer milliseconds since the Unix epoch.

use jiff::Timestamp;

use super::StoreError;

pub(super) fn to_ms(t: Timestamp) -> i64 {
    t.as_millisecond()
}

pub(super) fn from_ms(ms: i64) -> Result<Timestamp, StoreError> {
    Timestamp::from_millisecond(ms).map_err(|e| StoreError::Corrupt {
        what: "timestamp",
        detail: e.to_string(),
    })
}
