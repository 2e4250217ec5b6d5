//! `mailslot mcp`: the agent's mailbox as an MCP server (rmcp), over stdio or Streamable
//! HTTP. The handler (`server.rs`) wires tools, resources, prompts and pushes over the
//! domain layer (`mailbox`, `doorbell`), which knows nothing of MCP. This layer never opens a
//! relay socket itself.

mod attach;
mod completions;
mod era;
mod errors;
mod http;
mod http_auth;
mod line_limit;
mod links;
mod notice;
mod peers;
mod prompts;
mod push;
mod resources;
mod server;
mod sessions;
mod stdio;
mod strict;
mod tools;
mod views;

pub use http::{HttpOptions, PATH as HTTP_PATH, serve_http};
pub use http_auth::BearerToken;
pub use push::CHANNEL_METHOD;
pub use resources::{DIRECTORY, IDENTITY, INBOX, MEMORY};
pub use server::MailslotServer;
pub use sessions::SessionLimits;
pub use stdio::EofSignal;

use rmcp::ServiceExt;
use rmcp::service::ServerInitializeError;
use tokio_util::sync::CancellationToken;

use crate::doorbell::Doorbell;
use crate::doorbell::claude_code::Route;
use crate::mailbox::Mailbox;
use crate::store::SessionKey;

/// Why the server stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum McpError {
    /// The client broke the protocol during setup.
    #[error("MCP session setup failed: {0}")]
    Setup(String),
    /// The session ended abnormally.
    #[error("MCP session failed: {0}")]
    Session(String),
}

/// How long in-flight handlers may finish after the client's input ended. rmcp itself waits
/// up to 5 s, and a `subscriptions/listen` whose acknowledgment was still being confirmed when
/// the input ended waits that long; nobody is left to read a late answer anyway.
const EXIT_GRACE: std::time::Duration = std::time::Duration::from_millis(50);

/// Serves `mailbox` over `reader`/`writer` (stdin/stdout for `mailslot mcp`) until the client
/// hangs up. A client that only probes and leaves is a clean end.
pub async fn serve<R, W>(mailbox: Mailbox, reader: R, writer: W) -> Result<(), McpError>
where
    R: tokio::io::AsyncRead + Unpin + Send + 'static,
    W: tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let doorbell = Doorbell::new(&mailbox);
    serve_with(mailbox, doorbell, None, Route::open(), reader, writer).await
}

/// [`serve`] ringing a `doorbell` the caller made (and may give to other sinks, which subscribe
/// before this starts it), for the client session `session` when the client names one, with
/// channel events as `route` says.
pub async fn serve_with<R, W>(
    mailbox: Mailbox,
    doorbell: Doorbell,
    session: Option<SessionKey>,
    route: Route,
    reader: R,
    writer: W,
) -> Result<(), McpError>
where
    R: tokio::io::AsyncRead + Unpin + Send + 'static,
    W: tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let eof = CancellationToken::new();
    let server = MailslotServer::new(mailbox.clone(), doorbell.clone(), eof.clone())
        .with_client_session(session)
        .with_route(route.clone());
    // The session's pushes have subscribed: rings from now on, and what was heard since the
    // mailbox opened, reach its client.
    doorbell.start();
    let reader = EofSignal::new(reader, eof.clone());
    let result = match server.serve(line_limit::transport(reader, writer)).await {
        Ok(running) => {
            let waiting = running.waiting();
            tokio::pin!(waiting);
            let ended = tokio::select! {
                ended = &mut waiting => Some(ended),
                _ = eof.cancelled() => tokio::time::timeout(EXIT_GRACE, &mut waiting).await.ok(),
            };
            match ended {
                Some(Ok(_)) => Ok(()),
                Some(Err(e)) => Err(McpError::Session(e.to_string())),
                None => {
                    tracing::debug!("input closed; handlers still running are abandoned");
                    Ok(())
                }
            }
        }
        Err(ServerInitializeError::ConnectionClosed(_)) => Ok(()),
        Err(e) => Err(McpError::Setup(e.to_string())),
    };
    eof.cancel();
    route.release(&mailbox).await;
    mailbox.close().await;
    result
}
