//! `export` and `import`: one agent (keys and store) in one file sealed under a passphrase,
//! for backups and for moving an agent to another machine.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use serde::Serialize;
use zeroize::Zeroizing;

use super::Ctx;
use super::output;
use crate::agent::archive;
use crate::crypto::Passphrase;
use crate::mailbox::ConnectionLock;
use crate::protocol::{AgentName, Fingerprint};

#[derive(Serialize)]
struct Exported {
    agent: AgentName,
    fingerprint: Fingerprint,
    file: PathBuf,
}

/// `mailslot export`: writes the agent to `out` (default `NAME.mailslot` here).
pub(super) fn export(
    ctx: &Ctx,
    out: Option<PathBuf>,
    passphrase_file: Option<PathBuf>,
) -> anyhow::Result<()> {
    let agent = ctx.open_agent()?;
    let out = out.unwrap_or_else(|| PathBuf::from(format!("{}.mailslot", agent.name)));
    if out.exists() {
        bail!(
            "{} exists; choose another file with --out, or move it away",
            out.display()
        );
    }
    let passphrase = match &passphrase_file {
        Some(file) => from_file(file)?,
        None => {
            let first = prompt("Passphrase for the export: ")?;
            let passphrase = Passphrase::new(first.to_string())?;
            if *first != *prompt("Again: ")? {
                bail!("the passphrases differ; nothing was written");
            }
            passphrase
        }
    };
    let header = archive::export(&agent, &passphrase, &out)?;
    let done = Exported {
        agent: header.agent,
        fingerprint: header.fingerprint,
        file: out,
    };
    output::emit(ctx.json, &done, |d| {
        format!(
            "exported {} ({}) to {}: its keys and mail, sealed under your passphrase. The owner key is not in it; copy {} too when you move this home.",
            d.agent,
            d.fingerprint,
            d.file.display(),
            ctx.paths.owner_key().display()
        )
    })
}

#[derive(Serialize)]
struct Imported {
    agent: AgentName,
    fingerprint: Fingerprint,
    folder: PathBuf,
    replaced_kept_in: Option<PathBuf>,
}

/// `mailslot import FILE`: makes the agent in the file here, under the name it had (a name
/// is registered with its keys, so it cannot change on the way).
pub(super) fn import(
    ctx: &Ctx,
    file: &Path,
    replace: bool,
    passphrase_file: Option<PathBuf>,
) -> anyhow::Result<()> {
    // The header is in the clear: refuse what cannot work before asking for the passphrase.
    let (header, _, _) = archive::read_header(file)?;
    let dir = ctx.paths.agent_dir(&header.agent);
    if dir.exists() {
        if !replace {
            bail!(
                "agent {} already exists in {}; `{}` replaces it (the old folder is kept beside it)",
                header.agent,
                dir.display(),
                output::command(
                    &header.agent,
                    format!("import {} --replace", file.display())
                )
            );
        }
        let lock = ConnectionLock::for_agent(&dir);
        if lock.try_take()?.is_none() {
            bail!(
                "a running mailslot process{} uses agent {}; stop it, then import again",
                lock.holder()
                    .map(|p| format!(" (pid {p})"))
                    .unwrap_or_default(),
                header.agent
            );
        }
    }
    let passphrase = match &passphrase_file {
        Some(file) => from_file(file)?,
        None => Passphrase::new(prompt("The export's passphrase: ")?.to_string())?,
    };
    let (header, replaced) = archive::import(&ctx.paths, file, &passphrase, replace)?;
    let done = Imported {
        folder: ctx.paths.agent_dir(&header.agent),
        agent: header.agent,
        fingerprint: header.fingerprint,
        replaced_kept_in: replaced,
    };
    output::emit(ctx.json, &done, |d| {
        let mut text = format!(
            "imported {} ({}) into {}",
            d.agent,
            d.fingerprint,
            d.folder.display()
        );
        if let Some(old) = &d.replaced_kept_in {
            text += &format!("\nthe agent it replaced is kept in {}", old.display());
        }
        text
    })
}

/// Reads a passphrase from the controlling terminal, never echoed.
fn prompt(text: &str) -> anyhow::Result<Zeroizing<String>> {
    rpassword::prompt_password(text)
        .map(Zeroizing::new)
        .context("the passphrase is typed at a terminal; without one, give --passphrase-file FILE")
}

/// A passphrase from the first line of `file` (for scripted backups; the file is the
/// owner's to protect).
fn from_file(file: &Path) -> anyhow::Result<Passphrase> {
    let text = Zeroizing::new(
        std::fs::read_to_string(file)
            .with_context(|| format!("reading the passphrase from {}", file.display()))?,
    );
    let line = text.lines().next().unwrap_or_default().to_owned();
    Ok(Passphrase::new(line)?)
}
