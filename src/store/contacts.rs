//! The keyring: each peer's keys, pinned on first contact. A changed key is never accepted
//! silently: it is recorded and reported, and the pinned key stays.

use jiff::Timestamp;
use rusqlite::{OptionalExtension, params};
use serde::Serialize;

use super::time::{from_ms, to_ms};
use super::{Store, StoreError};
use crate::crypto::PublicIdentity;
use crate::protocol::{Address, Fingerprint, now_millis};

/// What [`Store::check_and_pin`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyCheck {
    /// First contact: the keys are now pinned.
    Pinned,
    /// The keys match the pinned ones.
    Matches,
    /// The keys differ from the pinned ones. The pinned keys stay; the change is recorded.
    Changed {
        /// The fingerprint pinned earlier.
        pinned: Fingerprint,
        /// The fingerprint presented now.
        presented: Fingerprint,
    },
}

/// A known peer.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Contact {
    /// Its address.
    pub address: Address,
    /// The fingerprint of its pinned keys.
    pub fingerprint: Fingerprint,
    /// When its keys were pinned.
    pub first_seen: Timestamp,
    /// When its keys were last seen.
    pub last_seen: Timestamp,
    /// Key changes seen and not yet resolved by the owner.
    pub key_changes: u32,
}

fn corrupt(detail: impl ToString) -> StoreError {
    StoreError::Corrupt {
        what: "contact",
        detail: detail.to_string(),
    }
}

impl Store {
    /// Compares `keys` with the keys pinned for `address`, pinning them on first contact.
    pub fn check_and_pin(
        &mut self,
        address: &Address,
        keys: &PublicIdentity,
    ) -> Result<KeyCheck, StoreError> {
        let now = to_ms(now_millis());
        let presented = keys.fingerprint();
        let tx = self.write_tx()?;
        let pinned: Option<String> = tx
            .query_row(
                "SELECT fingerprint FROM contacts WHERE address = ?1",
                [address.to_string()],
                |r| r.get(0),
            )
            .optional()?;
        let keys_json = serde_json::to_string(keys).expect("keys always serialize");
        let outcome = match pinned {
            None => {
                tx.execute(
                    "INSERT INTO contacts (address, keys, fingerprint, first_seen, last_seen) VALUES (?1, ?2, ?3, ?4, ?4)",
                    params![address.to_string(), keys_json, presented.as_str(), now],
                )?;
                KeyCheck::Pinned
            }
            Some(fp) if fp == presented.as_str() => {
                tx.execute(
                    "UPDATE contacts SET last_seen = ?2 WHERE address = ?1",
                    params![address.to_string(), now],
                )?;
                KeyCheck::Matches
            }
            Some(fp) => {
                tx.execute(
                    "INSERT INTO key_changes (address, pinned, presented, presented_keys, seen_at) VALUES (?1, ?2, ?3, ?4, ?5)",
                    params![address.to_string(), fp, presented.as_str(), keys_json, now],
                )?;
                KeyCheck::Changed {
                    pinned: Fingerprint::parse(&fp).map_err(corrupt)?,
                    presented,
                }
            }
        };
        tx.commit()?;
        if let KeyCheck::Changed { pinned, presented } = &outcome {
            tracing::warn!(%address, %pinned, %presented, "KEY CHANGED: a peer presented keys that differ from the pinned ones");
        }
        Ok(outcome)
    }

    /// Pins `keys` for `address` in place of what was pinned: the peer rotated its keys with
    /// a statement signed by the pinned ones. Changes recorded for these keys are settled;
    /// others stay.
    pub fn repin(&mut self, address: &Address, keys: &PublicIdentity) -> Result<(), StoreError> {
        let fingerprint = keys.fingerprint();
        let keys_json = serde_json::to_string(keys).expect("keys always serialize");
        let tx = self.write_tx()?;
        move_pin(&tx, address, &keys_json, &fingerprint)?;
        tx.execute(
            "DELETE FROM key_changes WHERE address = ?1 AND presented = ?2",
            params![address.to_string(), fingerprint.as_str()],
        )?;
        tx.commit()?;
        tracing::info!(%address, %fingerprint, "re-pinned after a signed key rotation");
        Ok(())
    }

    /// Pins the keys `address` presented with `fingerprint` (a change recorded earlier), on
    /// the owner's word; every recorded change for `address` is settled. `Ok(None)` when no
    /// change to `fingerprint` was seen: nothing changed.
    pub fn trust_presented(
        &mut self,
        address: &Address,
        fingerprint: &Fingerprint,
    ) -> Result<Option<Fingerprint>, StoreError> {
        let tx = self.write_tx()?;
        let found: Option<(String, String)> = tx
            .query_row(
                "SELECT k.presented_keys, c.fingerprint FROM key_changes k
                 JOIN contacts c ON c.address = k.address
                 WHERE k.address = ?1 AND k.presented = ?2 ORDER BY k.seen_at DESC LIMIT 1",
                params![address.to_string(), fingerprint.as_str()],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()?;
        let Some((keys_json, before)) = found else {
            return Ok(None);
        };
        move_pin(&tx, address, &keys_json, fingerprint)?;
        tx.execute(
            "DELETE FROM key_changes WHERE address = ?1",
            [address.to_string()],
        )?;
        tx.commit()?;
        tracing::warn!(%address, %fingerprint, "the owner accepted a key change");
        Fingerprint::parse(&before).map(Some).map_err(corrupt)
    }

    /// The fingerprints `address` presented that differ from its pinned keys and are not
    /// settled, newest first.
    pub fn presented_changes(&self, address: &Address) -> Result<Vec<Fingerprint>, StoreError> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT presented FROM key_changes WHERE address = ?1 GROUP BY presented ORDER BY max(seen_at) DESC",
        )?;
        let rows = stmt.query_map([address.to_string()], |r| r.get::<_, String>(0))?;
        rows.map(|fp| Fingerprint::parse(&fp?).map_err(corrupt))
            .collect()
    }

    /// The keys pinned for `address`.
    pub fn pinned_keys(&self, address: &Address) -> Result<Option<PublicIdentity>, StoreError> {
        let json: Option<String> = self
            .conn
            .query_row(
                "SELECT keys FROM contacts WHERE address = ?1",
                [address.to_string()],
                |r| r.get(0),
            )
            .optional()?;
        json.map(|j| serde_json::from_str(&j).map_err(corrupt))
            .transpose()
    }

    /// Every known peer, by address.
    pub fn contacts(&self) -> Result<Vec<Contact>, StoreError> {
        self.contacts_where("1", "")
    }

    /// The peer known as `address`, if its keys are pinned.
    pub fn contact(&self, address: &Address) -> Result<Option<Contact>, StoreError> {
        Ok(self
            .contacts_where("c.address = ?1", &address.to_string())?
            .pop())
    }

    fn contacts_where(&self, filter: &str, arg: &str) -> Result<Vec<Contact>, StoreError> {
        let mut stmt = self.conn.prepare_cached(&format!(
            "SELECT c.address, c.fingerprint, c.first_seen, c.last_seen,
                    (SELECT count(*) FROM key_changes k WHERE k.address = c.address)
             FROM contacts c WHERE {filter} AND ?1 = ?1 ORDER BY c.address"
        ))?;
        let rows = stmt.query_map([arg], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, i64>(2)?,
                r.get::<_, i64>(3)?,
                r.get::<_, u32>(4)?,
            ))
        })?;
        rows.map(|row| {
            let (address, fingerprint, first_seen, last_seen, key_changes) = row?;
            Ok(Contact {
                address: Address::parse(&address).map_err(corrupt)?,
                fingerprint: Fingerprint::parse(&fingerprint).map_err(corrupt)?,
                first_seen: from_ms(first_seen)?,
                last_seen: from_ms(last_seen)?,
                key_changes,
            })
        })
        .collect()
    }
}

/// Replaces the keys pinned for `address` (a rotation followed, or a change the owner
/// accepted).
fn move_pin(
    tx: &rusqlite::Transaction<'_>,
    address: &Address,
    keys_json: &str,
    fingerprint: &Fingerprint,
) -> Result<(), StoreError> {
    tx.execute(
        "UPDATE contacts SET keys = ?2, fingerprint = ?3, last_seen = ?4 WHERE address = ?1",
        params![
            address.to_string(),
            keys_json,
            fingerprint.as_str(),
            to_ms(now_millis())
        ],
    )?;
    Ok(())
}
