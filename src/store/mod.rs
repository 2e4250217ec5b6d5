//! The agent's local store: one SQLite database (WAL, `synchronous=FULL`) holding messages,
//! threads, memories, contacts and their pinned keys, the outbox, and a little metadata.
//!
//! [`Store`] is synchronous; async code goes through [`StoreHandle`], which runs it on a
//! dedicated thread so SQLite never blocks the runtime.

mod attachments;
mod check;
mod contacts;
mod deliveries;
mod denials;
mod error;
mod groups;
mod handle;
mod idle;
mod lookup;
mod memories;
mod messages;
mod meta;
mod migrations;
mod outbox;
mod page;
mod parked;
mod receipts;
mod relays;
mod search;
mod sent;
mod shown;
mod time;

use std::path::{Path, PathBuf};
use std::time::Duration;

use rusqlite::config::DbConfig;
use rusqlite::{Connection, OpenFlags};

pub use attachments::AttachmentInfo;
pub use check::RowsChecked;
pub use contacts::{Contact, KeyCheck};
pub use deliveries::{Delivery, OpenCopy};
pub use denials::{DENIALS_SHOWN_FOR, Denial};
pub use error::StoreError;
pub use groups::{GroupMark, Membership};
pub use handle::StoreHandle;
pub use idle::{IdleClaim, IdlePath};
pub use lookup::{IdPart, MIN_ID_PART};
pub use memories::{MAX_MEMORY_BYTES, MAX_TAGS, MAX_TITLE_CHARS, Memory, MemoryDraft, Recalled};
pub use messages::{
    Direction, InboxQuery, OwnerCheck, OwnerVoice, ReceiptRecord, StoredMessage, Trust,
    UnreadSummary,
};
pub use meta::MAX_STATUS_BYTES;
pub use migrations::SCHEMA_VERSION;
pub use outbox::OutboxItem;
pub use page::Page;
pub use parked::{MAX_PARKED, PARKED_FOR, ParkedLetter, Parking};
pub use receipts::{Acknowledged, ReceiptOutcome};
pub use relays::PinnedRelay;
pub use search::{MAX_QUERY_CHARS, MAX_SEARCH_RESULTS};
pub use sent::{RecipientState, SentItem, SentState};
pub use shown::{MAX_SESSION_CHARS, SessionKey, Via};

/// How long a writer waits for another process's transaction before failing.
const BUSY_TIMEOUT: Duration = Duration::from_secs(10);

/// An open agent store.
pub struct Store {
    conn: Connection,
    path: PathBuf,
    /// How owner messages are checked as they are read; without it every one is shown as an
    /// unverified claim.
    owner_check: Option<OwnerCheck>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl Store {
    /// Opens (creating if needed) and migrates the store at `path`.
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        let open_err = |source| StoreError::Open {
            path: path.to_owned(),
            source,
        };
        let flags = OpenFlags::SQLITE_OPEN_READ_WRITE
            | OpenFlags::SQLITE_OPEN_CREATE
            | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let mut conn = Connection::open_with_flags(path, flags).map_err(open_err)?;
        conn.busy_timeout(BUSY_TIMEOUT).map_err(open_err)?;
        // journal_mode answers with a row, so it is read rather than updated.
        let mode: String = conn
            .query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))
            .map_err(open_err)?;
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(open_err(rusqlite::Error::InvalidParameterName(format!(
                "journal_mode is {mode}, not wal: put the store on a local file system"
            ))));
        }
        // FULL: a committed message survives power loss, since the relay deletes what we ack.
        conn.pragma_update(None, "synchronous", "FULL")
            .map_err(open_err)?;
        conn.pragma_update(None, "foreign_keys", "ON")
            .map_err(open_err)?;
        // The query planner's stability guarantee: without it SQLite plans a statement for the
        // values bound to it (a `LIMIT ?`, say) and compiles it again when they change, and
        // rusqlite clears a cached statement's bindings when it is put back, so every cached
        // statement with a `LIMIT ?` was compiled anew at each use (performance log, 2026-12-03).
        conn.set_db_config(DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG, true)
            .map_err(open_err)?;
        migrations::migrate(&mut conn)?;
        Ok(Self {
            conn,
            path: path.to_owned(),
            owner_check: None,
        })
    }

    /// Checks every owner message read from now on with `check` (the agent layer's, over
    /// the home's confirmed owner key).
    pub fn set_owner_check(&mut self, check: OwnerCheck) {
        self.owner_check = Some(check);
    }

    /// Starts a write transaction. IMMEDIATE takes the write lock up front, so a writer in
    /// another process makes this one wait (busy timeout) instead of failing on upgrade.
    fn write_tx(&mut self) -> rusqlite::Result<rusqlite::Transaction<'_>> {
        self.conn
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
    }

    /// Runs `read`'s statements in one read transaction: they see one snapshot, and the WAL's
    /// read lock is taken once instead of once per statement (a search runs two dozen).
    /// Inside a transaction already open, `read` just runs in it, so reads that are one read
    /// themselves (a search, the unread summary) can be grouped into one snapshot.
    pub fn reading<T>(
        &self,
        read: impl FnOnce(&Self) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        if !self.conn.is_autocommit() {
            return read(self);
        }
        let tx = self.conn.unchecked_transaction()?;
        let out = read(self)?;
        tx.commit()?;
        Ok(out)
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Writes a consistent copy of the whole store to `path` (`VACUUM INTO`), which must not
    /// exist; other processes may keep writing meanwhile.
    pub fn snapshot(&self, path: &Path) -> Result<(), StoreError> {
        let target = path.to_str().ok_or_else(|| {
            crate::protocol::ValidationError::new(
                "path",
                format!("{} is not UTF-8; choose another folder", path.display()),
            )
        })?;
        self.conn.execute("VACUUM INTO ?1", [target])?;
        Ok(())
    }

    /// Runs SQLite's own consistency check; `Ok` means it said "ok".
    pub fn check_integrity(&self) -> Result<(), StoreError> {
        let result: String = self
            .conn
            .query_row("PRAGMA integrity_check", [], |r| r.get(0))?;
        if result == "ok" {
            Ok(())
        } else {
            Err(StoreError::Corrupt {
                what: "database",
                detail: result,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use rusqlite::StatementStatus;

    use super::*;

    /// A cached statement with a `LIMIT ?` stays compiled whatever limit is bound (the
    /// planner's stability guarantee; without it every use compiled it anew).
    #[test]
    fn a_cached_statement_is_not_compiled_again_for_new_bindings() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("store.db")).unwrap();
        let sql = "SELECT seq FROM messages WHERE direction = 'in' ORDER BY seq DESC LIMIT ?1";
        for limit in [1, 20, 5] {
            let mut stmt = store.conn.prepare_cached(sql).unwrap();
            let rows = stmt.query_map([limit], |r| r.get::<_, i64>(0)).unwrap();
            assert_eq!(rows.count(), 0);
        }
        let stmt = store.conn.prepare_cached(sql).unwrap();
        assert_eq!(stmt.get_status(StatementStatus::RePrepare), 0);
    }

    /// A search re-ranks its candidates by their times, read from their index, not from each
    /// whole row (migration 14).
    #[test]
    fn a_search_reads_its_candidates_times_from_their_index() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("store.db")).unwrap();
        let plan = store.plan(&search::times_sql(&messages::MESSAGES_FTS));
        assert!(
            plan.iter()
                .any(|step| step.contains("USING COVERING INDEX messages_recency")),
            "{plan:?}"
        );
    }

    /// The watcher's read starts at its position on the primary key: it neither reads nor
    /// sorts every received message (it runs ten times a second).
    #[test]
    fn the_watchers_read_starts_at_its_position() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("store.db")).unwrap();
        let plan = store.plan(&messages::arrived_since_sql());
        assert_eq!(
            plan[0], "SEARCH messages USING INTEGER PRIMARY KEY (rowid>?)",
            "{plan:?}"
        );
        assert!(
            !plan.iter().any(|step| step.contains("TEMP B-TREE")),
            "{plan:?}"
        );
    }
}
