//! Other relays' pinned keys and this relay's own key, on SQLite: the first pin of a name
//! wins and is replaced only by the operator (`mailslot relay pins`). Each statement is
//! written once, over a connection: the relay runs them in its writer's batch or on a read
//! connection; [`SqlitePins`] runs them on a connection of its own, beside a running relay.

use std::path::Path;
use std::sync::Mutex;

use rusqlite::{Connection, OptionalExtension, params};

use super::clock::now_ms;
use super::{SqliteStorage, connect};
use crate::protocol::{RelayKey, RelayName};
use crate::storage::relays::{OWN_KEY, compare_own, parse_own_key};
use crate::storage::{RelayPin, RelayPinRecord, RelayPins, StorageError};

impl RelayPins for SqliteStorage {
    /// Through the writer, so the first of two racing pins wins and the second compares.
    async fn pin_relay(&self, relay: RelayName, key: RelayKey) -> Result<RelayPin, StorageError> {
        self.writes.tables(move |tx| pin(tx, &relay, &key)).await
    }

    async fn pin_own_key(&self, key: RelayKey) -> Result<RelayPin, StorageError> {
        self.writes.tables(move |tx| pin_own(tx, &key)).await
    }

    async fn pinned_relay(&self, relay: RelayName) -> Result<Option<RelayKey>, StorageError> {
        self.readers.read(move |conn| pinned(conn, &relay)).await
    }

    async fn relays_pinned_with(&self, key: RelayKey) -> Result<Vec<RelayName>, StorageError> {
        self.readers.read(move |conn| named(conn, &key)).await
    }

    async fn relay_pins(&self) -> Result<Vec<RelayPinRecord>, StorageError> {
        self.readers.read(all).await
    }

    async fn unpin_relay(&self, relay: RelayName) -> Result<Option<RelayKey>, StorageError> {
        self.writes.tables(move |tx| unpin(tx, &relay)).await
    }

    async fn repin_relay(
        &self,
        relay: RelayName,
        was: Option<RelayKey>,
        key: RelayKey,
    ) -> Result<bool, StorageError> {
        self.writes
            .tables(move |tx| repin(tx, &relay, was.as_ref(), &key))
            .await
    }
}

/// The relay pins of a SQLite relay's database on a connection of their own, beside the relay
/// that may be running on it (SQLite orders their writes with the relay's; the relay reads
/// pins from the database at every contact, so it follows a change at its next one).
pub struct SqlitePins(Mutex<Connection>);

impl SqlitePins {
    /// Opens the pins of the existing database at `path` (with this build's schema).
    pub fn open(path: &Path) -> Result<Self, StorageError> {
        Ok(Self(Mutex::new(connect::open_beside(
            path,
            "change its relay pins",
        )?)))
    }

    fn with<T>(
        &self,
        run: impl FnOnce(&Connection) -> Result<T, StorageError>,
    ) -> Result<T, StorageError> {
        let conn = self.0.lock().map_err(|_| StorageError::Closed)?;
        run(&conn)
    }
}

impl RelayPins for SqlitePins {
    async fn pin_relay(&self, relay: RelayName, key: RelayKey) -> Result<RelayPin, StorageError> {
        self.with(|conn| pin(conn, &relay, &key))
    }

    async fn pin_own_key(&self, key: RelayKey) -> Result<RelayPin, StorageError> {
        self.with(|conn| pin_own(conn, &key))
    }

    async fn pinned_relay(&self, relay: RelayName) -> Result<Option<RelayKey>, StorageError> {
        self.with(|conn| pinned(conn, &relay))
    }

    async fn relays_pinned_with(&self, key: RelayKey) -> Result<Vec<RelayName>, StorageError> {
        self.with(|conn| named(conn, &key))
    }

    async fn relay_pins(&self) -> Result<Vec<RelayPinRecord>, StorageError> {
        self.with(all)
    }

    async fn unpin_relay(&self, relay: RelayName) -> Result<Option<RelayKey>, StorageError> {
        self.with(|conn| unpin(conn, &relay))
    }

    async fn repin_relay(
        &self,
        relay: RelayName,
        was: Option<RelayKey>,
        key: RelayKey,
    ) -> Result<bool, StorageError> {
        self.with(|conn| repin(conn, &relay, was.as_ref(), &key))
    }
}

/// Pins `key` for `relay` unless one is pinned, and compares. Two statements, each atomic: a
/// pin another connection committed between them is the one compared with.
fn pin(conn: &Connection, relay: &RelayName, key: &RelayKey) -> Result<RelayPin, StorageError> {
    let inserted = conn
        .prepare_cached(
            "INSERT INTO relay_pins (relay, key, pinned_at) VALUES (?1, ?2, ?3)
             ON CONFLICT (relay) DO NOTHING",
        )?
        .execute(params![relay.as_str(), key.as_bytes().as_slice(), now_ms()])?;
    if inserted == 1 {
        return Ok(RelayPin::Pinned);
    }
    let pinned = pinned(conn, relay)?.ok_or_else(|| {
        StorageError::Unavailable(format!("the pin of {relay} was removed meanwhile"))
    })?;
    Ok(if pinned == *key {
        RelayPin::Matches
    } else {
        RelayPin::Changed { pinned }
    })
}

/// Records `key` as the relay's own unless one is recorded, and compares.
fn pin_own(conn: &Connection, key: &RelayKey) -> Result<RelayPin, StorageError> {
    let held: Option<String> = conn
        .prepare_cached("SELECT value FROM meta WHERE key = ?1")?
        .query_row([OWN_KEY], |r| r.get(0))
        .optional()?;
    let held = held.map(parse_own_key).transpose()?;
    if held.is_none() {
        conn.execute(
            "INSERT INTO meta (key, value) VALUES (?1, ?2)",
            params![OWN_KEY, key.to_base64()],
        )?;
    }
    Ok(compare_own(held, *key))
}

fn pinned(conn: &Connection, relay: &RelayName) -> Result<Option<RelayKey>, StorageError> {
    conn.prepare_cached("SELECT key FROM relay_pins WHERE relay = ?1")?
        .query_row([relay.as_str()], |r| r.get::<_, Vec<u8>>(0))
        .optional()?
        .map(|bytes| key_of(relay, bytes))
        .transpose()
}

fn named(conn: &Connection, key: &RelayKey) -> Result<Vec<RelayName>, StorageError> {
    let mut names = conn.prepare_cached("SELECT relay FROM relay_pins WHERE key = ?1")?;
    let rows = names.query_map([key.as_bytes().as_slice()], |r| r.get::<_, String>(0))?;
    rows.map(|name| name_of(&name?)).collect()
}

/// Every pin, by name (also what `mailslot relay migrate` moves).
pub(super) fn all(conn: &Connection) -> Result<Vec<RelayPinRecord>, StorageError> {
    let mut stmt =
        conn.prepare_cached("SELECT relay, key, pinned_at FROM relay_pins ORDER BY relay")?;
    let mut rows = stmt.query([])?;
    let mut pins = Vec::new();
    while let Some(r) = rows.next()? {
        let relay = name_of(&r.get::<_, String>(0)?)?;
        pins.push(RelayPinRecord {
            key: key_of(&relay, r.get(1)?)?,
            relay,
            pinned_at_ms: r.get(2)?,
        });
    }
    Ok(pins)
}

fn unpin(conn: &Connection, relay: &RelayName) -> Result<Option<RelayKey>, StorageError> {
    conn.prepare_cached("DELETE FROM relay_pins WHERE relay = ?1 RETURNING key")?
        .query_row([relay.as_str()], |r| r.get::<_, Vec<u8>>(0))
        .optional()?
        .map(|bytes| key_of(relay, bytes))
        .transpose()
}

fn repin(
    conn: &Connection,
    relay: &RelayName,
    was: Option<&RelayKey>,
    key: &RelayKey,
) -> Result<bool, StorageError> {
    let (relay, key, now) = (relay.as_str(), key.as_bytes().as_slice(), now_ms());
    let changed = match was {
        Some(was) => conn.execute(
            "UPDATE relay_pins SET key = ?2, pinned_at = ?3 WHERE relay = ?1 AND key = ?4",
            params![relay, key, now, was.as_bytes().as_slice()],
        )?,
        None => conn.execute(
            "INSERT INTO relay_pins (relay, key, pinned_at) VALUES (?1, ?2, ?3)
             ON CONFLICT (relay) DO NOTHING",
            params![relay, key, now],
        )?,
    };
    Ok(changed == 1)
}

fn name_of(raw: &str) -> Result<RelayName, StorageError> {
    RelayName::new(raw).map_err(|e| StorageError::Database(format!("a pinned relay's name: {e}")))
}

fn key_of(relay: &RelayName, bytes: Vec<u8>) -> Result<RelayKey, StorageError> {
    Ok(RelayKey::from_bytes(bytes.try_into().map_err(|_| {
        StorageError::Database(format!("the key pinned for relay {relay} is not 32 bytes"))
    })?))
}
