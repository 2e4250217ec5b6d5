//! `remember`, `recall`, `forget`: the agent's notes across context resets.

use std::io::{IsTerminal, Read};

use anyhow::{Context, bail};
use serde::Serialize;

use super::{Ctx, output};
use crate::agent::Agent;
use crate::protocol::MemoryId;
use crate::store::{IdPart, MAX_MEMORY_BYTES, Recalled, StoreError};

/// `recall`'s `--limit` when none is given.
pub(super) const DEFAULT_RECALL_LIMIT: u32 = 10;

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

/// With a query, the best matches (ranked, not paged); without, the most recent memories,
/// a page at a time (`--before ID`).
pub(super) fn recall(
    ctx: &Ctx,
    query: Option<String>,
    limit: u32,
    before: Option<IdPart>,
) -> anyhow::Result<()> {
    let agent = ctx.open_agent()?;
    let before = before.map(|part| resolve(&agent, &part)).transpose()?;
    let (found, more) = match &query {
        Some(q) => (agent.store.recall(Some(q), limit as usize)?, 0),
        None => {
            let page = agent
                .store
                .recent_memories(limit as usize, before.as_ref())?;
            let found = page
                .items
                .into_iter()
                .map(|memory| Recalled { memory, score: 0.0 })
                .collect();
            (found, page.more)
        }
    };
    output::emit(ctx.json, &found, |found| {
        let Some(last) = found.last() else {
            return match (&query, before) {
                (Some(q), _) => format!("no memories match {q:?}"),
                (None, Some(id)) => format!("no more memories after {id}"),
                (None, None) => format!(
                    "no memories yet: {}",
                    output::command(&agent.name, "remember \"…\"")
                ),
            };
        };
        let mut lines: Vec<String> = found
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
            .collect();
        if query.is_some()
            && let Some(hint) = super::mail::more_may_match(found.len(), limit)
        {
            lines.push(hint);
        }
        if more > 0 {
            let args = if limit == DEFAULT_RECALL_LIMIT {
                "recall".to_owned()
            } else {
                format!("recall --limit {limit}")
            };
            lines.push(super::mail::next_page(
                &agent.name,
                (found.len(), more),
                before.is_none(),
                "memories",
                args,
                last.memory.id,
            ));
        }
        lines.join("\n")
    })
}

/// The memory `part` names, with what to run when it names none.
fn resolve(agent: &Agent, part: &IdPart) -> anyhow::Result<MemoryId> {
    match agent.store.resolve_memory(part) {
        Ok(id) => Ok(id),
        Err(e @ StoreError::NoSuchMemory { .. }) => bail!(
            "{e}; `{}` lists them",
            output::command(&agent.name, "recall")
        ),
        Err(e) => Err(e.into()),
    }
}

#[derive(Serialize)]
struct Forgotten {
    id: MemoryId,
}

/// Deletes the memory `part` names: its id, or its first or last characters when they name
/// one memory (as `read` finds a message).
pub(super) fn forget(ctx: &Ctx, part: IdPart) -> anyhow::Result<()> {
    let mut agent = ctx.open_agent()?;
    let id = resolve(&agent, &part)?;
    if !agent.store.forget(&id)? {
        bail!("memory {id} went away while it was forgotten");
    }
    output::emit(ctx.json, &Forgotten { id }, |f| format!("forgot {}", f.id))
}
