//! `presence [AGENT...]`: who is online among this agent's contacts and the listed agents;
//! `whois ADDRESS`: one agent's fingerprint, contact status, listing and presence. Both over
//! a control connection, through the same typed calls the MCP tools use.

use super::Ctx;
use super::output;
use crate::client::whois::{ContactStatus, Found, KeySource, Whois, whois as look_up};
use crate::client::{Connection, presence};
use crate::protocol::{Address, AgentName, Fingerprint, MAX_PRESENCE_AGENTS};
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
    output::emit(ctx.json, &found, |w| describe(&agent.name, w))
}

/// `whois` for a person, as `me` sees it.
fn describe(me: &AgentName, w: &Whois) -> String {
    let mut lines = vec![match &w.found {
        Found::Registered => format!("{}", w.address),
        Found::Unknown { reason } => format!("{}: unknown ({reason})", w.address),
        Found::Unreachable { reason } => format!("{}: not reachable ({reason})", w.address),
    }];
    if let (Some(fp), Some(source)) = (&w.fingerprint, w.key) {
        lines.push(match source {
            KeySource::Pinned => format!("  fingerprint  {fp} (pinned)"),
            KeySource::Relay => format!(
                "  fingerprint  {fp} (from its relay; not pinned)\n  to pin it    compare it with {}'s owner, then run `{}` (mail pins it too, unchecked)",
                w.address,
                output::command(me, format_args!("keys {}", w.address))
            ),
        });
    }
    lines.extend(key_change(me, w));
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

/// What `whois` says when `w`'s keys changed without a signature from the pinned ones: both
/// fingerprints, and how the owner accepts the new keys once the peer's owner confirmed them.
fn key_change(me: &AgentName, w: &Whois) -> Vec<String> {
    let mut offered: Vec<&Fingerprint> = w.presented.iter().collect();
    offered.extend(
        w.changed_to
            .iter()
            .filter(|f| Some(*f) != w.presented.as_ref()),
    );
    let (Some(pinned), false) = (&w.fingerprint, offered.is_empty()) else {
        return Vec::new();
    };
    let list = offered
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(" or ");
    let fp = match offered.as_slice() {
        [only] => only.to_string(),
        _ => "FINGERPRINT".to_owned(),
    };
    vec![
        format!(
            "  KEY CHANGED  it presents {list}, not the pinned {pinned}, and the pinned keys did not sign the change: someone else may hold the name, or it lost its key and registered again"
        ),
        format!(
            "  to accept    ask {}'s owner for its fingerprint yourself (not through an agent); only if it is {list}, run `{}` (asks for the owner passphrase)",
            w.address,
            output::command(
                me,
                format_args!("contacts trust {} --fingerprint {fp}", w.address)
            )
        ),
    ]
}
