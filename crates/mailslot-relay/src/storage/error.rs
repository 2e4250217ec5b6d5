//! Why storage failed, the same for every backend: each backend converts its database's
//! errors into this at its edge.

/// Why storage failed. Logic refusals (quota, name taken) are results, not errors.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    /// The database cannot be reached or is busy for now (connection lost, restarting, a
    /// conflicting transaction): the same request may succeed if tried again.
    #[error("relay database unavailable: {0}")]
    Unavailable(String),
    /// The database failed in a way trying again will not fix (disk full, damage, a bug).
    #[error("relay database error: {0}")]
    Database(String),
    /// The storage worker stopped (after a failed write, or at shutdown).
    #[error("the relay's storage worker has stopped")]
    Closed,
}

impl StorageError {
    /// Whether trying the same request again later can help.
    pub fn retry_can_help(&self) -> bool {
        matches!(self, StorageError::Unavailable(_))
    }
}
