//! `remember`, `recall`, `forget`: the agent's notes across context resets.

use std::io::{IsTerminal, Read};

use anyhow::{Context, bail};
use serde::Serialize;

use super::{Ctx, output};
use crate::protocol::MemoryId;
use crate::store::MAX_MEMORY_BYTES;

pub(super) fn remember(
    ctx: &Ctx,
    title: Option<String>,
    tags: Vec<String>,
    text: Option<String>,
) -> anyhow::Result<()> {
    let text = match text.as_deref() {
        Some("-") | None => read_stdin(ctx)?,
        Some(t) => t.to_owned(),
    };
    let mut agent = ctx.open_agent()?;
    let memory = agent.store.remember(&text, title.as_deref(), &tags)?;
    output::emit(ctx.json, &memory, |m| {
        format!("remembered {} \"{}\"", m.id, m.title)
    })
}

/// Reads the text from stdin, refusing a terminal (it would wait silently) and oversized input.
fn read_stdin(ctx: &Ctx) -> anyhow::Result<String> {
    let stdin = std::io::stdin();
    if stdin.is_terminal() {
        bail!(
            "no text given: pass it as an argument, or pipe it in (echo \"…\" | {})",
            output::command(&ctx.agent_name()?, "remember -")
        );
    }
    let mut buf = Vec::new();
    stdin
        .lock()
        .take(MAX_MEMORY_BYTES as u64 + 1)
        .read_to_end(&mut buf)
        .context("reading stdin")?;
    if buf.len() > MAX_MEMORY_BYTES {
        bail!(
            "text on stdin is over the limit of {MAX_MEMORY_BYTES} bytes; split it into several memories"
        );
    }
    String::from_utf8(buf).context("text on stdin is not UTF-8")
}

pub(super) fn recall(ctx: &Ctx, query: Option<String>, limit: u32) -> anyhow::Result<()> {
    let agent = ctx.open_agent()?;
    let found = agent.store.recall(query.as_deref(), limit as usize)?;
    output::emit(ctx.json, &found, |found| {
        if found.is_empty() {
            return match &query {
                Some(q) => format!("no memories match {q:?}"),
                None => format!(
                    "no memories yet: {}",
                    output::command(&agent.name, "remember \"…\"")
                ),
            };
        }
        found
            .iter()
            .map(|r| {
                let m = &r.memory;
                let tags = if m.tags.is_empty() {
                    String::new()
                } else {
                    format!("  [{}]", m.tags.join(", "))
                };
                format!(
                    "{}  {}  {}{tags}\n    {}",
                    m.id,
                    output::when(m.updated_at),
                    m.title,
                    output::one_line(&m.body, 96)
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    })
}

#[derive(Serialize)]
struct Forgotten {
    id: MemoryId,
}

pub(super) fn forget(ctx: &Ctx, id: MemoryId) -> anyhow::Result<()> {
    let mut agent = ctx.open_agent()?;
    if !agent.store.forget(&id)? {
        bail!(
            "no memory with id {id}; `{}` lists them",
            output::command(&agent.name, "recall")
        );
    }
    output::emit(ctx.json, &Forgotten { id }, |f| format!("forgot {}", f.id))
}
