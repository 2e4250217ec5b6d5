//! Discovery over HTTP: who this relay is (`/.well-known/mailslot`), and its agents' keys
//! signed by its own key, for clients and relays elsewhere.

use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};

use super::http::error;
use super::state::RelayState;
use super::storage::Storage;
use crate::crypto::PublicIdentity;
use crate::protocol::{
    AgentKeys, AgentName, EndpointPath, ErrorCode, PROTOCOL_VERSION, RelayInfo, WEBSOCKET_PATH,
};

/// The relay's name and key change only with a restart (and a changed key is refused by
/// everyone who pinned the old one), so an hour of caching is harmless.
const INFO_CACHE: &str = "public, max-age=3600";
/// An agent's keys change only when its name is retired and taken again.
const KEYS_CACHE: &str = "public, max-age=300";

/// `GET /.well-known/mailslot`: the relay's name, key, fingerprint, protocol version and
/// WebSocket path.
pub async fn info<S: Storage>(State(state): State<Arc<RelayState<S>>>) -> Response {
    let info = RelayInfo {
        name: state.name.clone(),
        key: state.identity.key(),
        fingerprint: state.identity.fingerprint(),
        version: PROTOCOL_VERSION,
        websocket: EndpointPath::new(WEBSOCKET_PATH).expect("the endpoint path is valid"),
    };
    ([(header::CACHE_CONTROL, INFO_CACHE)], Json(info)).into_response()
}

/// `GET /.well-known/mailslot/agents/{name}`: the agent's keys, signed by the relay's key.
pub async fn agent_keys<S: Storage>(
    State(state): State<Arc<RelayState<S>>>,
    Path(name): Path<String>,
) -> Response {
    let agent = match AgentName::new(&name) {
        Ok(n) => n,
        Err(e) => return error(StatusCode::BAD_REQUEST, ErrorCode::BadFrame, e.to_string()),
    };
    let keys = match state.storage.keys(agent.clone()).await {
        Ok(Some(keys)) => keys,
        Ok(None) => {
            return error(
                StatusCode::NOT_FOUND,
                ErrorCode::UnknownAgent,
                format!("no agent named {agent} on {}", state.name),
            );
        }
        Err(e) => {
            return error(
                StatusCode::SERVICE_UNAVAILABLE,
                ErrorCode::Internal,
                e.to_string(),
            );
        }
    };
    let fingerprint = match PublicIdentity::try_from(keys.clone()) {
        Ok(id) => id.fingerprint(),
        Err(e) => {
            return error(
                StatusCode::INTERNAL_SERVER_ERROR,
                ErrorCode::Internal,
                e.to_string(),
            );
        }
    };
    let signature = state.identity.sign_agent_keys(&state.name, &agent, &keys);
    let answer = AgentKeys {
        relay: state.name.clone(),
        agent,
        keys,
        fingerprint,
        signature,
    };
    ([(header::CACHE_CONTROL, KEYS_CACHE)], Json(answer)).into_response()
}
