//! `mailslot mcp --http ADDR`: the same server over Streamable HTTP, on loopback only. Host
//! and Origin headers are checked (DNS-rebinding protection): a web page cannot reach the
//! mailbox through a name that resolves to 127.0.0.1.

use std::net::SocketAddr;
use std::sync::Arc;

use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use tokio_util::sync::CancellationToken;

use super::{MailslotServer, McpError};
use crate::doorbell::Doorbell;
use crate::mailbox::Mailbox;

/// The path the server answers on.
pub const PATH: &str = "/mcp";

/// Serves `mailbox` (ringing `doorbell`) at `http://ADDR/mcp` until `stop` fires. `addr` must be a loopback
/// address: the server has no authentication of its own.
pub async fn serve_http(
    mailbox: Mailbox,
    doorbell: Doorbell,
    addr: SocketAddr,
    stop: CancellationToken,
) -> Result<(), McpError> {
    if !addr.ip().is_loopback() {
        return Err(McpError::Setup(format!(
            "--http {addr} is not a loopback address; the MCP server has no authentication, so it listens on 127.0.0.1 or [::1] only"
        )));
    }
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| McpError::Setup(format!("cannot listen on {addr}: {e}")))?;
    let bound = listener
        .local_addr()
        .map_err(|e| McpError::Setup(e.to_string()))?;
    let server = MailslotServer::new(mailbox.clone(), doorbell, stop.clone());
    let config = StreamableHttpServerConfig::default()
        .with_allowed_hosts(["localhost", "127.0.0.1", "::1", "[::1]"])
        .with_allowed_origins(["http://localhost:*", "http://127.0.0.1:*", "http://[::1]:*"])
        .with_cancellation_token(stop.child_token());
    let service = StreamableHttpService::new(
        move || Ok(server.for_new_session()),
        Arc::new(LocalSessionManager::default()),
        config,
    );
    let app = axum::Router::new().nest_service(PATH, service);
    eprintln!("mailslot: MCP over Streamable HTTP at http://{bound}{PATH}");
    let result = axum::serve(listener, app)
        .with_graceful_shutdown(async move { stop.cancelled().await })
        .await
        .map_err(|e| McpError::Session(e.to_string()));
    mailbox.close().await;
    result
}
