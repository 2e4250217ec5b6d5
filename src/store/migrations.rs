//! Versioned schema migrations, tracked in SQLite's `user_version`.

use rusqlite::{Connection, TransactionBehavior};

use super::StoreError;

/// Each entry moves the schema one version up; never edit one that has shipped.
const MIGRATIONS: &[&str] = &[
    // 1: the first schema.
    r#"
    CREATE TABLE meta (
        key   TEXT PRIMARY KEY,
        value TEXT NOT NULL
    ) STRICT;

    CREATE TABLE threads (
        id            TEXT PRIMARY KEY,
        subject       TEXT NOT NULL,
        first_at      INTEGER NOT NULL,
        last_at       INTEGER NOT NULL,
        message_count INTEGER NOT NULL
    ) STRICT;

    CREATE TABLE messages (
        seq       INTEGER PRIMARY KEY,
        id        TEXT NOT NULL UNIQUE,
        direction TEXT NOT NULL CHECK (direction IN ('in', 'out')),
        sender    TEXT NOT NULL,
        thread_id TEXT NOT NULL REFERENCES threads(id) DEFERRABLE INITIALLY DEFERRED,
        subject   TEXT NOT NULL,
        body      TEXT NOT NULL,
        sent_at   INTEGER NOT NULL,
        stored_at INTEGER NOT NULL,
        read_at   INTEGER,
        trust     TEXT NOT NULL CHECK (trust IN ('own', 'verified', 'key_changed', 'unverified')),
        json      TEXT NOT NULL
    ) STRICT;
    CREATE INDEX messages_inbox ON messages(direction, read_at, seq);
    CREATE INDEX messages_thread ON messages(thread_id, sent_at);
    CREATE INDEX messages_sender ON messages(sender, seq);

    -- Subject, body and sender never change after insert, so no update trigger is needed.
    CREATE VIRTUAL TABLE messages_fts USING fts5(
        subject, body, sender,
        content = 'messages', content_rowid = 'seq',
        tokenize = 'porter unicode61 remove_diacritics 2'
    );
    -- Subject counts three times the body, the sender twice.
    INSERT INTO messages_fts(messages_fts, rank) VALUES ('rank', 'bm25(3.0, 1.0, 2.0)');
    CREATE TRIGGER messages_fts_insert AFTER INSERT ON messages BEGIN
        INSERT INTO messages_fts(rowid, subject, body, sender)
        VALUES (new.seq, new.subject, new.body, new.sender);
    END;
    CREATE TRIGGER messages_fts_delete AFTER DELETE ON messages BEGIN
        INSERT INTO messages_fts(messages_fts, rowid, subject, body, sender)
        VALUES ('delete', old.seq, old.subject, old.body, old.sender);
    END;

    CREATE TABLE memories (
        seq        INTEGER PRIMARY KEY,
        id         TEXT NOT NULL UNIQUE,
        title      TEXT NOT NULL,
        body       TEXT NOT NULL,
        tags       TEXT NOT NULL,
        created_at INTEGER NOT NULL,
        updated_at INTEGER NOT NULL
    ) STRICT;
    CREATE INDEX memories_recent ON memories(updated_at);

    CREATE VIRTUAL TABLE memories_fts USING fts5(
        title, body, tags,
        content = 'memories', content_rowid = 'seq',
        tokenize = 'porter unicode61 remove_diacritics 2'
    );
    -- Title counts three times the body, tags twice.
    INSERT INTO memories_fts(memories_fts, rank) VALUES ('rank', 'bm25(3.0, 1.0, 2.0)');
    CREATE TRIGGER memories_fts_insert AFTER INSERT ON memories BEGIN
        INSERT INTO memories_fts(rowid, title, body, tags)
        VALUES (new.seq, new.title, new.body, new.tags);
    END;
    CREATE TRIGGER memories_fts_delete AFTER DELETE ON memories BEGIN
        INSERT INTO memories_fts(memories_fts, rowid, title, body, tags)
        VALUES ('delete', old.seq, old.title, old.body, old.tags);
    END;

    CREATE TABLE contacts (
        address     TEXT PRIMARY KEY,
        keys        TEXT NOT NULL,
        fingerprint TEXT NOT NULL,
        first_seen  INTEGER NOT NULL,
        last_seen   INTEGER NOT NULL
    ) STRICT;

    CREATE TABLE key_changes (
        seq             INTEGER PRIMARY KEY,
        address         TEXT NOT NULL REFERENCES contacts(address),
        pinned          TEXT NOT NULL,
        presented       TEXT NOT NULL,
        presented_keys  TEXT NOT NULL,
        seen_at         INTEGER NOT NULL
    ) STRICT;

    -- Messages waiting for a relay to accept them. They are sealed when sent, so a message
    -- can be queued while the relay (and the recipients' keys) are out of reach.
    CREATE TABLE outbox (
        message_id TEXT PRIMARY KEY REFERENCES messages(id),
        queued_at  INTEGER NOT NULL,
        attempts   INTEGER NOT NULL DEFAULT 0,
        last_error TEXT,
        failed     INTEGER NOT NULL DEFAULT 0 CHECK (failed IN (0, 1))
    ) STRICT;
    "#,
    // 2: which messages were put in front of a client session's model (hooks, channel
    // events, tool results), so no doorbell shows one twice to the same session.
    r#"
    CREATE TABLE shown (
        session    TEXT NOT NULL,
        message_id TEXT NOT NULL,
        via        TEXT NOT NULL,
        shown_at   INTEGER NOT NULL,
        PRIMARY KEY (session, message_id)
    ) STRICT, WITHOUT ROWID;
    CREATE INDEX shown_age ON shown(shown_at);
    "#,
    // 3: copies of sent messages that expired on the relay before their recipient took them.
    r#"
    CREATE TABLE bounces (
        message_id TEXT NOT NULL REFERENCES messages(id),
        recipient  TEXT NOT NULL,
        expired_at INTEGER NOT NULL,
        PRIMARY KEY (message_id, recipient)
    ) STRICT, WITHOUT ROWID;
    "#,
    // 4: other relays' keys, pinned on first contact like agents' keys; they vouch for the
    // keys of agents on those relays.
    r#"
    CREATE TABLE relay_keys (
        relay       TEXT PRIMARY KEY,
        key         TEXT NOT NULL,
        fingerprint TEXT NOT NULL,
        first_seen  INTEGER NOT NULL,
        last_seen   INTEGER NOT NULL
    ) STRICT;
    "#,
    // 5: importance as a rank (so inbox can ask for "at least high"); receipts this agent
    // sent (marked, never listed as mail); and the receipts table: for sent mail, what its
    // recipients said; for received mail, what this agent said.
    r#"
    ALTER TABLE messages ADD COLUMN importance INTEGER NOT NULL DEFAULT 0 CHECK (importance IN (0, 1, 2));
    ALTER TABLE messages ADD COLUMN is_receipt INTEGER NOT NULL DEFAULT 0 CHECK (is_receipt IN (0, 1));
    CREATE TABLE receipts (
        message_id TEXT NOT NULL REFERENCES messages(id),
        recipient  TEXT NOT NULL,
        kind       TEXT NOT NULL CHECK (kind IN ('read', 'acknowledged')),
        at         INTEGER NOT NULL,
        answer     TEXT,
        PRIMARY KEY (message_id, recipient, kind)
    ) STRICT, WITHOUT ROWID;
    "#,
    // 6: the inbox at volume. Read received mail newest first without sorting it all (the
    // inbox lists it after the unread, which `messages_inbox` already serves in order), and
    // the unread count kept by triggers, so the notice on every tool result does not count
    // every unread message each time.
    r#"
    CREATE INDEX messages_read ON messages(seq) WHERE direction = 'in' AND read_at IS NOT NULL;
    CREATE TABLE unread (
        id    INTEGER PRIMARY KEY CHECK (id = 1),
        count INTEGER NOT NULL CHECK (count >= 0)
    ) STRICT;
    INSERT INTO unread (id, count)
        VALUES (1, (SELECT count(*) FROM messages WHERE direction = 'in' AND read_at IS NULL));
    CREATE TRIGGER unread_insert AFTER INSERT ON messages
        WHEN new.direction = 'in' AND new.read_at IS NULL
    BEGIN
        UPDATE unread SET count = count + 1;
    END;
    CREATE TRIGGER unread_read AFTER UPDATE OF read_at ON messages
        WHEN new.direction = 'in' AND (old.read_at IS NULL) <> (new.read_at IS NULL)
    BEGIN
        UPDATE unread SET count = count + iif(new.read_at IS NULL, 1, -1);
    END;
    CREATE TRIGGER unread_delete AFTER DELETE ON messages
        WHEN old.direction = 'in' AND old.read_at IS NULL
    BEGIN
        UPDATE unread SET count = count - 1;
    END;
    "#,
    // 7: which recipients took their copy of sent mail. A row per (message, recipient) from
    // the moment the relay took the message, asked about at that relay (`relay`, its id)
    // while `open`; `delivered_at` is when the relay said the copy was taken (no later than
    // then). `recipient` is as addressed (like receipts'), `agent` the name on the relay.
    // Mail sent before this version has no rows: it stays "sent".
    r#"
    CREATE TABLE deliveries (
        message_id   TEXT NOT NULL REFERENCES messages(id),
        recipient    TEXT NOT NULL,
        agent        TEXT NOT NULL,
        relay        TEXT NOT NULL,
        taken_at     INTEGER NOT NULL,
        delivered_at INTEGER,
        open         INTEGER NOT NULL DEFAULT 1 CHECK (open IN (0, 1)),
        PRIMARY KEY (message_id, recipient)
    ) STRICT, WITHOUT ROWID;
    CREATE INDEX deliveries_open ON deliveries(relay, taken_at, message_id, agent) WHERE open = 1;
    "#,
    // 8: attachments in a table of their own, the bytes last in each row, so a listing reads
    // names and sizes without touching the bytes' overflow pages. Messages stored before
    // keep theirs in their JSON (`store/attachments.rs` reads both).
    r#"
    CREATE TABLE attachments (
        message_id TEXT NOT NULL,
        idx        INTEGER NOT NULL CHECK (idx >= 0),
        name       TEXT NOT NULL,
        media_type TEXT NOT NULL,
        size       INTEGER NOT NULL CHECK (size >= 0),
        sha256     TEXT NOT NULL,
        bytes      BLOB NOT NULL,
        PRIMARY KEY (message_id, idx)
    ) STRICT;
    CREATE TRIGGER attachments_delete AFTER DELETE ON messages BEGIN
        DELETE FROM attachments WHERE message_id = old.id;
    END;
    "#,
    // 9: which doorbell rings each client session's model while it is idle, claimed by the
    // `mailslot mcp` process (`pid`) that serves the session: a Claude Code channel or its
    // inbox socket. A session without a live claim is woken by the rewake hook instead,
    // which waits while the session is busy (`turns`, kept by the session's hooks: the
    // hooks after a tool and at the end of a turn show mail to a busy session).
    r#"
    CREATE TABLE doorbells (
        session TEXT PRIMARY KEY,
        path    TEXT NOT NULL,
        pid     INTEGER NOT NULL,
        since   INTEGER NOT NULL
    ) STRICT, WITHOUT ROWID;
    CREATE TABLE turns (
        session TEXT PRIMARY KEY,
        busy    INTEGER NOT NULL CHECK (busy IN (0, 1)),
        at      INTEGER NOT NULL
    ) STRICT, WITHOUT ROWID;
    "#,
    // 10: letters from another relay's agent that could not be opened yet because that relay
    // did not answer for the sender's keys. They are kept sealed, as delivered, so the relay
    // can be acknowledged and mail behind them flows; they are opened when the relay answers
    // (`next_at` is the next try), and given up after the relay's own keeping time.
    r#"
    CREATE TABLE parked (
        id         TEXT PRIMARY KEY,
        sender     TEXT NOT NULL,
        envelope   TEXT NOT NULL,
        parked_at  INTEGER NOT NULL,
        attempts   INTEGER NOT NULL CHECK (attempts >= 0),
        next_at    INTEGER NOT NULL,
        last_error TEXT NOT NULL
    ) STRICT, WITHOUT ROWID;
    CREATE INDEX parked_due ON parked(next_at);
    "#,
    // 11: denials of this agent's contact requests, heard from its relay, for `requests`.
    r#"
    CREATE TABLE denials (
        agent    TEXT PRIMARY KEY,
        heard_at INTEGER NOT NULL
    ) STRICT, WITHOUT ROWID;
    "#,
    // 12: groups this agent joined (its owner signed it), or that its model asked to join
    // and its owner has not decided on yet.
    r#"
    CREATE TABLE groups (
        address TEXT PRIMARY KEY,
        state   TEXT NOT NULL CHECK (state IN ('wished', 'joined')),
        since   INTEGER NOT NULL
    ) STRICT, WITHOUT ROWID;
    "#,
    // 13: the owner's voice. A received message written by the agent's owner (`mailslot
    // tell`, the dashboard) straight into this store carries the owner key's signature over
    // it; mail from a relay never does. Checked each time it is shown, never trusted here.
    r#"
    ALTER TABLE messages ADD COLUMN owner_signature BLOB
        CHECK (owner_signature IS NULL OR length(owner_signature) = 64);
    "#,
    // 14: the findable messages' times on an index of their own. A search re-ranks its best
    // matches by recency; reading each one's time from its whole row (scattered over the
    // table, mostly not in the page cache) cost a quarter of a search (performance log,
    // 2026-12-03 (night)).
    r#"
    CREATE INDEX messages_recency ON messages(seq, sent_at) WHERE is_receipt = 0;
    "#,
];

/// The schema version this build writes.
pub const SCHEMA_VERSION: u32 = MIGRATIONS.len() as u32;

/// Brings the database up to [`SCHEMA_VERSION`] in one write transaction, so two processes
/// opening a new store at once cannot both migrate it. A current store is only read: opening
/// it (every hook, every command) writes and flushes nothing.
pub fn migrate(conn: &mut Connection) -> Result<(), StoreError> {
    let current: u32 = conn.query_row("PRAGMA user_version", [], |r| r.get(0))?;
    if current == SCHEMA_VERSION {
        return Ok(());
    }
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let current: u32 = tx.query_row("PRAGMA user_version", [], |r| r.get(0))?;
    if current > SCHEMA_VERSION {
        return Err(StoreError::NewerSchema {
            found: current,
            known: SCHEMA_VERSION,
        });
    }
    for sql in &MIGRATIONS[current as usize..] {
        tx.execute_batch(sql)?;
    }
    tx.pragma_update(None, "user_version", SCHEMA_VERSION)?;
    tx.commit()?;
    Ok(())
}
