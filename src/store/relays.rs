//! Other relays' keys, pinned on first contact. A relay that presents another key is refused
//! (the caller reads nothing it vouches for) until the owner trusts the new key.

use jiff::Timestamp;
use rusqlite::{OptionalExtension, params};
use serde::Serialize;

use super::time::{from_ms, to_ms};
use super::{KeyCheck, Store, StoreError};
use crate::crypto::relay_fingerprint;
use crate::protocol::{Fingerprint, RelayKey, RelayName, now_millis};

/// A relay whose key is pinned.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PinnedRelay {
    /// Its name.
    pub relay: RelayName,
    /// Its key.
    pub key: RelayKey,
    /// The key's fingerprint.
    pub fingerprint: Fingerprint,
    /// When the key was pinned.
    pub first_seen: Timestamp,
    /// When the key was last presented.
    pub last_seen: Timestamp,
}

fn corrupt(detail: impl ToString) -> StoreError {
    StoreError::Corrupt {
        what: "relay key",
        detail: detail.to_string(),
    }
}

impl Store {
    /// Compares `key` with the key pinned for `relay`, pinning it on first contact. A changed
    /// key is not pinned; it is logged as an error.
    pub fn check_and_pin_relay(
        &mut self,
        relay: &RelayName,
        key: &RelayKey,
    ) -> Result<KeyCheck, StoreError> {
        let now = to_ms(now_millis());
        let presented = relay_fingerprint(key);
        let tx = self.write_tx()?;
        let pinned: Option<String> = tx
            .query_row(
                "SELECT fingerprint FROM relay_keys WHERE relay = ?1",
                [relay.as_str()],
                |r| r.get(0),
            )
            .optional()?;
        let outcome = match pinned {
            None => {
                tx.execute(
                    "INSERT INTO relay_keys (relay, key, fingerprint, first_seen, last_seen) VALUES (?1, ?2, ?3, ?4, ?4)",
                    params![relay.as_str(), key.to_base64(), presented.as_str(), now],
                )?;
                KeyCheck::Pinned
            }
            Some(fp) if fp == presented.as_str() => {
                tx.execute(
                    "UPDATE relay_keys SET last_seen = ?2 WHERE relay = ?1",
                    params![relay.as_str(), now],
                )?;
                KeyCheck::Matches
            }
            Some(fp) => KeyCheck::Changed {
                pinned: Fingerprint::parse(&fp).map_err(corrupt)?,
                presented,
            },
        };
        tx.commit()?;
        if let KeyCheck::Changed { pinned, presented } = &outcome {
            tracing::error!(%relay, %pinned, %presented, "RELAY KEY CHANGED: a relay presented a key that differs from the pinned one; nothing it vouches for is accepted");
        }
        Ok(outcome)
    }

    /// Pins `key` for `relay` in place of any earlier key (the owner checked the new one with
    /// the relay's operator). Returns the fingerprint it replaced.
    pub fn trust_relay(
        &mut self,
        relay: &RelayName,
        key: &RelayKey,
    ) -> Result<Option<Fingerprint>, StoreError> {
        let now = to_ms(now_millis());
        let fingerprint = relay_fingerprint(key);
        let tx = self.write_tx()?;
        let before: Option<String> = tx
            .query_row(
                "SELECT fingerprint FROM relay_keys WHERE relay = ?1",
                [relay.as_str()],
                |r| r.get(0),
            )
            .optional()?;
        tx.execute(
            "INSERT INTO relay_keys (relay, key, fingerprint, first_seen, last_seen) VALUES (?1, ?2, ?3, ?4, ?4)
             ON CONFLICT (relay) DO UPDATE SET key = ?2, fingerprint = ?3, first_seen = ?4, last_seen = ?4",
            params![relay.as_str(), key.to_base64(), fingerprint.as_str(), now],
        )?;
        tx.commit()?;
        before
            .map(|fp| Fingerprint::parse(&fp).map_err(corrupt))
            .transpose()
    }

    /// Every relay whose key is pinned, by name.
    pub fn pinned_relays(&self) -> Result<Vec<PinnedRelay>, StoreError> {
        let names: Vec<String> = self
            .conn
            .prepare("SELECT relay FROM relay_keys ORDER BY relay")?
            .query_map([], |r| r.get(0))?
            .collect::<Result<_, _>>()?;
        let mut pinned = Vec::with_capacity(names.len());
        for name in names {
            let relay = RelayName::new(&name).map_err(corrupt)?;
            pinned.extend(self.pinned_relay(&relay)?);
        }
        Ok(pinned)
    }

    /// The key pinned for `relay`.
    pub fn pinned_relay(&self, relay: &RelayName) -> Result<Option<PinnedRelay>, StoreError> {
        let row: Option<(String, String, i64, i64)> = self
            .conn
            .query_row(
                "SELECT key, fingerprint, first_seen, last_seen FROM relay_keys WHERE relay = ?1",
                [relay.as_str()],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
            )
            .optional()?;
        row.map(|(key, fingerprint, first_seen, last_seen)| {
            Ok(PinnedRelay {
                relay: relay.clone(),
                key: RelayKey::try_from(key).map_err(corrupt)?,
                fingerprint: Fingerprint::parse(&fingerprint).map_err(corrupt)?,
                first_seen: from_ms(first_seen)?,
                last_seen: from_ms(last_seen)?,
            })
        })
        .transpose()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_key_pinned_a_changed_one_refused_until_trusted() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = Store::open(&dir.path().join("store.db")).unwrap();
        let relay = RelayName::new("relay.example.com").unwrap();
        let (old, new) = (RelayKey::from_bytes([1; 32]), RelayKey::from_bytes([2; 32]));
        assert_eq!(
            store.check_and_pin_relay(&relay, &old).unwrap(),
            KeyCheck::Pinned
        );
        assert_eq!(
            store.check_and_pin_relay(&relay, &old).unwrap(),
            KeyCheck::Matches
        );
        assert_eq!(
            store.check_and_pin_relay(&relay, &new).unwrap(),
            KeyCheck::Changed {
                pinned: relay_fingerprint(&old),
                presented: relay_fingerprint(&new),
            }
        );
        assert_eq!(store.pinned_relay(&relay).unwrap().unwrap().key, old);
        assert_eq!(
            store.trust_relay(&relay, &new).unwrap(),
            Some(relay_fingerprint(&old))
        );
        assert_eq!(
            store.check_and_pin_relay(&relay, &new).unwrap(),
            KeyCheck::Matches
        );
        let other = RelayName::new("relay.example.com:8443").unwrap();
        assert!(store.pinned_relay(&other).unwrap().is_none());
    }
}
