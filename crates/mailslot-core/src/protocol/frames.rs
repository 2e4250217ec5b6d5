//! Relay protocol frames: versioned JSON objects, one per WebSocket text message, tagged by
//! `type`. The sequence is specified in `docs/protocol.md`.

use serde::{Deserialize, Serialize};

use jiff::Timestamp;

use super::{
    Address, AgentName, ConsentEvent, GroupPolicy, GroupView, InviteToken, KeyRotation, MessageId,
    OwnerAct, OwnerKey, Pattern, Peer, Policy, ProjectName, PublicKeys, Reason, RequestCode,
    RequestView, Reservation, ReservationId, ReservationMode, SealedEnvelope, Ttl, b64,
};

/// The protocol version this build speaks.
pub const PROTOCOL_VERSION: u32 = 1;
/// The longest request reference a client may choose.
pub const MAX_REF_CHARS: usize = 64;
/// Bytes a frame may add around an envelope.
pub const FRAME_OVERHEAD: usize = 4096;

/// A relay-chosen sequence number, increasing per relay; acks are cumulative.
pub type Seq = u64;

/// What the relay sends.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum ServerFrame {
    /// First frame on every connection: sign `nonce` with `relay` to authenticate.
    Challenge {
        /// Protocol version.
        v: u32,
        /// The relay's id, part of what the client signs.
        relay: String,
        /// 32 random bytes, fresh for this connection.
        #[serde(with = "b64")]
        nonce: Vec<u8>,
    },
    /// Authentication succeeded; stored mail follows.
    Welcome {
        /// The authenticated agent.
        agent: AgentName,
        /// How many messages wait.
        waiting: u64,
        /// The owner key that signs the agent's consent changes, once one is registered.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        owner: Option<OwnerKey>,
    },
    /// A stored message, in order.
    Deliver {
        /// Its sequence number; acknowledge it with `ack`.
        seq: Seq,
        /// The sealed copy for this recipient.
        envelope: SealedEnvelope,
    },
    /// Everything stored at connect time has been delivered; new mail is pushed as it comes.
    CaughtUp {},
    /// A `send` was stored durably.
    Sent {
        /// The client's request reference.
        #[serde(rename = "ref")]
        reference: String,
        /// The message id.
        id: MessageId,
        /// A group send's members on the roster who got no copy: they have not joined the
        /// group (their owner has not accepted its mail) or they block the sender.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        skipped: Vec<Address>,
    },
    /// An agent's public keys, answering `lookup`.
    Keys {
        /// The client's request reference.
        #[serde(rename = "ref")]
        reference: String,
        /// The agent.
        agent: AgentName,
        /// Its registered keys.
        keys: PublicKeys,
        /// Its last rotations (at most [`super::MAX_ROTATIONS`], oldest first): the signed
        /// steps from keys a peer may have pinned to these.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        rotations: Vec<KeyRotation>,
    },
    /// A group, answering `lookup` of a group's name: its roster instead of keys.
    Group {
        /// The client's request reference.
        #[serde(rename = "ref")]
        reference: String,
        /// The group.
        group: GroupView,
    },
    /// The groups the asker is on the roster of or owns, answering `groups`: by name, at
    /// most [`super::MAX_GROUPS_LISTED`].
    GroupList {
        /// The client's request reference.
        #[serde(rename = "ref")]
        reference: String,
        /// The groups.
        groups: Vec<GroupView>,
    },
    /// A contact request was created; the code is for the requester's owner only.
    Requested {
        /// The client's request reference.
        #[serde(rename = "ref")]
        reference: String,
        /// The verification code to pass to the target's owner out of band.
        code: RequestCode,
        /// When the request lapses.
        expires_at: Timestamp,
    },
    /// A consent change was applied.
    Done {
        /// The client's request reference.
        #[serde(rename = "ref")]
        reference: String,
        /// What happened, for people.
        detail: String,
    },
    /// The agent's consent state, answering `consent`.
    ConsentState {
        /// The client's request reference.
        #[serde(rename = "ref")]
        reference: String,
        /// Whom the agent accepts mail from.
        policy: Policy,
        /// Requests to this agent (no codes).
        incoming: Vec<RequestView>,
        /// Requests by this agent (with codes).
        outgoing: Vec<RequestView>,
        /// Approved contacts.
        contacts: Vec<Address>,
        /// Blocked agents and relays.
        blocked: Vec<Peer>,
    },
    /// The public directory, answering `directory`.
    DirectoryList {
        /// The client's request reference.
        #[serde(rename = "ref")]
        reference: String,
        /// The agents that opted in, by name.
        entries: Vec<DirectoryEntry>,
    },
    /// Who is online, answering `presence`: only agents the asker may see (its contacts
    /// and listed agents); anyone else is absent, never said to be offline.
    PresenceList {
        /// The client's request reference.
        #[serde(rename = "ref")]
        reference: String,
        /// The agents with a live delivery session, by name.
        online: Vec<Online>,
    },
    /// Bounces for this agent's mail, answering `bounces`: oldest first, at most
    /// [`MAX_BOUNCES`]; fewer means there are no more.
    BounceList {
        /// The client's request reference.
        #[serde(rename = "ref")]
        reference: String,
        /// Copies of this agent's messages that expired undelivered.
        bounces: Vec<Bounce>,
    },
    /// Where the asked copies stand, answering `copies`: one entry per asked copy, in the
    /// order asked.
    CopyStates {
        /// The client's request reference.
        #[serde(rename = "ref")]
        reference: String,
        /// Each copy and its fate.
        copies: Vec<CopyState>,
    },
    /// A `reserve` was granted.
    Reserved {
        /// The client's request reference.
        #[serde(rename = "ref")]
        reference: String,
        /// The reservation made.
        reservation: Reservation,
    },
    /// A `reserve` was refused: other holders' live reservations are in the way (each told
    /// that someone waits). Nothing was reserved.
    ReservationConflict {
        /// The client's request reference.
        #[serde(rename = "ref")]
        reference: String,
        /// The reservations in the way, whole (holder, patterns, reason, expiry).
        conflicts: Vec<Reservation>,
    },
    /// Answers `release`: the reservations that went.
    Released {
        /// The client's request reference.
        #[serde(rename = "ref")]
        reference: String,
        /// Their ids.
        ids: Vec<ReservationId>,
    },
    /// Answers `renew`: the reservations renewed, with their new expiry.
    Renewed {
        /// The client's request reference.
        #[serde(rename = "ref")]
        reference: String,
        /// The reservations.
        reservations: Vec<Reservation>,
    },
    /// Answers `reservations`: a project's live reservations, oldest first (at most
    /// [`super::MAX_PROJECT_RESERVATIONS`]).
    ReservationList {
        /// The client's request reference.
        #[serde(rename = "ref")]
        reference: String,
        /// The reservations.
        reservations: Vec<Reservation>,
    },
    /// News for the agent: consent, bounces, someone waiting for its files.
    Event {
        /// What happened.
        event: ConsentEvent,
    },
    /// Something was refused; the connection stays open unless the code says otherwise.
    Error {
        /// The request it answers, if any.
        #[serde(rename = "ref", default, skip_serializing_if = "Option::is_none")]
        reference: Option<String>,
        /// Stable machine-readable code.
        code: ErrorCode,
        /// A sentence for humans.
        message: String,
        /// When to try again, if trying again can help.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        retry_after_ms: Option<u64>,
    },
    /// Answers `ping`.
    Pong {},
}

/// What the client sends.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum ClientFrame {
    /// Answers the challenge. With `register`, also registers the name with these keys
    /// (first come, first served; the same keys again is a no-op).
    Hello {
        /// The agent.
        agent: AgentName,
        /// Ed25519 signature over the hello domain, the relay id and the nonce.
        #[serde(with = "b64")]
        signature: Vec<u8>,
        /// Keys to register under `agent`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        register: Option<PublicKeys>,
        /// A control connection: requests only (sends, lookups, consent). It gets no
        /// deliveries and no events, and never replaces the agent's delivery connection, so
        /// an owner's command can run beside a running agent.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        control: bool,
        /// The owner key to register for `agent` if it has none yet (first come); ignored
        /// once one is registered, which only the owner key itself can replace.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        owner: Option<OwnerKey>,
        /// An invite from the relay's operator, used up by registering a new name on a relay
        /// that registers by invite only.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        invite: Option<InviteToken>,
    },
    /// Store and forward an envelope.
    Send {
        /// Echoed in the answer.
        #[serde(rename = "ref")]
        reference: String,
        /// The envelope, sealed to the recipients it names.
        envelope: SealedEnvelope,
        /// A group on this relay the envelope is for: its keys wrap the content key for
        /// every member on the roster but the sender, and the relay stores one copy per
        /// member who joined.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        group: Option<AgentName>,
    },
    /// Make a group on this relay, owned by this agent's owner key, with this agent its
    /// first member. Answered with `group`.
    CreateGroup {
        /// Echoed in the answer.
        #[serde(rename = "ref")]
        reference: String,
        /// Its name, in the agents' namespace.
        group: AgentName,
        /// Who may post.
        #[serde(default)]
        policy: GroupPolicy,
    },
    /// The group's owner puts `member` on its roster. Answered with `group`.
    GroupAdd {
        /// Echoed in the answer.
        #[serde(rename = "ref")]
        reference: String,
        /// The group, on this relay.
        group: AgentName,
        /// The member: a bare name here, `name@host` on another relay.
        member: Address,
        /// The group's owner key's signature over the act (see `owner_payload`).
        #[serde(with = "b64")]
        owner_signature: Vec<u8>,
    },
    /// The group's owner takes `member` off its roster. Answered with `group`.
    GroupRemove {
        /// Echoed in the answer.
        #[serde(rename = "ref")]
        reference: String,
        /// The group, on this relay.
        group: AgentName,
        /// The member, as on the roster.
        member: Address,
        /// The group's owner key's signature over the act (see `owner_payload`).
        #[serde(with = "b64")]
        owner_signature: Vec<u8>,
    },
    /// This agent's owner accepts mail from the group `group`: the agent joins it.
    /// Answered with `done`.
    Join {
        /// Echoed in the answer.
        #[serde(rename = "ref")]
        reference: String,
        /// The group: bare on this relay, `name@host` on another.
        group: Address,
        /// The owner key's signature over the act (see `owner_payload`).
        #[serde(with = "b64")]
        owner_signature: Vec<u8>,
    },
    /// This agent leaves `group`: it stops accepting the group's mail and, for a group on
    /// this relay, leaves its roster. No owner signature: leaving only narrows what reaches
    /// the agent. Answered with `done`.
    Leave {
        /// Echoed in the answer.
        #[serde(rename = "ref")]
        reference: String,
        /// The group: bare on this relay, `name@host` on another.
        group: Address,
    },
    /// The groups on this relay this agent is on the roster of or owns. Answered with
    /// `group_list`.
    Groups {
        /// Echoed in the answer.
        #[serde(rename = "ref")]
        reference: String,
    },
    /// Everything up to and including `seq` is durably stored by the client.
    Ack {
        /// The highest sequence number committed.
        seq: Seq,
    },
    /// Ask for an agent's public keys.
    Lookup {
        /// Echoed in the answer.
        #[serde(rename = "ref")]
        reference: String,
        /// The agent.
        agent: AgentName,
    },
    /// Replace this agent's keys: `rotation` is signed by the registered keys and the new
    /// ones. Answered with `done`.
    RotateKeys {
        /// Echoed in the answer.
        #[serde(rename = "ref")]
        reference: String,
        /// The signed statement.
        rotation: KeyRotation,
    },
    /// Ask `to` to accept mail from this agent.
    Connect {
        /// Echoed in the answer.
        #[serde(rename = "ref")]
        reference: String,
        /// The agent asked.
        to: Address,
        /// Why, for its owner.
        note: String,
    },
    /// The owner approves `from`'s request to this agent with the code `from`'s owner passed on.
    Approve {
        /// Echoed in the answer.
        #[serde(rename = "ref")]
        reference: String,
        /// The requester the owner confirmed.
        from: Address,
        /// The code the requester's owner passed on.
        code: RequestCode,
        /// Only check that `from` has an open request with `code`: nothing changes, so no
        /// owner signature is needed (the owner sees the code checked before typing the
        /// passphrase), but the check counts against the approval limit like an attempt.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        dry_run: bool,
        /// The owner key's signature over the act (see `owner_payload`); empty on a dry run.
        #[serde(with = "b64", default, skip_serializing_if = "Vec::is_empty")]
        owner_signature: Vec<u8>,
    },
    /// The owner denies a request from `agent`.
    Deny {
        /// Echoed in the answer.
        #[serde(rename = "ref")]
        reference: String,
        /// The requester.
        agent: Address,
        /// The owner key's signature over the act (see `owner_payload`).
        #[serde(with = "b64")]
        owner_signature: Vec<u8>,
    },
    /// Refuse all mail and requests from `agent`.
    Block {
        /// Echoed in the answer.
        #[serde(rename = "ref")]
        reference: String,
        /// The agent.
        agent: Peer,
        /// The owner key's signature over the act (see `owner_payload`).
        #[serde(with = "b64")]
        owner_signature: Vec<u8>,
    },
    /// Lift a block.
    Unblock {
        /// Echoed in the answer.
        #[serde(rename = "ref")]
        reference: String,
        /// The agent.
        agent: Peer,
        /// The owner key's signature over the act (see `owner_payload`).
        #[serde(with = "b64")]
        owner_signature: Vec<u8>,
    },
    /// End a contact (both directions).
    Remove {
        /// Echoed in the answer.
        #[serde(rename = "ref")]
        reference: String,
        /// The contact.
        agent: Address,
        /// The owner key's signature over the act (see `owner_payload`).
        #[serde(with = "b64")]
        owner_signature: Vec<u8>,
    },
    /// Set whom this agent accepts mail from.
    SetPolicy {
        /// Echoed in the answer.
        #[serde(rename = "ref")]
        reference: String,
        /// The policy.
        policy: Policy,
        /// The owner key's signature over the act (see `owner_payload`).
        #[serde(with = "b64")]
        owner_signature: Vec<u8>,
    },
    /// Replace the agent's owner key; signed by the current one.
    SetOwner {
        /// Echoed in the answer.
        #[serde(rename = "ref")]
        reference: String,
        /// The new owner key.
        owner: OwnerKey,
        /// The current owner key's signature over the act.
        #[serde(with = "b64")]
        owner_signature: Vec<u8>,
    },
    /// Opt in to the relay's public directory with a description, or (`None`) out of it.
    SetListing {
        /// Echoed in the answer.
        #[serde(rename = "ref")]
        reference: String,
        /// One line about the agent, for people browsing the directory.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        description: Option<String>,
    },
    /// Ask for the public directory.
    Directory {
        /// Echoed in the answer.
        #[serde(rename = "ref")]
        reference: String,
    },
    /// Ask who is online among this agent's contacts and the listed agents.
    Presence {
        /// Echoed in the answer.
        #[serde(rename = "ref")]
        reference: String,
        /// Only these agents (at most [`MAX_PRESENCE_AGENTS`]); absent: every agent this one
        /// may see.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        agents: Option<Vec<AgentName>>,
    },
    /// Give up this agent's name: signed by the agent's key for this connection (see
    /// `retire_payload`). The name is held for the relay's grace period, then free.
    Retire {
        /// Echoed in the answer.
        #[serde(rename = "ref")]
        reference: String,
        /// Ed25519 signature by the agent's key over the retire domain and `retire_payload`.
        #[serde(with = "b64")]
        signature: Vec<u8>,
    },
    /// Ask for this agent's consent state.
    Consent {
        /// Echoed in the answer.
        #[serde(rename = "ref")]
        reference: String,
    },
    /// Ask for bounces: copies of this agent's messages that expired undelivered.
    Bounces {
        /// Echoed in the answer.
        #[serde(rename = "ref")]
        reference: String,
    },
    /// The client has recorded these bounces: the relay forgets them. Answered with `done`.
    AckBounces {
        /// Echoed in the answer.
        #[serde(rename = "ref")]
        reference: String,
        /// At most [`MAX_BOUNCES`] bounces, as `bounce_list` gave them.
        bounces: Vec<CopyKey>,
    },
    /// Ask where copies of this agent's mail stand (queued, bounced, taken): how a sender
    /// learns its mail was delivered. Answered with `copy_states`.
    Copies {
        /// Echoed in the answer.
        #[serde(rename = "ref")]
        reference: String,
        /// At most [`MAX_COPY_CHECKS`] copies of messages this agent sent.
        copies: Vec<CopyKey>,
    },
    /// Reserve files in a project for this agent: granted (`reserved`) unless another
    /// holder's live reservation conflicts (`reservation_conflict`).
    Reserve {
        /// Echoed in the answer.
        #[serde(rename = "ref")]
        reference: String,
        /// The project.
        project: ProjectName,
        /// At least one, at most [`super::MAX_PATTERNS`] repository-relative paths or globs.
        patterns: Vec<Pattern>,
        /// Exclusive or shared.
        mode: ReservationMode,
        /// Why, in one line.
        reason: Reason,
        /// Seconds it lasts [default: one hour].
        #[serde(default)]
        ttl: Ttl,
    },
    /// Release this agent's reservations in a project: those named by id, those holding one of
    /// the patterns exactly, or (`all`) every one. Answered with `released`.
    Release {
        /// Echoed in the answer.
        #[serde(rename = "ref")]
        reference: String,
        /// The project.
        project: ProjectName,
        /// By id (at most [`super::MAX_HELD_PER_PROJECT`]).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        ids: Vec<ReservationId>,
        /// By pattern, as reserved (at most [`super::MAX_PATTERNS`]).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        patterns: Vec<Pattern>,
        /// Every one of this agent's in the project.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        all: bool,
    },
    /// Give this agent's reservations in a project a new TTL from now: those named, or every
    /// one when `ids` is empty. Answered with `renewed`.
    Renew {
        /// Echoed in the answer.
        #[serde(rename = "ref")]
        reference: String,
        /// The project.
        project: ProjectName,
        /// Which (at most [`super::MAX_HELD_PER_PROJECT`]); empty: all of them.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        ids: Vec<ReservationId>,
        /// Seconds from now [default: one hour].
        #[serde(default)]
        ttl: Ttl,
    },
    /// Ask for a project's live reservations, every holder's. Answered with
    /// `reservation_list`.
    Reservations {
        /// Echoed in the answer.
        #[serde(rename = "ref")]
        reference: String,
        /// The project.
        project: ProjectName,
    },
    /// Keepalive.
    Ping {},
}

impl ClientFrame {
    /// The client's request reference, on frames that carry one.
    pub fn reference(&self) -> Option<&str> {
        match self {
            ClientFrame::Send { reference, .. }
            | ClientFrame::Lookup { reference, .. }
            | ClientFrame::RotateKeys { reference, .. }
            | ClientFrame::Connect { reference, .. }
            | ClientFrame::Approve { reference, .. }
            | ClientFrame::Deny { reference, .. }
            | ClientFrame::Block { reference, .. }
            | ClientFrame::Unblock { reference, .. }
            | ClientFrame::Remove { reference, .. }
            | ClientFrame::SetPolicy { reference, .. }
            | ClientFrame::SetOwner { reference, .. }
            | ClientFrame::SetListing { reference, .. }
            | ClientFrame::Directory { reference, .. }
            | ClientFrame::Presence { reference, .. }
            | ClientFrame::Retire { reference, .. }
            | ClientFrame::Consent { reference }
            | ClientFrame::Bounces { reference }
            | ClientFrame::AckBounces { reference, .. }
            | ClientFrame::Copies { reference, .. }
            | ClientFrame::Reserve { reference, .. }
            | ClientFrame::Release { reference, .. }
            | ClientFrame::Renew { reference, .. }
            | ClientFrame::Reservations { reference, .. }
            | ClientFrame::CreateGroup { reference, .. }
            | ClientFrame::GroupAdd { reference, .. }
            | ClientFrame::GroupRemove { reference, .. }
            | ClientFrame::Join { reference, .. }
            | ClientFrame::Leave { reference, .. }
            | ClientFrame::Groups { reference } => Some(reference),
            ClientFrame::Hello { .. } | ClientFrame::Ack { .. } | ClientFrame::Ping {} => None,
        }
    }

    /// The act and its signature, for the frames only the agent's owner may send.
    pub fn owner_act(&self) -> Option<(OwnerAct<'_>, &[u8])> {
        Some(match self {
            ClientFrame::Approve {
                from,
                code,
                owner_signature,
                dry_run: false,
                ..
            } => (OwnerAct::Approve { from, code }, owner_signature),
            ClientFrame::Deny {
                agent,
                owner_signature,
                ..
            } => (OwnerAct::Deny(agent), owner_signature),
            ClientFrame::Block {
                agent,
                owner_signature,
                ..
            } => (OwnerAct::Block(agent), owner_signature),
            ClientFrame::Unblock {
                agent,
                owner_signature,
                ..
            } => (OwnerAct::Unblock(agent), owner_signature),
            ClientFrame::Remove {
                agent,
                owner_signature,
                ..
            } => (OwnerAct::Remove(agent), owner_signature),
            ClientFrame::SetPolicy {
                policy,
                owner_signature,
                ..
            } => (OwnerAct::SetPolicy(*policy), owner_signature),
            ClientFrame::SetOwner {
                owner,
                owner_signature,
                ..
            } => (OwnerAct::SetOwner(owner), owner_signature),
            ClientFrame::Join {
                group,
                owner_signature,
                ..
            } => (OwnerAct::Join(group), owner_signature),
            // A roster change is signed by the group's owner key, not the agent's: the group
            // handler checks it (`relay/groups.rs`).
            _ => return None,
        })
    }
}

impl ServerFrame {
    /// The request this frame answers, if it answers one.
    pub fn reference(&self) -> Option<&str> {
        match self {
            ServerFrame::Sent { reference, .. }
            | ServerFrame::Keys { reference, .. }
            | ServerFrame::Requested { reference, .. }
            | ServerFrame::Done { reference, .. }
            | ServerFrame::ConsentState { reference, .. }
            | ServerFrame::DirectoryList { reference, .. }
            | ServerFrame::PresenceList { reference, .. }
            | ServerFrame::BounceList { reference, .. }
            | ServerFrame::CopyStates { reference, .. }
            | ServerFrame::Reserved { reference, .. }
            | ServerFrame::ReservationConflict { reference, .. }
            | ServerFrame::Released { reference, .. }
            | ServerFrame::Renewed { reference, .. }
            | ServerFrame::ReservationList { reference, .. }
            | ServerFrame::Group { reference, .. }
            | ServerFrame::GroupList { reference, .. } => Some(reference),
            ServerFrame::Error { reference, .. } => reference.as_deref(),
            // Listed, not `_`: a new answer must say whether it carries a reference.
            ServerFrame::Challenge { .. }
            | ServerFrame::Welcome { .. }
            | ServerFrame::Deliver { .. }
            | ServerFrame::CaughtUp {}
            | ServerFrame::Event { .. }
            | ServerFrame::Pong {} => None,
        }
    }
}

/// One agent in the public directory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DirectoryEntry {
    /// The agent.
    pub agent: AgentName,
    /// Its fingerprint, to compare out of band before trusting it.
    pub fingerprint: super::Fingerprint,
    /// What it says about itself.
    pub description: String,
}

/// The most agents one `presence` request names.
pub const MAX_PRESENCE_AGENTS: usize = 100;

/// An agent with a live delivery session.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Online {
    /// The agent.
    pub agent: AgentName,
    /// When its current delivery session began.
    pub since: Timestamp,
}

/// The most bounces one `bounce_list` or `ack_bounces` carries.
pub const MAX_BOUNCES: usize = 100;

/// One recipient's copy of a sent message: the message, and the recipient.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CopyKey {
    /// The message id.
    pub id: MessageId,
    /// The recipient the copy is for: a bare name on the asker's relay, `name@host` on
    /// another.
    pub to: Address,
}

/// The most copies one `copies` request asks about (and its `copy_states` answers).
pub const MAX_COPY_CHECKS: usize = 100;

/// Where a copy of the asker's mail stands on the relay, answering `copies`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CopyFate {
    /// Queued: its recipient has not taken it yet.
    Waiting,
    /// It expired undelivered and its bounce waits for the sender (`bounces`).
    Bounced,
    /// Neither queued nor bounced, and its recipient is registered: the recipient's client
    /// took it and acknowledged it (or the relay never had it).
    Gone,
    /// Neither queued nor bounced, and its recipient is not registered any more (it retired,
    /// and its queue went with its name): whether it took the copy first cannot be told.
    Unknown,
}

/// One copy's fate.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CopyState {
    /// The message id.
    pub id: MessageId,
    /// The recipient the copy is for, as asked.
    pub to: Address,
    /// Where it stands.
    pub state: CopyFate,
}

/// A copy of a message that expired on the relay before its recipient took it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Bounce {
    /// The message id.
    pub id: MessageId,
    /// The recipient whose copy expired or was refused: a bare name on the sender's relay,
    /// `name@host` on another.
    pub to: Address,
    /// When the relay gave up on it.
    pub expired_at: Timestamp,
}

impl Bounce {
    /// Which copy bounced.
    pub fn key(&self) -> CopyKey {
        CopyKey {
            id: self.id,
            to: self.to.clone(),
        }
    }
}

/// The longest directory description, in characters.
pub const MAX_DESCRIPTION_CHARS: usize = 200;

/// Stable error codes. Clients match on these, never on the message text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// The frame is not valid JSON or not a known frame.
    BadFrame,
    /// The frame came at the wrong time (e.g. `send` before `hello`).
    UnexpectedFrame,
    /// The hello's signature or agent is wrong.
    AuthFailed,
    /// No hello within the deadline.
    AuthTimeout,
    /// The name is registered with other keys.
    NameTaken,
    /// No agent of that name is registered.
    UnknownAgent,
    /// A recipient does not exist on this relay.
    UnknownRecipient,
    /// The envelope's `from` is not the authenticated agent.
    NotSender,
    /// The envelope is invalid (size, version, fields).
    InvalidEnvelope,
    /// The frame or envelope is over the size limit.
    TooLarge,
    /// Too many requests; retry after `retry_after_ms`.
    RateLimited,
    /// The recipient's queue is full; retry later.
    QuotaFull,
    /// Too many connections from this address, or to the relay.
    TooManyConnections,
    /// No complete HTTP request (the WebSocket upgrade among them) within the deadline.
    RequestTimeout,
    /// Another connection for this agent took over.
    Replaced,
    /// The relay is shutting down.
    ShuttingDown,
    /// The client misbehaved too often and is being disconnected.
    TooManyErrors,
    /// The client did not read what the relay sent it, and is being disconnected.
    NotReading,
    /// The recipient does not accept mail or requests from this sender (policy or block).
    NotAllowed,
    /// Too many pending contact requests; wait for answers or expiry.
    TooManyRequests,
    /// No pending request to this agent has that code (or it expired).
    BadCode,
    /// A consent change for an agent that has no owner key registered yet.
    OwnerRequired,
    /// A consent change not signed by the agent's owner key.
    NotOwner,
    /// The relay registers new names by invite only, and none came.
    RegistrationClosed,
    /// The invite is unknown or already used.
    BadInvite,
    /// The name was retired; it is held for a grace period, then free.
    NameRetired,
    /// A key rotation whose signatures do not verify, or whose old keys are not the ones
    /// registered now.
    BadRotation,
    /// Too many live reservations: the agent's in the project, or the project's.
    TooManyReservations,
    /// A group send's key wraps do not cover the group's roster (a member was added since
    /// the sender read it): read the roster again and seal again.
    GroupChanged,
    /// A group's roster is at [`super::MAX_GROUP_MEMBERS`].
    GroupFull,
    /// The agent made [`super::MAX_GROUPS_PER_CREATOR`] groups already.
    TooManyGroups,
    /// The relay failed; retry later.
    Internal,
}

impl ErrorCode {
    /// The snake_case name, as on the wire and in metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::BadFrame => "bad_frame",
            ErrorCode::UnexpectedFrame => "unexpected_frame",
            ErrorCode::AuthFailed => "auth_failed",
            ErrorCode::AuthTimeout => "auth_timeout",
            ErrorCode::NameTaken => "name_taken",
            ErrorCode::UnknownAgent => "unknown_agent",
            ErrorCode::UnknownRecipient => "unknown_recipient",
            ErrorCode::NotSender => "not_sender",
            ErrorCode::InvalidEnvelope => "invalid_envelope",
            ErrorCode::TooLarge => "too_large",
            ErrorCode::RateLimited => "rate_limited",
            ErrorCode::QuotaFull => "quota_full",
            ErrorCode::TooManyConnections => "too_many_connections",
            ErrorCode::RequestTimeout => "request_timeout",
            ErrorCode::Replaced => "replaced",
            ErrorCode::ShuttingDown => "shutting_down",
            ErrorCode::TooManyErrors => "too_many_errors",
            ErrorCode::NotReading => "not_reading",
            ErrorCode::NotAllowed => "not_allowed",
            ErrorCode::TooManyRequests => "too_many_requests",
            ErrorCode::BadCode => "bad_code",
            ErrorCode::OwnerRequired => "owner_required",
            ErrorCode::NotOwner => "not_owner",
            ErrorCode::RegistrationClosed => "registration_closed",
            ErrorCode::BadInvite => "bad_invite",
            ErrorCode::NameRetired => "name_retired",
            ErrorCode::BadRotation => "bad_rotation",
            ErrorCode::TooManyReservations => "too_many_reservations",
            ErrorCode::GroupChanged => "group_changed",
            ErrorCode::GroupFull => "group_full",
            ErrorCode::TooManyGroups => "too_many_groups",
            ErrorCode::Internal => "internal",
        }
    }
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The bytes a hello signs: the relay id and the nonce (the crypto layer adds the domain).
pub fn hello_payload(relay: &str, nonce: &[u8]) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(relay.len() + 1 + nonce.len());
    bytes.extend_from_slice(relay.as_bytes());
    bytes.push(0);
    bytes.extend_from_slice(nonce);
    bytes
}

/// The bytes a `retire` signs: the connection's challenge and the agent, so it is good on
/// this connection, for this name, only.
pub fn retire_payload(relay: &str, nonce: &[u8], agent: &AgentName) -> Vec<u8> {
    let mut bytes = hello_payload(relay, nonce);
    bytes.push(0);
    bytes.extend_from_slice(agent.as_str().as_bytes());
    bytes
}

/// The bytes an HTTP registration signs: the name and both public keys.
pub fn register_payload(name: &AgentName, keys: &PublicKeys) -> Vec<u8> {
    let mut bytes = name.as_str().as_bytes().to_vec();
    bytes.push(0);
    bytes.extend_from_slice(&keys.signing);
    bytes.extend_from_slice(&keys.sealing);
    bytes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_have_a_stable_wire_form() {
        // Fieldless frames are empty struct variants: the same wire form, and unlike unit
        // variants they refuse unknown fields.
        for (frame, wire) in [
            (
                serde_json::to_string(&ClientFrame::Ping {}).unwrap(),
                r#"{"type":"ping"}"#,
            ),
            (
                serde_json::to_string(&ServerFrame::Pong {}).unwrap(),
                r#"{"type":"pong"}"#,
            ),
            (
                serde_json::to_string(&ServerFrame::CaughtUp {}).unwrap(),
                r#"{"type":"caught_up"}"#,
            ),
        ] {
            assert_eq!(frame, wire);
        }
        assert!(serde_json::from_str::<ClientFrame>(r#"{"type":"ping","x":1}"#).is_err());
        assert!(serde_json::from_str::<ServerFrame>(r#"{"type":"pong","x":1}"#).is_err());
        let f = ClientFrame::Ack { seq: 7 };
        assert_eq!(
            serde_json::to_string(&f).unwrap(),
            r#"{"type":"ack","seq":7}"#
        );
        let e = ServerFrame::Error {
            reference: Some("r1".into()),
            code: ErrorCode::QuotaFull,
            message: "full".into(),
            retry_after_ms: Some(1000),
        };
        assert_eq!(
            serde_json::to_string(&e).unwrap(),
            r#"{"type":"error","ref":"r1","code":"quota_full","message":"full","retry_after_ms":1000}"#
        );
        assert!(
            serde_json::from_str::<ClientFrame>(r#"{"type":"ack","seq":1,"extra":2}"#).is_err()
        );
        assert!(serde_json::from_str::<ClientFrame>(r#"{"type":"launch"}"#).is_err());
    }

    #[test]
    fn every_error_code_names_itself_as_on_the_wire() {
        for code in [
            ErrorCode::BadFrame,
            ErrorCode::TooManyConnections,
            ErrorCode::Internal,
            ErrorCode::NotSender,
        ] {
            assert_eq!(
                serde_json::to_string(&code).unwrap(),
                format!("\"{}\"", code.as_str())
            );
        }
    }
}
