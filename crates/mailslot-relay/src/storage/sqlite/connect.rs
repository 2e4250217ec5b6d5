//! The database file's connections: the settings every connection gets, the writer's own,
//! and the pool of read connections. SQLite's errors become [`StorageError`] here.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rusqlite::Connection;
use rusqlite::config::DbConfig;
use tokio::sync::Semaphore;

use crate::storage::StorageError;

/// Read connections in the pool.
const READERS: usize = 4;
/// Database page size for new relay databases. A batch writes every page it touched to the
/// WAL, one frame at a time; at 4 KiB a busy batch spent a third of the writer's time on
/// frame writes, and 16 KiB pages cut flat-out CPU per message by a fifth.
pub(super) const PAGE_SIZE: i64 = 16 * 1024;
/// The writer's page cache, in KiB. SQLite's default 2 MiB is smaller than one busy batch:
/// it spilled dirty pages to the WAL mid-transaction and read them back.
const WRITER_CACHE_KIB: i64 = 64 * 1024;
/// WAL bytes kept on disk after the WAL restarts.
const WAL_KEEP_BYTES: i64 = 64 * 1024 * 1024;

/// SQLite's busy and locked answers pass if tried again; every other failure is kept as is.
impl From<rusqlite::Error> for StorageError {
    fn from(e: rusqlite::Error) -> Self {
        match e.sqlite_error_code() {
            Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked) => {
                StorageError::Unavailable(e.to_string())
            }
            _ => StorageError::Database(e.to_string()),
        }
    }
}

/// A connection to the existing database at `path`, for a command that changes it beside a
/// running relay or without one (`to` says what for: "make invites"): it must have this
/// build's schema, which only the relay brings up to date.
pub(super) fn open_beside(path: &Path, to: &str) -> Result<Connection, StorageError> {
    if !path.exists() {
        return Err(StorageError::Database(format!(
            "{} does not exist; start the relay with it once, then {to}",
            path.display()
        )));
    }
    let conn = open(path)?;
    let version = conn.query_row("PRAGMA user_version", [], |r| r.get::<_, i64>(0))? as usize;
    let current = super::schema::MIGRATIONS.len();
    if version != current {
        return Err(StorageError::Database(format!(
            "{} has schema {version}, this build {current}: start the relay with it once (it brings the schema up to date), then {to}",
            path.display()
        )));
    }
    Ok(conn)
}

/// A connection to the database at `path`, in WAL mode.
pub(super) fn open(path: &Path) -> Result<Connection, StorageError> {
    let conn = Connection::open(path)?;
    conn.busy_timeout(Duration::from_secs(10))?;
    // Only takes effect on a new database (before its first table).
    conn.pragma_update(None, "page_size", PAGE_SIZE)?;
    let _: String = conn.query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))?;
    // FULL, so checkpoints flush the WAL before copying it and the database after; the writer
    // alone commits with NORMAL and leaves the flush to the syncer (see `sync`).
    conn.pragma_update(None, "synchronous", "FULL")?;
    // Plans that do not depend on bound values: otherwise a statement with a `LIMIT ?` is
    // compiled again at each use, since rusqlite clears a cached statement's bindings.
    conn.set_db_config(DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG, true)?;
    Ok(conn)
}

/// Sets up the writer's connection for the writer thread.
pub(super) fn tune_writer(writer: &Connection) -> Result<(), StorageError> {
    // Checkpoints move the WAL into the database file with an fsync of their own; done by
    // the committing writer they would stall every send behind them, so a separate thread
    // does them without blocking writers.
    writer.pragma_update(None, "wal_autocheckpoint", 0)?;
    writer.pragma_update(None, "cache_size", -WRITER_CACHE_KIB)?;
    // A restarted WAL is truncated to this, so one burst does not hold its disk space.
    writer.pragma_update(None, "journal_size_limit", WAL_KEEP_BYTES)?;
    Ok(())
}

/// The read connections. Reads run on them in blocking threads, beside the writer.
pub(super) struct Readers {
    pool: Arc<Mutex<Vec<Connection>>>,
    /// One permit per connection: a reader waits here, never finds the pool empty.
    free: Arc<Semaphore>,
}

impl Readers {
    /// Opens the pool's connections to the database at `path`.
    pub(super) fn open(path: &Path) -> Result<Self, StorageError> {
        let pool = (0..READERS)
            .map(|_| open(path))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            pool: Arc::new(Mutex::new(pool)),
            free: Arc::new(Semaphore::new(READERS)),
        })
    }

    /// Runs `f` on a free read connection, waiting for one if all are busy.
    pub(super) async fn read<R: Send + 'static>(
        &self,
        f: impl FnOnce(&Connection) -> Result<R, StorageError> + Send + 'static,
    ) -> Result<R, StorageError> {
        let permit = self
            .free
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| StorageError::Closed)?;
        let readers = self.pool.clone();
        tokio::task::spawn_blocking(move || {
            let conn = readers.lock().map_err(|_| StorageError::Closed)?.pop();
            let Some(conn) = conn else {
                return Err(StorageError::Database(
                    "read pool out of step with its permits".into(),
                ));
            };
            let result = f(&conn);
            if let Ok(mut pool) = readers.lock() {
                pool.push(conn);
            }
            drop(permit);
            result
        })
        .await
        .map_err(|_| StorageError::Closed)?
    }
}

#[cfg(test)]
mod tests {
    use rusqlite::StatementStatus;

    use super::*;

    /// A cached statement with a `LIMIT ?` stays compiled whatever limit is bound.
    #[test]
    fn a_cached_statement_is_not_compiled_again_for_new_bindings() {
        let dir = tempfile::tempdir().unwrap();
        let conn = open(&dir.path().join("relay.db")).unwrap();
        let sql = "SELECT name FROM sqlite_master ORDER BY name LIMIT ?1";
        for limit in [1, 20, 5] {
            let mut stmt = conn.prepare_cached(sql).unwrap();
            let rows = stmt.query_map([limit], |r| r.get::<_, String>(0)).unwrap();
            assert_eq!(rows.count(), 0);
        }
        let stmt = conn.prepare_cached(sql).unwrap();
        assert_eq!(stmt.get_status(StatementStatus::RePrepare), 0);
    }
}
