//! `owner init` and `owner change`, and unlocking the owner key for a consent change: the
//! passphrase is read from the terminal itself, never echoed, never from arguments, the
//! environment or stdin.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use serde::Serialize;
use zeroize::Zeroizing;

use super::{Ctx, output};
use crate::agent::Agent;
use crate::client::Connection;
use crate::client::consent::{self, OwnerKeyProblem};
use crate::crypto::{Owner, OwnerKeyError, Passphrase, owner};
use crate::keys::read_owner_public;
use crate::protocol::{AgentName, Fingerprint, OwnerKey};

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
    match consent::check_owner(conn, &agent.name, agent.owner) {
        Ok(()) => Ok(()),
        Err(OwnerKeyProblem::Missing) => bail!(missing(ctx)),
        Err(e) => Err(e.into()),
    }
}

/// What `owner init` and `owner change` did.
#[derive(Serialize)]
struct Report {
    path: PathBuf,
    fingerprint: Fingerprint,
    agents: Vec<AgentOutcome>,
    /// Whether every agent has the key (`owner change` finishes only then).
    finished: bool,
}

#[derive(Serialize)]
struct AgentOutcome {
    agent: AgentName,
    done: bool,
    detail: String,
}

impl Report {
    fn emit(self, ctx: &Ctx, heading: &str) -> anyhow::Result<()> {
        output::emit(ctx.json, &self, |r| {
            let mut lines = vec![format!(
                "{heading} {} in {}",
                r.fingerprint,
                r.path.display()
            )];
            for a in &r.agents {
                lines.push(format!("  {}: {}", a.agent, a.detail));
            }
            if !r.finished {
                lines.push("Not every agent has the new key yet: run `mailslot owner change` again to finish (the old key stays in place until then).".into());
            }
            lines.join("\n")
        })
    }
}

/// Connects (control) as each agent of this home, offering `offer` as its owner key, and runs
/// `work` on the connection: whether the agent is done, and what to say.
fn each_agent(
    ctx: &Ctx,
    offer: Option<OwnerKey>,
    work: impl AsyncFn(&mut Connection) -> anyhow::Result<(bool, String)>,
) -> anyhow::Result<Vec<AgentOutcome>> {
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
            let mut conn =
                Connection::connect_control(&url, &agent.name, &agent.identity, offer).await?;
            let outcome = work(&mut conn).await;
            conn.close().await;
            outcome
        });
        let (done, detail) =
            outcome.unwrap_or_else(|e| (false, format!("not reached ({e:#}); try again later")));
        out.push(AgentOutcome {
            agent: name,
            done,
            detail,
        });
    }
    Ok(out)
}

/// What the relay holding `held` means for an agent whose owner key should be `mine`.
fn held_by_another(held: Option<&OwnerKey>) -> String {
    match held {
        Some(held) => format!(
            "NOT yours: the relay already holds another owner key for it (fingerprint {})",
            owner::fingerprint(held)
        ),
        None => "the relay holds no owner key for it".to_owned(),
    }
}

/// `mailslot owner init`: makes the owner key, sealed under a passphrase typed twice, and
/// registers it for every agent in this home that has none yet.
pub(super) fn init(ctx: &Ctx) -> anyhow::Result<()> {
    let path = ctx.paths.owner_key();
    if let Some(existing) = read_owner_public(&path)? {
        bail!(
            "{} already holds an owner key (fingerprint {}); mailslot never overwrites it (`mailslot owner change` replaces it)",
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
    // The hello offers the key; the welcome says whether the relay took it.
    let agents = each_agent(ctx, Some(public), async |conn| {
        Ok(match conn.owner() {
            Some(held) if *held == public => (true, "registered".to_owned()),
            held => (false, held_by_another(held)),
        })
    })?;
    Report {
        path,
        fingerprint: owner::fingerprint(&public),
        agents,
        finished: true,
    }
    .emit(ctx, "owner key")
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
    let (old_key, new_key) = (old.public(), new.public());
    let agents = each_agent(ctx, None, async |conn| {
        let held = conn.owner().copied();
        if held == Some(new_key) {
            return Ok((true, "has the new key".to_owned()));
        }
        if held != Some(old_key) {
            // Not this owner's agent on the relay: nothing to carry over.
            return Ok((
                true,
                format!("left alone: {}", held_by_another(held.as_ref())),
            ));
        }
        consent::set_owner(conn, &old, new_key).await?;
        Ok((true, "has the new key".to_owned()))
    })?;
    let finished = agents.iter().all(|a| a.done);
    if finished {
        std::fs::rename(&next_path, &path)
            .with_context(|| format!("moving {} to {}", next_path.display(), path.display()))?;
    }
    Report {
        path: if finished { path } else { next_path },
        fingerprint: owner::fingerprint(&new_key),
        agents,
        finished,
    }
    .emit(ctx, "new owner key")
}
