//! The queue role: per-recipient queues of sealed envelopes, in order, until acknowledged.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use super::StorageError;
use crate::protocol::{
    Address, AgentName, Bounce, CopyKey, MessageId, Policy, RelayName, Seq, Shown,
};

/// One recipient's copy of an envelope, serialized.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueuedCopy {
    /// Who gets it.
    pub recipient: AgentName,
    /// The id it is stored and deduplicated under when not the message's: each recipient's
    /// copy in another relay's mailbox has its own ([`MessageId::relay_copy`]), since they
    /// share that mailbox.
    pub id: Option<MessageId>,
    /// The canonical envelope bytes, with only this recipient's key.
    pub envelope: Arc<[u8]>,
    /// The group this copy is fanned out from, as the recipient's consent names it (bare
    /// here, `name@host` for another relay's group). A group copy passes the recipient's
    /// consent as the group's (the recipient joined it, and does not block the sender); one
    /// that does not is skipped, never refusing the others.
    pub group: Option<AgentName>,
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
    /// The sequence number of the recipient's copy committed just before it, where the storage
    /// numbers each recipient's copies without gaps (PostgreSQL). Copies committed by several
    /// nodes reach a session by different paths and may arrive out of order: a session that
    /// has not delivered `prev` reads the queue instead of skipping it. `None`: no such number
    /// (SQLite's are relay-wide, and its one writer pushes every copy in commit order).
    pub prev: Option<Seq>,
}

/// Called after every commit, on the storage's writer, with the copies it made durable in
/// commit order. It must not block.
pub type CommitListener = Box<dyn Fn(Vec<Committed>) + Send + Sync>;

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
    /// A send with group copies: those stored (the recipients with new mail), and the
    /// recipients whose consent did not take the group's copy.
    Fanned {
        /// Recipients with new mail.
        stored: Vec<AgentName>,
        /// Recipients that got no copy: not joined, or blocking the sender.
        skipped: Vec<AgentName>,
    },
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

/// The number of one claim of an agent's delivery session (its lease): later claims have
/// higher numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Epoch(u64);

impl Epoch {
    /// The epoch numbered `n`.
    pub const fn new(n: u64) -> Self {
        Self(n)
    }

    /// Its number.
    pub const fn get(self) -> u64 {
        self.0
    }
}

impl std::fmt::Display for Epoch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

/// The outcome of [`Queue::ack`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AckOutcome {
    /// Applied: this many copies were acknowledged.
    Applied(u64),
    /// Refused: a later claim replaced the session that sent it; nothing changed.
    Fenced,
}

/// Where a copy of a sender's mail stands in the queue, as [`Queue::copy_statuses`] says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CopyStatus {
    /// Stored, neither acknowledged nor expired.
    Queued,
    /// Expired undelivered; its bounce waits for the sender.
    Bounced,
    /// Neither: its recipient acknowledged it, or its bounce was fetched and acknowledged, or
    /// it was never stored.
    Gone,
}

/// The queue a copy of message `id` for `to` waits in, and the id it is stored under there:
/// a local agent's (a bare address) own queue under the message's id, or the mailbox of its
/// relay for an agent on another relay, under the id of that recipient's copy. `None` for a
/// relay whose name is too long to be a queue name, which never holds mail.
pub fn queue_of(id: MessageId, to: &Address) -> Option<(AgentName, MessageId)> {
    match to.host() {
        None => Some((to.name().clone(), id)),
        Some(relay) => Some((AgentName::relay_mailbox(relay)?, id.relay_copy(to))),
    }
}

/// Whether `queue` is a relay mailbox (`@host`) rather than an agent's queue. Only relay
/// mailboxes start with `@` ([`AgentName::relay_mailbox`]; an agent's name cannot).
pub(super) fn is_relay_mailbox(queue: &AgentName) -> bool {
    queue.as_str().starts_with('@')
}

/// Queued mail. Every write is durable before its future resolves.
pub trait Queue: Send + Sync + 'static {
    /// Sets the listener told about every stored copy after its commit (once; later calls are
    /// ignored). The relay pushes them straight to online recipients.
    fn on_commit(&self, listener: CommitListener);

    /// Stores copies of message `id` from `sender`, all or none: refused when a recipient does
    /// not accept the sender (under `default` for those without a policy) or its queue is full.
    /// A group copy ([`QueuedCopy::group`]) is checked against the group instead and skipped,
    /// not refused; a send with group copies answers [`Accepted::Fanned`].
    /// A relay mailbox (`@host`) takes mail from every sender: the relay it leads to applies
    /// its own agents' consent.
    /// Copies already stored (same sender, id and recipient) are skipped. The write is queued
    /// when this is called, so writes are applied in call order.
    fn accept(
        &self,
        sender: AgentName,
        id: MessageId,
        copies: Vec<QueuedCopy>,
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

    /// Claims `agent`'s delivery session: returns an epoch higher than every earlier claim's.
    /// Acks under an older epoch are refused from then on, so a replaced session (on this node
    /// or another) cannot acknowledge mail its successor is already delivering. `shown` is
    /// whether the session counts as the agent online; a backend shared by several nodes
    /// records it with the lease, so every node's presence leaves a hidden session out.
    fn claim(
        &self,
        agent: AgentName,
        shown: Shown,
    ) -> impl Future<Output = Result<Epoch, StorageError>> + Send;

    /// Says the session that claimed `epoch` has ended with every ack it received committed,
    /// so a claim on another node need not wait for it. Nothing changes if a later claim came.
    fn release(
        &self,
        agent: AgentName,
        epoch: Epoch,
    ) -> impl Future<Output = Result<(), StorageError>> + Send;

    /// Deletes everything for `agent` up to and including `upto`, if `epoch` is still the
    /// agent's latest claim.
    fn ack(
        &self,
        agent: AgentName,
        upto: Seq,
        epoch: Epoch,
    ) -> impl Future<Output = Result<AckOutcome, StorageError>> + Send;

    /// How many messages wait for `agent`.
    fn waiting(&self, agent: AgentName) -> impl Future<Output = Result<u64, StorageError>> + Send;

    /// Messages waiting in all queues.
    fn total_waiting(&self) -> impl Future<Output = Result<u64, StorageError>> + Send;

    /// The relays whose mailboxes (`@host`) hold mail, so that a starting relay opens a
    /// link to each.
    fn relay_mailboxes(&self) -> impl Future<Output = Result<Vec<RelayName>, StorageError>> + Send;

    /// Deletes envelopes that expired before `now_ms` and records a bounce for each, in one
    /// write; returns the bounces with their senders. Relay mailboxes (`@host`) are left
    /// alone: the link to that relay expires their copies, because only it can read which
    /// recipients each copy is for and bounce them by name ([`Queue::record_bounces`]).
    fn expire(
        &self,
        now_ms: i64,
    ) -> impl Future<Output = Result<Vec<(AgentName, Bounce)>, StorageError>> + Send;

    /// The bounces waiting for `sender`, oldest first, at most `limit`.
    fn bounces(
        &self,
        sender: AgentName,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<Bounce>, StorageError>> + Send;

    /// The senders on other relays (`name@host`) that bounces wait for here, at most
    /// `limit`: their relays are told over a link.
    fn remote_bounce_senders(
        &self,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<AgentName>, StorageError>> + Send;

    /// Where each of `sender`'s copies in `keys` stands, in the order asked. Reads only: no
    /// write on this path or on the ack path. A copy's expiry and its bounce are one write,
    /// so a copy is never seen as gone between the two.
    fn copy_statuses(
        &self,
        sender: AgentName,
        keys: Vec<CopyKey>,
    ) -> impl Future<Output = Result<Vec<CopyStatus>, StorageError>> + Send;

    /// Records bounces of `sender`'s mail that the relay's link to another relay gave up on
    /// (refused there, or past its TTL in the relay mailbox); one already recorded is kept,
    /// so recording again after a crash changes nothing. Durable when it resolves.
    fn record_bounces(
        &self,
        sender: AgentName,
        bounces: Vec<Bounce>,
    ) -> impl Future<Output = Result<(), StorageError>> + Send;

    /// Forgets the bounces `sender` recorded; returns how many there were.
    fn ack_bounces(
        &self,
        sender: AgentName,
        keys: Vec<CopyKey>,
    ) -> impl Future<Output = Result<u64, StorageError>> + Send;
}
