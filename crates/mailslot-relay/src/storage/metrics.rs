//! How a backend's writes went, for `/metrics`.

use std::fmt;
use std::sync::Arc;

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
    /// The series only this backend records, registered after the shared ones.
    backend: Option<Arc<dyn BackendMetrics>>,
}

/// Series a backend records that the others have no use for (SQLite's flushes, say).
pub(super) trait BackendMetrics: Send + Sync + fmt::Debug {
    /// Adds the series to `registry`, named `storage_*`.
    fn register(&self, registry: &mut Registry);
}

/// A histogram of seconds: 25 µs to ~1.4 s, each bucket 1.5 times the last, fine enough to
/// read a p99 off.
pub(super) fn seconds() -> Histogram {
    Histogram::new(exponential_buckets(0.000_025, 1.5, 28))
}

impl StorageMetrics {
    /// Empty series.
    pub fn new() -> Self {
        Self {
            write_seconds: seconds(),
            commit_seconds: seconds(),
            batch_writes: Histogram::new(exponential_buckets(1.0, 2.0, 11)),
            backend: None,
        }
    }

    /// Empty series, with `backend`'s own after them.
    pub(super) fn with_backend(backend: Arc<dyn BackendMetrics>) -> Self {
        Self {
            backend: Some(backend),
            ..Self::new()
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
        ];
        for (name, help, histogram) in series {
            registry.register(name, help, histogram.clone());
        }
        if let Some(backend) = &self.backend {
            backend.register(registry);
        }
    }
}

impl Default for StorageMetrics {
    fn default() -> Self {
        Self::new()
    }
}
