//! Other relays' pinned keys and this relay's own key, on SQLite: the first pin of a name
//! wins and is never replaced.

use rusqlite::{OptionalExtension, params};

use super::SqliteStorage;
use super::clock::now_ms;
use crate::protocol::{RelayKey, RelayName};
use crate::relay::storage::relays::{OWN_KEY, compare_own, parse_own_key};
use crate::relay::storage::{RelayPin, RelayPins, StorageError};

impl RelayPins for SqliteStorage {
    /// Through the writer, so the first of two racing pins wins and the second compares.
    async fn pin_relay(&self, relay: RelayName, key: RelayKey) -> Result<RelayPin, StorageError> {
        self.writes
            .tables(move |tx| {
                let pinned: Option<Vec<u8>> = tx
                    .prepare_cached("SELECT key FROM relay_pins WHERE relay = ?1")?
                    .query_row([relay.as_str()], |r| r.get(0))
                    .optional()?;
                let Some(pinned) = pinned else {
                    tx.execute(
                        "INSERT INTO relay_pins (relay, key, pinned_at) VALUES (?1, ?2, ?3)",
                        params![relay.as_str(), key.as_bytes().as_slice(), now_ms()],
                    )?;
                    return Ok(RelayPin::Pinned);
                };
                let pinned = RelayKey::from_bytes(pinned.try_into().map_err(|_| {
                    StorageError::Database(format!(
                        "the key pinned for relay {relay} is not 32 bytes"
                    ))
                })?);
                Ok(if pinned == key {
                    RelayPin::Matches
                } else {
                    RelayPin::Changed { pinned }
                })
            })
            .await
    }

    async fn pin_own_key(&self, key: RelayKey) -> Result<RelayPin, StorageError> {
        self.writes
            .tables(move |tx| {
                let held: Option<String> = tx
                    .prepare_cached("SELECT value FROM meta WHERE key = ?1")?
                    .query_row([OWN_KEY], |r| r.get(0))
                    .optional()?;
                let held = held.map(parse_own_key).transpose()?;
                if held.is_none() {
                    tx.execute(
                        "INSERT INTO meta (key, value) VALUES (?1, ?2)",
                        params![OWN_KEY, key.to_base64()],
                    )?;
                }
                Ok(compare_own(held, key))
            })
            .await
    }

    async fn pinned_relay(&self, relay: RelayName) -> Result<Option<RelayKey>, StorageError> {
        self.readers
            .read(move |conn| {
                let pinned: Option<Vec<u8>> = conn
                    .prepare_cached("SELECT key FROM relay_pins WHERE relay = ?1")?
                    .query_row([relay.as_str()], |r| r.get(0))
                    .optional()?;
                pinned
                    .map(|bytes| {
                        bytes.try_into().map(RelayKey::from_bytes).map_err(|_| {
                            StorageError::Database(format!(
                                "the key pinned for relay {relay} is not 32 bytes"
                            ))
                        })
                    })
                    .transpose()
            })
            .await
    }

    async fn relays_pinned_with(&self, key: RelayKey) -> Result<Vec<RelayName>, StorageError> {
        self.readers
            .read(move |conn| {
                let mut names =
                    conn.prepare_cached("SELECT relay FROM relay_pins WHERE key = ?1")?;
                let rows =
                    names.query_map([key.as_bytes().as_slice()], |r| r.get::<_, String>(0))?;
                rows.map(|name| {
                    RelayName::new(&name?)
                        .map_err(|e| StorageError::Database(format!("a pinned relay's name: {e}")))
                })
                .collect()
            })
            .await
    }
}
