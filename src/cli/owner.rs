//! `owner init`, `owner change` and `owner confirm`, and unlocking the owner key for a consent
//! change: the passphrase is read from the terminal itself, never echoed, never from
//! arguments, the environment or stdin. Each of them leaves the home's confirmed copy of the
//! key (`keys::pin_owner_key`) in step with the key file.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use serde::Serialize;
use zeroize::Zeroizing;

use super::Ctx;
use super::output::{self, outln};
use crate::agent::Agent;
use crate::client::Connection;
use crate::client::consent::{self, OwnerKeyProblem};
use crate::crypto::{Owner, OwnerKeyError, Passphrase, owner};
use crate::keys::{OwnerPinError, pin_owner_key, pin_path, read_owner_public};
use crate::protocol::{AgentName, Fingerprint, OwnerKey};

const NO_TERMINAL: &str = "the owner's passphrase is typed at a terminal: run this yourself in an interactive shell (agents cannot change consent)";

/// Reads a passphrase from the controlling terminal.
fn prompt(text: &str) -> anyhow::Result<String> {
    rpassword::prompt_password(text).context(NO_TERMINAL)
}

/// Asks for the owner's passphrase and unlocks the owner key; says how to make one when
/// there is none, and refuses one that is not the home's confirmed key before asking.
pub(super) fn unlock(ctx: &Ctx) -> anyhow::Result<Owner> {
    unlock_confirmed(ctx, "Owner passphrase: ")
}

/// [`unlock_file`] on the owner key file, once it is known to be the confirmed one.
fn unlock_confirmed(ctx: &Ctx, question: &str) -> anyhow::Result<Owner> {
    let path = ctx.paths.owner_key();
    read_owner_public(&path)?;
    unlock_file(ctx, &path, question)
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
    /// Shows the report; `again` is the command that finishes an unfinished one.
    fn emit(self, ctx: &Ctx, heading: &str, again: &str) -> anyhow::Result<()> {
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
                lines.push(format!("Not every agent has the new key yet: run `mailslot owner {again}` again to finish (the old key stays in place until then)."));
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
    pin_owner_key(&path)?;
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
    .emit(ctx, "owner key", "init")
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
    let old = unlock_confirmed(ctx, "Current owner passphrase: ")?;
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
    let new_key = new.public();
    let agents = move_agents(ctx, &old, new_key)?;
    let finished = agents.iter().all(|a| a.done);
    if finished {
        std::fs::rename(&next_path, &path)
            .with_context(|| format!("moving {} to {}", next_path.display(), path.display()))?;
        pin_owner_key(&path)?;
    }
    Report {
        path: if finished { path } else { next_path },
        fingerprint: owner::fingerprint(&new_key),
        agents,
        finished,
    }
    .emit(ctx, "new owner key", "change")
}

/// Registers `new_key` in place of `old`'s for every agent of this home whose relay holds
/// `old`'s, each change signed by `old`.
fn move_agents(ctx: &Ctx, old: &Owner, new_key: OwnerKey) -> anyhow::Result<Vec<AgentOutcome>> {
    let old_key = old.public();
    each_agent(ctx, None, async |conn| {
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
        consent::set_owner(conn, old, new_key).await?;
        Ok((true, "has the new key".to_owned()))
    })
}

/// `mailslot owner confirm`: makes the owner key file that replaced the confirmed one this
/// home's owner key. The passphrase of the confirmed key proves the owner wants it (an agent
/// can copy its own key file here, but does not know that passphrase), the new key's proves
/// it opens; then every agent whose relay holds the confirmed key gets the new one, signed by
/// the confirmed key, and the new file is pinned once all have it.
pub(super) fn confirm(ctx: &Ctx) -> anyhow::Result<()> {
    let path = ctx.paths.owner_key();
    let (pinned, found) = match read_owner_public(&path) {
        Ok(Some(key)) => {
            return outln!(
                "{} is this home's confirmed owner key already (fingerprint {}); nothing to confirm",
                path.display(),
                owner::fingerprint(&key)
            );
        }
        Ok(None) => bail!(missing(ctx)),
        Err(OwnerPinError::Changed { pinned, found, .. }) => (pinned, found),
        Err(e) => return Err(e.into()),
    };
    eprintln!(
        "{} holds owner key {}; this home's confirmed owner key is {}. Confirming moves every agent of this home to the new key.",
        path.display(),
        owner::fingerprint(&found),
        owner::fingerprint(&pinned)
    );
    let old = unlock_file(
        ctx,
        &pin_path(&path),
        &format!(
            "Passphrase of the confirmed owner key ({}): ",
            owner::fingerprint(&pinned)
        ),
    )?;
    let new = unlock_file(
        ctx,
        &path,
        &format!(
            "Passphrase of the new owner key ({}): ",
            owner::fingerprint(&found)
        ),
    )?;
    if new.public() != found {
        bail!(
            "{} changed while you typed; nothing was confirmed",
            path.display()
        );
    }
    let agents = move_agents(ctx, &old, found)?;
    let finished = agents.iter().all(|a| a.done);
    if finished {
        pin_owner_key(&path)?;
    }
    Report {
        path,
        fingerprint: owner::fingerprint(&found),
        agents,
        finished,
    }
    .emit(ctx, "confirmed owner key", "confirm")
}
