//! The relay-pins role: the keys of other relays, pinned on first contact.

use std::future::Future;

use super::StorageError;
use crate::protocol::{RelayKey, RelayName};

/// How a relay's presented key compares with the one pinned for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RelayPin {
    /// None was pinned; this one is now.
    Pinned,
    /// The same key as pinned.
    Matches,
    /// A different key than pinned; nothing changed.
    Changed {
        /// The key pinned before.
        pinned: RelayKey,
    },
}

/// Other relays' keys, shared by every node of a relay.
pub trait RelayPins: Send + Sync + 'static {
    /// Pins `key` for `relay` unless a key is pinned for it already, and says how `key`
    /// compares. Never replaces a pinned key.
    fn pin_relay(
        &self,
        relay: RelayName,
        key: RelayKey,
    ) -> impl Future<Output = Result<RelayPin, StorageError>> + Send;

    /// The key pinned for `relay`, if any.
    fn pinned_relay(
        &self,
        relay: RelayName,
    ) -> impl Future<Output = Result<Option<RelayKey>, StorageError>> + Send;

    /// Every relay name `key` is pinned for (a relay's key identifies it under any name).
    fn relays_pinned_with(
        &self,
        key: RelayKey,
    ) -> impl Future<Output = Result<Vec<RelayName>, StorageError>> + Send;
}
