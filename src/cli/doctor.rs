//! `mailslot doctor`: what is misconfigured and how to fix it: the config file, the owner
//! key, the agent's keys and their permissions, its store, its relay (reachable, registered,
//! and for the loopback relay, whether this home's relay is the one on the port), the other
//! relays it has met (reachable, key as pinned), and the OpenClaw doorbell, end to end against
//! the gateway. Exits 1 when a check fails.

use serde::Serialize;

use super::{Ctx, output, reach};
use crate::agent::Agent;
use crate::config;
use crate::crypto::owner;
use crate::doorbell::claude_code;
use crate::doorbell::openclaw::check::{self, Check, Outcome};
use crate::keys::{OwnerPinError, pin_path, read_owner_public};
use crate::protocol::AgentName;
use crate::store::{SessionKey, Store};

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
    match read_owner_public(&path) {
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
        Err(e) => {
            let pin = pin_path(&path);
            let fix = match &e {
                OwnerPinError::Changed { .. } => format!(
                    "`mailslot owner confirm` if you replaced it yourself, else `cp {} {}`",
                    pin.display(),
                    path.display()
                ),
                OwnerPinError::Missing { .. } => {
                    format!("`cp {} {}`", pin.display(), path.display())
                }
                OwnerPinError::File(_) => format!("restore {} from a backup", path.display()),
            };
            Check {
                name: "owner key",
                outcome: Outcome::Fail,
                detail: e.to_string(),
                fix: Some(fix),
            }
        }
    }
}

/// The agent's keys, store and relay; only "agent" when it does not exist.
fn agent_checks(ctx: &Ctx, name: &AgentName) -> anyhow::Result<Vec<Check>> {
    if !ctx.paths.agent_dir(name).exists() {
        return Ok(vec![Check {
            name: "agent",
            outcome: Outcome::Fail,
            detail: format!("no agent named {name} in {}", ctx.paths.home().display()),
            fix: Some(format!("run `{}`", output::command(name, "init"))),
        }]);
    }
    let agent = match ctx.open_agent() {
        Ok(agent) => agent,
        Err(e) => {
            return Ok(vec![Check {
                name: "keys",
                outcome: Outcome::Fail,
                detail: format!("{e:#}"),
                fix: Some(format!(
                    "restore {} from a backup",
                    ctx.paths.agent_dir(name).display()
                )),
            }]);
        }
    };
    let mut checks = vec![keys_check(&agent), store_check(&agent)];
    checks.extend(parked_check(&agent)?);
    checks.push(relay_check(ctx, &agent)?);
    checks.extend(other_relays_check(ctx, &agent)?);
    Ok(checks)
}

/// Letters kept because their sender's relay did not answer for its keys: a warning, since
/// they open by themselves when it answers (and are given up after a week).
fn parked_check(agent: &Agent) -> anyhow::Result<Option<Check>> {
    let (count, senders) = agent.store.parked_summary()?;
    if count == 0 {
        return Ok(None);
    }
    let from: Vec<String> = senders.iter().map(ToString::to_string).collect();
    Ok(Some(Check {
        name: "waiting letters",
        outcome: Outcome::Warn,
        detail: format!(
            "{count} letter(s) from {} wait for their sender's relay to answer for the sender's keys; mail from everyone else is not held up",
            from.join(", ")
        ),
        fix: Some(format!(
            "they open by themselves when that relay answers (`{}` tries at once); after {} days they are given up",
            super::output::command(&agent.name, "sync"),
            crate::store::PARKED_FOR.as_secs() / 86_400
        )),
    }))
}

/// Each other relay this agent has met (its key pinned): reachable, and still presenting the
/// pinned key. Unreachable is a warning (mail to its agents waits on this agent's relay); a
/// changed key fails (nothing from or to its agents is read until the owner confirms it).
fn other_relays_check(ctx: &Ctx, agent: &Agent) -> anyhow::Result<Vec<Check>> {
    let pinned = agent.store.pinned_relays()?;
    if pinned.is_empty() {
        return Ok(vec![Check {
            name: "other relays",
            outcome: Outcome::Skip,
            detail: "none met yet: no mail to or from another relay's agents".into(),
            fix: None,
        }]);
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let trusted = &ctx.config.trusted_hosts;
    Ok(pinned
        .into_iter()
        .map(|pin| {
            let found = runtime.block_on(crate::client::discover(trusted, &pin.relay));
            let (outcome, detail, fix) = match found {
                Ok(info) if info.key == pin.key => (
                    Outcome::Ok,
                    format!("{} reachable, key {} as pinned", pin.relay, pin.fingerprint),
                    None,
                ),
                Ok(info) => (
                    Outcome::Fail,
                    format!(
                        "{} presents the key {}, not {} pinned on {}",
                        pin.relay,
                        info.fingerprint,
                        pin.fingerprint,
                        pin.first_seen.strftime("%Y-%m-%d")
                    ),
                    Some(format!(
                        "check the new fingerprint with {}'s operator, then run `mailslot trust-relay {} --fingerprint FP`",
                        pin.relay, pin.relay
                    )),
                ),
                Err(e) => (
                    Outcome::Warn,
                    format!("{} (key {}) cannot be reached: {e}", pin.relay, pin.fingerprint),
                    Some("mail to its agents waits on your relay; check the name and that it runs".into()),
                ),
            };
            Check {
                name: "other relay",
                outcome,
                detail,
                fix,
            }
        })
        .collect())
}

/// The key file is 0600 and the agent's folder 0700 (loading the keys already refused a key
/// file that others can read).
fn keys_check(agent: &Agent) -> Check {
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&agent.dir).map(|m| m.permissions().mode() & 0o777);
    match mode {
        Ok(0o700) => Check {
            name: "keys",
            outcome: Outcome::Ok,
            detail: format!(
                "fingerprint {}; {} and its key file are private to you",
                agent.identity.fingerprint(),
                agent.dir.display()
            ),
            fix: None,
        },
        Ok(mode) => Check {
            name: "keys",
            outcome: Outcome::Warn,
            detail: format!(
                "{} has mode {mode:o}: others can see which files it holds",
                agent.dir.display()
            ),
            fix: Some(format!("chmod 700 {}", agent.dir.display())),
        },
        Err(e) => Check {
            name: "keys",
            outcome: Outcome::Fail,
            detail: format!("{}: {e}", agent.dir.display()),
            fix: None,
        },
    }
}

/// SQLite's own consistency check of the agent's store, then every row read back the way the
/// views read it: a store some view cannot read is never called intact.
fn store_check(agent: &Agent) -> Check {
    let path = agent.store.path().display().to_string();
    let fail = |e: crate::store::StoreError, fix: String| Check {
        name: "store",
        outcome: Outcome::Fail,
        detail: format!("{path}: {e}"),
        fix: Some(fix),
    };
    if let Err(e) = agent.store.check_integrity() {
        return fail(
            e,
            format!(
                "stop every mailslot process of this agent and restore {path} from a backup; its keys are separate and safe"
            ),
        );
    }
    match agent.store.check_rows() {
        // Mail that claims to be the owner's without the owner key's signature was not
        // written by `tell`: something with access to this home wrote it into the store.
        Ok(n) if n.owner_unverified > 0 => Check {
            name: "store",
            outcome: Outcome::Warn,
            detail: format!(
                "{path}: integrity ok; read back {} messages, {} copies; {} of them claim to be from you, the owner, but this home's owner key did not sign them (they are shown as unverified claims, fenced)",
                n.messages, n.deliveries, n.owner_unverified
            ),
            fix: Some(format!(
                "if you changed the owner key since, this is expected; otherwise something with access to {path} wrote them: find them with `{}` (marked as claims)",
                output::command(&agent.name, "inbox --all")
            )),
        },
        Ok(n) => Check {
            name: "store",
            outcome: Outcome::Ok,
            detail: format!(
                "{path}: integrity ok; read back {} messages, {} copies, {} memories, {} outbox entries, {} pins; {} from the owner, signature verified",
                n.messages, n.deliveries, n.memories, n.outbox, n.pins, n.owner_verified
            ),
            fix: None,
        },
        Err(e) => fail(
            e,
            format!(
                "SQLite can read {path} but mailslot cannot read this row: keep the file (copy it aside), and report this with `mailslot --version`; an older or newer mailslot may have written it"
            ),
        ),
    }
}

/// Whether the relay answers and knows the agent.
fn relay_check(ctx: &Ctx, agent: &Agent) -> anyhow::Result<Check> {
    let reach = reach::check(ctx, agent)?;
    let detail = reach.summary();
    let (outcome, fix) = match &reach.state {
        _ if reach.foreign_listener => (
            Outcome::Fail,
            Some(format!(
                "another home's relay or another program listens on this home's loopback port; stop it, or give this home its own port with local_relay_port in {} or {}",
                ctx.paths.config_file().display(),
                config::ENV_LOCAL_RELAY_PORT
            )),
        ),
        reach::State::Registered { .. } | reach::State::NotStarted => (Outcome::Ok, None),
        reach::State::NotRegistered | reach::State::Refused { .. } => (
            Outcome::Fail,
            Some(format!(
                "run `{}` (with --invite TOKEN on a relay that registers by invite)",
                output::command(&agent.name, "register")
            )),
        ),
        reach::State::Unreachable { .. } => (
            Outcome::Fail,
            Some(if reach.embedded {
                format!(
                    "something that is not this home's relay answers on its port: stop it, or set local_relay_port in {}",
                    ctx.paths.config_file().display()
                )
            } else {
                "check the relay URL (--relay, MAILSLOT_RELAY or relay in the config) and that the relay runs".to_owned()
            }),
        ),
    };
    Ok(Check {
        name: "relay",
        outcome,
        detail,
        fix,
    })
}

/// Which path wakes an idle Claude Code session of this agent, and why: this session's, when
/// doctor runs inside one (its environment names it), else the sessions Claude Code starts
/// in this folder, from their settings.
fn claude_code_check(ctx: &Ctx, agent: &AgentName) -> Check {
    let name = "claude code";
    let files = claude_code::launch::session_settings_files();
    let rewake = claude_code::launch::has_rewake_hook(&files, "hook wake");
    let session = std::env::var(config::ENV_CLAUDE_CODE_SESSION)
        .ok()
        .and_then(|raw| SessionKey::new(&raw).ok());
    let (who, cc) = match claude_code::Session::from_env(session) {
        Some(cc) => (format!("this session ({})", cc.key), cc),
        None => (
            "Claude Code sessions started here (2.1.224 or later)".to_owned(),
            claude_code::Session::new_interactive(&files),
        ),
    };
    let choice = cc.choose();
    let store = crate::agent::store_path(&ctx.paths.agent_dir(agent));
    let claim = Some(store)
        .filter(|p| p.exists())
        .and_then(|p| Store::open(&p).ok())
        .and_then(|s| s.idle_claim(&cc.key).ok().flatten())
        .filter(|c| claude_code::wake::alive(c.pid))
        .map(|c| {
            format!(
                "; mailslot mcp (pid {}) rings it by {} since {}",
                c.pid,
                c.path.as_str(),
                c.since
            )
        })
        .unwrap_or_default();
    let detail = format!(
        "{who}: idle, woken by the {} ({}){claim}; busy, shown new mail after each tool call (PostToolUse hook)",
        choice.path.as_str(),
        choice.reason
    );
    if choice.path == claude_code::Path::Hooks && !cc.flags.headless && !rewake {
        return Check {
            name,
            outcome: Outcome::Warn,
            detail: format!("{detail}; but no `mailslot hook wake` hook with \"asyncRewake\": true is configured, so an idle session waits for the user"),
            fix: Some("copy the hooks of mcp-config-examples/claude-code/.claude/settings.json into .claude/settings.json".into()),
        };
    }
    Check {
        name,
        outcome: Outcome::Ok,
        detail,
        fix: None,
    }
}

/// The config file: read, absent (defaults), or `problem`, which fails here while the other
/// checks run on the defaults.
fn config_check(config_file: &std::path::Path, problem: Option<anyhow::Error>) -> Check {
    let name = "config file";
    if let Some(e) = problem {
        let what = if config_file.exists() {
            format!(
                "correct {} (docs/configuration.md lists its keys; an unknown key is an error), or move it aside",
                config_file.display()
            )
        } else {
            "create it or name the right file".to_owned()
        };
        return Check {
            name,
            outcome: Outcome::Fail,
            detail: format!("{e:#}"),
            fix: Some(format!(
                "{what}; every other command stops at it, and the checks below ran on the defaults"
            )),
        };
    }
    let found = if config_file.exists() {
        "read"
    } else {
        "not found (defaults apply)"
    };
    Check {
        name,
        outcome: Outcome::Ok,
        detail: format!("{} {found}", config_file.display()),
        fix: None,
    }
}

pub(super) fn run(ctx: &Ctx, config_problem: Option<anyhow::Error>) -> anyhow::Result<()> {
    let cwd = std::env::current_dir()?;
    let agent = config::resolve_agent(ctx.agent.clone(), &ctx.config, &cwd)?;
    let config_file = ctx.paths.config_file();
    let mut checks = vec![config_check(config_file, config_problem)];
    checks.push(owner_check(ctx));
    checks.extend(agent_checks(ctx, &agent)?);
    checks.push(claude_code_check(ctx, &agent));
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
