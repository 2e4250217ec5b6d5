//! The consent calls: a contact request and the relay's consent state (over any [`Ask`]: the
//! CLI's control connection or the mailbox's session), and the owner's on a control
//! connection: a request's code checked without changing anything, the changes and a new
//! owner key signed with the owner key. The CLI and the dashboard both go through here, so a
//! consent change is signed one way only.

use super::ask::Ask;
use super::{ClientError, Connection};
use crate::crypto::{Owner, owner};
use crate::protocol::{
    Address, AgentName, ClientFrame, Fingerprint, OwnerAct, OwnerKey, Peer, Policy, RequestCode,
    RequestView, ServerFrame,
};

/// What became of a contact request.
#[derive(Debug, Clone)]
pub enum ContactRequest {
    /// Waiting for the owners; the code is for the requester's owner only (never a model).
    Pending {
        /// The code the requester's owner passes on.
        code: RequestCode,
        /// When the request lapses.
        expires_at: jiff::Timestamp,
    },
    /// Nothing was needed; the relay's sentence.
    Done(String),
}

/// The agent's consent as the relay holds it.
#[derive(Debug, Clone)]
pub struct ConsentState {
    /// Whom the agent accepts mail from.
    pub policy: Policy,
    /// Open requests to this agent (no codes: only the requester's side sees them).
    pub incoming: Vec<RequestView>,
    /// Open requests from this agent, with their codes.
    pub outgoing: Vec<RequestView>,
    /// Its contacts.
    pub contacts: Vec<Address>,
    /// The agents and relays it blocked.
    pub blocked: Vec<Peer>,
}

/// A consent change, which only the owner key can sign.
#[derive(Debug, Clone)]
pub enum Change {
    /// Approve `from`'s request with the code its owner passed on.
    Approve {
        /// The requester.
        from: Address,
        /// The code.
        code: RequestCode,
    },
    /// Deny a request.
    Deny(Address),
    /// Refuse all mail and requests from an agent, or from every agent of a relay.
    Block(Peer),
    /// Lift a block.
    Unblock(Peer),
    /// End a contact, both ways.
    Remove(Address),
    /// Set whom the agent accepts mail from.
    Policy(Policy),
    /// Join a group: accept the mail it fans out.
    Join(Address),
}

impl Change {
    fn act(&self) -> OwnerAct<'_> {
        match self {
            Change::Approve { from, code } => OwnerAct::Approve { from, code },
            Change::Deny(a) => OwnerAct::Deny(a),
            Change::Block(a) => OwnerAct::Block(a),
            Change::Unblock(a) => OwnerAct::Unblock(a),
            Change::Remove(a) => OwnerAct::Remove(a),
            Change::Policy(p) => OwnerAct::SetPolicy(*p),
            Change::Join(g) => OwnerAct::Join(g),
        }
    }

    fn frame(self, reference: String, owner_signature: Vec<u8>) -> ClientFrame {
        match self {
            Change::Approve { from, code } => ClientFrame::Approve {
                reference,
                from,
                code,
                dry_run: false,
                owner_signature,
            },
            Change::Deny(agent) => ClientFrame::Deny {
                reference,
                agent,
                owner_signature,
            },
            Change::Block(agent) => ClientFrame::Block {
                reference,
                agent,
                owner_signature,
            },
            Change::Unblock(agent) => ClientFrame::Unblock {
                reference,
                agent,
                owner_signature,
            },
            Change::Remove(agent) => ClientFrame::Remove {
                reference,
                agent,
                owner_signature,
            },
            Change::Policy(policy) => ClientFrame::SetPolicy {
                reference,
                policy,
                owner_signature,
            },
            Change::Join(group) => ClientFrame::Join {
                reference,
                group,
                owner_signature,
            },
        }
    }
}

/// Why the owner key of this home cannot sign for the connection's agent.
#[derive(Debug, thiserror::Error)]
pub enum OwnerKeyProblem {
    /// The home has no owner key yet.
    #[error(
        "this home has no owner key yet: run `mailslot owner init` once (it asks for a passphrase)"
    )]
    Missing,
    /// Another key was registered first for the agent.
    #[error(
        "the relay holds another owner key for {agent} (fingerprint {held}), not yours ({local}): someone registered theirs first, so consent for {agent} is in their hands. If it was not you, create a new agent, or ask the relay's operator"
    )]
    HeldByAnother {
        /// The agent.
        agent: AgentName,
        /// The fingerprint of the key the relay holds.
        held: Fingerprint,
        /// The fingerprint of this home's key.
        local: Fingerprint,
    },
    /// The relay did not say it holds any owner key.
    #[error("the relay did not register your owner key for {agent}; is it an older relay?")]
    NotRegistered {
        /// The agent.
        agent: AgentName,
    },
}

/// Checks, before a passphrase is asked for, that the relay holds `local` (this home's owner
/// key) for the connection's agent: otherwise no signature of it could count.
pub fn check_owner(
    conn: &Connection,
    agent: &AgentName,
    local: Option<OwnerKey>,
) -> Result<(), OwnerKeyProblem> {
    let Some(local) = local else {
        return Err(OwnerKeyProblem::Missing);
    };
    match conn.owner() {
        Some(held) if *held == local => Ok(()),
        Some(held) => Err(OwnerKeyProblem::HeldByAnother {
            agent: agent.clone(),
            held: owner::fingerprint(held),
            local: owner::fingerprint(&local),
        }),
        None => Err(OwnerKeyProblem::NotRegistered {
            agent: agent.clone(),
        }),
    }
}

fn unexpected(other: ServerFrame) -> ClientError {
    ClientError::Protocol(format!("unexpected answer {other:?}"))
}

/// Asks `to`'s owner to accept mail from the connection's agent, with a note for them.
pub async fn request(
    conn: &mut impl Ask,
    to: Address,
    note: String,
) -> Result<ContactRequest, ClientError> {
    match conn
        .ask(Box::new(|reference| ClientFrame::Connect {
            reference,
            to,
            note,
        }))
        .await?
    {
        ServerFrame::Requested {
            code, expires_at, ..
        } => Ok(ContactRequest::Pending { code, expires_at }),
        ServerFrame::Done { detail, .. } => Ok(ContactRequest::Done(detail)),
        other => Err(unexpected(other)),
    }
}

/// The agent's consent state on the relay.
pub async fn state(conn: &mut impl Ask) -> Result<ConsentState, ClientError> {
    match conn
        .ask(Box::new(|r| ClientFrame::Consent { reference: r }))
        .await?
    {
        ServerFrame::ConsentState {
            policy,
            incoming,
            outgoing,
            contacts,
            blocked,
            ..
        } => Ok(ConsentState {
            policy,
            incoming,
            outgoing,
            contacts,
            blocked,
        }),
        other => Err(unexpected(other)),
    }
}

/// Asks the relay whether `code` is the code of `from`'s request, changing nothing (it counts
/// against the approval limit, and gives the attempt back when it matches). A wrong code is
/// [`ClientError::Refused`] with `bad_code`.
pub async fn check_code(
    conn: &mut Connection,
    from: &Address,
    code: &RequestCode,
) -> Result<(), ClientError> {
    match conn
        .call(|r| ClientFrame::Approve {
            reference: r,
            from: from.clone(),
            code: code.clone(),
            dry_run: true,
            owner_signature: Vec::new(),
        })
        .await?
    {
        ServerFrame::Done { .. } => Ok(()),
        other => Err(unexpected(other)),
    }
}

/// Signs `change` with the unlocked owner key for this connection and sends it; the relay's
/// sentence on success.
pub async fn apply(
    conn: &mut Connection,
    owner: &Owner,
    change: Change,
) -> Result<String, ClientError> {
    let signature = conn.owner_signature(owner, &change.act());
    match conn
        .call(|reference| change.frame(reference, signature))
        .await?
    {
        ServerFrame::Done { detail, .. } => Ok(detail),
        other => Err(unexpected(other)),
    }
}

/// Registers `new` as the connection's agent's owner key, signed by `old`, the key the relay
/// holds now.
pub async fn set_owner(
    conn: &mut Connection,
    old: &Owner,
    new: OwnerKey,
) -> Result<(), ClientError> {
    let owner_signature = conn.owner_signature(old, &OwnerAct::SetOwner(&new));
    conn.call(|reference| ClientFrame::SetOwner {
        reference,
        owner: new,
        owner_signature,
    })
    .await?;
    Ok(())
}
