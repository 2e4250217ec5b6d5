//! Other relays' keys, pinned on first contact, and the relay's own.

use deadpool_postgres::Client;

use crate::protocol::{RelayKey, RelayName};
use crate::storage::relays::{OWN_KEY, compare_own, parse_own_key};
use crate::storage::{RelayPin, RelayPinRecord, StorageError};

/// Pins `key` for `relay` unless one is pinned, and compares. The insert and the read are two
/// statements: a pin committed by another node between them is seen by the read (each
/// statement reads what was committed before it began), so two racing nodes agree on one key.
pub(super) async fn pin(
    client: &Client,
    relay: &RelayName,
    key: &RelayKey,
) -> Result<RelayPin, StorageError> {
    let inserted = client
        .execute(
            "INSERT INTO relay_pins (relay, key, pinned_at) VALUES ($1, $2, $3)
             ON CONFLICT (relay) DO NOTHING",
            &[
                &relay.as_str(),
                &key.as_bytes().as_slice(),
                &super::now_ms(),
            ],
        )
        .await?;
    if inserted == 1 {
        return Ok(RelayPin::Pinned);
    }
    let pinned: Vec<u8> = client
        .query_one(
            "SELECT key FROM relay_pins WHERE relay = $1",
            &[&relay.as_str()],
        )
        .await?
        .try_get(0)?;
    let pinned = key_of(relay, pinned)?;
    Ok(if pinned == *key {
        RelayPin::Matches
    } else {
        RelayPin::Changed { pinned }
    })
}

/// Records `key` as the relay's own unless one is recorded, and compares; two nodes starting
/// at once agree on the first, as [`pin`] does.
pub(super) async fn pin_own(client: &Client, key: &RelayKey) -> Result<RelayPin, StorageError> {
    let inserted = client
        .execute(
            "INSERT INTO meta (key, value) VALUES ($1, $2) ON CONFLICT (key) DO NOTHING",
            &[&OWN_KEY, &key.to_base64()],
        )
        .await?;
    if inserted == 1 {
        return Ok(RelayPin::Pinned);
    }
    let held: String = client
        .query_one("SELECT value FROM meta WHERE key = $1", &[&OWN_KEY])
        .await?
        .try_get(0)?;
    Ok(compare_own(Some(parse_own_key(held)?), *key))
}

/// The key pinned for `relay`, if any.
pub(super) async fn pinned(
    client: &Client,
    relay: &RelayName,
) -> Result<Option<RelayKey>, StorageError> {
    client
        .query_opt(
            "SELECT key FROM relay_pins WHERE relay = $1",
            &[&relay.as_str()],
        )
        .await?
        .map(|row| key_of(relay, row.try_get(0)?))
        .transpose()
}

/// The relays `key` is pinned for.
pub(super) async fn named(client: &Client, key: &RelayKey) -> Result<Vec<RelayName>, StorageError> {
    client
        .query(
            "SELECT relay FROM relay_pins WHERE key = $1",
            &[&key.as_bytes().as_slice()],
        )
        .await?
        .into_iter()
        .map(|row| {
            let name: String = row.try_get(0)?;
            RelayName::new(&name)
                .map_err(|e| StorageError::Database(format!("a pinned relay's name: {e}")))
        })
        .collect()
}

/// Every pin, by name.
pub(super) async fn all(client: &Client) -> Result<Vec<RelayPinRecord>, StorageError> {
    client
        .query(
            "SELECT relay, key, pinned_at FROM relay_pins ORDER BY relay",
            &[],
        )
        .await?
        .into_iter()
        .map(|row| {
            let name: String = row.try_get(0)?;
            let relay = RelayName::new(&name)
                .map_err(|e| StorageError::Database(format!("a pinned relay's name: {e}")))?;
            Ok(RelayPinRecord {
                key: key_of(&relay, row.try_get(1)?)?,
                relay,
                pinned_at_ms: row.try_get(2)?,
            })
        })
        .collect()
}

/// Removes `relay`'s pin: the key it held.
pub(super) async fn unpin(
    client: &Client,
    relay: &RelayName,
) -> Result<Option<RelayKey>, StorageError> {
    client
        .query_opt(
            "DELETE FROM relay_pins WHERE relay = $1 RETURNING key",
            &[&relay.as_str()],
        )
        .await?
        .map(|row| key_of(relay, row.try_get(0)?))
        .transpose()
}

/// Pins `key` for `relay` in place of `was`, only while the pin is still `was`.
pub(super) async fn repin(
    client: &Client,
    relay: &RelayName,
    was: Option<&RelayKey>,
    key: &RelayKey,
) -> Result<bool, StorageError> {
    let (name, key, now) = (relay.as_str(), key.as_bytes().as_slice(), super::now_ms());
    let changed =
        match was {
            Some(was) => client
                .execute(
                    "UPDATE relay_pins SET key = $2, pinned_at = $3 WHERE relay = $1 AND key = $4",
                    &[&name, &key, &now, &was.as_bytes().as_slice()],
                )
                .await?,
            None => {
                client
                    .execute(
                        "INSERT INTO relay_pins (relay, key, pinned_at) VALUES ($1, $2, $3)
                     ON CONFLICT (relay) DO NOTHING",
                        &[&name, &key, &now],
                    )
                    .await?
            }
        };
    Ok(changed == 1)
}

fn key_of(relay: &RelayName, bytes: Vec<u8>) -> Result<RelayKey, StorageError> {
    Ok(RelayKey::from_bytes(bytes.try_into().map_err(|_| {
        StorageError::Database(format!("the key pinned for relay {relay} is not 32 bytes"))
    })?))
}
