//! `inbox`, `read`, `search`: the owner's view of the agent's mail.

use anyhow::bail;
use jiff::Timestamp;
use serde::Serialize;

use super::{Ctx, output};
use crate::protocol::{Address, MessageId, ThreadId};
use crate::store::{InboxQuery, StoredMessage, Trust};

/// One line of a listing; `read` shows the whole message.
#[derive(Serialize)]
struct Summary {
    id: MessageId,
    from: Address,
    subject: String,
    thread: ThreadId,
    sent_at: Timestamp,
    unread: bool,
    trust: Trust,
}

impl From<&StoredMessage> for Summary {
    fn from(s: &StoredMessage) -> Self {
        Self {
            id: s.message.id,
            from: s.message.from.clone(),
            subject: s.message.subject.clone(),
            thread: s.message.thread,
            sent_at: s.message.sent_at,
            unread: s.read_at.is_none(),
            trust: s.trust,
        }
    }
}

fn listing(items: &[Summary]) -> String {
    items
        .iter()
        .map(|m| {
            let mark = if m.unread { '*' } else { ' ' };
            let warn = if m.trust == Trust::KeyChanged {
                "  [KEY CHANGED]"
            } else {
                ""
            };
            format!(
                "{mark} {}  {:<16} {}{warn}\n    {}",
                output::when(m.sent_at),
                m.from.to_string(),
                output::one_line(&m.subject, 72),
                m.id
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

pub(super) fn inbox(ctx: &Ctx, all: bool, limit: u32) -> anyhow::Result<()> {
    let agent = ctx.open_agent()?;
    let q = InboxQuery {
        unread_only: !all,
        limit: limit as usize,
        ..InboxQuery::default()
    };
    let items: Vec<Summary> = agent.store.inbox(&q)?.iter().map(Summary::from).collect();
    output::emit(ctx.json, &items, |items| {
        if items.is_empty() {
            if all {
                "no mail yet".into()
            } else {
                format!(
                    "no unread mail ({} shows read mail too)",
                    output::command(&agent.name, "inbox --all")
                )
            }
        } else {
            listing(items)
        }
    })
}

pub(super) fn read(ctx: &Ctx, id: MessageId) -> anyhow::Result<()> {
    let mut agent = ctx.open_agent()?;
    let Some(mut stored) = agent.store.message(&id)? else {
        bail!(
            "no message with id {id}; `{}` lists them",
            output::command(&agent.name, "inbox --all")
        );
    };
    if stored.read_at.is_none() {
        agent.store.mark_read(&[id])?;
        stored = agent.store.message(&id)?.unwrap_or(stored);
    }
    output::emit(ctx.json, &stored, |s| {
        let m = &s.message;
        let list = |v: &[Address]| {
            v.iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        };
        let mut out = format!(
            "From:    {}  ({:?})\nTo:      {}\n",
            m.from,
            s.trust,
            list(&m.to)
        );
        if !m.cc.is_empty() {
            out += &format!("Cc:      {}\n", list(&m.cc));
        }
        if !m.bcc.is_empty() {
            out += &format!("Bcc:     {}\n", list(&m.bcc));
        }
        out += &format!(
            "Date:    {}\nSubject: {}\nThread:  {}\nId:      {}\n\n{}\n",
            output::when(m.sent_at),
            m.subject,
            m.thread,
            m.id,
            m.body
        );
        for a in &m.attachments {
            out += &format!(
                "\n[attachment {} ({}, {} bytes)]",
                a.name, a.media_type, a.size
            );
        }
        out
    })
}

pub(super) fn search(ctx: &Ctx, query: &str, limit: u32) -> anyhow::Result<()> {
    let agent = ctx.open_agent()?;
    let items: Vec<Summary> = agent
        .store
        .search_messages(query, limit as usize)?
        .iter()
        .map(Summary::from)
        .collect();
    output::emit(ctx.json, &items, |items| {
        if items.is_empty() {
            format!("no mail matches {query:?}")
        } else {
            listing(items)
        }
    })
}
