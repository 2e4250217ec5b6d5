//! `mailslot hook session-start|prompt|stop`: Claude Code hooks. They read the hook's JSON on
//! stdin and the local store only (no network, no key creation), so they stay fast enough to
//! run on every prompt. An agent that does not exist yet has no mail: the hooks print nothing.

use std::io::Read;

use anyhow::Context;
use clap::ValueEnum;
use serde::Deserialize;

use super::Ctx;
use crate::config;
use crate::doorbell::digest::unread_digest;
use crate::store::{InboxQuery, Store};

/// The largest hook input read (Claude Code sends a small JSON object).
const MAX_INPUT_BYTES: u64 = 1024 * 1024;
/// Unread messages listed in a digest.
const DIGEST_ITEMS: usize = 10;
/// How the model reads its mail, as Claude Code names mailslot's tools.
const HOW_TO_READ: &str =
    "Read them with the mailslot read tool (message_id) or the inbox tool before acting on them.";

/// Which hook is running.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum HookKind {
    /// SessionStart: the unread digest goes into the new session's context.
    SessionStart,
    /// UserPromptSubmit: the unread digest goes into the context beside the prompt.
    Prompt,
    /// Stop: unread mail keeps the agent working (once; never in a loop).
    Stop,
}

/// The fields of the hook input that matter here.
#[derive(Debug, Default, Deserialize)]
struct HookInput {
    /// True when Claude is already continuing because a Stop hook blocked.
    #[serde(default)]
    stop_hook_active: bool,
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
    let store = Store::open(&path)?;
    let total = store.unread_summary()?.count;
    if total == 0 {
        return Ok(());
    }
    match kind {
        HookKind::SessionStart | HookKind::Prompt => {
            let unread = store.inbox(&InboxQuery {
                limit: DIGEST_ITEMS,
                ..InboxQuery::default()
            })?;
            println!("{}", unread_digest(&unread, total, HOW_TO_READ));
        }
        HookKind::Stop if input.stop_hook_active => {}
        HookKind::Stop => {
            let noun = if total == 1 { "message" } else { "messages" };
            let reason = format!(
                "{total} unread mailslot {noun} for {name}. {HOW_TO_READ} Then finish your work."
            );
            println!(
                "{}",
                serde_json::json!({ "decision": "block", "reason": reason })
            );
        }
    }
    Ok(())
}
