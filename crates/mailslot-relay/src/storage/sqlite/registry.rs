//! The registry role on SQLite: who an agent is (names, keys and their rotations, retired
//! names), its owner key, the directory's listings, and the invites that let a name in on a
//! closed relay. Every write runs in the writer's batch.

use std::path::Path;

use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};

use super::clock::now_ms;
use super::{SqliteStorage, connect};
use crate::protocol::{AgentName, KeyRotation, OwnerKey, PublicKeys};
use crate::storage::registry::{rotations_column_with, rotations_from_column};
use crate::storage::{InviteDigest, Registration, Registry, StorageError};

impl SqliteStorage {
    /// Adds invites (their digests) to the database at `path`, beside a running relay or
    /// without one; the database must exist with the current schema.
    pub fn add_invites(path: &Path, digests: &[InviteDigest]) -> Result<(), StorageError> {
        let mut conn = connect::open_beside(path, "make invites")?;
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        for digest in digests {
            tx.execute(
                "INSERT INTO invites (digest, created_at) VALUES (?1, ?2)",
                params![digest.as_slice(), now_ms()],
            )?;
        }
        tx.commit()?;
        Ok(())
    }
}

impl Registry for SqliteStorage {
    async fn register(
        &self,
        name: AgentName,
        keys: PublicKeys,
        invite: Option<InviteDigest>,
    ) -> Result<Registration, StorageError> {
        self.writes
            .tables(move |tx| register(tx, &name, &keys, invite.as_ref()))
            .await
    }

    async fn keys(&self, name: AgentName) -> Result<Option<PublicKeys>, StorageError> {
        self.readers
            .read(move |conn| {
                let row: Option<(Vec<u8>, Vec<u8>)> = conn
                .prepare_cached(
                    "SELECT signing, sealing FROM agents WHERE name = ?1 AND retired_until IS NULL",
                )?
                .query_row([name.as_str()], |r| Ok((r.get(0)?, r.get(1)?)))
                .optional()?;
                row.map(|(s, x)| {
                    let bad = |_| {
                        StorageError::Database(format!("stored keys of {name} are not 32 bytes"))
                    };
                    Ok(PublicKeys {
                        signing: s.try_into().map_err(bad)?,
                        sealing: x.try_into().map_err(bad)?,
                    })
                })
                .transpose()
            })
            .await
    }

    async fn rotate(&self, rotation: KeyRotation) -> Result<bool, StorageError> {
        self.writes.tables(move |tx| rotate(tx, rotation)).await
    }

    async fn rotations(&self, name: AgentName) -> Result<Vec<KeyRotation>, StorageError> {
        self.readers.read(move |conn| rotations(conn, &name)).await
    }

    async fn retire(&self, name: AgentName, until_ms: i64) -> Result<bool, StorageError> {
        self.writes
            .enqueue(move |b| {
                b.index.forget_rules();
                retire(b.tx, &name, until_ms)
            })
            .await
    }

    async fn owner(&self, name: AgentName) -> Result<Option<OwnerKey>, StorageError> {
        self.readers.read(move |conn| owner(conn, &name)).await
    }

    async fn set_owner(
        &self,
        name: AgentName,
        key: OwnerKey,
        current: Option<OwnerKey>,
    ) -> Result<bool, StorageError> {
        self.writes
            .tables(move |tx| {
                if owner(tx, &name)? != current {
                    return Ok(false);
                }
                let changed = tx.execute(
                    "UPDATE agents SET owner = ?2 WHERE name = ?1",
                    params![name.as_str(), key.as_bytes().as_slice()],
                )?;
                Ok(changed == 1)
            })
            .await
    }

    async fn set_listing(
        &self,
        agent: AgentName,
        description: Option<String>,
    ) -> Result<(), StorageError> {
        self.writes
            .tables(move |tx| {
                tx.execute(
                    "UPDATE agents SET listing = ?2 WHERE name = ?1",
                    params![agent.as_str(), description],
                )?;
                Ok(())
            })
            .await
    }

    async fn directory(
        &self,
        limit: usize,
    ) -> Result<Vec<(AgentName, PublicKeys, String)>, StorageError> {
        self.readers.read(move |conn| {
            let mut stmt = conn.prepare_cached("SELECT name, signing, sealing, listing FROM agents WHERE listing IS NOT NULL ORDER BY name LIMIT ?1")?;
            let rows = stmt.query_map([limit as i64], |r| {
                Ok((r.get::<_, String>(0)?, r.get::<_, Vec<u8>>(1)?, r.get::<_, Vec<u8>>(2)?, r.get::<_, String>(3)?))
            })?;
            rows.map(|row| {
                let (name, signing, sealing, listing) = row?;
                let bad = |what: &str| StorageError::Database(format!("stored {what} of {name} is invalid"));
                let keys = PublicKeys {
                    signing: signing.try_into().map_err(|_| bad("signing key"))?,
                    sealing: sealing.try_into().map_err(|_| bad("sealing key"))?,
                };
                Ok((AgentName::new(&name).map_err(|_| bad("name"))?, keys, listing))
            })
            .collect()
        })
        .await
    }
}

fn register(
    tx: &rusqlite::Transaction<'_>,
    name: &AgentName,
    keys: &PublicKeys,
    invite: Option<&InviteDigest>,
) -> Result<Registration, StorageError> {
    let existing: Option<(Vec<u8>, Vec<u8>, Option<i64>)> = tx
        .query_row(
            "SELECT signing, sealing, retired_until FROM agents WHERE name = ?1",
            [name.as_str()],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .optional()?;
    let existing = match existing {
        Some((_, _, Some(until))) if until > now_ms() => return Ok(Registration::Retired(until)),
        // Retired and past its grace: the name is free, and nothing of its past comes along.
        Some((_, _, Some(_))) => {
            tx.execute("DELETE FROM agents WHERE name = ?1", [name.as_str()])?;
            None
        }
        Some((s, x, None)) => Some((s, x)),
        None => None,
    };
    Ok(match existing {
        // Groups share the agents' namespace.
        None if tx
            .prepare_cached("SELECT 1 FROM groups WHERE name = ?1")?
            .exists([name.as_str()])? =>
        {
            Registration::NameTaken
        }
        None => {
            if let Some(digest) = invite {
                let used = tx.execute(
                    "UPDATE invites SET used_by = ?2, used_at = ?3 WHERE digest = ?1 AND used_by IS NULL",
                    params![digest.as_slice(), name.as_str(), now_ms()],
                )?;
                if used == 0 {
                    return Ok(Registration::BadInvite);
                }
            }
            tx.execute(
                "INSERT INTO agents (name, signing, sealing, registered_at) VALUES (?1, ?2, ?3, ?4)",
                params![name.as_str(), keys.signing.as_slice(), keys.sealing.as_slice(), now_ms()],
            )?;
            Registration::Created
        }
        Some((s, x)) if s == keys.signing && x == keys.sealing => Registration::Unchanged,
        Some(_) => Registration::NameTaken,
    })
}

/// Moves `rotation.agent` to its new keys if it holds the old ones now (see
/// [`crate::storage::Registry::rotate`]).
fn rotate(tx: &rusqlite::Transaction<'_>, rotation: KeyRotation) -> Result<bool, StorageError> {
    let name = rotation.agent.clone();
    let kept: Option<Option<String>> = tx
        .query_row(
            "SELECT rotations FROM agents
             WHERE name = ?1 AND signing = ?2 AND sealing = ?3 AND retired_until IS NULL",
            params![
                name.as_str(),
                rotation.old.signing.as_slice(),
                rotation.old.sealing.as_slice()
            ],
            |r| r.get(0),
        )
        .optional()?;
    let Some(kept) = kept else {
        return Ok(false);
    };
    let new = rotation.new.clone();
    let column = rotations_column_with(
        rotations_from_column(name.as_str(), kept.as_deref())?,
        rotation,
    );
    tx.execute(
        "UPDATE agents SET signing = ?2, sealing = ?3, rotations = ?4 WHERE name = ?1",
        params![
            name.as_str(),
            new.signing.as_slice(),
            new.sealing.as_slice(),
            column
        ],
    )?;
    Ok(true)
}

/// The rotations kept for `name` (none when it is unknown or retired).
fn rotations(conn: &Connection, name: &AgentName) -> Result<Vec<KeyRotation>, StorageError> {
    let column: Option<Option<String>> = conn
        .prepare_cached("SELECT rotations FROM agents WHERE name = ?1 AND retired_until IS NULL")?
        .query_row([name.as_str()], |r| r.get(0))
        .optional()?;
    rotations_from_column(name.as_str(), column.flatten().as_deref())
}

/// Retires `name` until `until_ms`: its keys stop answering lookups and hellos, and its
/// contacts, blocks, requests, listing and owner key go; the row stays to hold the name.
/// Returns whether there was such an agent.
fn retire(
    tx: &rusqlite::Transaction<'_>,
    name: &AgentName,
    until_ms: i64,
) -> Result<bool, StorageError> {
    let changed = tx.execute(
        "UPDATE agents SET retired_until = ?2, listing = NULL, owner = NULL, policy = NULL, rotations = NULL WHERE name = ?1 AND retired_until IS NULL",
        params![name.as_str(), until_ms],
    )?;
    if changed == 0 {
        return Ok(false);
    }
    tx.execute(
        "DELETE FROM relations WHERE owner = ?1 OR peer = ?1",
        [name.as_str()],
    )?;
    tx.execute(
        "DELETE FROM contact_requests WHERE requester = ?1 OR target = ?1",
        [name.as_str()],
    )?;
    tx.execute(
        "DELETE FROM denials WHERE requester = ?1 OR target = ?1",
        [name.as_str()],
    )?;
    // Nobody will ask for its bounces any more.
    tx.execute("DELETE FROM bounces WHERE sender = ?1", [name.as_str()])?;
    Ok(true)
}

/// The owner key registered for `name`, if any.
fn owner(conn: &Connection, name: &AgentName) -> Result<Option<OwnerKey>, StorageError> {
    let raw: Option<Vec<u8>> = conn
        .prepare_cached("SELECT owner FROM agents WHERE name = ?1")?
        .query_row([name.as_str()], |r| r.get(0))
        .optional()?
        .flatten();
    raw.map(|bytes| {
        <[u8; 32]>::try_from(bytes)
            .map(OwnerKey::from_bytes)
            .map_err(|_| StorageError::Database(format!("the owner key of {name} is not 32 bytes")))
    })
    .transpose()
}
