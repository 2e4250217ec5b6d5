//! `mailslot hook session-start|prompt|post-tool|stop`: Claude Code hooks. They read the
//! hook's JSON on stdin and the local store only (no network, no key creation), so they stay
//! fast enough to run on every prompt and after every tool call. An agent that does not exist
//! yet has no mail: the hooks print nothing. What each prints is `doorbell::hooks`.

use std::io::Read;

use anyhow::Context;
use clap::ValueEnum;

use super::Ctx;
use super::output::outln;
use crate::config;
use crate::doorbell::hooks::{self, HookEvent, HookInput};
use crate::store::Store;

/// The largest hook input read (Claude Code sends a small JSON object, with the prompt).
const MAX_INPUT_BYTES: u64 = 1024 * 1024;

/// Which hook is running.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum HookKind {
    /// SessionStart: the unread digest goes into the new session's context.
    SessionStart,
    /// UserPromptSubmit: the digest of mail not shown yet goes beside the prompt.
    Prompt,
    /// PostToolUse: mail that arrived during the work, after any tool call.
    PostTool,
    /// Stop: mail not shown yet keeps the agent working (once; never in a loop).
    Stop,
}

impl From<HookKind> for HookEvent {
    fn from(kind: HookKind) -> Self {
        match kind {
            HookKind::SessionStart => HookEvent::SessionStart,
            HookKind::Prompt => HookEvent::Prompt,
            HookKind::PostTool => HookEvent::PostTool,
            HookKind::Stop => HookEvent::Stop,
        }
    }
}

pub(super) fn run(ctx: &Ctx, kind: HookKind) -> anyhow::Result<()> {
    let mut raw = Vec::new();
    std::io::stdin()
        .lock()
        .take(MAX_INPUT_BYTES + 1)
        .read_to_end(&mut raw)
        .context("reading the hook input on stdin")?;
    anyhow::ensure!(
        raw.len() as u64 <= MAX_INPUT_BYTES,
        "the hook input on stdin is over {MAX_INPUT_BYTES} bytes; Claude Code sends a small JSON object"
    );
    let input: HookInput = if raw.iter().all(u8::is_ascii_whitespace) {
        HookInput::default()
    } else {
        serde_json::from_slice(&raw)
            .context("the hook input on stdin is not the JSON object Claude Code sends")?
    };
    let cwd = std::env::current_dir()?;
    let name = config::resolve_agent(ctx.agent.clone(), &ctx.config, &cwd)?;
    let path = crate::agent::store_path(&ctx.paths.agent_dir(&name));
    if !path.exists() {
        return Ok(());
    }
    let mut store = Store::open(&path)?;
    if let Some(out) = hooks::answer(&mut store, &name, kind.into(), &input)? {
        outln!("{out}")?;
    }
    Ok(())
}
