//! The consent role: requests, contacts, blocks and policies, which every send is checked
//! against inside its write.

use std::future::Future;

use super::StorageError;
use crate::protocol::{AgentName, Policy, RequestCode, RequestView};

/// A consent change, applied durably like every write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConsentChange {
    /// `from` asks `to`; refused beyond `max_pending` open requests by `from`, beyond
    /// `max_to_target` open requests to `to`, and (when `from` is another relay's agent)
    /// beyond `max_from_relay` open requests from that relay's agents.
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
        /// Open requests one target may have waiting for it.
        max_to_target: u32,
        /// Open requests the agents of one other relay may have here.
        max_from_relay: u32,
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
    /// `target` denies `requester`'s request. A requester of this relay is kept the news
    /// until its request would have lapsed ([`ConsentLedger::take_denials`]).
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
    /// `owner` joins `group` (its owner signed it): mail from the group passes its consent as
    /// the group's, like a contact's, one way. Leaving is [`ConsentChange::Remove`].
    Join {
        /// The joining agent.
        owner: AgentName,
        /// The group, as stored: bare here, `name@host` on another relay.
        group: AgentName,
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
    /// The target has too many open requests waiting for it.
    TargetFull,
    /// The requester's relay has too many open requests here.
    RelayFull,
    /// The target blocks the requester or is closed.
    NotAllowed,
    /// No open request with that code, or none from that agent.
    NoSuchRequest,
    /// The note carries the code of an open request to the same target, which its model
    /// must never be handed.
    NoteHasCode,
}

/// The denials kept for one requester that has not heard of them yet; beyond it, the ones
/// closest to lapsing are dropped.
pub const DENIALS_KEPT: u32 = 16;

/// Whether a denial of `requester` is kept here: it is an agent of this relay, which logs in
/// here (another relay's agent hears through its own relay).
pub(crate) fn hears_here(requester: &AgentName) -> bool {
    requester.stored_address().host().is_none() && requester.mailbox_relay().is_none()
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

/// Consent between agents. Every write is durable before its future resolves.
pub trait ConsentLedger: Send + Sync + 'static {
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

    /// The targets that denied `requester`'s requests since it last took them, unlapsed,
    /// oldest request first. They are deleted as they are returned: each is handed over once.
    fn take_denials(
        &self,
        requester: AgentName,
        now_ms: i64,
    ) -> impl Future<Output = Result<Vec<AgentName>, StorageError>> + Send;

    /// An agent's consent state, open requests only.
    fn consent_state(
        &self,
        agent: AgentName,
        now_ms: i64,
    ) -> impl Future<Output = Result<ConsentState, StorageError>> + Send;
}
