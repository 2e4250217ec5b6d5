//! Errors from the local store.

use std::path::PathBuf;

use crate::protocol::ValidationError;

/// What went wrong in the store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// SQLite failed.
    #[error("database error: {0}")]
    Sqlite(#[from] rusqlite::Error),
    /// The database file could not be opened.
    #[error("cannot open the store at {path}: {source}")]
    Open {
        /// The database file.
        path: PathBuf,
        /// What SQLite said.
        source: rusqlite::Error,
    },
    /// The file was written by a newer mailslot.
    #[error(
        "the store has schema version {found}, newer than this build's {known}; upgrade mailslot"
    )]
    NewerSchema {
        /// The version in the file.
        found: u32,
        /// The newest version this build knows.
        known: u32,
    },
    /// An argument broke a limit.
    #[error(transparent)]
    Invalid(#[from] ValidationError),
    /// A stored row could not be read back.
    #[error("the store holds a corrupt {what}: {detail}")]
    Corrupt {
        /// Which kind of row.
        what: &'static str,
        /// What is wrong with it.
        detail: String,
    },
    /// No message id starts or ends with the part given.
    #[error("no message id starts or ends with {part}")]
    NoSuchMessage {
        /// What was given.
        part: String,
    },
    /// No memory id starts or ends with the part given.
    #[error("no memory id starts or ends with {part}")]
    NoSuchMemory {
        /// What was given.
        part: String,
    },
    /// Several ids start or end with the part given.
    #[error("{part} matches several {what} ({}, ...): give more of the id", some.join(", "))]
    AmbiguousId {
        /// What was given.
        part: String,
        /// What the ids name ("messages", "memories").
        what: &'static str,
        /// Some of the matching ids.
        some: Vec<String>,
    },
    /// The store's worker thread has stopped.
    #[error("the store's worker thread has stopped")]
    Closed,
}
