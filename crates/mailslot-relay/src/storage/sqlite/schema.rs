//! The relay database's schema: versioned migrations, applied in order and tracked in
//! `user_version`; the move of the queue out of its table into the spool, which came with
//! schema 5; and the relay's id, made on first use.

use std::collections::HashMap;
use std::path::Path;

use rusqlite::{Connection, OptionalExtension, Transaction};

use super::spool::{self, Spool, StoredCopy};
use crate::protocol::{AgentName, MessageId, Seq};
use crate::storage::StorageError;

/// Schema versions, applied in order; never edit a shipped one.
pub(super) const MIGRATIONS: &[&str] = &[
    r#"
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL) STRICT;
CREATE TABLE agents (
    name          TEXT PRIMARY KEY,
    signing       BLOB NOT NULL,
    sealing       BLOB NOT NULL,
    registered_at INTEGER NOT NULL,
    policy        TEXT CHECK (policy IN ('open', 'contacts', 'closed')),
    -- Present when the agent opted in to the public directory.
    listing       TEXT
) STRICT;
CREATE TABLE queue (
    seq         INTEGER PRIMARY KEY AUTOINCREMENT,
    recipient   TEXT NOT NULL,
    sender      TEXT NOT NULL,
    message_id  TEXT NOT NULL,
    envelope    BLOB NOT NULL,
    size        INTEGER NOT NULL,
    accepted_at INTEGER NOT NULL,
    expires_at  INTEGER NOT NULL,
    UNIQUE (sender, message_id, recipient)
) STRICT;
CREATE INDEX queue_recipient ON queue(recipient, seq);
CREATE INDEX queue_expiry ON queue(expires_at);
-- Running totals per recipient, so a quota check never scans the queue.
CREATE TABLE queue_totals (
    recipient TEXT PRIMARY KEY,
    count     INTEGER NOT NULL,
    bytes     INTEGER NOT NULL
) STRICT;
CREATE TABLE contact_requests (
    requester  TEXT NOT NULL,
    target     TEXT NOT NULL,
    note       TEXT NOT NULL,
    code       TEXT NOT NULL,
    expires_at INTEGER NOT NULL,
    PRIMARY KEY (requester, target)
) STRICT;
CREATE INDEX contact_requests_target ON contact_requests(target, code);
-- owner -> peer: 'contact' (stored both ways) or 'blocked' (one way).
CREATE TABLE relations (
    owner TEXT NOT NULL,
    peer  TEXT NOT NULL,
    kind  TEXT NOT NULL CHECK (kind IN ('contact', 'blocked')),
    since INTEGER NOT NULL,
    PRIMARY KEY (owner, peer)
) STRICT;
"#,
    r#"
-- Acknowledged up to this sequence number: rows at or below it are no longer the recipient's
-- (not counted, never delivered) and the writer deletes them in bulk (see `PURGE_EVERY`).
ALTER TABLE queue_totals ADD COLUMN acked INTEGER NOT NULL DEFAULT 0;
"#,
    r#"
-- The duplicate check's key leads with the message id: ids are time-ordered (UUIDv7), so new
-- entries land at one end of the index instead of in every sender's range, and a busy batch
-- rewrites a few index pages instead of one per sender.
CREATE TABLE queue_v3 (
    seq         INTEGER PRIMARY KEY AUTOINCREMENT,
    recipient   TEXT NOT NULL,
    sender      TEXT NOT NULL,
    message_id  TEXT NOT NULL,
    envelope    BLOB NOT NULL,
    size        INTEGER NOT NULL,
    accepted_at INTEGER NOT NULL,
    expires_at  INTEGER NOT NULL,
    UNIQUE (message_id, sender, recipient)
) STRICT;
INSERT INTO queue_v3 (seq, recipient, sender, message_id, envelope, size, accepted_at, expires_at)
    SELECT seq, recipient, sender, message_id, envelope, size, accepted_at, expires_at FROM queue;
-- Sequence numbers are never reused: the counter carries over, past rows already purged.
DELETE FROM sqlite_sequence WHERE name = 'queue_v3';
INSERT INTO sqlite_sequence (name, seq) SELECT 'queue_v3', seq FROM sqlite_sequence WHERE name = 'queue';
DROP TABLE queue;
ALTER TABLE queue_v3 RENAME TO queue;
CREATE INDEX queue_recipient ON queue(recipient, seq);
CREATE INDEX queue_expiry ON queue(expires_at);
"#,
    r#"
-- The queue keeps no secondary index. The writer holds each recipient's order, the totals the
-- quotas check and the duplicate keys in memory (`queue::QueueIndex`), rebuilt from this table
-- when the relay starts, so storing a copy writes its row at the table's end and nothing else
-- (each index entry was one more page rewritten per commit). Sequence numbers are assigned by
-- the writer; `seq_high` in `meta` keeps them from coming back once the rows are deleted.
CREATE TABLE acked (
    recipient TEXT PRIMARY KEY,
    seq       INTEGER NOT NULL
) STRICT;
INSERT INTO acked (recipient, seq) SELECT recipient, acked FROM queue_totals WHERE acked > 0;
INSERT INTO meta (key, value) SELECT 'seq_high', CAST(seq AS TEXT) FROM sqlite_sequence WHERE name = 'queue'
    ON CONFLICT (key) DO UPDATE SET value = excluded.value;
CREATE TABLE queue_v4 (
    seq         INTEGER PRIMARY KEY,
    recipient   TEXT NOT NULL,
    sender      TEXT NOT NULL,
    message_id  TEXT NOT NULL,
    envelope    BLOB NOT NULL,
    size        INTEGER NOT NULL,
    accepted_at INTEGER NOT NULL,
    expires_at  INTEGER NOT NULL
) STRICT;
-- Acknowledged rows were only waiting for a purge.
INSERT INTO queue_v4 (seq, recipient, sender, message_id, envelope, size, accepted_at, expires_at)
    SELECT q.seq, q.recipient, q.sender, q.message_id, q.envelope, q.size, q.accepted_at, q.expires_at
    FROM queue q LEFT JOIN queue_totals t ON t.recipient = q.recipient
    WHERE q.seq > coalesce(t.acked, 0);
DROP TABLE queue;
DROP TABLE queue_totals;
ALTER TABLE queue_v4 RENAME TO queue;
"#,
    r#"
-- The queue lives in the spool beside the database (`spool.rs`); `queue::move_table_to_spool`
-- copied the rows still waiting, and the highest sequence number, before this runs.
DROP TABLE queue;
DROP TABLE acked;
DELETE FROM meta WHERE key = 'seq_high';
"#,
    r#"
-- The owner key (Ed25519, 32 bytes) that signs the agent's consent changes; NULL until its
-- owner registers one, first come, and then replaceable only with a signature by it.
ALTER TABLE agents ADD COLUMN owner BLOB;
"#,
    r#"
-- Invites for a relay that registers by invite only: the SHA-256 of each token (the token
-- itself is never stored), and who used it.
CREATE TABLE invites (
    digest     BLOB PRIMARY KEY,
    created_at INTEGER NOT NULL,
    used_by    TEXT,
    used_at    INTEGER
) STRICT;
"#,
    r#"
-- Set when the agent retired its name: until then the name is held (it answers as unknown),
-- after it the name is free.
ALTER TABLE agents ADD COLUMN retired_until INTEGER;
"#,
    r#"
-- Copies that expired undelivered, kept for their sender until it asks for them (`bounces`)
-- and says it recorded them (`ack_bounces`): written in the batch that expires the copies.
CREATE TABLE bounces (
    sender     TEXT NOT NULL,
    message_id TEXT NOT NULL,
    recipient  TEXT NOT NULL,
    expired_at INTEGER NOT NULL,
    PRIMARY KEY (sender, message_id, recipient)
) STRICT, WITHOUT ROWID;
"#,
    r#"
-- The agent's last key rotations (a JSON array of signed statements, oldest first), handed
-- out with its keys so peers that pinned an older key can follow the chain.
ALTER TABLE agents ADD COLUMN rotations TEXT;
"#,
    r#"
-- Other relays' keys (Ed25519, 32 bytes), pinned on first contact and never replaced.
CREATE TABLE relay_pins (
    relay     TEXT PRIMARY KEY,
    key       BLOB NOT NULL,
    pinned_at INTEGER NOT NULL
) STRICT;
"#,
    r#"
-- Denials a requester of this relay has not heard of yet (it was offline): handed over, and
-- deleted, at its next login; dropped when the denied request would have lapsed.
CREATE TABLE denials (
    requester  TEXT NOT NULL,
    target     TEXT NOT NULL,
    expires_at INTEGER NOT NULL,
    PRIMARY KEY (requester, target)
) STRICT, WITHOUT ROWID;
"#,
    r#"
-- Groups: names in the agents' namespace whose mail is fanned out to their roster. The owner
-- key (32 bytes) signs roster changes; members are addresses (bare here, name@host there), in
-- the order they were added (rowid).
CREATE TABLE groups (
    name       TEXT PRIMARY KEY,
    creator    TEXT NOT NULL,
    owner      BLOB NOT NULL,
    policy     TEXT NOT NULL CHECK (policy IN ('members', 'owner', 'anyone')),
    created_at INTEGER NOT NULL
) STRICT;
CREATE TABLE group_members (
    grp      TEXT NOT NULL REFERENCES groups (name),
    member   TEXT NOT NULL,
    added_at INTEGER NOT NULL,
    UNIQUE (grp, member)
) STRICT;
CREATE INDEX group_members_member ON group_members (member);
"#,
    r#"
-- File reservations in a project's namespace (schema 14): `patterns` is a JSON array of
-- repository-relative paths or globs; a row whose `expires_at` has passed is gone (never
-- shown or counted) and the next reserve deletes it.
CREATE TABLE reservations (
    id         TEXT PRIMARY KEY,
    project    TEXT NOT NULL,
    holder     TEXT NOT NULL,
    patterns   TEXT NOT NULL,
    mode       TEXT NOT NULL CHECK (mode IN ('exclusive', 'shared')),
    reason     TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    expires_at INTEGER NOT NULL
) STRICT;
CREATE INDEX reservations_project ON reservations (project, expires_at);
CREATE INDEX reservations_expiry ON reservations (expires_at);
"#,
];

/// The last schema with the `queue` table: a database at or below it has its queue moved to
/// the spool before the next migration drops the table.
pub(super) const QUEUE_TABLE: usize = 4;

/// Brings the database to schema `upto` (or leaves it where it is, if that is later); returns
/// the schema it had.
pub(super) fn migrate(tx: &Transaction<'_>, upto: usize) -> Result<usize, StorageError> {
    let version = tx.query_row("PRAGMA user_version", [], |r| r.get::<_, i64>(0))? as usize;
    if version > MIGRATIONS.len() {
        return Err(StorageError::Database(format!(
            "the relay database has schema {version}, newer than this build's {}; upgrade mailslot",
            MIGRATIONS.len()
        )));
    }
    if version < upto {
        for sql in &MIGRATIONS[version..upto] {
            tx.execute_batch(sql)?;
        }
        tx.pragma_update(None, "user_version", upto as i64)?;
    }
    Ok(version)
}

/// The relay's id, made on first use.
pub(super) fn relay_id(tx: &Transaction<'_>) -> Result<String, StorageError> {
    let existing: Option<String> = tx
        .query_row("SELECT value FROM meta WHERE key = 'relay_id'", [], |r| {
            r.get(0)
        })
        .optional()?;
    if let Some(id) = existing {
        return Ok(id);
    }
    let mut raw = [0u8; 8];
    getrandom::fill(&mut raw).map_err(|e| StorageError::Database(e.to_string()))?;
    let id = format!(
        "relay-{}",
        raw.iter().map(|b| format!("{b:02x}")).collect::<String>()
    );
    tx.execute(
        "INSERT INTO meta (key, value) VALUES ('relay_id', ?1)",
        [&id],
    )?;
    Ok(id)
}

/// Moves the queue of a database from before the spool (schema 4) into the spool at `dir`:
/// its unacknowledged rows, and the highest sequence number assigned. The rows stay in the
/// table until the caller's migration drops it after this returns, so a crash in between
/// moves them again, and the scan keeps one record per sequence number.
pub(super) fn move_table_to_spool(conn: &Connection, dir: &Path) -> Result<(), StorageError> {
    let high: Option<String> = conn
        .query_row("SELECT value FROM meta WHERE key = 'seq_high'", [], |r| {
            r.get(0)
        })
        .optional()?;
    let high: Seq = match high {
        Some(h) => h
            .parse()
            .map_err(|_| StorageError::Database(format!("meta seq_high {h:?} is not a number")))?,
        None => 0,
    };
    let acked: HashMap<String, i64> = conn
        .prepare("SELECT recipient, seq FROM acked")?
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
        .collect::<Result<_, _>>()?;
    let max: Option<i64> = conn.query_row("SELECT max(seq) FROM queue", [], |r| r.get(0))?;
    if max.is_none() && high == 0 {
        return Ok(());
    }
    let mut spool = Spool::open(
        dir,
        high.max(max.unwrap_or(0).max(0) as Seq),
        spool::SEGMENT_BYTES,
    )?;
    let mut stmt = conn.prepare(
        "SELECT seq, recipient, sender, message_id, envelope, accepted_at, expires_at FROM queue ORDER BY seq",
    )?;
    let mut rows = stmt.query([])?;
    while let Some(r) = rows.next()? {
        let seq: i64 = r.get(0)?;
        let recipient: String = r.get(1)?;
        if seq <= acked.get(&recipient).copied().unwrap_or(0) {
            continue;
        }
        let corrupt =
            |what: String| StorageError::Database(format!("queue row {seq} is invalid: {what}"));
        let name = |s: &str| AgentName::from_stored(s).map_err(|e| corrupt(e.to_string()));
        let envelope: Vec<u8> = r.get(4)?;
        spool.stored(&StoredCopy {
            seq: Seq::try_from(seq).map_err(|e| corrupt(e.to_string()))?,
            accepted_at_ms: r.get(5)?,
            expires_at_ms: r.get(6)?,
            id: MessageId::parse(&r.get::<_, String>(3)?).map_err(|e| corrupt(e.to_string()))?,
            recipient: &name(&recipient)?,
            sender: &name(&r.get::<_, String>(2)?)?,
            envelope: &envelope,
        })?;
        spool.write()?;
    }
    spool.close()
}
