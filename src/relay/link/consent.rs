//! Consent across relays, the answering side: a contact request from another relay's agent to
//! one here, and an approval by another relay's agent of a request one here made. The other
//! relay speaks only for its own agents, and only about agents here.

use super::super::state::RelayState;
use super::super::storage::{ConsentChange, ConsentOutcome, Storage};
use crate::protocol::{
    Address, AgentName, ConsentEvent, ErrorCode, LinkAnswer, LinkRequest, RelayName, validate_note,
};

/// Applies a `connect` or `approved` from `relay`.
pub async fn apply<S: Storage>(
    state: &RelayState<S>,
    relay: &RelayName,
    request: LinkRequest,
) -> LinkAnswer {
    let refused = |code, message: String| LinkAnswer::Refused { code, message };
    match request {
        LinkRequest::Connect {
            from,
            to,
            note,
            code,
            expires_at,
        } => {
            let (Some(requester), Some(target)) = (theirs(relay, &from), ours(state, &to)) else {
                return refused(
                    ErrorCode::NotAllowed,
                    format!(
                        "{relay} asks for {from}, which is not its agent, or of {to}, which is not an agent here"
                    ),
                );
            };
            if let Err(e) = validate_note(&note) {
                return refused(ErrorCode::BadFrame, e.to_string());
            }
            match state.is_registered(&target).await {
                Ok(true) => {}
                Ok(false) => return refused(ErrorCode::UnknownAgent, format!("no agent {to}")),
                Err(e) => return refused(ErrorCode::Internal, e.to_string()),
            }
            if let Err(wait) = state.request_rate.take(&requester) {
                return refused(
                    ErrorCode::RateLimited,
                    format!("{from} made too many contact requests this hour; wait {wait:?}"),
                );
            }
            let change = ConsentChange::Request {
                from: requester,
                to: target.clone(),
                note: note.clone(),
                code,
                expires_at_ms: expires_at.as_millisecond(),
                max_pending: state.config.max_pending_requests,
            };
            match state.storage.consent(change).await {
                Ok(ConsentOutcome::Applied(_)) => {
                    state.presence.tell(
                        &target,
                        ConsentEvent::RequestReceived {
                            from,
                            note,
                            expires_at,
                        },
                    );
                    LinkAnswer::Done {}
                }
                Ok(ConsentOutcome::AlreadyContacts) => LinkAnswer::Done {},
                Ok(ConsentOutcome::TooManyPending) => refused(
                    ErrorCode::TooManyRequests,
                    format!("{from} has too many open requests here"),
                ),
                Ok(ConsentOutcome::NoteHasCode) => refused(
                    ErrorCode::BadFrame,
                    "note: holds the code of an open request".into(),
                ),
                Ok(_) => refused(
                    ErrorCode::NotAllowed,
                    format!("{to} does not accept requests from {from}"),
                ),
                Err(e) => refused(ErrorCode::Internal, e.to_string()),
            }
        }
        LinkRequest::Approved {
            requester,
            target,
            code,
        } => {
            let (Some(approver), Some(asker)) = (theirs(relay, &target), ours(state, &requester))
            else {
                return refused(
                    ErrorCode::NotAllowed,
                    format!(
                        "{relay} approves for {target}, which is not its agent, or {requester}, which is not an agent here"
                    ),
                );
            };
            // The request must be open here with that code: a relay cannot make contacts
            // nobody asked for.
            let change = ConsentChange::Approve {
                target: approver,
                requester: asker.clone(),
                code,
            };
            match state.storage.consent(change).await {
                Ok(ConsentOutcome::Applied(_)) => {
                    state
                        .presence
                        .tell(&asker, ConsentEvent::Approved { by: target });
                    LinkAnswer::Done {}
                }
                Ok(_) => refused(
                    ErrorCode::BadCode,
                    format!("{requester} has no open request to {target} with that code"),
                ),
                Err(e) => refused(ErrorCode::Internal, e.to_string()),
            }
        }
        LinkRequest::Denied { requester, target } => {
            let (Some(denier), Some(asker)) = (theirs(relay, &target), ours(state, &requester))
            else {
                return refused(
                    ErrorCode::NotAllowed,
                    format!(
                        "{relay} denies for {target}, which is not its agent, or {requester}, which is not an agent here"
                    ),
                );
            };
            let change = ConsentChange::Deny {
                target: denier,
                requester: asker.clone(),
            };
            match state.storage.consent(change).await {
                Ok(ConsentOutcome::Applied(_)) => {
                    state
                        .presence
                        .tell(&asker, ConsentEvent::Denied { by: target });
                    LinkAnswer::Done {}
                }
                Ok(_) => refused(
                    ErrorCode::BadCode,
                    format!("{requester} has no open request to {target}"),
                ),
                Err(e) => refused(ErrorCode::Internal, e.to_string()),
            }
        }
        LinkRequest::Hello { .. } | LinkRequest::Ping {} | LinkRequest::Bounced { .. } => {
            refused(ErrorCode::UnexpectedFrame, "not a consent request".into())
        }
    }
}

/// `address` as kept here when it is an agent of `relay`.
fn theirs(relay: &RelayName, address: &Address) -> Option<AgentName> {
    (address.host() == Some(relay))
        .then(|| AgentName::remote_agent(address))
        .flatten()
}

/// The agent here that `address` names.
fn ours<S: Storage>(state: &RelayState<S>, address: &Address) -> Option<AgentName> {
    (address.host() == Some(&state.name)).then(|| address.name().clone())
}
