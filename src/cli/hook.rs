//! `mailslot hook session-start|prompt|post-tool|stop|wake`: Claude Code hooks. They read the
//! hook's JSON on stdin and the local store only (no network, no key creation), so they stay
//! fast enough to run on every prompt and after every tool call. An agent that does not exist
//! yet has no mail: the hooks print nothing. What each prints is `doorbell::hooks`; `wake`
//! (an `asyncRewake` entry) waits in the background and is `doorbell::claude_code::wake`.

use std::io::Read;
use std::process::ExitCode;

use anyhow::Context;
use clap::ValueEnum;

use super::Ctx;
use super::output::outln;
use crate::config;
use crate::doorbell::claude_code::wake::{self, Woke};
use crate::doorbell::hooks::{self, HookEvent, HookInput};
use crate::store::SessionKey;

/// The largest hook input read (Claude Code sends a small JSON object, with the prompt).
const MAX_INPUT_BYTES: u64 = 1024 * 1024;
/// The exit code with which an `asyncRewake` hook wakes the model (its stderr is shown).
const REWAKE: u8 = 2;

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
    /// SessionStart and Stop with "asyncRewake": true: waits for mail and wakes the session
    /// (exit 2, the digest on stderr), unless mailslot mcp rings it by channel or socket.
    Wake,
}

impl HookKind {
    fn event(self) -> Option<HookEvent> {
        match self {
            HookKind::SessionStart => Some(HookEvent::SessionStart),
            HookKind::Prompt => Some(HookEvent::Prompt),
            HookKind::PostTool => Some(HookEvent::PostTool),
            HookKind::Stop => Some(HookEvent::Stop),
            HookKind::Wake => None,
        }
    }
}

pub(super) fn run(ctx: &Ctx, kind: HookKind) -> anyhow::Result<ExitCode> {
    let input = read_input()?;
    let cwd = std::env::current_dir()?;
    let name = config::resolve_agent(ctx.agent.clone(), &ctx.config, &cwd)?;
    let agent_dir = ctx.paths.agent_dir(&name);
    let path = crate::agent::store_path(&agent_dir);
    if !path.exists() {
        return Ok(ExitCode::SUCCESS);
    }
    let mut store = crate::agent::open_store(&ctx.paths, &name, &path)?;
    let Some(event) = kind.event() else {
        // Without a session there is nothing to wait for on its behalf.
        let Some(session) = input
            .session_id
            .as_deref()
            .map(SessionKey::new)
            .transpose()?
        else {
            return Ok(ExitCode::SUCCESS);
        };
        let watched = wake::Watched::now();
        return Ok(
            match wake::wait(&mut store, &name, &agent_dir, &session, watched, wake::LIFE)? {
                Woke::Mail(digest) => {
                    eprintln!("{digest}");
                    ExitCode::from(REWAKE)
                }
                Woke::Headless | Woke::Joined | Woke::SessionEnded | Woke::Expired => {
                    ExitCode::SUCCESS
                }
            },
        );
    };
    if let Some(out) = hooks::answer(&mut store, &name, event, &input)? {
        outln!("{out}")?;
    }
    Ok(ExitCode::SUCCESS)
}

fn read_input() -> anyhow::Result<HookInput> {
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
    if raw.iter().all(u8::is_ascii_whitespace) {
        return Ok(HookInput::default());
    }
    serde_json::from_slice(&raw)
        .context("the hook input on stdin is not the JSON object Claude Code sends")
}
