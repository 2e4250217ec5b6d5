//! Registrations and what hangs on a name: keys, retirement, the owner key, the directory
//! listing, invites. Writes that read before they decide take the names' advisory locks, so
//! two nodes deciding about one name take turns.

use deadpool_postgres::{Client, GenericClient, Transaction};

use super::now_ms;
use crate::protocol::{AgentName, KeyRotation, OwnerKey, PublicKeys};
use crate::storage::registry::{rotations_column_with, rotations_from_column};
use crate::storage::{InviteDigest, Registration, StorageError};

/// The advisory lock class of names (with `hashtext(name)`), ASCII "na".
const NAME_LOCK: i32 = 0x6e61;

/// Takes the advisory locks of `names` until the transaction ends, in byte order, so that
/// two transactions locking the same names never wait for each other in a circle.
pub(super) async fn lock_names(
    tx: &Transaction<'_>,
    names: &[&AgentName],
) -> Result<(), StorageError> {
    let mut sorted: Vec<&str> = names.iter().map(|n| n.as_str()).collect();
    sorted.sort_unstable();
    sorted.dedup();
    let stmt = tx
        .prepare_cached("SELECT pg_advisory_xact_lock($1, hashtext($2))")
        .await?;
    for name in sorted {
        tx.execute(&stmt, &[&NAME_LOCK, &name]).await?;
    }
    Ok(())
}

fn key(bytes: Vec<u8>, what: &str, name: &str) -> Result<[u8; 32], StorageError> {
    bytes
        .try_into()
        .map_err(|_| StorageError::Database(format!("the stored {what} of {name} is not 32 bytes")))
}

pub(super) async fn register(
    client: &mut Client,
    name: &AgentName,
    keys: &PublicKeys,
    invite: Option<&InviteDigest>,
) -> Result<Registration, StorageError> {
    let tx = client.transaction().await?;
    lock_names(&tx, &[name]).await?;
    let existing = tx
        .query_opt(
            "SELECT signing, sealing, retired_until FROM agents WHERE name = $1",
            &[&name.as_str()],
        )
        .await?;
    let existing = match existing {
        None => None,
        Some(row) => {
            let retired: Option<i64> = row.try_get(2)?;
            match retired {
                Some(until) if until > now_ms() => return Ok(Registration::Retired(until)),
                // Retired and past its grace: the name is free, and nothing of its past comes
                // along.
                Some(_) => {
                    tx.execute("DELETE FROM agents WHERE name = $1", &[&name.as_str()])
                        .await?;
                    None
                }
                None => Some((row.try_get::<_, Vec<u8>>(0)?, row.try_get::<_, Vec<u8>>(1)?)),
            }
        }
    };
    // Groups share the agents' namespace (and its lock).
    let group = tx
        .query_opt("SELECT 1 FROM groups WHERE name = $1", &[&name.as_str()])
        .await?
        .is_some();
    let outcome = match existing {
        None if group => Registration::NameTaken,
        None => {
            if let Some(digest) = invite {
                let used = tx
                    .execute(
                        "UPDATE invites SET used_by = $2, used_at = $3 WHERE digest = $1 AND used_by IS NULL",
                        &[&digest.as_slice(), &name.as_str(), &now_ms()],
                    )
                    .await?;
                if used == 0 {
                    return Ok(Registration::BadInvite);
                }
            }
            tx.execute(
                "INSERT INTO agents (name, signing, sealing, registered_at) VALUES ($1, $2, $3, $4)",
                &[
                    &name.as_str(),
                    &keys.signing.as_slice(),
                    &keys.sealing.as_slice(),
                    &now_ms(),
                ],
            )
            .await?;
            Registration::Created
        }
        Some((s, x)) if s == keys.signing && x == keys.sealing => Registration::Unchanged,
        Some(_) => Registration::NameTaken,
    };
    tx.commit().await?;
    Ok(outcome)
}

pub(super) async fn keys(
    client: &Client,
    name: &AgentName,
) -> Result<Option<PublicKeys>, StorageError> {
    let stmt = client
        .prepare_cached(
            "SELECT signing, sealing FROM agents WHERE name = $1 AND retired_until IS NULL",
        )
        .await?;
    let Some(row) = client.query_opt(&stmt, &[&name.as_str()]).await? else {
        return Ok(None);
    };
    Ok(Some(PublicKeys {
        signing: key(row.try_get(0)?, "signing key", name.as_str())?,
        sealing: key(row.try_get(1)?, "sealing key", name.as_str())?,
    }))
}

/// Moves `rotation.agent` to its new keys if it holds the old ones now (see
/// [`crate::storage::Registry::rotate`]).
pub(super) async fn rotate(
    client: &mut Client,
    rotation: KeyRotation,
) -> Result<bool, StorageError> {
    let name = rotation.agent.clone();
    let tx = client.transaction().await?;
    lock_names(&tx, &[&name]).await?;
    let Some(row) = tx
        .query_opt(
            "SELECT rotations FROM agents
             WHERE name = $1 AND signing = $2 AND sealing = $3 AND retired_until IS NULL",
            &[
                &name.as_str(),
                &rotation.old.signing.as_slice(),
                &rotation.old.sealing.as_slice(),
            ],
        )
        .await?
    else {
        return Ok(false);
    };
    let kept: Option<String> = row.try_get(0)?;
    let new = rotation.new.clone();
    let column = rotations_column_with(
        rotations_from_column(name.as_str(), kept.as_deref())?,
        rotation,
    );
    tx.execute(
        "UPDATE agents SET signing = $2, sealing = $3, rotations = $4 WHERE name = $1",
        &[
            &name.as_str(),
            &new.signing.as_slice(),
            &new.sealing.as_slice(),
            &column,
        ],
    )
    .await?;
    tx.commit().await?;
    Ok(true)
}

/// The rotations kept for `name` (none when it is unknown or retired).
pub(super) async fn rotations(
    client: &Client,
    name: &AgentName,
) -> Result<Vec<KeyRotation>, StorageError> {
    let stmt = client
        .prepare_cached("SELECT rotations FROM agents WHERE name = $1 AND retired_until IS NULL")
        .await?;
    let column: Option<String> = match client.query_opt(&stmt, &[&name.as_str()]).await? {
        Some(row) => row.try_get(0)?,
        None => None,
    };
    rotations_from_column(name.as_str(), column.as_deref())
}

/// Retires `name` until `until_ms` (see [`crate::storage::Storage::retire`]).
pub(super) async fn retire(
    client: &mut Client,
    name: &AgentName,
    until_ms: i64,
) -> Result<bool, StorageError> {
    let tx = client.transaction().await?;
    lock_names(&tx, &[name]).await?;
    let changed = tx
        .execute(
            "UPDATE agents SET retired_until = $2, listing = NULL, owner = NULL, policy = NULL, rotations = NULL WHERE name = $1 AND retired_until IS NULL",
            &[&name.as_str(), &until_ms],
        )
        .await?;
    if changed == 0 {
        return Ok(false);
    }
    tx.execute(
        "DELETE FROM relations WHERE owner = $1 OR peer = $1",
        &[&name.as_str()],
    )
    .await?;
    tx.execute(
        "DELETE FROM contact_requests WHERE requester = $1 OR target = $1",
        &[&name.as_str()],
    )
    .await?;
    tx.execute(
        "DELETE FROM denials WHERE requester = $1 OR target = $1",
        &[&name.as_str()],
    )
    .await?;
    // Nobody can ask for them any more.
    tx.execute("DELETE FROM bounces WHERE sender = $1", &[&name.as_str()])
        .await?;
    tx.commit().await?;
    Ok(true)
}

pub(super) async fn owner(
    client: &impl GenericClient,
    name: &AgentName,
) -> Result<Option<OwnerKey>, StorageError> {
    let stmt = client
        .prepare_cached("SELECT owner FROM agents WHERE name = $1")
        .await?;
    let raw: Option<Vec<u8>> = match client.query_opt(&stmt, &[&name.as_str()]).await? {
        Some(row) => row.try_get(0)?,
        None => None,
    };
    raw.map(|bytes| key(bytes, "owner key", name.as_str()).map(OwnerKey::from_bytes))
        .transpose()
}

pub(super) async fn set_owner(
    client: &mut Client,
    name: &AgentName,
    new: OwnerKey,
    current: Option<OwnerKey>,
) -> Result<bool, StorageError> {
    let tx = client.transaction().await?;
    lock_names(&tx, &[name]).await?;
    if owner(&tx, name).await? != current {
        return Ok(false);
    }
    let changed = tx
        .execute(
            "UPDATE agents SET owner = $2 WHERE name = $1",
            &[&name.as_str(), &new.as_bytes().as_slice()],
        )
        .await?;
    tx.commit().await?;
    Ok(changed == 1)
}

pub(super) async fn set_listing(
    client: &Client,
    agent: &AgentName,
    description: Option<String>,
) -> Result<(), StorageError> {
    client
        .execute(
            "UPDATE agents SET listing = $2 WHERE name = $1",
            &[&agent.as_str(), &description],
        )
        .await?;
    Ok(())
}

pub(super) async fn directory(
    client: &Client,
    limit: usize,
) -> Result<Vec<(AgentName, PublicKeys, String)>, StorageError> {
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let rows = client
        .query(
            "SELECT name, signing, sealing, listing FROM agents WHERE listing IS NOT NULL ORDER BY name LIMIT $1",
            &[&limit],
        )
        .await?;
    rows.into_iter()
        .map(|row| {
            let name: String = row.try_get(0)?;
            let keys = PublicKeys {
                signing: key(row.try_get(1)?, "signing key", &name)?,
                sealing: key(row.try_get(2)?, "sealing key", &name)?,
            };
            let agent = AgentName::new(&name).map_err(|e| {
                StorageError::Database(format!("a stored agent name {name:?} is invalid: {e}"))
            })?;
            Ok((agent, keys, row.try_get(3)?))
        })
        .collect()
}

pub(super) async fn add_invites(
    client: &mut Client,
    digests: &[InviteDigest],
) -> Result<(), StorageError> {
    let tx = client.transaction().await?;
    for digest in digests {
        tx.execute(
            "INSERT INTO invites (digest, created_at) VALUES ($1, $2)",
            &[&digest.as_slice(), &now_ms()],
        )
        .await?;
    }
    tx.commit().await?;
    Ok(())
}
