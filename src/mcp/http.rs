//! `mailslot mcp --http ADDR`: the same server over Streamable HTTP, on loopback only. Every
//! request needs the agent's bearer token (`http_auth.rs`); Host and Origin headers are
//! checked (DNS-rebinding protection): a web page cannot reach the mailbox through a name that
//! resolves to 127.0.0.1. Sessions are bounded in number and end when idle (`sessions.rs`).

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use tokio_util::sync::CancellationToken;

use super::http_auth::{self, BearerToken};
use super::sessions::{BoundedSessions, SessionLimits};
use super::{MailslotServer, McpError};
use crate::doorbell::Doorbell;
use crate::mailbox::Mailbox;

/// The path the server answers on.
pub const PATH: &str = "/mcp";

/// The largest request body read (rmcp's own limit, which it answers with 413).
const MAX_BODY_BYTES: usize = 4 * 1024 * 1024;

/// How `mailslot mcp --http` serves.
#[derive(Debug)]
pub struct HttpOptions {
    /// Where to listen: a loopback address.
    pub addr: SocketAddr,
    /// The agent's bearer token.
    pub token: BearerToken,
    /// How many sessions, for how long idle.
    pub limits: SessionLimits,
}

/// Serves `mailbox` (ringing `doorbell`) at `http://ADDR/mcp` until `stop` fires, to clients
/// that send the agent's bearer token.
pub async fn serve_http(
    mailbox: Mailbox,
    doorbell: Doorbell,
    options: HttpOptions,
    stop: CancellationToken,
) -> Result<(), McpError> {
    let HttpOptions {
        addr,
        token,
        limits,
    } = options;
    if !addr.ip().is_loopback() {
        return Err(McpError::Setup(format!(
            "--http {addr} is not a loopback address; the MCP server listens on 127.0.0.1 or [::1] only (its token travels in plain HTTP)"
        )));
    }
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| McpError::Setup(format!("cannot listen on {addr}: {e}")))?;
    let bound = listener
        .local_addr()
        .map_err(|e| McpError::Setup(e.to_string()))?;
    let server = MailslotServer::new(mailbox.clone(), doorbell.clone(), stop.clone());
    doorbell.start();
    let config = StreamableHttpServerConfig::default()
        .with_allowed_hosts(["localhost", "127.0.0.1", "::1", "[::1]"])
        .with_allowed_origins(["http://localhost:*", "http://127.0.0.1:*", "http://[::1]:*"])
        .with_cancellation_token(stop.child_token());
    let sessions = Arc::new(BoundedSessions::new(limits));
    let service = StreamableHttpService::new(
        move || Ok(server.for_new_session()),
        sessions.clone(),
        config,
    );
    // Layers run outside in: the token first, then the session cap, then rmcp.
    let app = axum::Router::new()
        .nest_service(PATH, service)
        .layer(middleware::from_fn_with_state(sessions, refuse_when_full))
        .layer(middleware::from_fn_with_state(
            Arc::new(token),
            http_auth::check,
        ));
    eprintln!(
        "mailslot: clients send `Authorization: Bearer <token>`; `mailslot --agent {} mcp --print-token` prints it",
        mailbox.name()
    );
    eprintln!("mailslot: MCP over Streamable HTTP at http://{bound}{PATH}");
    let result = axum::serve(listener, app)
        .with_graceful_shutdown(async move { stop.cancelled().await })
        .await
        .map_err(|e| McpError::Session(e.to_string()));
    mailbox.close().await;
    result
}

/// At the cap, an `initialize` (a POST that opens a session) gets `503` and a JSON-RPC error
/// that says why, rather than the generic failure rmcp gives when its session manager refuses.
/// Below it, nothing is read here.
async fn refuse_when_full(
    State(sessions): State<Arc<BoundedSessions>>,
    request: Request,
    next: Next,
) -> Response {
    let opens_session =
        request.method() == Method::POST && !request.headers().contains_key("mcp-session-id");
    if !opens_session || !sessions.full() {
        return next.run(request).await;
    }
    let (parts, body) = request.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, MAX_BODY_BYTES).await else {
        return StatusCode::PAYLOAD_TOO_LARGE.into_response();
    };
    #[derive(serde::Deserialize)]
    struct Head {
        method: Option<String>,
        id: Option<serde_json::Value>,
    }
    match serde_json::from_slice::<Head>(&bytes) {
        Ok(Head {
            method: Some(method),
            id,
        }) if method == "initialize" => {
            let error = serde_json::json!({
                "jsonrpc": "2.0",
                "id": id,
                "error": { "code": -32000, "message": sessions.full_error().to_string() },
            });
            let mut response = (StatusCode::SERVICE_UNAVAILABLE, axum::Json(error)).into_response();
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("10"));
            response
        }
        _ => next.run(Request::from_parts(parts, bytes.into())).await,
    }
}
