//! `inbox`, `read`, `thread`, `mark-read`, `search`, `sent`: the owner's view of the agent's
//! mail. Messages are named by any unique start or end of their id (`store::IdPart`).

use std::path::Path;

use anyhow::{Context, bail};
use jiff::Timestamp;
use serde::Serialize;

use super::{Ctx, output};
use crate::agent::Agent;
use crate::doorbell::frame::{UNVERIFIED_OWNER, signature_line};
use crate::mailbox::{FileError, Folders, save_file};
use crate::protocol::{Address, AgentName, Importance, MessageId, ThreadId};
use crate::store::{
    Direction, IdPart, InboxQuery, MAX_SEARCH_RESULTS, OwnerVoice, RecipientState, SentItem,
    SentState, StoredMessage, Trust,
};

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
    importance: Importance,
    ack_required: bool,
    /// Set on the owner's messages (`tell`): whether the owner key's signature verified.
    #[serde(skip_serializing_if = "Option::is_none")]
    owner: Option<OwnerVoice>,
}

/// Who wrote a received message, for the owner's eyes: "your owner" when the owner key's
/// signature verified, else the sender's address.
fn sender(from: &Address, trust: Trust) -> String {
    if trust == Trust::Owner {
        "your owner".into()
    } else {
        from.to_string()
    }
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
            importance: s.message.importance,
            ack_required: s.message.ack_required,
            owner: s.owner.clone(),
        }
    }
}

fn listing(items: &[Summary]) -> String {
    items
        .iter()
        .map(|m| {
            let mark = if m.unread { '*' } else { ' ' };
            let mut warn = String::new();
            if m.trust == Trust::KeyChanged {
                warn.push_str("  [KEY CHANGED]");
            }
            if m.owner == Some(OwnerVoice::Unverified) {
                warn.push_str("  [CLAIMS TO BE YOURS: OWNER SIGNATURE NOT VERIFIED]");
            }
            if !m.importance.is_normal() {
                warn.push_str(&format!("  [{}]", m.importance.as_str().to_uppercase()));
            }
            if m.ack_required {
                warn.push_str("  [ack requested]");
            }
            format!(
                "{mark} {}  {:<16} {}{warn}\n    {}",
                output::when(m.sent_at),
                sender(&m.from, m.trust),
                output::one_line(&m.subject, 72),
                m.id
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The limit `inbox` and `sent` use when none is given (their `--limit`'s default).
pub(super) const DEFAULT_LIMIT: u32 = 50;

/// The last line of a page that has more after it: how many, and the command that lists
/// them (`args` with `--before` the page's last id). On the first page, how many in all.
pub(super) fn next_page(
    agent: &AgentName,
    page: (usize, u64),
    first: bool,
    what: &str,
    args: String,
    last: impl std::fmt::Display,
) -> String {
    let (shown, more) = page;
    let more_line = format!(
        "{more} more: `{}`",
        output::command(agent, format_args!("{args} --before {last}"))
    );
    if first {
        format!(
            "{shown} of {} {what} shown; {more_line}",
            shown as u64 + more
        )
    } else {
        more_line
    }
}

pub(super) fn inbox(
    ctx: &Ctx,
    all: bool,
    limit: u32,
    importance: Option<Importance>,
    before: Option<IdPart>,
) -> anyhow::Result<()> {
    let agent = ctx.open_agent()?;
    let before = before
        .map(|part| resolve(&agent, &part).map(|(id, _)| id))
        .transpose()?;
    let q = InboxQuery {
        unread_only: !all,
        limit: limit as usize,
        importance,
        ..InboxQuery::default()
    };
    let page = agent.store.inbox_page(&q, before.as_ref())?;
    let items: Vec<Summary> = page.items.iter().map(Summary::from).collect();
    output::emit(ctx.json, &items, |items| {
        let what = if all { "messages" } else { "unread" };
        match (items.last(), before) {
            (None, Some(id)) => {
                let what = if all { "messages" } else { "unread mail" };
                format!("no more {what} after {id}")
            }
            (None, None) if all => "no mail yet".into(),
            (None, None) => format!(
                "no unread mail ({} shows read mail too)",
                output::command(&agent.name, "inbox --all")
            ),
            (Some(last), _) if page.more > 0 => {
                let mut args = "inbox".to_owned();
                if all {
                    args += " --all";
                }
                if let Some(level) = importance {
                    args += &format!(" --importance {level}");
                }
                if limit != DEFAULT_LIMIT {
                    args += &format!(" --limit {limit}");
                }
                let next = next_page(
                    &agent.name,
                    (items.len(), page.more),
                    before.is_none(),
                    what,
                    args,
                    last.id,
                );
                format!("{}\n{next}", listing(items))
            }
            (Some(_), _) => listing(items),
        }
    })
}

/// The message `part` names, with what to run when it names none or several.
pub(super) fn resolve(agent: &Agent, part: &IdPart) -> anyhow::Result<(MessageId, StoredMessage)> {
    let id = match agent.store.resolve_message(part) {
        Ok(id) => id,
        Err(e @ crate::store::StoreError::NoSuchMessage { .. }) => bail!(
            "{e}; `{}` and `{}` list them",
            output::command(&agent.name, "inbox --all"),
            output::command(&agent.name, "sent")
        ),
        Err(e) => return Err(e.into()),
    };
    let Some(stored) = agent.store.message(&id)? else {
        bail!("message {id} went away while it was read");
    };
    Ok((id, stored))
}

pub(super) fn read(ctx: &Ctx, part: IdPart, save: Option<&Path>) -> anyhow::Result<()> {
    let mut agent = ctx.open_agent()?;
    let (id, mut stored) = resolve(&agent, &part)?;
    // Saved before it is marked read: a failed save leaves the message unread.
    if let Some(dir) = save {
        save_attachments(&agent, &stored, dir)?;
    }
    if stored.read_at.is_none() {
        agent.store.mark_read(&agent.address(), &[id])?;
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
        let (from, signature) = match &s.owner {
            Some(OwnerVoice::Verified(fp)) => (
                format!("your owner (owner key {fp})"),
                signature_line(s.trust, &m.from),
            ),
            Some(OwnerVoice::Unverified) => (m.from.to_string(), UNVERIFIED_OWNER.to_owned()),
            None => (m.from.to_string(), signature_line(s.trust, &m.from)),
        };
        let mut out = format!(
            "From:    {from}\nSignature: {signature}\nTo:      {}\n",
            list(&m.to)
        );
        if !m.cc.is_empty() {
            out += &format!("Cc:      {}\n", list(&m.cc));
        }
        if !m.bcc.is_empty() {
            out += &format!("Bcc:     {}\n", list(&m.bcc));
        }
        if !m.importance.is_normal() {
            out += &format!("Importance: {}\n", m.importance);
        }
        if m.ack_required {
            out += "Acknowledgement requested\n";
        }
        out += &format!(
            "Date:    {}\nSubject: {}\nThread:  {}\nId:      {}\n\n{}\n",
            output::when(m.sent_at),
            m.subject,
            m.thread,
            m.id,
            m.body
        );
        for (i, a) in s.attachments.iter().enumerate() {
            out += &format!(
                "\n[attachment {i}: {} ({}, {} bytes, sha256 {})]",
                a.name, a.media_type, a.size, a.sha256
            );
        }
        for r in &s.receipts {
            out += &format!(
                "\n[{} {} at {}]",
                r.recipient,
                r.kind.as_str(),
                output::when(r.at)
            );
            if let Some(answer) = &r.answer {
                out += &format!(" {answer}");
            }
        }
        out
    })
}

/// The last line of a ranked listing (`search`, `recall WORDS`) that returned all it could:
/// more may match, and how to find them.
pub(super) fn more_may_match(shown: usize, limit: u32) -> Option<String> {
    let limit = limit as usize;
    (shown == limit.min(MAX_SEARCH_RESULTS)).then(|| {
        let raise = if limit < MAX_SEARCH_RESULTS {
            format!(", or raise --limit (up to {MAX_SEARCH_RESULTS} are ranked)")
        } else {
            format!(" (at most {MAX_SEARCH_RESULTS} are ranked)")
        };
        format!("the best {shown} matches; more may match: add words to narrow it{raise}")
    })
}

/// Search ranks what it finds (relevance and recency) and is not paged: its last line says
/// when more may match, and how to find them.
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
            return format!("no mail matches {query:?}");
        }
        match more_may_match(items.len(), limit) {
            Some(hint) => format!("{}\n{hint}", listing(items)),
            None => listing(items),
        }
    })
}

/// Writes a message's attachments into `dir` (made when missing), each under its name and
/// never over an existing file; one attachment in memory at a time.
fn save_attachments(agent: &Agent, stored: &StoredMessage, dir: &Path) -> anyhow::Result<()> {
    let id = stored.message.id;
    if stored.attachments.is_empty() {
        eprintln!("mailslot: {id} has no attachments; nothing saved");
        return Ok(());
    }
    std::fs::create_dir_all(dir).map_err(|e| {
        anyhow::anyhow!(
            "--save {}: cannot make the folder ({e}); name a folder you may write to",
            dir.display()
        )
    })?;
    for index in 0..stored.attachments.len() {
        // Names are plain file names (validated when the message was opened).
        let a = agent
            .store
            .attachment(&id, index)?
            .with_context(|| format!("attachment {index} of {id} went away"))?;
        let path = match save_file(
            "--save",
            &dir.join(&a.name),
            &a.bytes,
            &Folders::Anywhere,
            false,
        ) {
            Ok(path) => path,
            // The shared words name the MCP tool's `overwrite`, which the CLI does not have.
            Err(FileError::Exists { path, .. }) => bail!(
                "--save: {path} exists, and a saved attachment never replaces a file; move it, or save into another folder"
            ),
            Err(e) => return Err(e.into()),
        };
        eprintln!(
            "saved {} ({} bytes, sha256 {})",
            path.display(),
            a.size,
            a.sha256
        );
    }
    Ok(())
}

/// One line per message of a thread, oldest first, with who wrote it.
#[derive(Serialize)]
struct ThreadLine {
    id: MessageId,
    direction: Direction,
    from: Address,
    to: Vec<Address>,
    subject: String,
    sent_at: Timestamp,
    unread: bool,
    trust: Trust,
}

pub(super) fn thread(ctx: &Ctx, part: IdPart) -> anyhow::Result<()> {
    let agent = ctx.open_agent()?;
    let (_, stored) = resolve(&agent, &part)?;
    let lines: Vec<ThreadLine> = agent
        .store
        .thread(&stored.message.thread)?
        .iter()
        .map(|s| ThreadLine {
            id: s.message.id,
            direction: s.direction,
            from: s.message.from.clone(),
            to: s.message.to.iter().chain(&s.message.cc).cloned().collect(),
            subject: s.message.subject.clone(),
            sent_at: s.message.sent_at,
            unread: s.direction == Direction::In && s.read_at.is_none(),
            trust: s.trust,
        })
        .collect();
    output::emit(ctx.json, &lines, |lines| {
        let mut text = format!("thread {}", stored.message.thread);
        for l in lines {
            // Sent: to whom; received: from whom.
            let (arrow, who) = if l.direction == Direction::Out {
                let to: Vec<String> = l.to.iter().map(ToString::to_string).collect();
                ("to  ", to.join(", "))
            } else {
                ("from", sender(&l.from, l.trust))
            };
            let mark = if l.unread { '*' } else { ' ' };
            text += &format!(
                "\n{mark} {}  {arrow} {:<16} {}\n    {}",
                output::when(l.sent_at),
                output::one_line(&who, 16),
                output::one_line(&l.subject, 68),
                l.id
            );
        }
        text
    })
}

#[derive(Serialize)]
struct Marked {
    marked_read: usize,
}

pub(super) fn mark_read(ctx: &Ctx, parts: Vec<IdPart>, all: bool) -> anyhow::Result<()> {
    let mut agent = ctx.open_agent()?;
    let marked_read = if all {
        agent.store.mark_all_read(&agent.address())?
    } else {
        let ids = parts
            .iter()
            .map(|p| resolve(&agent, p).map(|(id, _)| id))
            .collect::<anyhow::Result<Vec<_>>>()?;
        agent.store.mark_read(&agent.address(), &ids)?
    };
    output::emit(ctx.json, &Marked { marked_read }, |m| {
        format!("{} message(s) marked read", m.marked_read)
    })
}

/// One sent message and where it stands.
#[derive(Serialize)]
struct SentLine {
    id: MessageId,
    to: Vec<Address>,
    subject: String,
    sent_at: Timestamp,
    state: SentState,
    attempts: u32,
    last_error: Option<String>,
    bounced: Vec<Address>,
    importance: Importance,
    recipients: Vec<RecipientState>,
}

impl From<&SentItem> for SentLine {
    fn from(i: &SentItem) -> Self {
        let m = &i.stored.message;
        Self {
            id: m.id,
            to: m.to.iter().chain(&m.cc).chain(&m.bcc).cloned().collect(),
            subject: m.subject.clone(),
            sent_at: m.sent_at,
            state: i.state,
            attempts: i.attempts,
            last_error: i.last_error.clone(),
            bounced: i.stored.bounced.clone(),
            importance: m.importance,
            recipients: i.recipients.clone(),
        }
    }
}

pub(super) fn sent(
    ctx: &Ctx,
    state: Option<SentState>,
    limit: u32,
    before: Option<IdPart>,
) -> anyhow::Result<()> {
    let agent = ctx.open_agent()?;
    let before = before
        .map(|part| resolve(&agent, &part).map(|(id, _)| id))
        .transpose()?;
    let page = agent
        .store
        .sent_page(state, limit as usize, before.as_ref())?;
    let items: Vec<SentLine> = page.items.iter().map(SentLine::from).collect();
    output::emit(ctx.json, &items, |items| {
        let Some(last) = items.last() else {
            return match before {
                Some(id) => format!("no more sent mail after {id}"),
                None => "no sent mail".to_owned(),
            };
        };
        let mut lines = Vec::new();
        for i in items {
            let to =
                i.to.iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(", ");
            lines.push(format!(
                "{:<12} {}  to {:<16} {}\n    {}",
                i.state.as_str(),
                output::when(i.sent_at),
                output::one_line(&to, 16),
                output::one_line(&i.subject, 60),
                i.id
            ));
            // One recipient without an answer: its time on a line of its own.
            if let [only] = i.recipients.as_slice()
                && only.answer.is_none()
                && let Some(at) = only.at
            {
                lines.push(format!(
                    "    {} at {}",
                    only.state.as_str(),
                    output::when(at)
                ));
            }
            if let Some(error) = &i.last_error {
                lines.push(format!("    {error}"));
            }
            if !i.bounced.is_empty() {
                let who: Vec<String> = i.bounced.iter().map(ToString::to_string).collect();
                lines.push(format!("    expired undelivered for {}", who.join(", ")));
            }
            // Per recipient only when they differ or say something.
            let detail = i.recipients.len() > 1 || i.recipients.iter().any(|r| r.answer.is_some());
            for r in i.recipients.iter().filter(|_| detail) {
                let at =
                    r.at.map(|t| format!(" at {}", output::when(t)))
                        .unwrap_or_default();
                let answer = r
                    .answer
                    .as_deref()
                    .map(|a| format!(": {}", output::one_line(a, 100)))
                    .unwrap_or_default();
                lines.push(format!("    {} {}{at}{answer}", r.to, r.state.as_str()));
            }
        }
        if items.iter().any(|i| i.state == SentState::Failed) {
            lines.push(format!(
                "`{}` queues the failed ones again",
                output::command(&agent.name, "retry --all-failed")
            ));
        }
        if page.more > 0 {
            let mut args = "sent".to_owned();
            if let Some(state) = state {
                args += &format!(" --state {}", state.as_str());
            }
            if limit != DEFAULT_LIMIT {
                args += &format!(" --limit {limit}");
            }
            let what = "sent messages";
            let first = before.is_none();
            lines.push(next_page(
                &agent.name,
                (items.len(), page.more),
                first,
                what,
                args,
                last.id,
            ));
        }
        lines.join("\n")
    })
}

#[derive(Serialize)]
struct ReadReceipts {
    read_receipts: bool,
}

/// Shows or sets the owner's read-receipt setting.
pub(super) fn read_receipts(ctx: &Ctx, set: Option<&str>) -> anyhow::Result<()> {
    let mut agent = ctx.open_agent()?;
    if let Some(set) = set {
        agent.store.set_read_receipts(set == "on")?;
    }
    let on = agent.store.read_receipts()?;
    output::emit(ctx.json, &ReadReceipts { read_receipts: on }, |r| {
        if r.read_receipts {
            format!(
                "read receipts are on: senders learn when {} read their mail",
                agent.name
            )
        } else {
            format!(
                "read receipts are off: senders never learn when {} read their mail",
                agent.name
            )
        }
    })
}
