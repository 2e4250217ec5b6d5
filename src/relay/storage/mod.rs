//! Durable relay storage behind one trait: registrations and per-recipient queues of sealed
//! envelopes. SQLite now (one node); the trait is shaped for PostgreSQL later (many nodes).

mod sqlite;

use std::future::Future;

use crate::protocol::{AgentName, MessageId, PublicKeys, Seq};

pub use sqlite::SqliteStorage;

/// Why storage failed. Logic refusals (quota, name taken) are results, not errors.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    /// The database failed.
    #[error("relay database error: {0}")]
    Database(String),
    /// The storage worker stopped.
    #[error("the relay's storage worker has stopped")]
    Closed,
}

impl From<rusqlite::Error> for StorageError {
    fn from(e: rusqlite::Error) -> Self {
        StorageError::Database(e.to_string())
    }
}

/// The outcome of a registration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Registration {
    /// The name is now bound to the keys.
    Created,
    /// The name was already bound to these same keys.
    Unchanged,
    /// The name is bound to other keys; nothing changed.
    NameTaken,
}

/// One recipient's copy of an envelope, serialized.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Copy {
    /// Who gets it.
    pub recipient: AgentName,
    /// The canonical envelope bytes, with only this recipient's key.
    pub envelope: Vec<u8>,
}

/// Per-recipient queue limits, checked atomically with the insert.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quota {
    /// Messages waiting.
    pub count: u64,
    /// Bytes waiting.
    pub bytes: u64,
}

/// The outcome of [`Storage::accept`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Accepted {
    /// Stored; these recipients have new mail.
    Stored(Vec<AgentName>),
    /// Every copy was stored before (a re-send); nothing changed.
    Duplicate,
    /// A recipient's queue is full; nothing was stored.
    QuotaFull(AgentName),
}

/// A queued envelope.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Queued {
    /// Its sequence number.
    pub seq: Seq,
    /// The canonical envelope bytes.
    pub envelope: Vec<u8>,
    /// When the relay accepted it, in Unix milliseconds.
    pub accepted_at_ms: i64,
}

/// What the relay stores. Every write is durable before its future resolves.
pub trait Storage: Send + Sync + 'static {
    /// This relay's stable id, which clients sign in their hello.
    fn relay_id(&self) -> &str;

    /// Binds `name` to `keys`, first come first served.
    fn register(
        &self,
        name: AgentName,
        keys: PublicKeys,
    ) -> impl Future<Output = Result<Registration, StorageError>> + Send;

    /// The keys registered for `name`.
    fn keys(
        &self,
        name: AgentName,
    ) -> impl Future<Output = Result<Option<PublicKeys>, StorageError>> + Send;

    /// Stores copies of message `id` from `sender`, all or none, unless a queue is full.
    /// Copies already stored (same sender, id and recipient) are skipped.
    fn accept(
        &self,
        sender: AgentName,
        id: MessageId,
        copies: Vec<Copy>,
        quota: Quota,
        expires_at_ms: i64,
    ) -> impl Future<Output = Result<Accepted, StorageError>> + Send;

    /// Up to `limit` queued envelopes for `agent` after `after`, in order.
    fn pending(
        &self,
        agent: AgentName,
        after: Seq,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<Queued>, StorageError>> + Send;

    /// Deletes everything for `agent` up to and including `upto`; returns how many.
    fn ack(
        &self,
        agent: AgentName,
        upto: Seq,
    ) -> impl Future<Output = Result<u64, StorageError>> + Send;

    /// How many messages wait for `agent`.
    fn waiting(&self, agent: AgentName) -> impl Future<Output = Result<u64, StorageError>> + Send;

    /// Deletes envelopes that expired before `now_ms`; returns how many.
    fn expire(&self, now_ms: i64) -> impl Future<Output = Result<u64, StorageError>> + Send;
}
