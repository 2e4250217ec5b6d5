//! How a backend's writes went, for `/metrics`.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// How a backend's writes went, for `/metrics`. Clones share the same series.
#[derive(Clone, Debug)]
pub struct StorageMetrics {
    /// Seconds from a write's arrival at the storage to its answer.
    pub write_seconds: Histogram,
    /// Seconds one batch took to apply and commit (without the flush).
    pub commit_seconds: Histogram,
    /// Writes per batch.
    pub batch_writes: Histogram,
    /// Seconds one flush to disk took.
    pub flush_seconds: Histogram,
    /// Seconds the writer stood still to restart its log (SQLite's WAL restart).
    pub log_restart_seconds: Histogram,
    /// Spool records found damaged when the storage opened (each one is logged).
    pub spool_corrupt_records: Counter,
    /// Queued copies lost with them.
    pub spool_lost_copies: Counter,
}

impl StorageMetrics {
    /// Empty series.
    pub fn new() -> Self {
        // 25 µs to ~1.4 s, each bucket 1.5 times the last: fine enough to read a p99 off.
        let seconds = || Histogram::new(exponential_buckets(0.000_025, 1.5, 28));
        Self {
            write_seconds: seconds(),
            commit_seconds: seconds(),
            batch_writes: Histogram::new(exponential_buckets(1.0, 2.0, 11)),
            flush_seconds: seconds(),
            log_restart_seconds: seconds(),
            spool_corrupt_records: Counter::default(),
            spool_lost_copies: Counter::default(),
        }
    }

    /// Adds the series to `registry`, named `storage_*`.
    pub fn register(&self, registry: &mut Registry) {
        let series = [
            (
                "storage_write_seconds",
                "Time from a write's arrival at storage to its answer (durable or refused)",
                &self.write_seconds,
            ),
            (
                "storage_commit_seconds",
                "Time to apply and commit one batch of writes, before its flush",
                &self.commit_seconds,
            ),
            (
                "storage_batch_writes",
                "Writes committed together in one batch",
                &self.batch_writes,
            ),
            (
                "storage_flush_seconds",
                "Time one flush of the log to disk took",
                &self.flush_seconds,
            ),
            (
                "storage_log_restart_seconds",
                "Time the writer stood still to restart its log",
                &self.log_restart_seconds,
            ),
        ];
        for (name, help, histogram) in series {
            registry.register(name, help, histogram.clone());
        }
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

impl Default for StorageMetrics {
    fn default() -> Self {
        Self::new()
    }
}
