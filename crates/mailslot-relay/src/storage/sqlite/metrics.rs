//! The series only the SQLite backend records: its flushes, its WAL restarts and the damage
//! found in its spool. They go to `/metrics` after the shared storage series, under the names
//! they always had.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::storage::metrics::{BackendMetrics, seconds};

/// The SQLite backend's own series. Clones share them.
#[derive(Clone, Debug)]
pub(super) struct SqliteMetrics {
    /// Seconds one flush to disk took.
    pub(super) flush_seconds: Histogram,
    /// Seconds the writer stood still to restart the WAL.
    pub(super) log_restart_seconds: Histogram,
    /// Spool records found damaged when the storage opened (each one is logged).
    pub(super) spool_corrupt_records: Counter,
    /// Queued copies lost with them.
    pub(super) spool_lost_copies: Counter,
}

impl SqliteMetrics {
    /// Empty series.
    pub(super) fn new() -> Self {
        Self {
            flush_seconds: seconds(),
            log_restart_seconds: seconds(),
            spool_corrupt_records: Counter::default(),
            spool_lost_copies: Counter::default(),
        }
    }
}

impl BackendMetrics for SqliteMetrics {
    fn register(&self, registry: &mut Registry) {
        registry.register(
            "storage_flush_seconds",
            "Time one flush of the log to disk took",
            self.flush_seconds.clone(),
        );
        registry.register(
            "storage_log_restart_seconds",
            "Time the writer stood still to restart its log",
            self.log_restart_seconds.clone(),
        );
        registry.register(
            "storage_spool_corrupt_records",
            "Spool records found damaged when the storage opened, each logged with where it was",
            self.spool_corrupt_records.clone(),
        );
        registry.register(
            "storage_spool_lost_copies",
            "Queued copies lost with the damaged spool records",
            self.spool_lost_copies.clone(),
        );
    }
}
