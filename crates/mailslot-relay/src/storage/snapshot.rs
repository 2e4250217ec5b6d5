//! A relay's data as one backend hands it to another (`mailslot relay migrate`): the tables,
//! read whole, and the waiting mail as a stream of bounded chunks, so a large queue is never
//! in memory at once. The SQLite backend exports it; the PostgreSQL backend imports it.

use serde::Serialize;

use super::{InviteDigest, StorageError};
use crate::protocol::{
    AgentName, Bounce, KeyRotation, MessageId, OwnerKey, Policy, PublicKeys, RelayKey, RelayName,
    RequestCode,
};

/// A registered name, or a retired one still held.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentRecord {
    /// Its name.
    pub name: AgentName,
    /// Its public keys.
    pub keys: PublicKeys,
    /// When it registered (Unix ms).
    pub registered_at_ms: i64,
    /// The policy it set, if any.
    pub policy: Option<Policy>,
    /// Its directory description, when it opted in.
    pub listing: Option<String>,
    /// Its owner's key, once registered.
    pub owner: Option<OwnerKey>,
    /// Until when its retired name is held (Unix ms); `None` while it is in use.
    pub retired_until_ms: Option<i64>,
    /// Its last key rotations, oldest first.
    pub rotations: Vec<KeyRotation>,
}

/// An invite not used yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InviteRecord {
    /// The SHA-256 of its token.
    pub digest: InviteDigest,
    /// When it was made (Unix ms).
    pub created_at_ms: i64,
}

/// How an agent relates to another.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RelationKind {
    /// A contact (stored both ways).
    Contact,
    /// Blocked (one way).
    Blocked,
}

impl RelationKind {
    /// The kind as both backends store it.
    pub fn as_str(self) -> &'static str {
        match self {
            RelationKind::Contact => "contact",
            RelationKind::Blocked => "blocked",
        }
    }
}

/// One direction of a relation: `owner` holds `peer` as `kind`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RelationRecord {
    /// Whose relation it is.
    pub owner: AgentName,
    /// About whom.
    pub peer: AgentName,
    /// Contact or block.
    pub kind: RelationKind,
    /// Since when (Unix ms).
    pub since_ms: i64,
}

/// An open contact request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestRecord {
    /// Who asks.
    pub requester: AgentName,
    /// Whom.
    pub target: AgentName,
    /// The requester's note.
    pub note: String,
    /// The code the target's owner approves with.
    pub code: RequestCode,
    /// When it lapses (Unix ms).
    pub expires_at_ms: i64,
}

/// Another relay's key, pinned on first contact.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RelayPinRecord {
    /// The relay's name.
    pub relay: RelayName,
    /// Its pinned key.
    pub key: RelayKey,
    /// When it was pinned (Unix ms).
    pub pinned_at_ms: i64,
}

/// A copy waiting for its recipient.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WaitingCopy {
    /// Who gets it: an agent, or a relay mailbox (`@host`).
    pub recipient: AgentName,
    /// Who sent it: an agent, or a relay mailbox for mail that came over a link.
    pub sender: AgentName,
    /// The message's id.
    pub id: MessageId,
    /// The canonical envelope bytes, with only this recipient's key.
    pub envelope: Vec<u8>,
    /// When the relay accepted it (Unix ms).
    pub accepted_at_ms: i64,
    /// When it expires and bounces (Unix ms).
    pub expires_at_ms: i64,
}

/// The waiting copies in chunks of bounded size, recipient by recipient, each recipient's in
/// sequence order.
pub type WaitingCopies = Box<dyn Iterator<Item = Result<Vec<WaitingCopy>, StorageError>> + Send>;

/// Everything a relay keeps that outlives a restart, except what is only bookkeeping (delivery
/// leases, acknowledged copies' duplicate keys, used invites, lapsed requests).
pub struct Snapshot {
    /// The relay's id, which clients sign in their hello.
    pub relay_id: String,
    /// The relay's own key as its database recorded it (none before a start that recorded it):
    /// the nodes serving the moved relay must use the same key file.
    pub relay_key: Option<RelayKey>,
    /// Registered names, and retired names still held.
    pub agents: Vec<AgentRecord>,
    /// Invites not used yet.
    pub invites: Vec<InviteRecord>,
    /// Contacts (both directions) and blocks.
    pub relations: Vec<RelationRecord>,
    /// Open contact requests.
    pub requests: Vec<RequestRecord>,
    /// Bounces not fetched by their senders yet, by sender (with copies that expired while the
    /// relay was stopped).
    pub bounces: Vec<(AgentName, Bounce)>,
    /// Other relays' pinned keys.
    pub relay_pins: Vec<RelayPinRecord>,
    /// Damaged records the source skipped (its own check lists them).
    pub damaged_records: usize,
    /// The waiting mail.
    pub copies: WaitingCopies,
}

/// What a migration moved.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Moved {
    /// The relay's id, the same on the target.
    pub relay_id: String,
    /// Names, retired ones included.
    pub agents: u64,
    /// Retired names still held.
    pub retired: u64,
    /// Invites not used yet.
    pub invites: u64,
    /// Pairs of contacts.
    pub contacts: u64,
    /// Blocks.
    pub blocks: u64,
    /// Open contact requests.
    pub requests: u64,
    /// Queues with mail waiting: agents', and relay mailboxes (`@host`).
    pub recipients: u64,
    /// Waiting copies.
    pub copies: u64,
    /// Their envelopes' bytes.
    pub bytes: u64,
    /// Bounces not fetched yet.
    pub bounces: u64,
    /// Other relays' pinned keys.
    pub relay_pins: u64,
    /// Damaged records of the source that were skipped.
    pub damaged_records: u64,
}

/// Why a migration did not happen; the target is unchanged either way.
#[derive(Debug, thiserror::Error)]
pub enum MigrateError {
    /// The target already holds a relay's data.
    #[error(
        "{target} already holds a relay ({agents} agents, {copies} waiting copies): relay migrate moves a relay only into an empty database; create a new one (`createdb NAME`) and pass its URL with --to"
    )]
    NotEmpty {
        /// The target's URL, without its password.
        target: String,
        /// Agents it holds.
        agents: u64,
        /// Copies waiting in it.
        copies: u64,
    },
    /// Reading the source or writing the target failed.
    #[error(transparent)]
    Storage(#[from] StorageError),
}
