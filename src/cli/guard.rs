//! `mailslot guard`: a git pre-commit hook that refuses a commit touching files another
//! agent holds exclusively. `install` writes the hook where git runs it (`core.hooksPath`
//! respected); the hook runs `check`, which reads the staged paths and the project's
//! reservations. Overrides: `git commit --no-verify`, or `MAILSLOT_GUARD=off`. A relay that
//! cannot be reached lets the commit through with a warning: the guard keeps agents from
//! colliding, it never locks anyone out of their own repository.

use std::fs;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::process::ExitCode;

use super::Ctx;
use crate::client::reservations;
use crate::doorbell::frame::fence_line;
use crate::protocol::{
    AgentName, MAX_REASON_CHARS, Pattern, ProjectName, Reservation, ReservationMode,
};

/// The environment variable that turns the check off for one commit.
pub const ENV_GUARD: &str = "MAILSLOT_GUARD";
/// The exit code that stops the commit.
const BLOCKED: u8 = 1;
/// The line that marks a hook as the guard's.
const MARK: &str = "# mailslot guard:";

/// The hook's text: runs this very binary, as found now, with the committer's environment
/// choosing the agent.
fn hook_text() -> anyhow::Result<String> {
    let exe = std::env::current_exe()?;
    let exe = exe.to_string_lossy().replace('\'', r"'\''");
    Ok(format!(
        "#!/bin/sh\n{MARK} refuses a commit touching files another agent holds exclusively.\n# Skip it once: git commit --no-verify, or {ENV_GUARD}=off git commit ...\nexec '{exe}' guard check\n"
    ))
}

pub(super) fn install(force: bool) -> anyhow::Result<()> {
    let hooks = crate::repo::hooks_dir(&std::env::current_dir()?)?;
    fs::create_dir_all(&hooks)?;
    let path = hooks.join("pre-commit");
    let text = hook_text()?;
    match fs::read_to_string(&path) {
        Ok(existing) if existing == text => {
            eprintln!("the guard is already installed at {}", path.display());
            return Ok(());
        }
        Ok(existing) if !force && !existing.contains(MARK) => anyhow::bail!(
            "{} holds another pre-commit hook; run it from yours by adding the line `mailslot guard check || exit 1`, or replace it with `mailslot guard install --force` (it is kept as pre-commit.before-mailslot)",
            path.display()
        ),
        Ok(existing) if !existing.contains(MARK) => {
            fs::write(hooks.join("pre-commit.before-mailslot"), existing)?;
        }
        _ => {}
    }
    let staged = hooks.join(".pre-commit.mailslot");
    {
        let mut file = fs::File::create(&staged)?;
        file.write_all(text.as_bytes())?;
        file.sync_all()?;
    }
    fs::set_permissions(&staged, fs::Permissions::from_mode(0o755))?;
    fs::rename(&staged, &path)?;
    eprintln!(
        "installed the guard at {}; a commit touching files another agent holds exclusively is refused (override once: git commit --no-verify)",
        path.display()
    );
    Ok(())
}

pub(super) fn check(ctx: &Ctx, project: Option<ProjectName>) -> anyhow::Result<ExitCode> {
    if std::env::var(ENV_GUARD).is_ok_and(|v| v.eq_ignore_ascii_case("off")) {
        eprintln!("mailslot guard: off ({ENV_GUARD}=off); reservations not checked");
        return Ok(ExitCode::SUCCESS);
    }
    let dir = std::env::current_dir()?;
    let staged = crate::repo::staged_paths(&dir)?;
    if staged.is_empty() {
        return Ok(ExitCode::SUCCESS);
    }
    let project = super::reservations::project(project)?;
    let asked = super::consent::with_relay(ctx, async |conn, agent| {
        let listed = reservations::list(conn, project).await?;
        Ok((agent.name.clone(), listed))
    });
    let (me, listed) = match asked {
        Ok(answer) => answer,
        Err(e) => {
            eprintln!(
                "mailslot guard: WARNING: reservations were NOT checked ({e:#}); the commit goes through unchecked. Set {}=NAME to the committing agent and make sure its relay runs, or {ENV_GUARD}=off to silence this.",
                crate::config::ENV_AGENT
            );
            return Ok(ExitCode::SUCCESS);
        }
    };
    let blocked = blocking(&me, &listed, &staged);
    if blocked.is_empty() {
        return Ok(ExitCode::SUCCESS);
    }
    let mut text = format!(
        "mailslot guard: this commit touches files another agent holds exclusively (checked as {me}):"
    );
    for (path, r, pattern) in &blocked {
        text.push_str(&format!(
            "\n  {path}\n    held by {} (pattern {pattern}, exclusive) until {}\n    reason: {}",
            r.holder,
            super::output::when(r.expires_at),
            fence_line(r.reason.as_str(), MAX_REASON_CHARS)
        ));
    }
    text.push_str(&format!(
        "\nWait for its release (`mailslot reservations` shows what is held), ask the holder, or override once: git commit --no-verify, or {ENV_GUARD}=off git commit ..."
    ));
    eprintln!("{text}");
    Ok(ExitCode::from(BLOCKED))
}

/// Each staged path another agent holds exclusively, with the reservation and the pattern
/// that holds it. Paths are relative to the repository's top, as git stages them.
fn blocking<'a>(
    me: &AgentName,
    listed: &'a [Reservation],
    staged: &'a [String],
) -> Vec<(&'a str, &'a Reservation, &'a Pattern)> {
    let others: Vec<&Reservation> = listed
        .iter()
        .filter(|r| &r.holder != me && r.mode == ReservationMode::Exclusive)
        .collect();
    let matchers: Vec<(&Reservation, &Pattern, _)> = others
        .iter()
        .flat_map(|r| r.patterns.iter().map(move |p| (*r, p, p.matcher())))
        .collect();
    staged
        .iter()
        .filter_map(|path| {
            matchers
                .iter()
                .find(|(_, _, m)| m.holds(path))
                .map(|(r, p, _)| (path.as_str(), *r, *p))
        })
        .collect()
}
