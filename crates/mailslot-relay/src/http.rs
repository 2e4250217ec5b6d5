//! The relay's HTTP surface: health, metrics, the WebSocket endpoint, registration,
//! public-key lookup and discovery.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::Router;
use axum::extract::ws::WebSocketUpgrade;
use axum::extract::{ConnectInfo, Extension, Path, RawQuery, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::{Deserialize, Serialize};

use super::answer::{error, registered};
use super::inbound::FrameDone;
use super::state::RelayState;
use super::storage::{Groups, Registration, Registry, Storage};
use super::{discovery, session};
use crate::crypto::PublicIdentity;
use crate::crypto::sign::{self, Domain};
use crate::protocol::{
    AgentName, ErrorCode, Fingerprint, InviteToken, KeyRotation, LINK_PATH, PublicKeys, Shown,
    WELL_KNOWN_PATH, b64, register_payload,
};

/// Bytes each socket reads at a time (tungstenite grows the read buffer for larger frames).
const SOCKET_BUFFER: usize = 4 * 1024;
/// Bytes of queued frames written in one system call. The buffer only grows while frames
/// queue up, so idle connections do not pay for it, but it never shrinks: at 64 KiB a thousand
/// busy connections kept about 50 MiB of it, and 8 KiB costs no throughput that the benchmark
/// can see (performance log, 2026-12-03).
const WRITE_BUFFER: usize = 8 * 1024;
/// How long `/healthz` waits for the database's answer.
const HEALTH_TIMEOUT: Duration = Duration::from_secs(2);

/// Every route.
pub fn router<S: Storage>(state: Arc<RelayState<S>>) -> Router {
    Router::new()
        .route("/healthz", get(healthz::<S>))
        .route("/metrics", get(metrics::<S>))
        .route("/v1/ws", get(websocket::<S>))
        .route(LINK_PATH, get(link::<S>))
        .route("/v1/agents", post(register::<S>))
        .route("/v1/agents/{name}", get(lookup::<S>))
        .route("/v1/directory", get(directory::<S>))
        .route(WELL_KNOWN_PATH, get(discovery::info::<S>))
        .route(
            &format!("{WELL_KNOWN_PATH}/agents/{{name}}"),
            get(discovery::agent_keys::<S>),
        )
        .with_state(state)
}

/// What `/healthz` says when the relay cannot serve.
#[derive(Serialize)]
struct Unhealthy {
    /// Always `unavailable`.
    status: &'static str,
    /// What failed: `database`.
    failed: &'static str,
    /// Why, in the storage's words.
    message: String,
}

/// `ok` (200) when the database answers a cheap probe within [`HEALTH_TIMEOUT`], else 503
/// with an [`Unhealthy`] body.
async fn healthz<S: Storage>(State(state): State<Arc<RelayState<S>>>) -> Response {
    let message = match tokio::time::timeout(HEALTH_TIMEOUT, state.storage.check_health()).await {
        Ok(Ok(())) => return "ok\n".into_response(),
        Ok(Err(e)) => e.to_string(),
        Err(_) => format!(
            "the relay database did not answer within {} s",
            HEALTH_TIMEOUT.as_secs()
        ),
    };
    tracing::warn!(error = %message, "health check failed");
    (
        StatusCode::SERVICE_UNAVAILABLE,
        Json(Unhealthy {
            status: "unavailable",
            failed: "database",
            message,
        }),
    )
        .into_response()
}

async fn metrics<S: Send + Sync + 'static>(
    State(state): State<Arc<RelayState<S>>>,
) -> impl IntoResponse {
    state.metrics.sockets.set(state.connections.open() as i64);
    (
        [("content-type", "text/plain; version=0.0.4; charset=utf-8")],
        state.metrics.render(),
    )
}

async fn websocket<S: Storage>(
    State(state): State<Arc<RelayState<S>>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    done: Option<Extension<FrameDone>>,
    RawQuery(query): RawQuery,
    upgrade: WebSocketUpgrade,
) -> Response {
    let done = done.map(|Extension(done)| done).unwrap_or_default();
    let shown = Shown::from_query(query.as_deref());
    // The socket's connection slot was taken when it was accepted (`listener`).
    sized(upgrade, &state.config)
        .on_upgrade(move |socket| session::run(state, socket, (peer.ip(), shown), done))
}

/// A link from another relay (`/v1/relay`).
async fn link<S: Storage>(
    State(state): State<Arc<RelayState<S>>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    done: Option<Extension<FrameDone>>,
    upgrade: WebSocketUpgrade,
) -> Response {
    let done = done.map(|Extension(done)| done).unwrap_or_default();
    sized(upgrade, &state.config)
        .on_upgrade(move |socket| super::link::answer(state, socket, (peer.ip(), done)))
}

/// A WebSocket upgrade with the relay's frame limit and small buffers: the default 128 KiB
/// read buffer per socket would cost 1.3 GiB at 10,000 idle agents.
fn sized(upgrade: WebSocketUpgrade, config: &super::RelayConfig) -> WebSocketUpgrade {
    let max = config.max_frame_bytes();
    upgrade
        .max_message_size(max)
        .max_frame_size(max)
        .read_buffer_size(SOCKET_BUFFER)
        .write_buffer_size(WRITE_BUFFER)
}

/// A registration over HTTP: the signature over the name and keys proves key possession.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RegisterRequest {
    name: AgentName,
    keys: PublicKeys,
    #[serde(with = "b64")]
    signature: Vec<u8>,
    /// An invite, for a relay that registers by invite only.
    #[serde(default)]
    invite: Option<InviteToken>,
}

/// An agent's public record.
#[derive(Serialize)]
struct AgentRecord {
    name: AgentName,
    keys: PublicKeys,
    fingerprint: Fingerprint,
    /// The signed steps from its earlier keys (see `protocol::KeyRotation`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    rotations: Vec<KeyRotation>,
}

async fn register<S: Registry>(
    State(state): State<Arc<RelayState<S>>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    body: axum::body::Bytes,
) -> Response {
    let req: RegisterRequest = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => {
            return error(
                StatusCode::BAD_REQUEST,
                ErrorCode::BadFrame,
                format!("not a registration: {e}"),
            );
        }
    };
    let Ok(identity) = PublicIdentity::try_from(req.keys.clone()) else {
        return error(
            StatusCode::BAD_REQUEST,
            ErrorCode::BadFrame,
            "keys are not valid public keys",
        );
    };
    if sign::verify_detached(
        &identity,
        Domain::Register,
        &register_payload(&req.name, &req.keys),
        &req.signature,
    )
    .is_err()
    {
        return error(
            StatusCode::BAD_REQUEST,
            ErrorCode::AuthFailed,
            "the signature does not match the keys",
        );
    }
    let record = AgentRecord {
        name: req.name.clone(),
        keys: req.keys.clone(),
        fingerprint: identity.fingerprint(),
        rotations: Vec::new(),
    };
    // Only a new name takes from the IP's allowance (and needs an invite on a closed relay).
    let invite = match state.storage.keys(req.name.clone()).await {
        Ok(Some(_)) => None,
        Ok(None) => {
            match super::registration::admit(&state, peer.ip(), &req.name, req.invite.as_ref()) {
                Ok(invite) => invite,
                Err(refused) if refused.code == ErrorCode::RegistrationClosed => {
                    return error(StatusCode::FORBIDDEN, refused.code, refused.message);
                }
                Err(refused) => {
                    let mut response =
                        error(StatusCode::TOO_MANY_REQUESTS, refused.code, refused.message);
                    if let Some(wait) = refused.retry
                        && let Ok(value) = (wait.as_secs() + 1).to_string().parse()
                    {
                        response.headers_mut().insert("retry-after", value);
                    }
                    return response;
                }
            }
        }
        Err(e) => {
            return error(
                StatusCode::SERVICE_UNAVAILABLE,
                ErrorCode::Internal,
                e.to_string(),
            );
        }
    };
    match state
        .storage
        .register(req.name.clone(), req.keys, invite)
        .await
    {
        Ok(Registration::Created) => {
            state.remember_registered(&req.name);
            (StatusCode::CREATED, Json(record)).into_response()
        }
        Ok(Registration::Unchanged) => (StatusCode::OK, Json(record)).into_response(),
        Ok(Registration::NameTaken) => error(
            StatusCode::CONFLICT,
            ErrorCode::NameTaken,
            format!("{} is registered with other keys", req.name),
        ),
        Ok(Registration::Retired(until)) => error(
            StatusCode::CONFLICT,
            ErrorCode::NameRetired,
            super::retire::held_until(&req.name, until),
        ),
        Ok(Registration::BadInvite) => {
            state.metrics.refuse_registration("invite");
            error(
                StatusCode::FORBIDDEN,
                ErrorCode::BadInvite,
                super::registration::BAD_INVITE,
            )
        }
        Err(e) => error(
            StatusCode::SERVICE_UNAVAILABLE,
            ErrorCode::Internal,
            e.to_string(),
        ),
    }
}

async fn directory<S: Registry>(State(state): State<Arc<RelayState<S>>>) -> Response {
    match super::directory::entries(&state).await {
        Ok(entries) => Json(entries).into_response(),
        Err(e) => error(
            StatusCode::SERVICE_UNAVAILABLE,
            ErrorCode::Internal,
            e.to_string(),
        ),
    }
}

async fn lookup<S: Registry + Groups>(
    State(state): State<Arc<RelayState<S>>>,
    Path(name): Path<String>,
) -> Response {
    match registered(&state, &name, "this relay").await {
        Ok((name, keys, fingerprint)) => match state.storage.rotations(name.clone()).await {
            Ok(rotations) => Json(AgentRecord {
                name,
                keys,
                fingerprint,
                rotations,
            })
            .into_response(),
            Err(e) => error(
                StatusCode::SERVICE_UNAVAILABLE,
                ErrorCode::Internal,
                e.to_string(),
            ),
        },
        Err(refusal) => refusal,
    }
}
