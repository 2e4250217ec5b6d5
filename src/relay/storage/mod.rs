//! Durable relay storage behind one trait: registrations and per-recipient queues of sealed
//! envelopes. SQLite for one node (the embedded default); PostgreSQL for several nodes sharing
//! one database.

mod postgres;
mod report;
mod sqlite;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::protocol::{
    AgentName, MessageId, OwnerKey, Policy, PublicKeys, RequestCode, RequestView, Seq,
};

pub use postgres::{PostgresStorage, is_postgres_url, redact_url};
pub use report::{
    CheckReport, DamagedRecord, DatabaseReport, Loss, RecordKind, SpoolReport, Unclosed,
};
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
    /// The invite is unknown or used; nothing changed.
    BadInvite,
    /// The name was retired and is held until then (Unix ms); nothing changed.
    Retired(i64),
}

/// The SHA-256 digest of an invite token: all a relay keeps of it.
pub type InviteDigest = [u8; 32];

/// One recipient's copy of an envelope, serialized.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Copy {
    /// Who gets it.
    pub recipient: AgentName,
    /// The canonical envelope bytes, with only this recipient's key.
    pub envelope: Arc<[u8]>,
}

/// A copy just made durable, announced to the commit listener in commit order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Committed {
    /// Who gets it.
    pub recipient: AgentName,
    /// Its sequence number.
    pub seq: Seq,
    /// The canonical envelope bytes.
    pub envelope: Arc<[u8]>,
    /// When the relay accepted it, in Unix milliseconds.
    pub accepted_at_ms: i64,
}

/// Called after every commit, on the storage's writer, with the copies it made durable in
/// commit order. It must not block.
pub type CommitListener = Box<dyn Fn(Vec<Committed>) + Send + Sync>;

/// How a backend's writes went, for `/metrics`. Clones share the same series.
#[derive(Clone, Debug)]
pub struct StorageMetrics {
    /// Seconds from a write's arrival at the storage to its answer.
    pub write_seconds: Histogram,
    /// Seconds one batch took to apply and commit (without the flush).
    pub commit_seconds: Histogram,
    /// Writes per batch.
    pub batch_writes: Histogram,
    /// Seconds one flush to disk took.
    pub flush_seconds: Histogram,
    /// Seconds the writer stood still to restart its log (SQLite's WAL restart).
    pub log_restart_seconds: Histogram,
    /// Spool records found damaged when the storage opened (each one is logged).
    pub spool_corrupt_records: Counter,
    /// Queued copies lost with them.
    pub spool_lost_copies: Counter,
}

impl StorageMetrics {
    /// Empty series.
    pub fn new() -> Self {
        // 25 µs to ~1.4 s, each bucket 1.5 times the last: fine enough to read a p99 off.
        let seconds = || Histogram::new(exponential_buckets(0.000_025, 1.5, 28));
        Self {
            write_seconds: seconds(),
            commit_seconds: seconds(),
            batch_writes: Histogram::new(exponential_buckets(1.0, 2.0, 11)),
            flush_seconds: seconds(),
            log_restart_seconds: seconds(),
            spool_corrupt_records: Counter::default(),
            spool_lost_copies: Counter::default(),
        }
    }

    /// Adds the series to `registry`, named `storage_*`.
    pub fn register(&self, registry: &mut Registry) {
        let series = [
            (
                "storage_write_seconds",
                "Time from a write's arrival at storage to its answer (durable or refused)",
                &self.write_seconds,
            ),
            (
                "storage_commit_seconds",
                "Time to apply and commit one batch of writes, before its flush",
                &self.commit_seconds,
            ),
            (
                "storage_batch_writes",
                "Writes committed together in one batch",
                &self.batch_writes,
            ),
            (
                "storage_flush_seconds",
                "Time one flush of the log to disk took",
                &self.flush_seconds,
            ),
            (
                "storage_log_restart_seconds",
                "Time the writer stood still to restart its log",
                &self.log_restart_seconds,
            ),
        ];
        for (name, help, histogram) in series {
            registry.register(name, help, histogram.clone());
        }
        registry.register(
            "storage_spool_corrupt_records",
            "Spool records found damaged when the storage opened, each logged with where it was",
            self.spool_corrupt_records.clone(),
        );
        registry.register(
            "storage_spool_lost_copies",
            "Queued copies lost with the damaged spool records",
            self.spool_lost_copies.clone(),
        );
    }
}

impl Default for StorageMetrics {
    fn default() -> Self {
        Self::new()
    }
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
    /// A recipient does not accept mail from the sender (policy or block); nothing was stored.
    NotAllowed(AgentName),
}

/// A write already queued: resolves once it is durable (or failed).
pub type Pending<T> = Pin<Box<dyn Future<Output = Result<T, StorageError>> + Send + 'static>>;

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

/// A consent change, applied durably like every write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConsentChange {
    /// `from` asks `to`; refused beyond `max_pending` open requests by `from`.
    Request {
        /// The requester.
        from: AgentName,
        /// The target.
        to: AgentName,
        /// The requester's note.
        note: String,
        /// The fresh code.
        code: RequestCode,
        /// When it lapses (Unix ms).
        expires_at_ms: i64,
        /// Open requests a requester may have.
        max_pending: u32,
    },
    /// `target` approves `requester`'s request, which must carry `code`: both become contacts.
    Approve {
        /// The approving agent.
        target: AgentName,
        /// The requester.
        requester: AgentName,
        /// The code.
        code: RequestCode,
    },
    /// `target` denies `requester`'s request.
    Deny {
        /// The denying agent.
        target: AgentName,
        /// The requester.
        requester: AgentName,
    },
    /// `owner` blocks `peer` (ending any contact and pending requests between them).
    Block {
        /// The blocking agent.
        owner: AgentName,
        /// The blocked agent.
        peer: AgentName,
    },
    /// `owner` lifts a block on `peer`.
    Unblock {
        /// The agent.
        owner: AgentName,
        /// The unblocked agent.
        peer: AgentName,
    },
    /// `owner` ends its contact with `peer`, both ways.
    Remove {
        /// The agent.
        owner: AgentName,
        /// The former contact.
        peer: AgentName,
    },
    /// `owner` sets its policy.
    SetPolicy {
        /// The agent.
        owner: AgentName,
        /// The policy.
        policy: Policy,
    },
}

/// The outcome of a [`ConsentChange`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConsentOutcome {
    /// Applied. For approvals and denials: the requester, to be told.
    Applied(Option<AgentName>),
    /// A request to an agent that is already a contact.
    AlreadyContacts,
    /// The requester has too many open requests.
    TooManyPending,
    /// The target blocks the requester or is closed.
    NotAllowed,
    /// No open request with that code, or none from that agent.
    NoSuchRequest,
    /// The note carries the code of an open request to the same target, which its model
    /// must never be handed.
    NoteHasCode,
}

/// An agent's consent state.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ConsentState {
    /// Its own policy, if it set one.
    pub policy: Option<Policy>,
    /// Requests to it.
    pub incoming: Vec<RequestView>,
    /// Requests by it.
    pub outgoing: Vec<RequestView>,
    /// Its contacts.
    pub contacts: Vec<AgentName>,
    /// Whom it blocks.
    pub blocked: Vec<AgentName>,
}

/// What the relay stores. Every write is durable before its future resolves.
pub trait Storage: Send + Sync + 'static {
    /// This relay's stable id, which clients sign in their hello.
    fn relay_id(&self) -> &str;

    /// Sets the listener told about every stored copy after its commit (once; later calls are
    /// ignored). The relay pushes them straight to online recipients.
    fn on_commit(&self, listener: CommitListener);

    /// The series this storage records its writes in.
    fn metrics(&self) -> &StorageMetrics;

    /// Binds `name` to `keys`, first come first served. With `invite` (the digest of an invite
    /// token), a new name uses the invite up in the same write, and is refused without a
    /// valid unused one.
    fn register(
        &self,
        name: AgentName,
        keys: PublicKeys,
        invite: Option<InviteDigest>,
    ) -> impl Future<Output = Result<Registration, StorageError>> + Send;

    /// The keys registered for `name`.
    fn keys(
        &self,
        name: AgentName,
    ) -> impl Future<Output = Result<Option<PublicKeys>, StorageError>> + Send;

    /// Retires `name` (its own request): until `until_ms` the name is held but answers as
    /// unknown, then it is free; contacts, blocks, requests, listing and owner key go at once.
    /// Returns whether there was such an agent. Mail still queued for it is the caller's.
    fn retire(
        &self,
        name: AgentName,
        until_ms: i64,
    ) -> impl Future<Output = Result<bool, StorageError>> + Send;

    /// The owner key registered for `name`: the key its consent changes must be signed by.
    fn owner(
        &self,
        name: AgentName,
    ) -> impl Future<Output = Result<Option<OwnerKey>, StorageError>> + Send;

    /// Registers `key` as `name`'s owner key if the one registered now is `current` (`None`:
    /// none yet), atomically; returns whether it did.
    fn set_owner(
        &self,
        name: AgentName,
        key: OwnerKey,
        current: Option<OwnerKey>,
    ) -> impl Future<Output = Result<bool, StorageError>> + Send;

    /// Stores copies of message `id` from `sender`, all or none: refused when a recipient does
    /// not accept the sender (under `default` for those without a policy) or its queue is full.
    /// Copies already stored (same sender, id and recipient) are skipped. The write is queued
    /// when this is called, so writes are applied in call order.
    fn accept(
        &self,
        sender: AgentName,
        id: MessageId,
        copies: Vec<Copy>,
        quota: Quota,
        expires_at_ms: i64,
        default: Policy,
    ) -> Pending<Accepted>;

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

    /// Applies a consent change.
    fn consent(
        &self,
        change: ConsentChange,
    ) -> impl Future<Output = Result<ConsentOutcome, StorageError>> + Send;

    /// Whether `requester` has an open request to `target` with `code` (a dry run of
    /// [`ConsentChange::Approve`]).
    fn has_request(
        &self,
        target: AgentName,
        requester: AgentName,
        code: RequestCode,
        now_ms: i64,
    ) -> impl Future<Output = Result<bool, StorageError>> + Send;

    /// An agent's consent state, open requests only.
    fn consent_state(
        &self,
        agent: AgentName,
        now_ms: i64,
    ) -> impl Future<Output = Result<ConsentState, StorageError>> + Send;

    /// Puts `agent` in the public directory with `description`, or (`None`) takes it out.
    fn set_listing(
        &self,
        agent: AgentName,
        description: Option<String>,
    ) -> impl Future<Output = Result<(), StorageError>> + Send;

    /// The public directory: agents that opted in, with their keys and descriptions, by name.
    fn directory(
        &self,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<(AgentName, PublicKeys, String)>, StorageError>> + Send;

    /// Messages waiting in all queues.
    fn total_waiting(&self) -> impl Future<Output = Result<u64, StorageError>> + Send;

    /// Deletes envelopes that expired before `now_ms`; returns how many.
    fn expire(&self, now_ms: i64) -> impl Future<Output = Result<u64, StorageError>> + Send;
}
