//! `mailslot relay migrate`: a stopped SQLite relay moved into a PostgreSQL database, where
//! several nodes can then serve it. The SQLite backend reads ([`SqliteStorage::export`]), the
//! PostgreSQL backend writes ([`PostgresStorage::import`]); this only joins them.

use std::path::Path;

use super::storage::{MigrateError, Moved, PostgresStorage, SqliteStorage, StorageError};

/// Moves the SQLite relay database at `from` (and its spool) into the empty PostgreSQL
/// database at `to`, in one transaction there; `from` is only read. The caller makes sure no
/// relay runs on `from`.
pub async fn migrate(from: &Path, to: &str) -> Result<Moved, MigrateError> {
    let from = from.to_owned();
    let snapshot = tokio::task::spawn_blocking(move || SqliteStorage::export(&from))
        .await
        .map_err(|e| StorageError::Database(format!("reading the SQLite relay failed: {e}")))??;
    PostgresStorage::import(to, snapshot).await
}
