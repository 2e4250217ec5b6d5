//! The schema: versioned migrations, applied at start by whichever node gets the advisory
//! lock first (the others wait, then find nothing to do), and the relay's id, made once and
//! shared by every node.
//!
//! Names are `COLLATE "C"`: ordered by bytes, as SQLite orders them, so listings match and
//! every transaction locks mailboxes in one order.

use deadpool_postgres::Client;

use super::describe;
use crate::storage::StorageError;

/// Schema versions, applied in order; never edit a shipped one.
pub(super) const MIGRATIONS: &[&str] = &[
    r#"
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE agents (
    name          TEXT COLLATE "C" PRIMARY KEY,
    signing       BYTEA NOT NULL,
    sealing       BYTEA NOT NULL,
    registered_at BIGINT NOT NULL,
    policy        TEXT CHECK (policy IN ('open', 'contacts', 'closed')),
    -- Present when the agent opted in to the public directory.
    listing       TEXT,
    -- The owner key (Ed25519, 32 bytes) that signs its consent changes.
    owner         BYTEA,
    -- Set when it retired its name: held until then, free after.
    retired_until BIGINT
);
CREATE TABLE invites (
    digest     BYTEA PRIMARY KEY,
    created_at BIGINT NOT NULL,
    used_by    TEXT,
    used_at    BIGINT
);
CREATE TABLE contact_requests (
    requester  TEXT COLLATE "C" NOT NULL,
    target     TEXT COLLATE "C" NOT NULL,
    note       TEXT NOT NULL,
    code       TEXT NOT NULL,
    expires_at BIGINT NOT NULL,
    PRIMARY KEY (requester, target)
);
CREATE INDEX contact_requests_target ON contact_requests (target, code);
-- owner -> peer: 'contact' (stored both ways) or 'blocked' (one way).
CREATE TABLE relations (
    owner TEXT COLLATE "C" NOT NULL,
    peer  TEXT COLLATE "C" NOT NULL,
    kind  TEXT NOT NULL CHECK (kind IN ('contact', 'blocked')),
    since BIGINT NOT NULL,
    PRIMARY KEY (owner, peer)
);
-- One row per recipient that ever had mail. Its row lock, held from a send's allocation of
-- sequence numbers to its commit, serialises the recipient's inserts, so its numbers commit
-- in order and a reader never skips one that commits late. The totals are what quotas check.
CREATE TABLE mailboxes (
    recipient TEXT COLLATE "C" PRIMARY KEY,
    next_seq  BIGINT NOT NULL DEFAULT 1,
    waiting   BIGINT NOT NULL DEFAULT 0,
    bytes     BIGINT NOT NULL DEFAULT 0
);
CREATE TABLE queue (
    recipient   TEXT COLLATE "C" NOT NULL,
    seq         BIGINT NOT NULL,
    sender      TEXT COLLATE "C" NOT NULL,
    message_id  TEXT NOT NULL,
    envelope    BYTEA NOT NULL,
    size        BIGINT NOT NULL,
    accepted_at BIGINT NOT NULL,
    expires_at  BIGINT NOT NULL,
    PRIMARY KEY (recipient, seq),
    UNIQUE (message_id, sender, recipient)
);
CREATE INDEX queue_expiry ON queue (expires_at);
-- Keys of copies acknowledged a moment ago: a sender's retry racing the ack is still a
-- duplicate until `until_ms` (the SQLite backend keeps them in memory for as long).
CREATE TABLE acked_copies (
    message_id TEXT NOT NULL,
    sender     TEXT COLLATE "C" NOT NULL,
    recipient  TEXT COLLATE "C" NOT NULL,
    until_ms   BIGINT NOT NULL,
    PRIMARY KEY (message_id, sender, recipient)
);
-- Which node holds an agent's delivery session, and the epoch that fences a replaced one.
CREATE TABLE leases (
    agent      TEXT COLLATE "C" PRIMARY KEY,
    epoch      BIGINT NOT NULL,
    node       TEXT NOT NULL,
    claimed_at BIGINT NOT NULL
);
"#,
    r#"
-- Copies that expired undelivered, kept for their sender until it asks for them (`bounces`)
-- and says it recorded them (`ack_bounces`): written in the transaction that expires them.
CREATE TABLE bounces (
    sender     TEXT COLLATE "C" NOT NULL,
    message_id TEXT NOT NULL,
    recipient  TEXT COLLATE "C" NOT NULL,
    expired_at BIGINT NOT NULL,
    PRIMARY KEY (sender, message_id, recipient)
);
"#,
    r#"
-- A lease whose session ended (released) has no node: a claim need not wait for anyone.
ALTER TABLE leases ALTER COLUMN node DROP NOT NULL;
"#,
    r#"
-- An envelope stays in its queue row up to a page's size, uncompressed (it is ciphertext):
-- by default a row over ~2 KB (a 1 KiB message is ~2.7 KB sealed) had its envelope tried by
-- pglz and then cut into TOAST chunks, a second table and index written at every send and
-- read back at every delivery.
ALTER TABLE queue SET (toast_tuple_target = 8160);
ALTER TABLE queue ALTER COLUMN envelope SET STORAGE EXTERNAL;
-- The keys of acknowledged copies only stretch the duplicate check over the 2 s after an ack:
-- not worth their WAL. A crash of the database empties the table, as a restart of a SQLite
-- relay forgets the same keys (it keeps them in memory); a re-send racing the ack is then
-- stored again, and the recipient's client keeps one (it deduplicates by message id).
ALTER TABLE acked_copies SET UNLOGGED;
"#,
    r#"
-- The agent's last key rotations (a JSON array of signed statements, oldest first), handed
-- out with its keys so peers that pinned an older key can follow the chain.
ALTER TABLE agents ADD COLUMN rotations TEXT;
"#,
    r#"
-- Other relays' keys (Ed25519, 32 bytes), pinned on first contact and never replaced.
CREATE TABLE relay_pins (
    relay     TEXT COLLATE "C" PRIMARY KEY,
    key       BYTEA NOT NULL,
    pinned_at BIGINT NOT NULL
);
"#,
    r#"
-- Hidden presence: a lease claimed by a connection that is no session of its agent (the
-- dashboard's `?presence=hidden`), which no node lists as online.
ALTER TABLE leases ADD COLUMN hidden BOOLEAN NOT NULL DEFAULT false;
"#,
    r#"
-- Denials a requester of this relay has not heard of yet (it was offline): handed over, and
-- deleted, at its next login; dropped when the denied request would have lapsed.
CREATE TABLE denials (
    requester  TEXT COLLATE "C" NOT NULL,
    target     TEXT COLLATE "C" NOT NULL,
    expires_at BIGINT NOT NULL,
    PRIMARY KEY (requester, target)
);
"#,
    r#"
-- Groups: names in the agents' namespace whose mail is fanned out to their roster. The owner
-- key (32 bytes) signs roster changes; members are addresses (bare here, name@host there), in
-- the order they were added.
CREATE TABLE groups (
    name       TEXT COLLATE "C" PRIMARY KEY,
    creator    TEXT COLLATE "C" NOT NULL,
    owner      BYTEA NOT NULL,
    policy     TEXT NOT NULL CHECK (policy IN ('members', 'owner', 'anyone')),
    created_at BIGINT NOT NULL
);
CREATE TABLE group_members (
    position BIGSERIAL PRIMARY KEY,
    grp      TEXT COLLATE "C" NOT NULL REFERENCES groups (name),
    member   TEXT COLLATE "C" NOT NULL,
    added_at BIGINT NOT NULL,
    UNIQUE (grp, member)
);
CREATE INDEX group_members_member ON group_members (member);
"#,
    r#"
-- File reservations in a project's namespace (schema 10): `patterns` is a JSON array of
-- repository-relative paths or globs; a row whose `expires_at` has passed is gone (never
-- shown or counted) and the next reserve deletes it. Writes in a project take its advisory
-- lock, so a reserve's check and insert are not interleaved with another node's.
CREATE TABLE reservations (
    id         TEXT PRIMARY KEY,
    project    TEXT COLLATE "C" NOT NULL,
    holder     TEXT COLLATE "C" NOT NULL,
    patterns   TEXT NOT NULL,
    mode       TEXT NOT NULL CHECK (mode IN ('exclusive', 'shared')),
    reason     TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    expires_at BIGINT NOT NULL
);
CREATE INDEX reservations_project ON reservations (project, expires_at);
CREATE INDEX reservations_expiry ON reservations (expires_at);
"#,
];

/// The advisory lock key under which migrations run ("mailslot" in ASCII, as a number).
const MIGRATION_LOCK: i64 = 0x6d61_696c_736c_6f74;

/// Brings the schema up to date under the migration lock and returns the relay's id (made
/// now if this is the first node ever).
pub(super) async fn migrate(client: &mut Client) -> Result<String, StorageError> {
    let tx = client.transaction().await?;
    // Held to the commit: a node starting beside this one waits here, then sees the schema.
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
        .await?;
    tx.batch_execute("CREATE TABLE IF NOT EXISTS mailslot_schema (version INTEGER NOT NULL)")
        .await?;
    let version: i32 = match tx
        .query_opt("SELECT version FROM mailslot_schema", &[])
        .await?
    {
        Some(row) => row.try_get(0)?,
        None => {
            tx.execute("INSERT INTO mailslot_schema (version) VALUES (0)", &[])
                .await?;
            0
        }
    };
    let known = MIGRATIONS.len();
    let version = usize::try_from(version).unwrap_or(usize::MAX);
    if version > known {
        return Err(StorageError::Database(format!(
            "the relay database has schema {version}, newer than this build's {known}; upgrade mailslot on this node"
        )));
    }
    for sql in &MIGRATIONS[version..] {
        tx.batch_execute(sql).await.map_err(|e| {
            StorageError::Database(format!("migrating the relay database: {}", describe(&e)))
        })?;
    }
    if version < known {
        tx.execute(
            "UPDATE mailslot_schema SET version = $1",
            &[&(known as i32)],
        )
        .await?;
    }
    let mut raw = [0u8; 8];
    getrandom::fill(&mut raw).map_err(|e| StorageError::Database(format!("no randomness: {e}")))?;
    let fresh = format!(
        "relay-{}",
        raw.iter().map(|b| format!("{b:02x}")).collect::<String>()
    );
    tx.execute(
        "INSERT INTO meta (key, value) VALUES ('relay_id', $1) ON CONFLICT (key) DO NOTHING",
        &[&fresh],
    )
    .await?;
    let relay_id: String = tx
        .query_one("SELECT value FROM meta WHERE key = 'relay_id'", &[])
        .await?
        .try_get(0)?;
    tx.commit().await?;
    Ok(relay_id)
}
