//! `owner init` and `owner change`, and unlocking the owner key for a consent change: the
//! passphrase is read from the terminal itself, never echoed, never from arguments, the
//! environment or stdin.

use std::path::Path;

use anyhow::{Context, bail};
use serde::Serialize;
use zeroize::Zeroizing;

use super::{Ctx, output};
use crate::agent::Agent;
use crate::client::Connection;
use crate::crypto::{Owner, OwnerKeyError, Passphrase, owner};
use crate::protocol::{AgentName, ClientFrame, Fingerprint, OwnerAct, OwnerKey};

const NO_TERMINAL: &str = "the owner's passphrase is typed at a terminal: run this yourself in an interactive shell (agents cannot change consent)";

/// Reads a passphrase from the controlling terminal.
fn prompt(text: &str) -> anyhow::Result<String> {
    rpassword::prompt_password(text).context(NO_TERMINAL)
}

/// Asks for the owner's passphrase and unlocks the owner key; says how to make one when
/// there is none.
pub(super) fn unlock(ctx: &Ctx) -> anyhow::Result<Owner> {
    unlock_file(ctx, &ctx.paths.owner_key(), "Owner passphrase: ")
}

fn unlock_file(ctx: &Ctx, path: &Path, question: &str) -> anyhow::Result<Owner> {
    if !path.exists() {
        bail!(missing(ctx));
    }
    let passphrase = Passphrase::new(prompt(question)?)?;
    match Owner::unlock(path, &passphrase) {
        Ok(owner) => Ok(owner),
        Err(e @ OwnerKeyError::WrongPassphrase { .. }) => bail!("{e}"),
        Err(e) => Err(e.into()),
    }
}

fn missing(ctx: &Ctx) -> String {
    format!(
        "consent changes are signed with your owner key, and {} has none yet: run `mailslot owner init` once (it asks for a passphrase), then try again",
        ctx.paths.home().display()
    )
}

/// Checks, before the passphrase is asked for, that the relay holds this home's owner key
/// for the connection's agent.
pub(super) fn check_registered(ctx: &Ctx, conn: &Connection, agent: &Agent) -> anyhow::Result<()> {
    let Some(local) = agent.owner else {
        bail!(missing(ctx));
    };
    match conn.owner() {
        Some(held) if *held == local => Ok(()),
        Some(held) => bail!(
            "the relay holds another owner key for {} (fingerprint {}), not yours ({}): someone registered theirs first, so consent for {} is in their hands. If it was not you, create a new agent, or ask the relay's operator",
            agent.name,
            owner::fingerprint(held),
            owner::fingerprint(&local),
            agent.name
        ),
        None => bail!(
            "the relay did not register your owner key for {}; is it an older relay?",
            agent.name
        ),
    }
}

#[derive(Serialize)]
struct Initialized {
    path: std::path::PathBuf,
    fingerprint: Fingerprint,
    agents: Vec<Registered>,
}

#[derive(Serialize)]
struct Registered {
    agent: AgentName,
    registered: bool,
    detail: String,
}

/// `mailslot owner init`: makes the owner key, sealed under a passphrase typed twice, and
/// registers it for every agent in this home that has none yet.
pub(super) fn init(ctx: &Ctx) -> anyhow::Result<()> {
    let path = ctx.paths.owner_key();
    if let Some(existing) = owner::read_public(&path)? {
        bail!(
            "{} already holds an owner key (fingerprint {}); mailslot never overwrites it",
            path.display(),
            owner::fingerprint(&existing)
        );
    }
    eprintln!(
        "The owner key signs every consent change (approve, deny, block, policy) for the agents in {}. Choose a passphrase that your agents never see.",
        ctx.paths.home().display()
    );
    let passphrase = new_passphrase()?;
    let owner = Owner::generate();
    owner.save_new(&path, &passphrase)?;
    let public = owner.public();
    let agents = register_everywhere(ctx, public)?;
    output::emit(
        ctx.json,
        &Initialized {
            path,
            fingerprint: owner::fingerprint(&public),
            agents,
        },
        |i| {
            let mut lines = vec![format!(
                "owner key {} in {}",
                i.fingerprint,
                i.path.display()
            )];
            for a in &i.agents {
                lines.push(format!("  {}: {}", a.agent, a.detail));
            }
            lines.join("\n")
        },
    )
}

/// Asks for a new passphrase, twice.
fn new_passphrase() -> anyhow::Result<Passphrase> {
    let first = Zeroizing::new(prompt("New owner passphrase: ")?);
    let passphrase = Passphrase::new(first.to_string())?;
    if *first != *Zeroizing::new(prompt("Again: ")?) {
        bail!("the passphrases differ; nothing was changed");
    }
    Ok(passphrase)
}

/// `mailslot owner change`: a new owner key (and passphrase), registered in place of the old
/// one for every agent of this home, each change signed by the old key. The new key waits in
/// `owner.key.next` until every agent has it; running the command again finishes an
/// interrupted change with it.
pub(super) fn change(ctx: &Ctx) -> anyhow::Result<()> {
    let path = ctx.paths.owner_key();
    let next_path = path.with_file_name("owner.key.next");
    let old = unlock_file(ctx, &path, "Current owner passphrase: ")?;
    let new = if next_path.exists() {
        eprintln!(
            "An earlier change did not finish; finishing it with the new key in {}.",
            next_path.display()
        );
        unlock_file(
            ctx,
            &next_path,
            "New owner passphrase (of the unfinished change): ",
        )?
    } else {
        let passphrase = new_passphrase()?;
        let new = Owner::generate();
        new.save_new(&next_path, &passphrase)?;
        new
    };
    let agents = switch_everywhere(ctx, &old, &new)?;
    let unfinished = agents.iter().any(|a| !a.registered);
    if !unfinished {
        std::fs::rename(&next_path, &path)
            .with_context(|| format!("moving {} to {}", next_path.display(), path.display()))?;
    }
    output::emit(
        ctx.json,
        &Initialized {
            path: if unfinished { next_path } else { path },
            fingerprint: owner::fingerprint(&new.public()),
            agents,
        },
        |i| {
            let mut lines = vec![format!(
                "new owner key {} in {}",
                i.fingerprint,
                i.path.display()
            )];
            for a in &i.agents {
                lines.push(format!("  {}: {}", a.agent, a.detail));
            }
            if unfinished {
                lines.push("Not every agent has the new key yet: run `mailslot owner change` again to finish (the old key stays in place until then).".into());
            }
            lines.join("\n")
        },
    )
}

/// Connects as each agent of this home and replaces `old` with `new` where the relay holds
/// `old`.
fn switch_everywhere(ctx: &Ctx, old: &Owner, new: &Owner) -> anyhow::Result<Vec<Registered>> {
    let names = ctx.paths.agent_names()?;
    if names.is_empty() {
        return Ok(Vec::new());
    }
    let url = ctx.relay_url()?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let (old_key, new_key) = (old.public(), new.public());
    let mut out = Vec::new();
    for name in names {
        let (agent, _) = Agent::open_or_create(&ctx.paths, &name)?;
        let outcome = runtime.block_on(async {
            let mut conn =
                Connection::connect_control(&url, &agent.name, &agent.identity, None).await?;
            let held = conn.owner().copied();
            let switched = if held == Some(old_key) {
                let owner_signature = conn.owner_signature(old, &OwnerAct::SetOwner(&new_key));
                conn.call(|reference| ClientFrame::SetOwner {
                    reference,
                    owner: new_key,
                    owner_signature,
                })
                .await?;
                true
            } else {
                held == Some(new_key)
            };
            conn.close().await;
            anyhow::Ok((held, switched))
        });
        let (registered, detail) = match outcome {
            Ok((_, true)) => (true, "has the new key".to_owned()),
            // Not this owner's agent on the relay: nothing to carry over.
            Ok((None, false)) => (
                true,
                "had no owner key; it gets the new one on its next connection".to_owned(),
            ),
            Ok((Some(held), false)) => (
                true,
                format!(
                    "left alone: the relay holds another owner key for it (fingerprint {})",
                    owner::fingerprint(&held)
                ),
            ),
            Err(e) => (false, format!("NOT changed yet ({e:#})")),
        };
        out.push(Registered {
            agent: name,
            registered,
            detail,
        });
    }
    Ok(out)
}

/// Connects as each agent of this home, offering `public` as its owner key.
fn register_everywhere(ctx: &Ctx, public: OwnerKey) -> anyhow::Result<Vec<Registered>> {
    let names = ctx.paths.agent_names()?;
    if names.is_empty() {
        return Ok(Vec::new());
    }
    let url = ctx.relay_url()?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let mut out = Vec::new();
    for name in names {
        let (agent, _) = Agent::open_or_create(&ctx.paths, &name)?;
        let outcome = runtime.block_on(async {
            let conn =
                Connection::connect_control(&url, &agent.name, &agent.identity, Some(public))
                    .await?;
            let held = conn.owner().copied();
            conn.close().await;
            anyhow::Ok(held)
        });
        let (registered, detail) = match outcome {
            Ok(Some(held)) if held == public => (true, "registered".to_owned()),
            Ok(Some(held)) => (
                false,
                format!(
                    "NOT registered: the relay already holds another owner key for it (fingerprint {})",
                    owner::fingerprint(&held)
                ),
            ),
            Ok(None) => (false, "NOT registered: the relay ignored it".to_owned()),
            Err(e) => (
                false,
                format!("not registered yet ({e:#}); it is on the agent's next connection"),
            ),
        };
        out.push(Registered {
            agent: name,
            registered,
            detail,
        });
    }
    Ok(out)
}
