//! The PostgreSQL backend: several relay nodes share one database. Sends are batched by each
//! node's writer task into one transaction (`batch`); everything else runs on the pool in a
//! transaction of its own. Per-recipient sequence numbers come from the recipient's mailbox
//! row, locked until the commit, so they commit in order (see `schema`).
//!
//! Files by role: `registry` (registrations, keys, owners, listings, invites), `consent`,
//! `queue` (reads, acks, the delivery lease, expiry), `reservations` (file reservations), `batch` (the group-committing writer),
//! `schema` (migrations), `connect` (URL, TLS, pool), `import` (a relay moved in from another
//! backend).

mod batch;
mod connect;
mod consent;
mod groups;
mod import;
mod pipeline;
mod queue;
mod registry;
mod relays;
mod reservations;
mod schema;

use super::{RelayPin, RelayPinRecord, RelayPins, Reservations, Reserve, Which};
use crate::protocol::{
    ProjectName, RelayKey, RelayName, Reservation, ReservationId, ReservationRequest, Ttl,
};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use deadpool_postgres::{Object, Pool};
use tokio::sync::{mpsc, oneshot};

pub use connect::{Notifier, Target, is_postgres_url, redact_url};

use super::{
    Accepted, AckOutcome, CommitListener, ConsentChange, ConsentLedger, ConsentOutcome,
    ConsentState, CopyStatus, Epoch, GroupCreation, Groups, InviteDigest, MigrateError, Moved,
    Pending, Queue, Queued, QueuedCopy, Quota, Registration, Registry, RosterChange, Snapshot,
    Storage, StorageError, StorageMetrics,
};
use crate::protocol::{
    Address, AgentName, Bounce, CopyKey, GroupView, KeyRotation, MessageId, OwnerKey, Policy,
    PublicKeys, RequestCode, Seq, Shown,
};

/// PostgreSQL-backed relay storage: one per relay node.
pub struct PostgresStorage {
    target: Target,
    relay_id: String,
    node_id: String,
    pool: Pool,
    /// Sends, to the writer task, in call order. Dropping it ends the task.
    writes: mpsc::UnboundedSender<batch::AcceptOp>,
    listener: Arc<OnceLock<CommitListener>>,
    metrics: StorageMetrics,
}

impl From<tokio_postgres::Error> for StorageError {
    fn from(e: tokio_postgres::Error) -> Self {
        StorageError::Database(describe(&e))
    }
}

impl From<deadpool_postgres::PoolError> for StorageError {
    fn from(e: deadpool_postgres::PoolError) -> Self {
        StorageError::Database(format!("no connection to the relay database: {e}"))
    }
}

/// The server's own words for a database error (with its SQLSTATE), else the client's.
fn describe(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!(
            "PostgreSQL {} {}: {}",
            db.severity(),
            db.code().code(),
            db.message()
        ),
        None => match std::error::Error::source(e) {
            Some(cause) => format!("PostgreSQL connection: {e}: {cause}"),
            None => format!("PostgreSQL connection: {e}"),
        },
    }
}

/// A transaction that failed only because it met another one (deadlock, serialization) and
/// changed nothing: running it again can succeed.
fn retryable(e: &tokio_postgres::Error) -> bool {
    use tokio_postgres::error::SqlState;
    e.code().is_some_and(|c| {
        *c == SqlState::T_R_DEADLOCK_DETECTED || *c == SqlState::T_R_SERIALIZATION_FAILURE
    })
}

fn now_ms() -> i64 {
    jiff::Timestamp::now().as_millisecond()
}

/// `n` random bytes as lowercase hex.
fn random_hex(n: usize) -> Result<String, StorageError> {
    let mut raw = vec![0u8; n];
    getrandom::fill(&mut raw).map_err(|e| StorageError::Database(format!("no randomness: {e}")))?;
    Ok(raw.iter().map(|b| format!("{b:02x}")).collect())
}

/// A count, sequence number or epoch as stored (`BIGINT`), which is never negative.
fn unsigned(value: i64, what: &str) -> Result<u64, StorageError> {
    u64::try_from(value)
        .map_err(|_| StorageError::Database(format!("a stored {what} is negative: {value}")))
}

/// A sequence number for a query; one past `i64::MAX` means "all of them".
fn seq_to_db(seq: Seq) -> i64 {
    i64::try_from(seq).unwrap_or(i64::MAX)
}

impl PostgresStorage {
    /// Connects to the database at `url` (`postgres://USER@HOST:PORT/DB`, with
    /// `?sslmode=require` for TLS, verified against the platform's roots or `SSL_CERT_FILE`),
    /// brings its schema up to date under an advisory lock, and starts this node's writer.
    pub async fn connect(url: &str) -> Result<Self, StorageError> {
        let target = Target::parse(url)?;
        let shown = target.shown().to_owned();
        let pool = target.pool()?;
        let mut client = pool
            .get()
            .await
            .map_err(|e| connect::unreachable(&shown, &e))?;
        let relay_id = schema::migrate(&mut client).await?;
        drop(client);
        let node_id = format!("node-{}", random_hex(6)?);
        let listener: Arc<OnceLock<CommitListener>> = Arc::new(OnceLock::new());
        let metrics = StorageMetrics::new();
        let (writes, queue) = mpsc::unbounded_channel();
        tokio::spawn(batch::run(
            batch::Writer {
                pool: pool.clone(),
                connection: None,
                listener: listener.clone(),
                metrics: metrics.clone(),
                node_id: node_id.clone(),
            },
            queue,
        ));
        tracing::info!(database = %shown, node = %node_id, relay = %relay_id, "relay storage on PostgreSQL");
        Ok(Self {
            target,
            relay_id,
            node_id,
            pool,
            writes,
            listener,
            metrics,
        })
    }

    /// Moves `snapshot` (another relay's data, see [`Snapshot`]) into the database at `url`,
    /// bringing its schema up to date first: in one transaction, refused unless the database
    /// holds no agents and no mail, so a failure or a refusal leaves none of the relay in it
    /// (the schema stays, as any node would make it). The relay id
    /// carries over; start the nodes after it returns (a node reads the id when it starts).
    pub async fn import(url: &str, snapshot: Snapshot) -> Result<Moved, MigrateError> {
        let target = Target::parse(url)?;
        let pool = target.pool()?;
        let mut client = pool
            .get()
            .await
            .map_err(|e| connect::unreachable(target.shown(), &e))?;
        schema::migrate(&mut client).await?;
        import::import(&mut client, target.shown(), snapshot).await
    }

    /// This node's id, made at connect: it tags the `mailslot_wake` and `mailslot_lease`
    /// notifications this node sends, so a node can tell its own from the others'.
    pub fn node_id(&self) -> &str {
        &self.node_id
    }

    /// Where the database is, to open a `LISTEN` connection of its own.
    pub fn target(&self) -> &Target {
        &self.target
    }

    /// Sends notifications to the other nodes over this node's pool.
    pub fn notifier(&self) -> Notifier {
        Notifier(self.pool.clone())
    }

    /// Adds invites (their digests) for a relay that registers by invite only.
    pub async fn add_invites(&self, digests: &[InviteDigest]) -> Result<(), StorageError> {
        registry::add_invites(&mut self.client().await?, digests).await
    }

    async fn client(&self) -> Result<Object, StorageError> {
        Ok(self.pool.get().await?)
    }
}

impl Registry for PostgresStorage {
    async fn register(
        &self,
        name: AgentName,
        keys: PublicKeys,
        invite: Option<InviteDigest>,
    ) -> Result<Registration, StorageError> {
        registry::register(&mut self.client().await?, &name, &keys, invite.as_ref()).await
    }

    async fn keys(&self, name: AgentName) -> Result<Option<PublicKeys>, StorageError> {
        registry::keys(&self.client().await?, &name).await
    }

    async fn rotate(&self, rotation: KeyRotation) -> Result<bool, StorageError> {
        registry::rotate(&mut self.client().await?, rotation).await
    }

    async fn rotations(&self, name: AgentName) -> Result<Vec<KeyRotation>, StorageError> {
        registry::rotations(&self.client().await?, &name).await
    }

    async fn retire(&self, name: AgentName, until_ms: i64) -> Result<bool, StorageError> {
        registry::retire(&mut self.client().await?, &name, until_ms).await
    }

    async fn owner(&self, name: AgentName) -> Result<Option<OwnerKey>, StorageError> {
        registry::owner(&self.client().await?, &name).await
    }

    async fn set_owner(
        &self,
        name: AgentName,
        key: OwnerKey,
        current: Option<OwnerKey>,
    ) -> Result<bool, StorageError> {
        registry::set_owner(&mut self.client().await?, &name, key, current).await
    }

    async fn set_listing(
        &self,
        agent: AgentName,
        description: Option<String>,
    ) -> Result<(), StorageError> {
        registry::set_listing(&self.client().await?, &agent, description).await
    }

    async fn directory(
        &self,
        limit: usize,
    ) -> Result<Vec<(AgentName, PublicKeys, String)>, StorageError> {
        registry::directory(&self.client().await?, limit).await
    }
}

impl Groups for PostgresStorage {
    async fn create_group(
        &self,
        group: GroupView,
        max: usize,
    ) -> Result<GroupCreation, StorageError> {
        groups::create(&mut self.client().await?, &group, max).await
    }

    async fn group(&self, name: AgentName) -> Result<Option<GroupView>, StorageError> {
        groups::read(&self.client().await?, &name).await
    }

    async fn add_member(
        &self,
        group: AgentName,
        member: Address,
        max: usize,
    ) -> Result<RosterChange, StorageError> {
        groups::add_member(&mut self.client().await?, &group, &member, max).await
    }

    async fn remove_member(
        &self,
        group: AgentName,
        member: Address,
    ) -> Result<RosterChange, StorageError> {
        groups::remove_member(&mut self.client().await?, &group, &member).await
    }

    async fn groups_of(
        &self,
        member: Address,
        owner: Option<OwnerKey>,
        limit: usize,
    ) -> Result<Vec<GroupView>, StorageError> {
        groups::of(&self.client().await?, &member, owner, limit).await
    }
}

impl ConsentLedger for PostgresStorage {
    async fn consent(&self, change: ConsentChange) -> Result<ConsentOutcome, StorageError> {
        consent::consent(&mut self.client().await?, &change).await
    }

    async fn has_request(
        &self,
        target: AgentName,
        requester: AgentName,
        code: RequestCode,
        now_ms: i64,
    ) -> Result<bool, StorageError> {
        consent::has_request(&self.client().await?, &target, &requester, &code, now_ms).await
    }

    async fn take_denials(
        &self,
        requester: AgentName,
        now_ms: i64,
    ) -> Result<Vec<AgentName>, StorageError> {
        consent::take_denials(&self.client().await?, &requester, now_ms).await
    }

    async fn consent_state(
        &self,
        agent: AgentName,
        now_ms: i64,
    ) -> Result<ConsentState, StorageError> {
        consent::state(&self.client().await?, &agent, now_ms).await
    }
}

impl Queue for PostgresStorage {
    fn on_commit(&self, listener: CommitListener) {
        let _ = self.listener.set(listener);
    }

    fn accept(
        &self,
        sender: AgentName,
        id: MessageId,
        copies: Vec<QueuedCopy>,
        quota: Quota,
        expires_at_ms: i64,
        default: Policy,
    ) -> Pending<Accepted> {
        let (reply, answer) = oneshot::channel();
        let arrived = Instant::now();
        let queued = self.writes.send(batch::AcceptOp {
            sender,
            id,
            copies,
            quota,
            expires_at_ms,
            default,
            reply,
        });
        let latency = self.metrics.write_seconds.clone();
        Box::pin(async move {
            queued.map_err(|_| StorageError::Closed)?;
            let answer = answer.await.map_err(|_| StorageError::Closed)?;
            latency.observe(arrived.elapsed().as_secs_f64());
            answer
        })
    }

    async fn pending(
        &self,
        agent: AgentName,
        after: Seq,
        limit: usize,
    ) -> Result<Vec<Queued>, StorageError> {
        queue::pending(&self.client().await?, &agent, after, limit).await
    }

    /// The agent's epoch goes up by one; a `mailslot_lease` notification tells the other
    /// nodes at the commit. The lease records whether the session is hidden.
    async fn claim(&self, agent: AgentName, shown: Shown) -> Result<Epoch, StorageError> {
        queue::claim(&mut self.client().await?, (&agent, shown), &self.node_id)
            .await
            .map(Epoch::new)
    }

    /// The lease row forgets its node, and a `mailslot_release` notification tells the node
    /// that may be waiting to claim.
    async fn release(&self, agent: AgentName, epoch: Epoch) -> Result<(), StorageError> {
        queue::release(&self.client().await?, &agent, epoch.get(), &self.node_id).await
    }

    async fn ack(
        &self,
        agent: AgentName,
        upto: Seq,
        epoch: Epoch,
    ) -> Result<AckOutcome, StorageError> {
        Ok(
            match queue::ack_fenced(self.client().await?, &agent, upto, epoch.get()).await? {
                Some(n) => AckOutcome::Applied(n),
                None => AckOutcome::Fenced,
            },
        )
    }

    async fn waiting(&self, agent: AgentName) -> Result<u64, StorageError> {
        queue::waiting(&self.client().await?, &agent).await
    }

    async fn total_waiting(&self) -> Result<u64, StorageError> {
        queue::total_waiting(&self.client().await?).await
    }

    async fn relay_mailboxes(&self) -> Result<Vec<RelayName>, StorageError> {
        queue::relay_mailboxes(&self.client().await?).await
    }

    async fn expire(&self, now_ms: i64) -> Result<Vec<(AgentName, Bounce)>, StorageError> {
        queue::expire(&mut self.client().await?, now_ms).await
    }

    async fn remote_bounce_senders(&self, limit: usize) -> Result<Vec<AgentName>, StorageError> {
        queue::remote_bounce_senders(&self.client().await?, limit).await
    }

    async fn bounces(&self, sender: AgentName, limit: usize) -> Result<Vec<Bounce>, StorageError> {
        queue::bounces(&self.client().await?, &sender, limit).await
    }

    async fn copy_statuses(
        &self,
        sender: AgentName,
        keys: Vec<CopyKey>,
    ) -> Result<Vec<CopyStatus>, StorageError> {
        queue::copy_statuses(&self.client().await?, &sender, &keys).await
    }

    async fn record_bounces(
        &self,
        sender: AgentName,
        bounces: Vec<Bounce>,
    ) -> Result<(), StorageError> {
        queue::record_bounces(&self.client().await?, &sender, &bounces).await
    }

    async fn ack_bounces(
        &self,
        sender: AgentName,
        keys: Vec<CopyKey>,
    ) -> Result<u64, StorageError> {
        queue::ack_bounces(&self.client().await?, &sender, &keys).await
    }
}

impl RelayPins for PostgresStorage {
    async fn pin_relay(&self, relay: RelayName, key: RelayKey) -> Result<RelayPin, StorageError> {
        relays::pin(&self.client().await?, &relay, &key).await
    }

    async fn pin_own_key(&self, key: RelayKey) -> Result<RelayPin, StorageError> {
        relays::pin_own(&self.client().await?, &key).await
    }

    async fn pinned_relay(&self, relay: RelayName) -> Result<Option<RelayKey>, StorageError> {
        relays::pinned(&self.client().await?, &relay).await
    }

    async fn relays_pinned_with(&self, key: RelayKey) -> Result<Vec<RelayName>, StorageError> {
        relays::named(&self.client().await?, &key).await
    }

    async fn relay_pins(&self) -> Result<Vec<RelayPinRecord>, StorageError> {
        relays::all(&self.client().await?).await
    }

    async fn unpin_relay(&self, relay: RelayName) -> Result<Option<RelayKey>, StorageError> {
        relays::unpin(&self.client().await?, &relay).await
    }

    async fn repin_relay(
        &self,
        relay: RelayName,
        was: Option<RelayKey>,
        key: RelayKey,
    ) -> Result<bool, StorageError> {
        relays::repin(&self.client().await?, &relay, was.as_ref(), &key).await
    }
}

impl Reservations for PostgresStorage {
    async fn reserve(
        &self,
        holder: AgentName,
        wanted: ReservationRequest,
        now_ms: i64,
    ) -> Result<Reserve, StorageError> {
        reservations::reserve(&mut self.client().await?, &holder, wanted, now_ms).await
    }

    async fn release_reserved(
        &self,
        holder: AgentName,
        project: ProjectName,
        which: Which,
        now_ms: i64,
    ) -> Result<Vec<ReservationId>, StorageError> {
        reservations::release(&mut self.client().await?, &holder, &project, &which, now_ms).await
    }

    async fn renew_reserved(
        &self,
        holder: AgentName,
        project: ProjectName,
        ids: Vec<ReservationId>,
        ttl: Ttl,
        now_ms: i64,
    ) -> Result<Vec<Reservation>, StorageError> {
        let client = &mut self.client().await?;
        reservations::renew(client, &holder, &project, (&ids, ttl), now_ms).await
    }

    async fn reservations(
        &self,
        project: ProjectName,
        now_ms: i64,
    ) -> Result<Vec<Reservation>, StorageError> {
        reservations::live(&self.client().await?, &project, now_ms).await
    }
}

impl Storage for PostgresStorage {
    fn relay_id(&self) -> &str {
        &self.relay_id
    }

    fn metrics(&self) -> &StorageMetrics {
        &self.metrics
    }

    /// `SELECT 1` on a connection from the pool (a new one when the pooled ones broke).
    async fn check_health(&self) -> Result<(), StorageError> {
        let client = self.pool.get().await.map_err(|e| {
            StorageError::Unavailable(match e {
                deadpool_postgres::PoolError::Backend(e) => describe(&e),
                other => format!("no connection to the relay database: {other}"),
            })
        })?;
        client
            .query_one("SELECT 1", &[])
            .await
            .map_err(|e| StorageError::Unavailable(describe(&e)))?;
        Ok(())
    }
}
