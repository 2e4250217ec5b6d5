//! Consent frames: contact requests, approvals by code, denials, blocks, policies, the owner
//! key. Codes are returned only to the requester; the target is told a request exists, never
//! its code. Every change to an agent's consent must be signed by the agent's owner key for
//! this connection: the agent's own key is not enough.

use std::time::Duration;

use super::link;
use super::state::RelayState;
use super::storage::{
    ConsentChange, ConsentLedger, ConsentOutcome, Registry, RelayPins, StorageError,
};
use super::wire::error_frame;
use crate::crypto::owner;
use crate::protocol::{
    Address, AgentName, ClientFrame, ConsentEvent, ErrorCode, LinkAnswer, LinkRequest,
    MAX_STORED_NAME_BYTES, OwnerKey, Peer, Policy, RequestCode, ServerFrame, validate_note,
};

fn error(reference: String, code: ErrorCode, message: impl Into<String>) -> ServerFrame {
    error_frame(Some(reference), code, message, None)
}

fn retry_error(
    reference: String,
    code: ErrorCode,
    message: impl Into<String>,
    retry: Duration,
) -> ServerFrame {
    error_frame(Some(reference), code, message, Some(retry))
}

fn done(reference: String, detail: impl Into<String>) -> ServerFrame {
    ServerFrame::Done {
        reference,
        detail: detail.into(),
    }
}

fn internal(reference: String, e: StorageError) -> ServerFrame {
    retry_error(
        reference,
        ErrorCode::Internal,
        format!("not applied: {e}"),
        Duration::from_secs(1),
    )
}

/// The owner key when `frame` is one only the agent's owner may send, checked against the
/// frame's signature for this connection (`None` for every other frame); the refusal when the
/// signature is missing or wrong.
pub async fn signed_by_owner<S: Registry>(
    state: &RelayState<S>,
    (agent, nonce): (&AgentName, &[u8]),
    frame: &ClientFrame,
) -> Result<Option<OwnerKey>, ServerFrame> {
    let Some((act, signature)) = frame.owner_act() else {
        return Ok(None);
    };
    let reference = || frame.reference().unwrap_or_default().to_owned();
    let owner = match state.storage.owner(agent.clone()).await {
        Ok(Some(owner)) => owner,
        Ok(None) => {
            return Err(error(
                reference(),
                ErrorCode::OwnerRequired,
                format!(
                    "{agent} has no owner key yet: its owner runs `mailslot owner init` (consent changes are signed by the owner, never by the agent)"
                ),
            ));
        }
        Err(e) => return Err(internal(reference(), e)),
    };
    if owner::verify(&owner, &state.relay_id, nonce, agent, &act, signature).is_err() {
        tracing::warn!(%agent, "a consent change not signed by the agent's owner key was refused");
        return Err(error(
            reference(),
            ErrorCode::NotOwner,
            format!(
                "not signed by {agent}'s owner key for this connection; consent changes need the owner's passphrase"
            ),
        ));
    }
    Ok(Some(owner))
}

/// The refusal of a peer this relay cannot keep: an address too long to be stored, or a relay
/// blocking itself.
fn not_kept(reference: String) -> ServerFrame {
    error(
        reference,
        ErrorCode::BadFrame,
        format!(
            "an address is at most {MAX_STORED_NAME_BYTES} bytes, and a relay cannot block itself"
        ),
    )
}

/// Answers `agent`'s `deny` of `requester`'s request.
#[tracing::instrument(level = "debug", name = "request", skip_all, fields(kind = "deny", %agent, r#ref = %reference, %requester))]
pub async fn deny<S: ConsentLedger + RelayPins>(
    state: &RelayState<S>,
    agent: &AgentName,
    reference: String,
    requester: Address,
) -> ServerFrame {
    let Some(peer) = state.stored_peer(&requester) else {
        return not_kept(reference);
    };
    let change = ConsentChange::Deny {
        target: agent.clone(),
        requester: peer.clone(),
    };
    match state.storage.consent(change).await {
        Ok(ConsentOutcome::Applied(_)) => match requester.host() {
            // Another relay's agent: its relay withdraws the request and tells it.
            Some(relay) if state.local_name(&requester).is_none() => {
                let told = LinkRequest::Denied {
                    requester: requester.clone(),
                    target: Address::remote(agent.clone(), state.name.clone()),
                };
                if let Err(why) = link::ask(state, relay, told).await {
                    tracing::info!(%requester, %why, "the requester's relay was not told of the denial; its request lapses there");
                }
                done(reference, format!("denied {requester}'s request"))
            }
            _ => {
                state.presence.tell(
                    &peer,
                    ConsentEvent::Denied {
                        by: Address::local(agent.clone()),
                    },
                );
                done(reference, format!("denied {requester}'s request"))
            }
        },
        // The code stays `bad_code` (what older clients know); the words say why.
        Ok(_) => error(
            reference,
            ErrorCode::BadCode,
            format!(
                "{requester} has no open request to {agent}: it was already denied or approved, withdrawn, or it lapsed; nothing changed"
            ),
        ),
        Err(e) => internal(reference, e),
    }
}

/// Answers `agent`'s `block` of `peer`.
#[tracing::instrument(level = "debug", name = "request", skip_all, fields(kind = "block", %agent, r#ref = %reference, %peer))]
pub async fn block<S: ConsentLedger>(
    state: &RelayState<S>,
    agent: &AgentName,
    reference: String,
    peer: Peer,
) -> ServerFrame {
    let Some(kept) = state.stored_block(&peer) else {
        return not_kept(reference);
    };
    let change = ConsentChange::Block {
        owner: agent.clone(),
        peer: kept,
    };
    apply(state, reference, change, format!("blocked {peer}")).await
}

/// Answers `agent`'s `unblock` of `peer`.
#[tracing::instrument(level = "debug", name = "request", skip_all, fields(kind = "unblock", %agent, r#ref = %reference, %peer))]
pub async fn unblock<S: ConsentLedger>(
    state: &RelayState<S>,
    agent: &AgentName,
    reference: String,
    peer: Peer,
) -> ServerFrame {
    let Some(kept) = state.stored_block(&peer) else {
        return not_kept(reference);
    };
    let change = ConsentChange::Unblock {
        owner: agent.clone(),
        peer: kept,
    };
    apply(state, reference, change, format!("unblocked {peer}")).await
}

/// Answers `agent`'s `remove` of its contact `peer`.
#[tracing::instrument(level = "debug", name = "request", skip_all, fields(kind = "remove", %agent, r#ref = %reference, %peer))]
pub async fn remove<S: ConsentLedger>(
    state: &RelayState<S>,
    agent: &AgentName,
    reference: String,
    peer: Address,
) -> ServerFrame {
    let Some(kept) = state.stored_peer(&peer) else {
        return not_kept(reference);
    };
    let change = ConsentChange::Remove {
        owner: agent.clone(),
        peer: kept,
    };
    let detail = format!("{peer} is no longer a contact");
    apply(state, reference, change, detail).await
}

/// Answers `agent`'s `set_policy`.
#[tracing::instrument(level = "debug", name = "request", skip_all, fields(kind = "set_policy", %agent, r#ref = %reference, %policy))]
pub async fn set_policy<S: ConsentLedger>(
    state: &RelayState<S>,
    agent: &AgentName,
    reference: String,
    policy: Policy,
) -> ServerFrame {
    let change = ConsentChange::SetPolicy {
        owner: agent.clone(),
        policy,
    };
    apply(state, reference, change, format!("policy is now {policy}")).await
}

/// Answers `agent`'s `consent`: its policy, open requests, contacts and blocks.
#[tracing::instrument(level = "debug", name = "request", skip_all, fields(kind = "consent", %agent, r#ref = %reference))]
pub async fn state_of<S: ConsentLedger>(
    state: &RelayState<S>,
    agent: &AgentName,
    reference: String,
) -> ServerFrame {
    match state
        .storage
        .consent_state(agent.clone(), jiff::Timestamp::now().as_millisecond())
        .await
    {
        Ok(s) => ServerFrame::ConsentState {
            reference,
            policy: s.policy.unwrap_or(state.config.effective_default_policy()),
            incoming: s.incoming,
            outgoing: s.outgoing,
            contacts: s.contacts.iter().map(AgentName::stored_address).collect(),
            blocked: s.blocked.iter().map(AgentName::stored_peer).collect(),
        },
        Err(e) => internal(reference, e),
    }
}

/// Answers `agent`'s `set_owner`: `new` replaces `current`, the key its signature was
/// checked against.
#[tracing::instrument(level = "debug", name = "request", skip_all, fields(kind = "set_owner", %agent, r#ref = %reference))]
pub async fn set_owner<S: Registry>(
    state: &RelayState<S>,
    agent: &AgentName,
    reference: String,
    (current, new): (Option<OwnerKey>, OwnerKey),
) -> ServerFrame {
    if !owner::is_valid(&new) {
        return error(
            reference,
            ErrorCode::BadFrame,
            "owner: not a valid Ed25519 public key",
        );
    }
    match state.storage.set_owner(agent.clone(), new, current).await {
        Ok(true) => {
            tracing::info!(%agent, "owner key replaced");
            done(
                reference,
                format!("{agent}'s owner key is now {}", owner::fingerprint(&new)),
            )
        }
        Ok(false) => error(
            reference,
            ErrorCode::NotOwner,
            "the owner key changed meanwhile; try again",
        ),
        Err(e) => internal(reference, e),
    }
}

async fn apply<S: ConsentLedger>(
    state: &RelayState<S>,
    reference: String,
    change: ConsentChange,
    detail: String,
) -> ServerFrame {
    match state.storage.consent(change).await {
        Ok(ConsentOutcome::Applied(_)) => done(reference, detail),
        Ok(_) => error(reference, ErrorCode::BadCode, "nothing to change"),
        Err(e) => internal(reference, e),
    }
}

/// Answers `agent`'s `connect`: a contact request to `to`, here or on another relay.
#[tracing::instrument(level = "debug", name = "request", skip_all, fields(kind = "connect", %agent, r#ref = %reference, %to))]
pub async fn connect<S: Registry + ConsentLedger + RelayPins>(
    state: &RelayState<S>,
    agent: &AgentName,
    reference: String,
    to: Address,
    note: String,
) -> ServerFrame {
    if let Err(e) = validate_note(&note) {
        return error(reference, ErrorCode::BadFrame, e.to_string());
    }
    let Some(target) = state.stored_peer(&to) else {
        return error(
            reference,
            ErrorCode::BadFrame,
            format!("an address is at most {MAX_STORED_NAME_BYTES} bytes"),
        );
    };
    if &target == agent {
        return error(reference, ErrorCode::BadFrame, "an agent cannot ask itself");
    }
    let remote = to.host().filter(|_| state.local_name(&to).is_none());
    match remote {
        Some(relay) if !state.config.links_with(relay) => {
            return error(
                reference,
                ErrorCode::NotAllowed,
                format!("this relay does not deliver to {relay} (its operator denied it)"),
            );
        }
        Some(relay) if link::names_private(relay) && !state.config.may_reach_private(relay) => {
            return error(
                reference,
                ErrorCode::NotAllowed,
                link::private_refusal(relay),
            );
        }
        Some(_) => {}
        None => match state.is_registered(&target).await {
            Ok(true) => {}
            Ok(false) => {
                return error(
                    reference,
                    ErrorCode::UnknownAgent,
                    format!("no agent named {to} on this relay"),
                );
            }
            Err(e) => return internal(reference, e),
        },
    }
    if let Err(wait) = state.request_rate.take(agent) {
        return retry_error(
            reference,
            ErrorCode::RateLimited,
            "too many contact requests this hour",
            wait,
        );
    }
    let mut raw = [0u8; 5];
    if getrandom::fill(&mut raw).is_err() {
        return retry_error(
            reference,
            ErrorCode::Internal,
            "no randomness",
            Duration::from_secs(1),
        );
    }
    let code = RequestCode::from_random(raw);
    let expires_at = jiff::Timestamp::now()
        + jiff::SignedDuration::from_secs(state.config.request_ttl_secs as i64);
    let change = ConsentChange::Request {
        from: agent.clone(),
        to: target.clone(),
        note: note.clone(),
        code: code.clone(),
        expires_at_ms: expires_at.as_millisecond(),
        max_pending: state.config.max_pending_requests,
        max_to_target: state.config.max_requests_to_agent,
        max_from_relay: state.config.max_requests_from_relay,
    };
    match state.storage.consent(change).await {
        Ok(ConsentOutcome::Applied(_)) => {}
        Ok(ConsentOutcome::AlreadyContacts) => {
            return done(reference, format!("{to} is already a contact"));
        }
        Ok(ConsentOutcome::TooManyPending) => {
            return retry_error(
                reference,
                ErrorCode::TooManyRequests,
                format!(
                    "{agent} already has {} open requests; wait for answers or for them to expire",
                    state.config.max_pending_requests
                ),
                Duration::from_secs(state.config.request_ttl_secs),
            );
        }
        Ok(ConsentOutcome::TargetFull | ConsentOutcome::RelayFull) => {
            return retry_error(
                reference,
                ErrorCode::TooManyRequests,
                format!(
                    "{to} already has {} open contact requests waiting (max_requests_to_agent); ask again once its owner has answered some or they expired",
                    state.config.max_requests_to_agent
                ),
                Duration::from_secs(state.config.request_ttl_secs),
            );
        }
        Ok(ConsentOutcome::NoteHasCode) => {
            return error(
                reference,
                ErrorCode::BadFrame,
                "note: holds the code of an open request to the same agent; codes go from owner to owner, never through agents, so leave it out",
            );
        }
        Ok(_) => {
            return error(
                reference,
                ErrorCode::NotAllowed,
                format!("{to} does not accept requests from {agent}"),
            );
        }
        Err(e) => return internal(reference, e),
    }
    match remote {
        None => state.presence.tell(
            &target,
            ConsentEvent::RequestReceived {
                from: Address::local(agent.clone()),
                note,
                expires_at,
            },
        ),
        // The other relay records it too (and tells its agent), or the request is withdrawn
        // here and its refusal is the answer.
        Some(relay) => {
            let ask = LinkRequest::Connect {
                from: Address::remote(agent.clone(), state.name.clone()),
                to: to.clone(),
                note,
                code: code.clone(),
                expires_at,
            };
            let refusal = match link::ask(state, relay, ask).await {
                Ok(LinkAnswer::Done {}) => None,
                Ok(LinkAnswer::Refused { code, message }) => Some((code, message, None)),
                Ok(other) => Some((
                    ErrorCode::Internal,
                    format!("{relay} answered the request with {other:?}"),
                    Some(Duration::from_secs(60)),
                )),
                Err(why) => Some((
                    ErrorCode::Internal,
                    format!("the request was not passed on: {why}"),
                    Some(Duration::from_secs(60)),
                )),
            };
            if let Some((code, message, retry)) = refusal {
                let withdraw = ConsentChange::Deny {
                    target: target.clone(),
                    requester: agent.clone(),
                };
                if let Err(e) = state.storage.consent(withdraw).await {
                    tracing::warn!(%agent, %to, error = %e, "could not withdraw a request the other relay refused");
                }
                return error_frame(Some(reference), code, message, retry);
            }
        }
    }
    ServerFrame::Requested {
        reference,
        code,
        expires_at,
    }
}

const BAD_CODE: &str =
    "no open request from that agent has that code; check it with the requester's owner";

/// Takes one approval attempt from `agent`'s hourly allowance (approvals and their dry runs
/// alike); `Some` is the refusal, saying when the next one may be made.
fn take_attempt<S>(
    state: &RelayState<S>,
    agent: &AgentName,
    reference: &str,
) -> Option<ServerFrame> {
    let wait = state.approve_rate.take(agent).err()?;
    Some(retry_error(
        reference.to_owned(),
        ErrorCode::RateLimited,
        "too many approval attempts this hour",
        wait,
    ))
}

/// A dry run of `approve`. It takes a token from the approval limit first, so checking is no
/// faster a way to guess codes than approving; a match gives the token back, so checking and
/// then approving costs one attempt, as approving alone does.
#[tracing::instrument(level = "debug", name = "request", skip_all, fields(kind = "check_code", %agent, r#ref = %reference, %from))]
pub async fn check_code<S: ConsentLedger>(
    state: &RelayState<S>,
    agent: &AgentName,
    reference: String,
    from: Address,
    code: RequestCode,
) -> ServerFrame {
    let Some(requester) = state.stored_peer(&from) else {
        return not_kept(reference);
    };
    if let Some(refused) = take_attempt(state, agent, &reference) {
        return refused;
    }
    let now = jiff::Timestamp::now().as_millisecond();
    match state
        .storage
        .has_request(agent.clone(), requester.clone(), code, now)
        .await
    {
        Ok(true) => {
            state.approve_rate.give_back(agent);
            done(
                reference,
                format!("the code matches {requester}'s open request"),
            )
        }
        Ok(false) => error(reference, ErrorCode::BadCode, BAD_CODE),
        Err(e) => internal(reference, e),
    }
}

/// Answers `agent`'s `approve` of `from`'s request, with the code its owner was given.
#[tracing::instrument(level = "debug", name = "request", skip_all, fields(kind = "approve", %agent, r#ref = %reference, %from))]
pub async fn approve<S: ConsentLedger + RelayPins>(
    state: &RelayState<S>,
    agent: &AgentName,
    reference: String,
    from: Address,
    code: RequestCode,
) -> ServerFrame {
    let Some(requester) = state.stored_peer(&from) else {
        return not_kept(reference);
    };
    if let Some(refused) = take_attempt(state, agent, &reference) {
        return refused;
    }
    match state
        .storage
        .consent(ConsentChange::Approve {
            target: agent.clone(),
            requester,
            code: code.clone(),
        })
        .await
    {
        Ok(ConsentOutcome::Applied(Some(requester))) => {
            let address = requester.stored_address();
            let Some(relay) = address.host() else {
                state.presence.tell(
                    &requester,
                    ConsentEvent::Approved {
                        by: Address::local(agent.clone()),
                    },
                );
                return done(reference, format!("{requester} is now a contact"));
            };
            // The requester's relay records the contact too, so this agent's mail to it is
            // taken there.
            let told = LinkRequest::Approved {
                requester: address.clone(),
                target: Address::remote(agent.clone(), state.name.clone()),
                code,
            };
            match link::ask(state, relay, told).await {
                Ok(LinkAnswer::Done {}) => done(reference, format!("{address} is now a contact")),
                outcome => {
                    tracing::warn!(%agent, requester = %address, ?outcome, "the requester's relay did not take the approval");
                    done(
                        reference,
                        format!(
                            "{address} is now a contact here; its relay {relay} could not be told ({}), so mail to it may be refused there until it is: approve again later",
                            match outcome {
                                Ok(LinkAnswer::Refused { message, .. }) => message,
                                Ok(other) => format!("{other:?}"),
                                Err(why) => why,
                            }
                        ),
                    )
                }
            }
        }
        Ok(_) => error(reference, ErrorCode::BadCode, BAD_CODE),
        Err(e) => internal(reference, e),
    }
}
