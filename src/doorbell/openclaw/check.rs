//! `mailslot doctor`'s OpenClaw checks, end to end: the settings, the token, the gateway
//! (reachable, token accepted, `sessions_send` allowed), the session (created if missing,
//! which delivery would do anyway), and the last delivery's outcome.

use std::path::Path;

use serde::Serialize;

use super::gateway::{Failure, Gateway};
use super::{DeliveryState, rpc, status};
use crate::config::openclaw::OpenClawConfig;
use crate::protocol::AgentName;

/// How a check came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// Fine.
    Ok,
    /// Works, but worth knowing.
    Warn,
    /// Broken: mail will not reach OpenClaw until it is fixed.
    Fail,
    /// Not run (an earlier check failed).
    Skip,
}

/// One check.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Check {
    /// What was checked.
    pub name: &'static str,
    /// How it came out.
    pub outcome: Outcome,
    /// What was found.
    pub detail: String,
    /// What to do about it.
    pub fix: Option<String>,
}

impl Check {
    fn new(name: &'static str, outcome: Outcome, detail: impl Into<String>) -> Self {
        Self {
            name,
            outcome,
            detail: detail.into(),
            fix: None,
        }
    }

    fn fix(mut self, fix: impl Into<String>) -> Self {
        self.fix = Some(fix.into());
        self
    }
}

/// Runs every check for the mailslot agent `agent` (whose folder is `dir`).
pub async fn run(config: &OpenClawConfig, agent: &AgentName, dir: &Path) -> Vec<Check> {
    let mut checks = Vec::new();
    let url = &config.gateway_url;
    let key = config.session_key.render(&config.agent_id, agent, "sender");
    let session = if config.session_key.per_sender() {
        format!("one per sender, like {key}")
    } else {
        key.clone()
    };
    checks.push(Check::new(
        "settings",
        Outcome::Ok,
        format!(
            "gateway {url}, OpenClaw agent {}, session {session}, reply tool {}",
            config.agent_id,
            config.reply_tool()
        ),
    ));
    if !config.rings_for(agent) {
        checks.push(
            Check::new(
                "agent",
                Outcome::Warn,
                format!("openclaw.agents leaves {agent} out: its mail does not go to OpenClaw"),
            )
            .fix(format!("add \"{agent}\" to openclaw.agents in config.toml")),
        );
    }
    if !url.is_loopback() && !url.is_tls() {
        checks.push(
            Check::new(
                "transport",
                Outcome::Warn,
                format!("{url} is plain http to another machine: the token crosses the network unencrypted"),
            )
            .fix("use https:// (for example behind tailscale serve or a TLS proxy)"),
        );
    }

    let gateway = match Gateway::new(url.clone(), config.token.clone()) {
        Ok(g) => g,
        Err(e) => {
            checks.push(Check::new("http client", Outcome::Fail, e));
            return checks;
        }
    };
    let token = match gateway.token() {
        Ok(t) => {
            checks.push(Check::new(
                "token",
                Outcome::Ok,
                format!("read from {}", config.token.describe()),
            ));
            Some(t)
        }
        Err(f) => {
            checks.push(Check::new("token", Outcome::Fail, f.what(url)));
            None
        }
    };

    let reachable = match gateway.ready().await {
        Ok(true) => {
            checks.push(Check::new(
                "gateway reachable",
                Outcome::Ok,
                format!("{url} is ready"),
            ));
            true
        }
        Ok(false) => {
            checks.push(
                Check::new("gateway reachable", Outcome::Fail, format!("{url} answers but is still starting"))
                    .fix("wait until it is ready (it takes up to a minute) and run mailslot doctor again"),
            );
            false
        }
        Err(f) => {
            checks.push(failed("gateway reachable", &f, config));
            false
        }
    };

    let Some(token) = token.filter(|_| reachable) else {
        for name in ["token accepted", "sessions_send allowed", "session"] {
            checks.push(Check::new(name, Outcome::Skip, "needs the checks above"));
        }
        return with_last_delivery(checks, dir);
    };
    match gateway.probe_send().await {
        Ok(()) => {
            checks.push(Check::new(
                "token accepted",
                Outcome::Ok,
                "the gateway accepts the token",
            ));
            checks.push(Check::new(
                "sessions_send allowed",
                Outcome::Ok,
                "gateway.tools.allow exposes sessions_send over HTTP",
            ));
        }
        Err(f @ Failure::NotAllowed { .. }) => {
            checks.push(Check::new(
                "token accepted",
                Outcome::Ok,
                "the gateway accepts the token",
            ));
            checks.push(failed("sessions_send allowed", &f, config));
        }
        Err(f) => {
            checks.push(failed("token accepted", &f, config));
            checks.push(Check::new(
                "sessions_send allowed",
                Outcome::Skip,
                "needs the token",
            ));
            if f == Failure::BadToken {
                checks.push(Check::new("session", Outcome::Skip, "needs the token"));
                return with_last_delivery(checks, dir);
            }
        }
    }

    let session_check = if config.session_key.per_sender() {
        rpc::session_exists(url, &token, &key).await.map(|_| {
            Check::new(
                "session",
                Outcome::Ok,
                "the gateway's WebSocket accepts mailslot; each sender's session is created on its first message",
            )
        })
    } else {
        let label = format!("mailslot {key}");
        rpc::ensure_session(url, &token, &key, &config.agent_id, &label)
            .await
            .map(|created| {
                let how = if created { "created now" } else { "exists" };
                Check::new("session", Outcome::Ok, format!("{key} {how}"))
            })
    };
    checks.push(session_check.unwrap_or_else(|e| {
        Check::new("session", Outcome::Fail, e.to_string()).fix(format!(
            "check openclaw.agent_id ({}) names an agent in openclaw.json, and the gateway token",
            config.agent_id
        ))
    }));
    with_last_delivery(checks, dir)
}

fn failed(name: &'static str, failure: &Failure, config: &OpenClawConfig) -> Check {
    let check = Check::new(name, Outcome::Fail, failure.what(&config.gateway_url));
    match failure.fix(&config.token) {
        Some(fix) => check.fix(fix),
        None => check,
    }
}

fn with_last_delivery(mut checks: Vec<Check>, dir: &Path) -> Vec<Check> {
    let Some(last) = status::load(dir) else {
        checks.push(Check::new("last delivery", Outcome::Ok, "none yet"));
        return checks;
    };
    let at = last.at.strftime("%Y-%m-%d %H:%M:%S UTC");
    let check = match last.state {
        DeliveryState::Delivered => Check::new(
            "last delivery",
            Outcome::Ok,
            format!(
                "message {} delivered into {} at {at}",
                last.message_id, last.session_key
            ),
        ),
        DeliveryState::Retrying | DeliveryState::Failed => {
            let state = if last.state == DeliveryState::Failed {
                "failed"
            } else {
                "was failing"
            };
            Check::new(
                "last delivery",
                Outcome::Warn,
                format!(
                    "message {} {state} at {at} (it is in the inbox): {}",
                    last.message_id,
                    last.error.as_deref().unwrap_or("no reason recorded")
                ),
            )
        }
    };
    checks.push(check);
    checks
}
