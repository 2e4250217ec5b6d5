//! The bounces table: a bounce for each copy that expired undelivered (or that another relay
//! refused), kept for its sender until the sender acknowledges it.

use jiff::Timestamp;
use rusqlite::Connection;

use crate::protocol::{Address, AgentName, Bounce, CopyKey, MessageId};
use crate::storage::StorageError;

/// Records a bounce for each expired copy (sender, recipient, id); returns them by sender.
pub(super) fn record_expired(
    conn: &Connection,
    expired: Vec<(AgentName, AgentName, MessageId)>,
    now_ms: i64,
) -> Result<Vec<(AgentName, Bounce)>, StorageError> {
    let expired_at = Timestamp::from_millisecond(now_ms).unwrap_or(Timestamp::UNIX_EPOCH);
    let bounces: Vec<(AgentName, Bounce)> = expired
        .into_iter()
        .map(|(sender, recipient, id)| {
            let to = Address::local(recipient);
            (sender, Bounce { id, to, expired_at })
        })
        .collect();
    for (sender, bounce) in &bounces {
        insert(conn, sender, std::slice::from_ref(bounce))?;
    }
    Ok(bounces)
}

/// Stores `sender`'s bounces, each under its recipient as written (a bare name for a local
/// agent, `name@host` for one on another relay); one already stored is kept as it is.
pub(super) fn insert(
    conn: &Connection,
    sender: &AgentName,
    bounces: &[Bounce],
) -> Result<(), StorageError> {
    let mut insert = conn.prepare_cached(
        "INSERT INTO bounces (sender, message_id, recipient, expired_at) VALUES (?1, ?2, ?3, ?4)
         ON CONFLICT DO NOTHING",
    )?;
    for b in bounces {
        insert.execute(rusqlite::params![
            sender.as_str(),
            b.id.to_string(),
            b.to.to_string(),
            b.expired_at.as_millisecond()
        ])?;
    }
    Ok(())
}

/// The bounces waiting for `sender`, oldest first, at most `limit`.
pub(super) fn list(
    conn: &Connection,
    sender: &AgentName,
    limit: usize,
) -> Result<Vec<Bounce>, StorageError> {
    let mut stmt = conn.prepare_cached(
        "SELECT message_id, recipient, expired_at FROM bounces WHERE sender = ?1
         ORDER BY expired_at, message_id, recipient LIMIT ?2",
    )?;
    let rows = stmt.query_map(rusqlite::params![sender.as_str(), limit as i64], |r| {
        Ok((
            r.get::<_, String>(0)?,
            r.get::<_, String>(1)?,
            r.get::<_, i64>(2)?,
        ))
    })?;
    let mut bounces = Vec::new();
    for row in rows {
        let (id, to, at) = row?;
        let corrupt =
            |what: &str| StorageError::Database(format!("a bounce row has an invalid {what}"));
        bounces.push(Bounce {
            id: MessageId::parse(&id).map_err(|_| corrupt("message_id"))?,
            to: Address::parse(&to).map_err(|_| corrupt("recipient"))?,
            expired_at: Timestamp::from_millisecond(at).map_err(|_| corrupt("expired_at"))?,
        });
    }
    Ok(bounces)
}

/// The senders on other relays that bounces wait for, at most `limit`.
pub(super) fn remote_senders(
    conn: &Connection,
    limit: usize,
) -> Result<Vec<AgentName>, StorageError> {
    let mut stmt = conn.prepare_cached(
        "SELECT DISTINCT sender FROM bounces WHERE instr(sender, '@') > 1 ORDER BY sender LIMIT ?1",
    )?;
    let rows = stmt.query_map([limit as i64], |r| r.get::<_, String>(0))?;
    rows.map(|r| {
        AgentName::from_stored(&r?)
            .map_err(|e| StorageError::Database(format!("a bounce row has an invalid sender: {e}")))
    })
    .collect()
}

/// Whether a bounce waits for `sender` for each of `keys`, in order.
pub(super) fn bounced(
    conn: &Connection,
    sender: &AgentName,
    keys: &[CopyKey],
) -> Result<Vec<bool>, StorageError> {
    let mut stmt = conn.prepare_cached(
        "SELECT EXISTS (SELECT 1 FROM bounces WHERE sender = ?1 AND message_id = ?2 AND recipient = ?3)",
    )?;
    keys.iter()
        .map(|k| {
            Ok(stmt.query_row(
                rusqlite::params![sender.as_str(), k.id.to_string(), k.to.to_string()],
                |r| r.get::<_, bool>(0),
            )?)
        })
        .collect()
}

/// Forgets bounces `sender` has recorded; returns how many there were.
pub(super) fn ack(
    tx: &rusqlite::Transaction<'_>,
    sender: &AgentName,
    keys: &[CopyKey],
) -> Result<u64, StorageError> {
    let mut delete = tx.prepare_cached(
        "DELETE FROM bounces WHERE sender = ?1 AND message_id = ?2 AND recipient = ?3",
    )?;
    let mut gone = 0;
    for key in keys {
        gone += delete.execute(rusqlite::params![
            sender.as_str(),
            key.id.to_string(),
            key.to.to_string()
        ])? as u64;
    }
    Ok(gone)
}
