//! The relay-pins role: the keys of other relays, pinned on first contact, and the relay's own
//! key, recorded at its first start so that every node of it must use the same one.

use std::future::Future;

use super::{RelayPinRecord, StorageError};
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

    /// Every other relay's pinned key, by name (`mailslot relay pins`).
    fn relay_pins(&self) -> impl Future<Output = Result<Vec<RelayPinRecord>, StorageError>> + Send;

    /// Removes the pin of `relay`: the key it held, if one was pinned. The next contact with
    /// `relay` pins the key it presents then, as a first contact.
    fn unpin_relay(
        &self,
        relay: RelayName,
    ) -> impl Future<Output = Result<Option<RelayKey>, StorageError>> + Send;

    /// Pins `key` for `relay` in place of `was` (`None`: nothing pinned), only while the pin
    /// is still `was`: the operator decided on the keys they were shown. Whether it changed.
    fn repin_relay(
        &self,
        relay: RelayName,
        was: Option<RelayKey>,
        key: RelayKey,
    ) -> impl Future<Output = Result<bool, StorageError>> + Send;

    /// Records `key` as this relay's own unless the database holds one already (a database
    /// from before the key was recorded gets it at its first start), and says how `key`
    /// compares. Never replaces the recorded key.
    fn pin_own_key(
        &self,
        key: RelayKey,
    ) -> impl Future<Output = Result<RelayPin, StorageError>> + Send;
}

/// The `meta` row that holds the relay's own public key (base64).
pub(crate) const OWN_KEY: &str = "relay_key";

/// The relay's own key as `meta` holds it.
pub(crate) fn parse_own_key(text: String) -> Result<RelayKey, StorageError> {
    RelayKey::try_from(text).map_err(|e| {
        StorageError::Database(format!(
            "the relay's own key recorded in the database (meta {OWN_KEY}): {e}"
        ))
    })
}

/// How `key` compares with the recorded `held` (`None`: nothing was recorded; it is now).
pub(crate) fn compare_own(held: Option<RelayKey>, key: RelayKey) -> RelayPin {
    match held {
        None => RelayPin::Pinned,
        Some(held) if held == key => RelayPin::Matches,
        Some(pinned) => RelayPin::Changed { pinned },
    }
}
