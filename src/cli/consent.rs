//! `connect`, `requests`, `approve`, `deny`, `block`, `unblock`, `contacts`, `policy`: the
//! owner decides who may write to the agent. Every change is signed with the owner key, which
//! only the owner's passphrase, typed at a terminal, unlocks.

use std::io::{BufRead, IsTerminal, Write};

use anyhow::{Context, bail};
use serde::Serialize;

use super::output::{self, outln};
use super::{Ctx, owner};
use crate::agent::Agent;
use crate::client::consent::{self as relay_consent, Change, ConsentState, ContactRequest};
use crate::client::{ClientError, Connection};
use crate::crypto::PublicIdentity;
use crate::protocol::{
    Address, AgentName, ErrorCode, Fingerprint, Peer, Policy, RequestCode, RequestView,
};
use crate::store::{Contact, Denial, Store};

/// Opens the agent, connects, runs `work`, closes.
pub(super) fn with_relay<T>(
    ctx: &Ctx,
    work: impl AsyncFnOnce(&mut Connection, &Agent) -> anyhow::Result<T>,
) -> anyhow::Result<T> {
    let agent = ctx.open_agent()?;
    let url = ctx.relay_url()?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        // A control connection: a running `mailslot mcp` for this agent keeps its own.
        let mut conn =
            Connection::connect_control(&url, &agent.name, &agent.identity, agent.owner).await?;
        let result = work(&mut conn, &agent).await;
        conn.close().await;
        result
    })
}

/// The fingerprint of `agent`'s keys: from the agent's relay when it is there (a bare name),
/// else from its own relay.
async fn fingerprint(
    ctx: &Ctx,
    conn: &mut Connection,
    agent: &Address,
) -> Result<Fingerprint, ClientError> {
    if agent.host().is_some() {
        return crate::client::remote_fingerprint(&ctx.config.trusted_hosts, agent).await;
    }
    let keys = conn.lookup(agent.name()).await?;
    PublicIdentity::try_from(keys)
        .map(|k| k.fingerprint())
        .map_err(|e| ClientError::Protocol(e.to_string()))
}

#[derive(Serialize)]
struct Requested {
    to: Address,
    code: RequestCode,
    expires_at: jiff::Timestamp,
    your_fingerprint: Fingerprint,
}

pub(super) fn connect(ctx: &Ctx, to: Address, note: String) -> anyhow::Result<()> {
    let requested = with_relay(ctx, async |conn, agent| {
        let answer = relay_consent::request(conn, to.clone(), note).await?;
        // A denial of the request before is old news once this one is open.
        agent.store.forget_denial(&to)?;
        match answer {
            ContactRequest::Pending { code, expires_at } => Ok(Some(Requested {
                to: to.clone(),
                code,
                expires_at,
                your_fingerprint: agent.identity.fingerprint(),
            })),
            ContactRequest::Done(detail) => {
                eprintln!("{detail}");
                Ok(None)
            }
        }
    })?;
    let Some(r) = requested else { return Ok(()) };
    output::emit(ctx.json, &r, |r| {
        format!(
            "Asked {to}. Give {to}'s owner this code yourself (not through an agent):\n\n    {code}\n\nThey approve with `{approve}`. It expires at {when}.\nYour agent's fingerprint, for them to compare: {fp}",
            to = r.to,
            code = r.code,
            approve = output::command(r.to.name(), format_args!("approve {}", r.code)),
            when = output::when(r.expires_at),
            fp = r.your_fingerprint
        )
    })
}

#[derive(Serialize)]
struct Requests {
    incoming: Vec<RequestView>,
    outgoing: Vec<RequestView>,
    /// Denials of this agent's requests it heard of lately (kept in its store).
    denied: Vec<Denial>,
}

/// The denials `me`'s store kept; none when it has no store yet.
fn denials(ctx: &Ctx, me: &AgentName) -> anyhow::Result<Vec<Denial>> {
    let path = crate::agent::store_path(&ctx.paths.agent_dir(me));
    if !path.exists() {
        return Ok(Vec::new());
    }
    Ok(Store::open(&path)?.denials()?)
}

#[derive(Serialize)]
struct Contacts {
    policy: Policy,
    contacts: Vec<Address>,
    blocked: Vec<Peer>,
}

pub(super) fn requests(ctx: &Ctx) -> anyhow::Result<()> {
    let (
        me,
        ConsentState {
            incoming, outgoing, ..
        },
    ) = with_relay(ctx, async |conn, agent| {
        Ok((agent.name.clone(), relay_consent::state(conn).await?))
    })?;
    let denied = denials(ctx, &me)?;
    let shown = Requests {
        incoming,
        outgoing,
        denied,
    };
    output::emit(ctx.json, &shown, |r| {
        let mut lines = Vec::new();
        if r.incoming.is_empty() && r.outgoing.is_empty() {
            lines.push("no open contact requests".to_owned());
        }
        for q in &r.incoming {
            lines.push(format!(
                "from {}: {:?} (until {}) — approve with `{}` using the code {}'s owner gives you",
                q.agent,
                q.note,
                output::when(q.expires_at),
                output::command(&me, "approve CODE"),
                q.agent
            ));
        }
        for q in &r.outgoing {
            let code = q.code.as_ref().map(|c| c.as_str()).unwrap_or("?");
            lines.push(format!(
                "to {}: waiting (until {}); code for their owner: {code}",
                q.agent,
                output::when(q.expires_at)
            ));
        }
        for d in &r.denied {
            lines.push(format!(
                "{}'s owner denied your request (heard {})",
                d.by,
                output::when(d.heard_at)
            ));
        }
        lines.join("\n")
    })
}

pub(super) fn approve(ctx: &Ctx, code: RequestCode, from: Option<Address>) -> anyhow::Result<()> {
    let stdin = std::io::stdin();
    if !stdin.is_terminal() {
        bail!(
            "approve needs a person at a terminal: run `{}` yourself in an interactive shell (agents cannot approve)",
            output::command(&ctx.agent_name()?, format_args!("approve {code}"))
        );
    }
    let detail = with_relay(ctx, async |conn, agent| {
        owner::check_registered(ctx, conn, agent)?;
        let incoming = relay_consent::state(conn).await?.incoming;
        let request = match (&from, incoming.as_slice()) {
            (_, []) => bail!("no open contact requests to approve"),
            (Some(f), list) => list
                .iter()
                .find(|q| &q.agent == f)
                .with_context(|| format!("no open request from {f}"))?
                .clone(),
            (None, [only]) => only.clone(),
            (None, list) => {
                let names: Vec<String> = list.iter().map(|q| q.agent.to_string()).collect();
                bail!(
                    "several open requests ({}); say which with --from NAME",
                    names.join(", ")
                );
            }
        };
        // The code first: a typo should not cost the person a confirmation and a passphrase.
        relay_consent::check_code(conn, &request.agent, &code).await?;
        let fp = fingerprint(ctx, conn, &request.agent).await?;
        let pinned = agent.store.contact(&request.agent)?;
        let mut out = std::io::stderr();
        writeln!(out, "Request from {} (fingerprint {fp})", request.agent)?;
        if !request.note.is_empty() {
            writeln!(out, "Note: {:?}", request.note)?;
        }
        if let Some(pinned) = pinned.filter(|p| p.fingerprint != fp) {
            writeln!(
                out,
                "{}",
                differs(&agent.name, &request.agent, &pinned, &fp)
            )?;
        }
        write!(
            out,
            "Compare the fingerprint with {}'s owner. Approve? [y/N] ",
            request.agent
        )?;
        out.flush()?;
        let mut answer = String::new();
        stdin.lock().read_line(&mut answer)?;
        if !matches!(answer.trim().to_lowercase().as_str(), "y" | "yes") {
            bail!("not approved");
        }
        let owner = owner::unlock(ctx)?;
        let change = Change::Approve {
            from: request.agent.clone(),
            code,
        };
        Ok(relay_consent::apply(conn, &owner, change).await?)
    })?;
    outln!("{detail}")?;
    Ok(())
}

/// What `approve` says before asking when the requester's keys are not the ones `me` pinned
/// for it: both fingerprints, what that can mean, and that approving moves no pin.
fn differs(me: &AgentName, requester: &Address, pinned: &Contact, now: &Fingerprint) -> String {
    format!(
        "THE FINGERPRINT DIFFERS: {me} pinned {requester}'s keys as {} on {}; the request comes from keys {now}, which the pinned ones did not sign. {requester} may have lost its key and registered again, or someone else now holds the name: ask {requester}'s owner, yourself, which fingerprint is theirs.\nApproving makes {requester} a contact; its mail stays marked key_changed until you also run `{}`.",
        pinned.fingerprint,
        pinned.first_seen.strftime("%Y-%m-%d"),
        output::command(
            me,
            format_args!("contacts trust {requester} --fingerprint {now}")
        )
    )
}

pub(super) fn change(ctx: &Ctx, change: Change) -> anyhow::Result<()> {
    let denying = matches!(change, Change::Deny(_));
    let detail = with_relay(ctx, async |conn, agent| {
        owner::check_registered(ctx, conn, agent)?;
        let owner = owner::unlock(ctx)?;
        match relay_consent::apply(conn, &owner, change).await {
            // A request already denied (or approved, or lapsed) is no mistake of the owner's:
            // the relay's sentence, without the code.
            Err(ClientError::Refused {
                code: ErrorCode::BadCode,
                message,
                ..
            }) if denying => bail!(
                "{message}. `{}` lists the open ones",
                output::command(&agent.name, "requests")
            ),
            done => Ok(done?),
        }
    })?;
    outln!("{detail}")?;
    Ok(())
}

pub(super) fn contacts(ctx: &Ctx) -> anyhow::Result<()> {
    let ConsentState {
        policy,
        contacts,
        blocked,
        ..
    } = with_relay(ctx, async |conn, _| Ok(relay_consent::state(conn).await?))?;
    output::emit(
        ctx.json,
        &Contacts {
            policy,
            contacts,
            blocked,
        },
        |c| {
            fn list(v: &[impl ToString]) -> String {
                if v.is_empty() {
                    "(none)".to_owned()
                } else {
                    v.iter()
                        .map(ToString::to_string)
                        .collect::<Vec<_>>()
                        .join(", ")
                }
            }
            format!(
                "policy    {}\ncontacts  {}\nblocked   {}",
                c.policy,
                list(&c.contacts),
                list(&c.blocked)
            )
        },
    )
}
