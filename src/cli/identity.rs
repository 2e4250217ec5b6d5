//! `init`, `register`, `retire`, `whoami`, `doing`, `status`: who the agent is and how its
//! store looks.

use serde::Serialize;

use super::output::{self, outln};
use super::{Ctx, reach};
use crate::client::Connection;
use crate::protocol::{Address, AgentName, Fingerprint, InviteToken};
use crate::store::SCHEMA_VERSION;

#[derive(Serialize)]
struct Whoami {
    agent: AgentName,
    address: Address,
    fingerprint: Fingerprint,
    identity: Option<String>,
}

#[derive(Serialize)]
struct Initialized {
    #[serde(flatten)]
    who: Whoami,
    /// The relay it was registered with, when it was.
    registered_on: Option<String>,
    /// Why it is not registered yet, when it is not.
    not_registered: Option<String>,
}

/// Makes the agent's keys and store and, unless `offline`, registers its name with the relay,
/// so that others can write to it at once. An unreachable or refusing relay leaves the agent
/// made and says which command registers it later.
pub(super) fn init(ctx: &Ctx, offline: bool) -> anyhow::Result<()> {
    let agent = ctx.open_or_create_agent()?;
    let (registered_on, not_registered) = if offline {
        (None, Some("--offline".to_owned()))
    } else {
        match register_now(ctx, &agent, None) {
            Ok(url) => (Some(url.to_string()), None),
            Err(e) => (None, Some(format!("{e:#}"))),
        }
    };
    let done = Initialized {
        who: Whoami {
            agent: agent.name.clone(),
            address: agent.address(),
            fingerprint: agent.identity.fingerprint(),
            identity: agent.store.identity_text()?,
        },
        registered_on,
        not_registered,
    };
    output::emit(ctx.json, &done, |i| {
        let register = output::command(&i.who.agent, "register");
        let relay = match (&i.registered_on, &i.not_registered) {
            (Some(url), _) => format!("registered on {url}"),
            (None, _) if offline => {
                format!(
                    "not registered yet (--offline): run `{register}` when the relay is reachable"
                )
            }
            (None, why) => format!(
                "not registered yet: {}\nthen run `{register}`",
                why.as_deref().unwrap_or("unknown")
            ),
        };
        format!(
            "agent {} is ready\nfingerprint {}\nfolder {}\nrelay {relay}",
            i.who.agent,
            i.who.fingerprint,
            agent.dir.display()
        )
    })
}

/// Registers `agent` with the relay (a name already registered with its keys changes
/// nothing); the relay's URL.
fn register_now(
    ctx: &Ctx,
    agent: &crate::agent::Agent,
    invite: Option<InviteToken>,
) -> anyhow::Result<crate::client::RelayUrl> {
    let url = ctx.relay_url()?;
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(async {
            let conn =
                Connection::register(&url, &agent.name, &agent.identity, agent.owner, invite)
                    .await?;
            conn.close().await;
            anyhow::Ok(())
        })?;
    Ok(url)
}

#[derive(Serialize)]
struct Registered {
    agent: AgentName,
    relay: String,
    fingerprint: Fingerprint,
}

/// Registers the agent's name with the relay now (with an invite, for a relay that registers
/// by invite only); a name already registered with these keys changes nothing.
pub(super) fn register(ctx: &Ctx, invite: Option<InviteToken>) -> anyhow::Result<()> {
    let agent = ctx.open_or_create_agent()?;
    let url = register_now(ctx, &agent, invite)?;
    let done = Registered {
        agent: agent.name.clone(),
        relay: url.to_string(),
        fingerprint: agent.identity.fingerprint(),
    };
    output::emit(ctx.json, &done, |r| {
        format!(
            "{} is registered on {} (fingerprint {})",
            r.agent, r.relay, r.fingerprint
        )
    })
}

/// Gives up the agent's name on the relay, after the person at the terminal types it.
pub(super) fn retire(ctx: &Ctx) -> anyhow::Result<()> {
    use std::io::{BufRead, IsTerminal, Write};
    let stdin = std::io::stdin();
    if !stdin.is_terminal() {
        anyhow::bail!(
            "retire needs a person at a terminal: run `{}` yourself in an interactive shell",
            output::command(&ctx.agent_name()?, "retire")
        );
    }
    let agent = ctx.open_agent()?;
    let url = ctx.relay_url()?;
    let mut err = std::io::stderr();
    write!(
        err,
        "This gives up the name {name} on {url}: its contacts, requests and waiting mail go, and the name is held for a while, then anyone may take it. Type {name} to confirm: ",
        name = agent.name
    )?;
    err.flush()?;
    let mut typed = String::new();
    stdin.lock().read_line(&mut typed)?;
    if typed.trim() != agent.name.as_str() {
        anyhow::bail!("not retired");
    }
    let detail = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(async {
            let mut conn =
                Connection::connect_control(&url, &agent.name, &agent.identity, None).await?;
            let detail = conn.retire(&agent.identity).await;
            conn.close().await;
            anyhow::Ok(detail?)
        })?;
    outln!(
        "{detail}\nThe folder {} keeps its keys and mail; delete it when you no longer need them.",
        agent.dir.display()
    )?;
    Ok(())
}

#[derive(serde::Serialize)]
struct RotationReport {
    old: crate::protocol::Fingerprint,
    new: crate::protocol::Fingerprint,
    announced: Vec<Announced>,
}

#[derive(serde::Serialize)]
struct Announced {
    peer: crate::protocol::Address,
    status: &'static str,
    detail: Option<String>,
}

/// `rotate-keys`: new keys, signed by the old ones, registered, announced to pinned peers.
pub(super) fn rotate_keys(ctx: &Ctx) -> anyhow::Result<()> {
    use crate::mailbox::SendOutcome;
    let agent = ctx.open_agent()?;
    let url = ctx.relay_url()?;
    let rotated = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?
        .block_on(crate::mailbox::rotate_keys(
            agent,
            url,
            ctx.config.trusted_hosts.clone(),
        ))?;
    let announced = rotated
        .announced
        .into_iter()
        .map(|(peer, outcome)| {
            let (status, detail) = match outcome {
                Ok(SendOutcome::Sent) => ("sent", None),
                Ok(SendOutcome::Queued { reason }) => ("queued", Some(reason)),
                Err(reason) => ("failed", Some(reason)),
            };
            Announced {
                peer,
                status,
                detail,
            }
        })
        .collect();
    let report = RotationReport {
        old: rotated.old,
        new: rotated.new,
        announced,
    };
    output::emit(ctx.json, &report, |r| {
        let mut text = format!(
            "The agent's keys are now {} (were {}); the old sealing key is kept to open mail sealed to it.",
            r.new, r.old
        );
        if r.announced.is_empty() {
            text.push_str("\nNo peer's keys were pinned: nobody to tell.");
        }
        for a in &r.announced {
            text.push_str(&format!("\n  {:<8} {}", a.status, a.peer));
            if let Some(d) = &a.detail {
                text.push_str(&format!(" ({d})"));
            }
        }
        text
    })
}

pub(super) fn whoami(ctx: &Ctx, set: Option<String>) -> anyhow::Result<()> {
    let mut agent = ctx.open_agent()?;
    if let Some(text) = set {
        agent.store.set_identity_text(&text)?;
    }
    let who = Whoami {
        agent: agent.name.clone(),
        address: agent.address(),
        fingerprint: agent.identity.fingerprint(),
        identity: agent.store.identity_text()?,
    };
    output::emit(ctx.json, &who, |w| {
        let identity = w.identity.clone().unwrap_or_else(|| {
            format!(
                "(not set: {})",
                output::command(&w.agent, "whoami --set \"who this agent is\"")
            )
        });
        format!("{} ({})\n{}", w.address, w.fingerprint, identity)
    })
}

#[derive(Serialize)]
struct Doing {
    current_task: Option<String>,
}

pub(super) fn doing(ctx: &Ctx, set: Option<String>) -> anyhow::Result<()> {
    let mut agent = ctx.open_agent()?;
    if let Some(text) = set {
        agent.store.set_current_task(&text)?;
    }
    let doing = Doing {
        current_task: agent.store.current_task()?,
    };
    output::emit(ctx.json, &doing, |d| {
        d.current_task.clone().unwrap_or_else(|| {
            format!(
                "(no current task: {})",
                output::command(&agent.name, "doing --set \"what you are doing\"")
            )
        })
    })
}

#[derive(Serialize)]
struct Status {
    agent: AgentName,
    address: Address,
    fingerprint: Fingerprint,
    identity: Option<String>,
    current_task: Option<String>,
    folder: String,
    store: String,
    schema_version: u32,
    messages: u64,
    unread: u32,
    memories: u64,
    /// Agents whose keys this agent pinned (it has written to or heard from them).
    pinned_keys: usize,
    outbox: u64,
    /// The relay, and what it holds for the agent (contacts among it).
    relay: reach::Reach,
    /// The process holding the agent's relay connection (a running `mailslot mcp`), if any.
    connection_held_by: Option<u32>,
}

pub(super) fn status(ctx: &Ctx) -> anyhow::Result<()> {
    let agent = ctx.open_agent()?;
    let s = &agent.store;
    let status = Status {
        agent: agent.name.clone(),
        address: agent.address(),
        fingerprint: agent.identity.fingerprint(),
        identity: s.identity_text()?,
        current_task: s.current_task()?,
        folder: agent.dir.display().to_string(),
        store: s.path().display().to_string(),
        schema_version: SCHEMA_VERSION,
        messages: s.message_count()?,
        unread: s.unread_summary()?.count,
        memories: s.memory_count()?,
        pinned_keys: s.contacts()?.len(),
        outbox: s.outbox_len()?,
        connection_held_by: held_by(&agent.dir),
        relay: reach::check(ctx, &agent)?,
    };
    output::emit(ctx.json, &status, |st| {
        let none = "(not set)";
        format!(
            "agent        {}\nfingerprint  {}\nidentity     {}\ndoing        {}\nfolder       {}\nrelay        {}\nmail         {} messages, {} unread, {} waiting in the outbox\nmemories     {}\ncontacts     {}\nconnection   {}",
            st.address,
            st.fingerprint,
            st.identity
                .as_deref()
                .map(|t| output::one_line(t, 70))
                .as_deref()
                .unwrap_or(none),
            st.current_task
                .as_deref()
                .map(|t| output::one_line(t, 70))
                .as_deref()
                .unwrap_or(none),
            st.folder,
            st.relay.summary(),
            st.messages,
            st.unread,
            st.outbox,
            st.memories,
            contacts_line(st),
            st.connection_held_by
                .map(|pid| format!("held by a running mailslot process (pid {pid})"))
                .unwrap_or_else(|| "no mailslot mcp is running for this agent".into()),
        )
    })
}

/// Contacts as the relay holds them (the one answer `contacts` also gives), and the keys
/// pinned here, which are not the same thing.
fn contacts_line(st: &Status) -> String {
    let pinned = match st.pinned_keys {
        1 => "1 agent's key pinned here".to_owned(),
        n => format!("{n} agents' keys pinned here"),
    };
    match &st.relay.state {
        reach::State::Registered {
            contacts,
            incoming_requests,
            ..
        } => format!(
            "{} approved ({}), {incoming_requests} request{} waiting; {pinned}",
            contacts.len(),
            output::command(&st.agent, "contacts"),
            if *incoming_requests == 1 { "" } else { "s" }
        ),
        _ => format!("unknown while the relay cannot say; {pinned}"),
    }
}

/// The pid of the process holding the agent's relay connection lock, if one does.
fn held_by(dir: &std::path::Path) -> Option<u32> {
    let lock = crate::mailbox::ConnectionLock::for_agent(dir);
    match lock.try_take() {
        Ok(Some(_free)) => None,
        Ok(None) => lock.holder(),
        Err(_) => None,
    }
}
