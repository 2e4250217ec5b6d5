//! The relay's HTTP answers shared by its routes: the JSON error body, and a registered
//! agent's keys (or the answer that says why not) for the lookup and the discovery document.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use super::state::RelayState;
use super::storage::{Groups, Registry};
use crate::crypto::PublicIdentity;
use crate::protocol::{AgentName, ErrorCode, Fingerprint, PublicKeys};

#[derive(Serialize)]
struct ErrorBody {
    code: ErrorCode,
    message: String,
}

/// An error answer: `status`, with the code and sentence as JSON.
pub(super) fn error(status: StatusCode, code: ErrorCode, message: impl Into<String>) -> Response {
    (
        status,
        Json(ErrorBody {
            code,
            message: message.into(),
        }),
    )
        .into_response()
}

/// A registered agent's name, keys and fingerprint, or the answer that says why not (`relay`
/// names the relay in the "no agent" answer); shared by the lookup and the signed discovery
/// answer.
pub(super) async fn registered<S: Registry + Groups>(
    state: &RelayState<S>,
    name: &str,
    relay: &str,
) -> Result<(AgentName, PublicKeys, Fingerprint), Response> {
    let name = AgentName::new(name)
        .map_err(|e| error(StatusCode::BAD_REQUEST, ErrorCode::BadFrame, e.to_string()))?;
    let keys = match state.storage.keys(name.clone()).await {
        Ok(Some(keys)) => keys,
        // A group has no keys; mail to it from another relay is not carried yet.
        Ok(None) if matches!(state.storage.group(name.clone()).await, Ok(Some(_))) => {
            return Err(error(
                StatusCode::NOT_FOUND,
                ErrorCode::UnknownAgent,
                format!(
                    "{name} is a group on {relay}; only agents of {relay} post to it (mail to a group from another relay is not carried yet): write to its members"
                ),
            ));
        }
        Ok(None) => {
            return Err(error(
                StatusCode::NOT_FOUND,
                ErrorCode::UnknownAgent,
                format!("no agent named {name} on {relay}"),
            ));
        }
        Err(e) => {
            return Err(error(
                StatusCode::SERVICE_UNAVAILABLE,
                ErrorCode::Internal,
                e.to_string(),
            ));
        }
    };
    let fingerprint = PublicIdentity::try_from(keys.clone())
        .map(|id| id.fingerprint())
        .map_err(|e| {
            error(
                StatusCode::INTERNAL_SERVER_ERROR,
                ErrorCode::Internal,
                e.to_string(),
            )
        })?;
    Ok((name, keys, fingerprint))
}
