//! Discovery over HTTP: who this relay is (`/.well-known/mailslot`), and its agents' keys
//! signed by its own key, for clients and relays elsewhere.

use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};

use super::answer::registered;
use super::state::RelayState;
use super::storage::{Groups, Registry};
use crate::protocol::{AgentKeys, EndpointPath, PROTOCOL_VERSION, RelayInfo, WEBSOCKET_PATH};

/// The relay's name and key change only with a restart (and a changed key is refused by
/// everyone who pinned the old one), so an hour of caching is harmless.
const INFO_CACHE: &str = "public, max-age=3600";
/// An agent's keys change only when its name is retired and taken again.
const KEYS_CACHE: &str = "public, max-age=300";

/// `GET /.well-known/mailslot`: the relay's name, key, fingerprint, protocol version and
/// WebSocket path.
pub async fn info<S: Send + Sync + 'static>(State(state): State<Arc<RelayState<S>>>) -> Response {
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
pub async fn agent_keys<S: Registry + Groups>(
    State(state): State<Arc<RelayState<S>>>,
    Path(name): Path<String>,
) -> Response {
    let relay = state.name.to_string();
    let (agent, keys, fingerprint) = match registered(&state, &name, &relay).await {
        Ok(found) => found,
        Err(refusal) => return refusal,
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
