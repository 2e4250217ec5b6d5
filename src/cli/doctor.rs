//! `mailslot doctor`: what is misconfigured and how to fix it. Today: the config file, the
//! owner key, and the OpenClaw doorbell, end to end against the gateway. Exits 1 when a check fails.

use serde::Serialize;

use super::{Ctx, output};
use crate::config;
use crate::crypto::owner;
use crate::doorbell::openclaw::check::{self, Check, Outcome};

#[derive(Serialize)]
struct Report {
    config_file: String,
    agent: String,
    checks: Vec<Check>,
}

/// Whether this home has an owner key (offline: the relay's copy is checked by every consent
/// command).
fn owner_check(ctx: &Ctx) -> Check {
    let path = ctx.paths.owner_key();
    match owner::read_public(&path) {
        Ok(Some(key)) => Check {
            name: "owner key",
            outcome: Outcome::Ok,
            detail: format!("{} (fingerprint {})", path.display(), owner::fingerprint(&key)),
            fix: None,
        },
        Ok(None) => Check {
            name: "owner key",
            outcome: Outcome::Warn,
            detail: "none yet: nobody can approve, deny, block or change the policy of this home's agents".into(),
            fix: Some("run `mailslot owner init` yourself, before any agent gets a shell".into()),
        },
        Err(e) => Check {
            name: "owner key",
            outcome: Outcome::Fail,
            detail: e.to_string(),
            fix: Some(format!("restore {} from a backup", path.display())),
        },
    }
}

pub(super) fn run(ctx: &Ctx) -> anyhow::Result<()> {
    let cwd = std::env::current_dir()?;
    let agent = config::resolve_agent(ctx.agent.clone(), &ctx.config, &cwd)?;
    let config_file = ctx.paths.config_file();
    // The file was read before any command ran: an invalid one never gets this far.
    let found = if config_file.exists() {
        "read"
    } else {
        "not found (defaults apply)"
    };
    let mut checks = vec![Check {
        name: "config file",
        outcome: Outcome::Ok,
        detail: format!("{} {found}", config_file.display()),
        fix: None,
    }];
    checks.push(owner_check(ctx));
    match &ctx.config.openclaw {
        None => checks.push(Check {
            name: "openclaw",
            outcome: Outcome::Skip,
            detail: "not configured: mail does not go to an OpenClaw gateway".into(),
            fix: Some(format!(
                "to deliver mail into OpenClaw, add an [openclaw] table to {} (README, \"OpenClaw\")",
                config_file.display()
            )),
        }),
        Some(openclaw) => {
            let dir = ctx.paths.agent_dir(&agent);
            let found = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?
                .block_on(check::run(openclaw, &agent, &dir));
            checks.extend(found);
        }
    }
    let failed = checks.iter().filter(|c| c.outcome == Outcome::Fail).count();
    let report = Report {
        config_file: config_file.display().to_string(),
        agent: agent.to_string(),
        checks,
    };
    output::emit(ctx.json, &report, |r| {
        let mut text = format!("mailslot doctor for agent {}\n", r.agent);
        for c in &r.checks {
            let mark = match c.outcome {
                Outcome::Ok => "ok  ",
                Outcome::Warn => "WARN",
                Outcome::Fail => "FAIL",
                Outcome::Skip => "skip",
            };
            text.push_str(&format!("{mark}  {}: {}\n", c.name, c.detail));
            if let Some(fix) = &c.fix {
                text.push_str(&format!("      fix: {fix}\n"));
            }
        }
        text
    })?;
    if failed > 0 {
        anyhow::bail!(
            "{failed} check{} failed",
            if failed == 1 { "" } else { "s" }
        );
    }
    Ok(())
}
