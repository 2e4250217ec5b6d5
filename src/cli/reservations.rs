//! `reserve`, `release`, `renew`, `reservations`: file reservations in a project, over a
//! control connection, through the same typed calls the MCP tools use. The project is
//! `--project`, else the repository's (`git config mailslot.project`, else its root commit).
//! Reasons are other agents' words: the text output fences them (an agent with a shell may
//! be the reader); `--json` gives scripts the values.

use std::process::ExitCode;

use super::{Ctx, output};
use crate::client::reservations::{self, Release, Reserved};
use crate::doorbell::frame::fence_line;
use crate::protocol::{
    MAX_REASON_CHARS, Pattern, ProjectName, Reason, Reservation, ReservationId, ReservationMode,
    ReservationRequest, Ttl,
};

/// The exit code of a reserve refused because others hold the files.
const REFUSED: u8 = 3;

/// What `reserve` asks for.
pub(super) struct Wanted {
    pub patterns: Vec<Pattern>,
    pub reason: String,
    pub shared: bool,
    pub ttl: Ttl,
}

/// `--project`, else the project of the repository the command runs in.
pub(super) fn project(given: Option<ProjectName>) -> anyhow::Result<ProjectName> {
    match given {
        Some(p) => Ok(p),
        None => Ok(crate::repo::project(&std::env::current_dir()?)?),
    }
}

pub(super) fn reserve(
    ctx: &Ctx,
    project: Option<ProjectName>,
    wanted: Wanted,
) -> anyhow::Result<ExitCode> {
    let request = ReservationRequest {
        project: self::project(project)?,
        patterns: wanted.patterns,
        mode: if wanted.shared {
            ReservationMode::Shared
        } else {
            ReservationMode::Exclusive
        },
        reason: Reason::new(&wanted.reason)?,
        ttl: wanted.ttl,
    };
    let outcome = super::consent::with_relay(ctx, async |conn, _| {
        Ok(reservations::reserve(conn, request).await?)
    })?;
    output::emit(ctx.json, &outcome, |o| match o {
        Reserved::Granted { reservation } => {
            format!("reserved {}\n{}", reservation.id, describe(reservation))
        }
        Reserved::Refused { conflicts } => {
            let mut text = String::from(
                "refused: other agents hold these files (each holder was told you wait):",
            );
            for r in conflicts {
                text.push('\n');
                text.push_str(&describe(r));
            }
            text.push_str("\nWait for a release (`mailslot reservations` shows what is held), or ask the holder.");
            text
        }
    })?;
    Ok(match outcome {
        Reserved::Granted { .. } => ExitCode::SUCCESS,
        Reserved::Refused { .. } => ExitCode::from(REFUSED),
    })
}

pub(super) fn release(
    ctx: &Ctx,
    project: Option<ProjectName>,
    targets: Vec<String>,
    all: bool,
) -> anyhow::Result<()> {
    let which = match (targets.is_empty(), all) {
        (true, true) => Release::All,
        (false, false) => which(&targets)?,
        (true, false) => {
            anyhow::bail!("name what to release: reservation ids, patterns as reserved, or --all")
        }
        (false, true) => anyhow::bail!("give ids or patterns, or --all, not both"),
    };
    let project = self::project(project)?;
    let released = super::consent::with_relay(ctx, async |conn, _| {
        Ok(reservations::release(conn, project, which).await?)
    })?;
    output::emit(ctx.json, &released, |ids| {
        if ids.is_empty() {
            return "nothing released: this agent holds no live reservation like that".into();
        }
        ids.iter()
            .map(|id| format!("released {id}"))
            .collect::<Vec<_>>()
            .join("\n")
    })
}

/// Ids when every target reads as one, else patterns.
fn which(targets: &[String]) -> anyhow::Result<Release> {
    let ids: Result<Vec<ReservationId>, _> = targets.iter().map(|t| t.parse()).collect();
    if let Ok(ids) = ids {
        return Ok(Release::Ids(ids));
    }
    let patterns = targets
        .iter()
        .map(|t| Pattern::new(t))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Release::Patterns(patterns))
}

pub(super) fn renew(
    ctx: &Ctx,
    project: Option<ProjectName>,
    ids: Vec<ReservationId>,
    ttl: Ttl,
) -> anyhow::Result<()> {
    let project = self::project(project)?;
    let renewed = super::consent::with_relay(ctx, async |conn, _| {
        Ok(reservations::renew(conn, project, ids, ttl).await?)
    })?;
    output::emit(ctx.json, &renewed, |renewed| {
        if renewed.is_empty() {
            return "nothing renewed: this agent holds no live reservation like that (an expired one is gone: reserve again)".into();
        }
        renewed
            .iter()
            .map(|r| format!("renewed {} until {}", r.id, output::when(r.expires_at)))
            .collect::<Vec<_>>()
            .join("\n")
    })
}

pub(super) fn list(ctx: &Ctx, project: Option<ProjectName>) -> anyhow::Result<()> {
    let project = self::project(project)?;
    let shown = project.clone();
    let listed = super::consent::with_relay(ctx, async |conn, _| {
        Ok(reservations::list(conn, project).await?)
    })?;
    output::emit(ctx.json, &listed, |listed| {
        if listed.is_empty() {
            return format!("no live reservations in {shown}");
        }
        listed.iter().map(describe).collect::<Vec<_>>().join("\n")
    })
}

/// One reservation for people: who holds what, how, until when and why (fenced).
pub(super) fn describe(r: &Reservation) -> String {
    let patterns: Vec<&str> = r.patterns.iter().map(Pattern::as_str).collect();
    format!(
        "  {}  {} ({}) until {}  id {}\n    reason: {}",
        r.holder,
        patterns.join(" "),
        r.mode,
        output::when(r.expires_at),
        r.id,
        fence_line(r.reason.as_str(), MAX_REASON_CHARS)
    )
}
