//! Durable relay storage, split by role: the registry (names, keys, owner keys), consent,
//! the queue, groups, the keys of other relays, and file reservations. SQLite for one node (the embedded default); PostgreSQL for several.
//!
//! Each role is a narrow trait with backend-owned errors converted to [`StorageError`] at the
//! backend's edge, so nothing outside a backend sees its database's types. Every backend
//! passes one contract suite (`tests/it/storage_contract.rs`).

use std::future::Future;

mod consent;
mod error;
mod groups;
mod metrics;
pub(crate) mod postgres;
mod queue;
mod registry;
mod relays;
mod report;
pub(crate) mod reservations;
mod snapshot;
mod sqlite;

pub(crate) use consent::hears_here;
pub use consent::{ConsentChange, ConsentLedger, ConsentOutcome, ConsentState, DENIALS_KEPT};
pub use error::StorageError;
pub use groups::{GroupCreation, Groups, RosterChange};
pub use metrics::StorageMetrics;
pub use postgres::{PostgresStorage, is_postgres_url, redact_url};
pub use queue::{
    Accepted, AckOutcome, CommitListener, Committed, CopyStatus, Epoch, Pending, Queue, Queued,
    QueuedCopy, Quota, queue_of,
};
pub use registry::{InviteDigest, Registration, Registry};
pub use relays::{RelayPin, RelayPins};
pub use report::{
    CheckReport, DamagedRecord, DatabaseReport, Loss, RecordKind, SpoolReport, Unclosed,
};
pub use reservations::{Reservations, Reserve, Which};
pub use snapshot::{
    AgentRecord, InviteRecord, MigrateError, Moved, RelationKind, RelationRecord, RelayPinRecord,
    RequestRecord, Snapshot, WaitingCopies, WaitingCopy,
};
pub use sqlite::{SqlitePins, SqliteStorage};

/// A whole backend: every role, over one database, with the relay's id and its metrics.
pub trait Storage: Registry + ConsentLedger + Queue + RelayPins + Groups + Reservations {
    /// This relay's stable id, which clients sign in their hello.
    fn relay_id(&self) -> &str;

    /// The series this storage records its writes in.
    fn metrics(&self) -> &StorageMetrics;

    /// A cheap liveness probe of the database, for `/healthz`: `Ok` when writes can be made.
    /// It may wait as long as the database does; the caller bounds the wait.
    fn check_health(&self) -> impl Future<Output = Result<(), StorageError>> + Send;
}
