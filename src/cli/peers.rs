//! `presence [AGENT...]`: who is online among this agent's contacts and the listed agents;
//! `whois ADDRESS`: one agent's fingerprint, contact status, listing and presence. Both over
//! a control connection, through the same typed calls the MCP tools use.

use super::Ctx;
use super::output;
use crate::client::whois::{ContactStatus, Found, KeySource, Whois, whois as look_up};
use crate::client::{Connection, presence};
use crate::protocol::{Address, AgentName, MAX_PRESENCE_AGENTS};
use crate::store::StoreHandle;

pub(super) fn presence(ctx: &Ctx, agents: Vec<AgentName>) -> anyhow::Result<()> {
    if agents.len() > MAX_PRESENCE_AGENTS {
        anyhow::bail!(
            "{} agents named; ask about at most {MAX_PRESENCE_AGENTS} at a time, or name none for everyone this agent may see",
            agents.len()
        );
    }
    let asked = (!agents.is_empty()).then_some(agents);
    let online =
        super::consent::with_relay(
            ctx,
            async |conn, _| Ok(presence::online(conn, asked).await?),
        )?;
    output::emit(ctx.json, &online, |online| {
        if online.is_empty() {
            return "nobody this agent may see is online (only contacts and listed agents are shown)"
                .into();
        }
        online
            .iter()
            .map(|o| {
                format!(
                    "{:<20} online since {}",
                    o.agent.to_string(),
                    output::when(o.since)
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    })
}

pub(super) fn whois(ctx: &Ctx, address: Address) -> anyhow::Result<()> {
    let agent = ctx.open_agent()?;
    let url = ctx.relay_url()?;
    let store = StoreHandle::spawn(agent.store)?;
    let trusted = ctx.config.trusted_hosts.clone();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let found = runtime.block_on(async {
        // A control connection: a running `mailslot mcp` for this agent keeps its own.
        let mut conn =
            Connection::connect_control(&url, &agent.name, &agent.identity, agent.owner).await?;
        let found = look_up(&mut conn, &store, &trusted, &address).await;
        conn.close().await;
        found
    })?;
    output::emit(ctx.json, &found, describe)
}

/// `whois` for a person.
fn describe(w: &Whois) -> String {
    let mut lines = vec![match &w.found {
        Found::Registered => format!("{}", w.address),
        Found::Unknown { reason } => format!("{}: unknown ({reason})", w.address),
        Found::Unreachable { reason } => format!("{}: not reachable ({reason})", w.address),
    }];
    if let (Some(fp), Some(source)) = (&w.fingerprint, w.key) {
        lines.push(match source {
            KeySource::Pinned => format!("  fingerprint  {fp} (pinned)"),
            KeySource::Relay => format!("  fingerprint  {fp} (from its relay; not pinned)"),
        });
    }
    if let Some(now) = &w.presented {
        lines.push(format!(
            "  KEY CHANGED  its relay now presents {now}; ask its owner which is right"
        ));
    }
    if let Some((relay, fp)) = &w.vouched_by {
        lines.push(format!("  vouched for  by the relay {relay}, key {fp}"));
    }
    if matches!(w.found, Found::Registered) {
        lines.push(format!(
            "  contact      {}",
            match w.contact {
                ContactStatus::Approved => "approved",
                ContactStatus::PendingIncoming => "pending (it asked; see `mailslot requests`)",
                ContactStatus::PendingOutgoing => "pending (this agent asked)",
                ContactStatus::Blocked => "blocked",
                ContactStatus::None => "none",
            }
        ));
    }
    if let Some(listing) = &w.listing {
        lines.push(format!("  listed       {}", output::one_line(listing, 200)));
    }
    if let Some(since) = w.online_since {
        lines.push(format!("  online since {}", output::when(since)));
    }
    lines.join("\n")
}
