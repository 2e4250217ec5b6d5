//! `mailslot mcp`: serve the agent's mailbox to an LLM client over stdio (stdout carries the
//! protocol and nothing else; logs go to stderr), or over Streamable HTTP on loopback.

use std::io::IsTerminal;

use anyhow::Context;

use super::Ctx;
use super::output::{self, outln};
use crate::doorbell::claude_code::{self, Route};
use crate::mailbox::{Mailbox, RelayStatus};
use crate::protocol::AgentName;
use crate::store::SessionKey;

/// `mailslot mcp --print-token`: the agent's bearer token for MCP over HTTP, on stdout.
pub(super) fn print_token(ctx: &Ctx) -> anyhow::Result<()> {
    let agent = ctx.open_or_create_agent()?;
    let token = crate::mcp::BearerToken::load_or_create(&agent.dir)?;
    outln!("{}", token.expose())?;
    Ok(())
}

pub(super) fn run(
    ctx: &Ctx,
    http: Option<std::net::SocketAddr>,
    limits: crate::mcp::SessionLimits,
) -> anyhow::Result<()> {
    let agent = ctx.open_or_create_agent()?;
    if http.is_none()
        && let Some(notice) = terminal_notice(&agent.name, std::io::stdin().is_terminal())
    {
        eprintln!("{notice}");
    }
    let token = http
        .map(|_| crate::mcp::BearerToken::load_or_create(&agent.dir))
        .transpose()?;
    // The embedded relay may fail to start: serve from the store anyway and keep retrying.
    let relay = ctx.relay_url_or_default();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let mailbox = Mailbox::open_trusting(agent, relay, ctx.config.trusted_hosts.clone())
            .await
            .context("opening the mailbox")?;
        if let Some(port) = ctx.local_relay()? {
            tokio::spawn(keep_local_relay(mailbox.clone(), ctx.paths.clone(), port));
        }
        // One doorbell for the OpenClaw sink and the MCP pushes; the MCP server starts it once
        // every sink has subscribed.
        let doorbell = crate::doorbell::Doorbell::new(&mailbox);
        let _openclaw =
            crate::doorbell::openclaw::start(ctx.config.openclaw.as_ref(), &mailbox, &doorbell);
        match http.zip(token) {
            Some((addr, token)) => {
                let stop = tokio_util::sync::CancellationToken::new();
                tokio::spawn({
                    let stop = stop.clone();
                    async move {
                        if let Err(e) = super::relay::wait_for_signal().await {
                            tracing::warn!(error = %e, "cannot watch for SIGTERM");
                        }
                        stop.cancel();
                    }
                });
                let options = crate::mcp::HttpOptions {
                    addr,
                    token,
                    limits,
                };
                crate::mcp::serve_http(mailbox, doorbell, options, stop).await?;
            }
            None => {
                let session = client_session();
                let route = claude_code_route(&mailbox, &doorbell, session.clone());
                let (reader, writer) = rmcp::transport::io::stdio_pipes();
                crate::mcp::serve_with(mailbox, doorbell, session, route, reader, writer).await?;
            }
        }
        anyhow::Ok(())
    })?;
    // Nothing may keep a finished server alive (blocking store or stdin threads).
    runtime.shutdown_timeout(std::time::Duration::from_millis(50));
    Ok(())
}

/// What a stdio server started by a person at a terminal says on stderr (a client's stdin is
/// a pipe, and it gets nothing but the protocol): what it is and how a client starts it. It
/// then serves anyway: a person may be typing JSON-RPC on purpose.
fn terminal_notice(agent: &AgentName, stdin_is_terminal: bool) -> Option<String> {
    stdin_is_terminal.then(|| {
        format!(
            "mailslot mcp serves {agent}'s mailbox to an LLM client (Claude Code, Codex, VS Code, OpenClaw…) as an MCP server over stdio: the client starts it and speaks JSON-RPC on its stdin and stdout, so at a terminal it only waits.\n\
             To use it, add it to the client, e.g. `claude mcp add mailslot -- {}`; mailslot's source has every client's config in mcp-config-examples/, and `mailslot help mcp` shows the options.\n\
             To read {agent}'s mail yourself, use `{}`. Ctrl-D or Ctrl-C ends this server.",
            output::command(agent, "mcp"),
            output::command(agent, "inbox"),
        )
    })
}

/// The Claude Code session this server serves, from the environment Claude Code gives its
/// MCP servers; an implausible value is ignored (with a warning), never trusted.
fn client_session() -> Option<SessionKey> {
    let raw = std::env::var(crate::config::ENV_CLAUDE_CODE_SESSION).ok()?;
    SessionKey::new(&raw)
        .inspect_err(
            |e| tracing::warn!(error = %e, "ignoring {}", crate::config::ENV_CLAUDE_CODE_SESSION),
        )
        .ok()
}

/// The route of the Claude Code session this server serves: which path wakes it while idle
/// (logged with the reason), the socket doorbell started when it may be needed, and the
/// session claimed in the store. Outside Claude Code every client gets channel events.
fn claude_code_route(
    mailbox: &Mailbox,
    doorbell: &crate::doorbell::Doorbell,
    session: Option<SessionKey>,
) -> Route {
    let Some(cc) = claude_code::Session::from_env(session) else {
        return Route::open();
    };
    let choice = cc.choose();
    tracing::info!(path = choice.path.as_str(), reason = %choice.reason, "doorbell for an idle Claude Code session");
    let route = Route::for_session(&cc);
    let may_ring = choice.path != claude_code::Path::Hooks && cc.socket_usable();
    if let Some(socket) = cc.socket.clone().filter(|_| may_ring) {
        crate::doorbell::bell::start(
            mailbox.clone(),
            doorbell,
            cc.key.clone(),
            crate::doorbell::bell::Bell::Socket(socket),
            route.clone(),
        );
    }
    route.keep_claimed(mailbox.clone());
    route
}

/// With the embedded default, nobody else restarts the loopback relay when it stops: each
/// time the connection is lost, start it again if nothing listens (a no-op when it runs).
async fn keep_local_relay(mailbox: Mailbox, paths: crate::config::Paths, port: u16) {
    let mut status = mailbox.watch_status();
    while status.changed().await.is_ok() {
        if !matches!(*status.borrow_and_update(), RelayStatus::Offline { .. }) {
            continue;
        }
        let paths = paths.clone();
        let started =
            tokio::task::spawn_blocking(move || super::local_relay::ensure(&paths, port)).await;
        if let Ok(Err(e)) = started {
            tracing::warn!(error = %format!("{e:#}"), "cannot restart the local relay");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_terminal_is_told_what_the_server_is_and_how_clients_start_it() {
        let alice = AgentName::new("alice").unwrap();
        assert_eq!(terminal_notice(&alice, false), None);
        let notice = terminal_notice(&alice, true).unwrap();
        assert!(notice.contains("MCP server over stdio"), "{notice}");
        assert!(
            notice.contains("`claude mcp add mailslot -- mailslot --agent alice mcp`"),
            "{notice}"
        );
        assert!(notice.contains("`mailslot help mcp`"), "{notice}");
    }
}
