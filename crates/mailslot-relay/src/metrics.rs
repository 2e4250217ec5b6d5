//! Prometheus metrics, served as text at `/metrics`.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use super::storage::StorageMetrics;
use crate::protocol::ErrorCode;

/// Labels for rejections.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CodeLabel {
    /// The error code.
    pub code: String,
}

/// Labels for refused registrations.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    /// Why: `rate` (the IP's bucket was empty).
    pub reason: String,
}

/// Labels for the links with other relays.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RelayLabel {
    /// The other relay's name.
    pub relay: String,
}

impl RelayLabel {
    /// The label of `relay`'s series.
    pub fn of(relay: &crate::protocol::RelayName) -> Self {
        Self {
            relay: relay.to_string(),
        }
    }
}

/// Every metric the relay keeps.
pub struct Metrics {
    registry: Registry,
    /// Open, authenticated WebSocket connections.
    pub connections: Gauge,
    /// Open sockets, counted from accept (set when the metrics are read).
    pub sockets: Gauge,
    /// Envelope copies accepted (stored).
    pub accepted: Counter,
    /// Envelope copies delivered (sent to a recipient socket).
    pub delivered: Counter,
    /// Envelope copies acknowledged (deleted).
    pub acked: Counter,
    /// Envelope copies expired undelivered.
    pub expired: Counter,
    /// Messages waiting across all queues.
    pub queued: Gauge,
    /// Refusals by error code.
    pub rejections: Family<CodeLabel, Counter>,
    /// Seconds from acceptance to delivery.
    pub delivery_latency: Histogram,
    /// New names refused, by reason.
    pub registrations_refused: Family<ReasonLabel, Counter>,
    /// Copies another relay took from this one, per relay.
    pub link_delivered: Family<RelayLabel, Counter>,
    /// Recipients another relay refused for good (bounced to their senders), per relay.
    pub link_bounced: Family<RelayLabel, Counter>,
    /// Links to another relay that failed (unreachable, refused, broken), per relay.
    pub link_failures: Family<RelayLabel, Counter>,
    /// Copies stored here that came from another relay, per relay.
    pub link_received: Family<RelayLabel, Counter>,
    /// Copies waiting here for another relay, per relay (read at each link attempt and at
    /// most once a second while a link delivers).
    pub link_queued: Family<RelayLabel, Gauge>,
}

impl Metrics {
    /// Registers every metric, the storage's among them.
    pub fn new(storage: &StorageMetrics) -> Self {
        let mut registry = Registry::with_prefix("mailslot_relay");
        let m = Self {
            connections: Gauge::default(),
            sockets: Gauge::default(),
            accepted: Counter::default(),
            delivered: Counter::default(),
            acked: Counter::default(),
            expired: Counter::default(),
            queued: Gauge::default(),
            rejections: Family::default(),
            // 100 µs to ~52 s.
            delivery_latency: Histogram::new(exponential_buckets(0.0001, 2.0, 20)),
            registrations_refused: Family::default(),
            link_delivered: Family::default(),
            link_bounced: Family::default(),
            link_failures: Family::default(),
            link_received: Family::default(),
            link_queued: Family::default(),
            registry: Registry::default(),
        };
        registry.register(
            "connections",
            "Open authenticated connections",
            m.connections.clone(),
        );
        registry.register(
            "sockets",
            "Open sockets, from accept to close, authenticated or not",
            m.sockets.clone(),
        );
        registry.register("accepted", "Envelope copies stored", m.accepted.clone());
        registry.register(
            "delivered",
            "Envelope copies pushed to recipients",
            m.delivered.clone(),
        );
        registry.register(
            "acked",
            "Envelope copies acknowledged and deleted",
            m.acked.clone(),
        );
        registry.register(
            "expired",
            "Envelope copies expired undelivered",
            m.expired.clone(),
        );
        registry.register(
            "queued",
            "Envelope copies waiting (approximate between restarts)",
            m.queued.clone(),
        );
        registry.register(
            "rejections",
            "Requests refused, by error code",
            m.rejections.clone(),
        );
        registry.register(
            "delivery_latency_seconds",
            "Time from acceptance to delivery to the recipient",
            m.delivery_latency.clone(),
        );
        registry.register(
            "registrations_refused",
            "New names refused, by reason",
            m.registrations_refused.clone(),
        );
        registry.register(
            "link_delivered",
            "Copies another relay took from this one, per relay",
            m.link_delivered.clone(),
        );
        registry.register(
            "link_bounced",
            "Recipients another relay refused for good, per relay",
            m.link_bounced.clone(),
        );
        registry.register(
            "link_failures",
            "Links to another relay that failed, per relay",
            m.link_failures.clone(),
        );
        registry.register(
            "link_received",
            "Copies stored here that came from another relay, per relay",
            m.link_received.clone(),
        );
        registry.register(
            "link_queued",
            "Copies waiting here for another relay, per relay",
            m.link_queued.clone(),
        );
        storage.register(&mut registry);
        Self { registry, ..m }
    }

    /// Counts a refusal.
    pub fn reject(&self, code: ErrorCode) {
        self.rejections
            .get_or_create(&CodeLabel {
                code: code.as_str().to_owned(),
            })
            .inc();
    }

    /// Counts a refused registration.
    pub fn refuse_registration(&self, reason: &str) {
        self.registrations_refused
            .get_or_create(&ReasonLabel {
                reason: reason.to_owned(),
            })
            .inc();
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)
            .expect("writing to a String cannot fail");
        out
    }
}
