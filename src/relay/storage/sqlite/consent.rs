//! Registrations and consent: who an agent is, and whom it accepts mail from. Every write
//! here runs in the writer's batch, so a consent change and a send never race.

use rusqlite::{Connection, OptionalExtension, params};

use super::clock::now_ms;
use crate::protocol::{AgentName, KeyRotation, OwnerKey, PublicKeys, RequestCode, RequestView};
use crate::relay::storage::registry::{rotations_column_with, rotations_from_column};
use crate::relay::storage::{
    ConsentChange, ConsentOutcome, InviteDigest, Registration, StorageError,
};

pub(super) fn register(
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
/// [`crate::relay::storage::Registry::rotate`]).
pub(super) fn rotate(
    tx: &rusqlite::Transaction<'_>,
    rotation: KeyRotation,
) -> Result<bool, StorageError> {
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
pub(super) fn rotations(
    conn: &Connection,
    name: &AgentName,
) -> Result<Vec<KeyRotation>, StorageError> {
    let column: Option<Option<String>> = conn
        .prepare_cached("SELECT rotations FROM agents WHERE name = ?1 AND retired_until IS NULL")?
        .query_row([name.as_str()], |r| r.get(0))
        .optional()?;
    rotations_from_column(name.as_str(), column.flatten().as_deref())
}

/// Retires `name` until `until_ms`: its keys stop answering lookups and hellos, and its
/// contacts, blocks, requests, listing and owner key go; the row stays to hold the name.
/// Returns whether there was such an agent.
pub(super) fn retire(
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
    // Nobody will ask for its bounces any more.
    tx.execute("DELETE FROM bounces WHERE sender = ?1", [name.as_str()])?;
    Ok(true)
}

/// The owner key registered for `name`, if any.
pub(super) fn owner(conn: &Connection, name: &AgentName) -> Result<Option<OwnerKey>, StorageError> {
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

/// How `owner` relates to `peer`: its own row, else a block of `peer`'s whole relay (which
/// is only ever a block, so "contact" is the peer's own row).
fn relation(
    tx: &rusqlite::Transaction<'_>,
    owner: &AgentName,
    peer: &AgentName,
) -> Result<Option<String>, StorageError> {
    Ok(tx
        .query_row(
            "SELECT kind FROM relations WHERE owner = ?1
                 AND peer IN (?2, '*@' || substr(?2, instr(?2, '@') + 1))
             ORDER BY peer = ?2 DESC LIMIT 1",
            [owner.as_str(), peer.as_str()],
            |r| r.get(0),
        )
        .optional()?)
}

pub(super) fn consent(
    tx: &rusqlite::Transaction<'_>,
    change: &ConsentChange,
) -> Result<ConsentOutcome, StorageError> {
    let now = now_ms();
    tx.execute("DELETE FROM contact_requests WHERE expires_at < ?1", [now])?;
    let add_contacts = |a: &AgentName, b: &AgentName| -> Result<(), StorageError> {
        for (owner, peer) in [(a, b), (b, a)] {
            tx.execute(
                "INSERT INTO relations (owner, peer, kind, since) VALUES (?1, ?2, 'contact', ?3)
                 ON CONFLICT (owner, peer) DO UPDATE SET kind = 'contact', since = excluded.since
                 WHERE relations.kind != 'blocked'",
                params![owner.as_str(), peer.as_str(), now],
            )?;
        }
        Ok(())
    };
    Ok(match change {
        ConsentChange::Request {
            from,
            to,
            note,
            code,
            expires_at_ms,
            max_pending,
            max_to_target,
            max_from_relay,
        } => {
            let policy: Option<String> = tx
                .query_row(
                    "SELECT policy FROM agents WHERE name = ?1",
                    [to.as_str()],
                    |r| r.get(0),
                )
                .optional()?
                .flatten();
            if relation(tx, to, from)?.as_deref() == Some("blocked")
                || policy.as_deref() == Some("closed")
            {
                return Ok(ConsentOutcome::NotAllowed);
            }
            if relation(tx, from, to)?.as_deref() == Some("contact") {
                return Ok(ConsentOutcome::AlreadyContacts);
            }
            let pending: u32 = tx.query_row(
                "SELECT count(*) FROM contact_requests WHERE requester = ?1 AND target != ?2",
                [from.as_str(), to.as_str()],
                |r| r.get(0),
            )?;
            if pending >= *max_pending {
                return Ok(ConsentOutcome::TooManyPending);
            }
            // Asking again replaces a request, so the one being replaced is not counted.
            let waiting: u32 = tx.query_row(
                "SELECT count(*) FROM contact_requests WHERE target = ?1 AND requester != ?2",
                [to.as_str(), from.as_str()],
                |r| r.get(0),
            )?;
            if waiting >= *max_to_target {
                return Ok(ConsentOutcome::TargetFull);
            }
            if let Some((_, relay)) = from.as_str().split_once('@') {
                let from_relay: u32 = tx.query_row(
                    "SELECT count(*) FROM contact_requests
                     WHERE substr(requester, instr(requester, '@') + 1) = ?1
                       AND instr(requester, '@') > 0
                       AND NOT (requester = ?2 AND target = ?3)",
                    [relay, from.as_str(), to.as_str()],
                    |r| r.get(0),
                )?;
                if from_relay >= *max_from_relay {
                    return Ok(ConsentOutcome::RelayFull);
                }
            }
            let mut open_codes = tx.prepare_cached(
                "SELECT code FROM contact_requests WHERE target = ?1 AND requester != ?2",
            )?;
            let codes =
                open_codes.query_map([to.as_str(), from.as_str()], |r| r.get::<_, String>(0))?;
            for stored in codes {
                if RequestCode::parse(&stored?).is_ok_and(|c| c.appears_in(note)) {
                    return Ok(ConsentOutcome::NoteHasCode);
                }
            }
            // Asking again replaces the earlier request (new code, new expiry).
            tx.execute(
                "INSERT INTO contact_requests (requester, target, note, code, expires_at) VALUES (?1, ?2, ?3, ?4, ?5)
                 ON CONFLICT (requester, target) DO UPDATE SET note = excluded.note, code = excluded.code, expires_at = excluded.expires_at",
                params![from.as_str(), to.as_str(), note, code.as_str(), expires_at_ms],
            )?;
            ConsentOutcome::Applied(None)
        }
        ConsentChange::Approve {
            target,
            requester,
            code,
        } => {
            let n = tx.execute(
                "DELETE FROM contact_requests WHERE target = ?1 AND requester = ?2 AND code = ?3",
                [target.as_str(), requester.as_str(), code.as_str()],
            )?;
            if n == 0 {
                return Ok(ConsentOutcome::NoSuchRequest);
            }
            add_contacts(target, requester)?;
            ConsentOutcome::Applied(Some(requester.clone()))
        }
        ConsentChange::Deny { target, requester } => {
            let n = tx.execute(
                "DELETE FROM contact_requests WHERE requester = ?1 AND target = ?2",
                [requester.as_str(), target.as_str()],
            )?;
            changed(n, Some(requester.clone()))
        }
        ConsentChange::Block { owner, peer } => {
            tx.execute(
                "DELETE FROM contact_requests WHERE (requester = ?1 AND target = ?2) OR (requester = ?2 AND target = ?1)",
                [owner.as_str(), peer.as_str()],
            )?;
            tx.execute(
                "DELETE FROM relations WHERE owner = ?1 AND peer = ?2 AND kind = 'contact'",
                [peer.as_str(), owner.as_str()],
            )?;
            tx.execute(
                "INSERT INTO relations (owner, peer, kind, since) VALUES (?1, ?2, 'blocked', ?3)
                 ON CONFLICT (owner, peer) DO UPDATE SET kind = 'blocked', since = excluded.since",
                params![owner.as_str(), peer.as_str(), now],
            )?;
            ConsentOutcome::Applied(None)
        }
        ConsentChange::Unblock { owner, peer } => {
            let n = tx.execute(
                "DELETE FROM relations WHERE owner = ?1 AND peer = ?2 AND kind = 'blocked'",
                [owner.as_str(), peer.as_str()],
            )?;
            changed(n, None)
        }
        ConsentChange::Remove { owner, peer } => {
            let n = tx.execute(
                "DELETE FROM relations WHERE kind = 'contact' AND ((owner = ?1 AND peer = ?2) OR (owner = ?2 AND peer = ?1))",
                [owner.as_str(), peer.as_str()],
            )?;
            changed(n, None)
        }
        ConsentChange::SetPolicy { owner, policy } => {
            tx.execute(
                "UPDATE agents SET policy = ?2 WHERE name = ?1",
                [owner.as_str(), policy.as_str()],
            )?;
            ConsentOutcome::Applied(None)
        }
    })
}

/// `Applied` when a statement changed rows, `NoSuchRequest` when there was nothing to change.
fn changed(rows: usize, requester: Option<AgentName>) -> ConsentOutcome {
    if rows == 0 {
        ConsentOutcome::NoSuchRequest
    } else {
        ConsentOutcome::Applied(requester)
    }
}

pub(super) fn names(
    conn: &Connection,
    sql: &str,
    agent: &AgentName,
) -> Result<Vec<AgentName>, StorageError> {
    let mut stmt = conn.prepare_cached(sql)?;
    let rows = stmt.query_map([agent.as_str()], |r| r.get::<_, String>(0))?;
    rows.map(|r| AgentName::from_stored(&r?).map_err(|e| StorageError::Database(e.to_string())))
        .collect()
}

pub(super) fn requests(
    conn: &Connection,
    sql: &str,
    agent: &AgentName,
    now: i64,
    with_code: bool,
) -> Result<Vec<RequestView>, StorageError> {
    let mut stmt = conn.prepare_cached(sql)?;
    let rows = stmt.query_map(params![agent.as_str(), now], |r| {
        Ok((
            r.get::<_, String>(0)?,
            r.get::<_, String>(1)?,
            r.get::<_, String>(2)?,
            r.get::<_, i64>(3)?,
        ))
    })?;
    rows.map(|row| {
        let (other, note, code, expires) = row?;
        let bad = |e: String| StorageError::Database(e);
        Ok(RequestView {
            agent: AgentName::from_stored(&other)
                .map_err(|e| bad(e.to_string()))?
                .stored_address(),
            note,
            expires_at: jiff::Timestamp::from_millisecond(expires)
                .map_err(|e| bad(e.to_string()))?,
            code: if with_code {
                Some(RequestCode::parse(&code).map_err(|e| bad(e.to_string()))?)
            } else {
                None
            },
        })
    })
    .collect()
}
