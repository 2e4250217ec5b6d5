//! Consent across relays, the answering side: a contact request from another relay's agent to
//! one here, and an approval by another relay's agent of a request one here made. The other
//! relay speaks only for its own agents, and only about agents here.

use super::super::state::RelayState;
use super::super::storage::{ConsentChange, ConsentLedger, ConsentOutcome, Registry};
use crate::protocol::{
    Address, AgentName, ConsentEvent, ErrorCode, LinkAnswer, LinkRequest, RelayName, RequestCode,
    validate_note,
};

/// Applies a `connect` or `approved` from `relay`.
pub async fn apply<S: Registry + ConsentLedger>(
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
            // A request lasts as long as this relay keeps its own, whatever the other one
            // asks for: the other relay's clock and choices do not fill this one's table.
            let latest = jiff::Timestamp::now()
                + jiff::SignedDuration::from_secs(state.config.request_ttl_secs as i64);
            let expires_at = expires_at.min(latest);
            let change = ConsentChange::Request {
                from: requester,
                to: target.clone(),
                note: note.clone(),
                code,
                expires_at_ms: expires_at.as_millisecond(),
                max_pending: state.config.max_pending_requests,
                max_to_target: state.config.max_requests_to_agent,
                max_from_relay: state.config.max_requests_from_relay,
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
                Ok(ConsentOutcome::TargetFull) => refused(
                    ErrorCode::TooManyRequests,
                    format!(
                        "{to} already has {} open contact requests waiting (max_requests_to_agent at {}); ask again later",
                        state.config.max_requests_to_agent, state.name
                    ),
                ),
                Ok(ConsentOutcome::RelayFull) => refused(
                    ErrorCode::TooManyRequests,
                    format!(
                        "the agents of {relay} already have {} open contact requests at {} (max_requests_from_relay); ask again once some are answered or expired",
                        state.config.max_requests_from_relay, state.name
                    ),
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
        } => settle(state, relay, requester, target, Some(code)).await,
        LinkRequest::Denied { requester, target } => {
            settle(state, relay, requester, target, None).await
        }
        LinkRequest::Hello { .. } | LinkRequest::Ping {} | LinkRequest::Bounced { .. } => {
            refused(ErrorCode::UnexpectedFrame, "not a consent request".into())
        }
    }
}

/// `target`'s answer to `requester`'s request here, from `target`'s relay: an approval with
/// the request's `code`, or (`None`) a denial. It applies only to a request open here, so a
/// relay can neither make contacts nobody asked for nor speak for another relay's agents.
async fn settle<S: ConsentLedger>(
    state: &RelayState<S>,
    relay: &RelayName,
    requester: Address,
    target: Address,
    code: Option<RequestCode>,
) -> LinkAnswer {
    let refused = |code, message: String| LinkAnswer::Refused { code, message };
    let (Some(answerer), Some(asker)) = (theirs(relay, &target), ours(state, &requester)) else {
        return refused(
            ErrorCode::NotAllowed,
            format!(
                "{relay} answers for {target}, which is not its agent, or {requester}, which is not an agent here"
            ),
        );
    };
    let with_code = if code.is_some() {
        " with that code"
    } else {
        ""
    };
    let (change, event) = match code {
        Some(code) => (
            ConsentChange::Approve {
                target: answerer,
                requester: asker.clone(),
                code,
            },
            ConsentEvent::Approved { by: target.clone() },
        ),
        None => (
            ConsentChange::Deny {
                target: answerer,
                requester: asker.clone(),
            },
            ConsentEvent::Denied { by: target.clone() },
        ),
    };
    match state.storage.consent(change).await {
        Ok(ConsentOutcome::Applied(_)) => {
            state.presence.tell(&asker, event);
            LinkAnswer::Done {}
        }
        Ok(_) => refused(
            ErrorCode::BadCode,
            format!("{requester} has no open request to {target}{with_code}"),
        ),
        Err(e) => refused(ErrorCode::Internal, e.to_string()),
    }
}

/// `address` as kept here when it is an agent of `relay`.
fn theirs(relay: &RelayName, address: &Address) -> Option<AgentName> {
    (address.host() == Some(relay))
        .then(|| AgentName::remote_agent(address))
        .flatten()
}

/// The agent here that `address` names.
fn ours<S>(state: &RelayState<S>, address: &Address) -> Option<AgentName> {
    (address.host() == Some(&state.name)).then(|| address.name().clone())
}
