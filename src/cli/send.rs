//! `send`, `reply`, `sync`: mail through the relay. A message is stored and queued first, so
//! an unreachable relay never loses it; `sync` (or the next send) delivers it.

use std::path::PathBuf;

use anyhow::{Context, bail};
use serde::Serialize;

use super::{Ctx, output};
use crate::agent::Agent;
use crate::client;
use crate::mailbox::{
    AckOutcome, AttachmentSource, ConnectionLock, Folders, Mailbox, MailboxError, SendOutcome,
    load_attachment,
};
use crate::progress::Progress;
use crate::protocol::{Address, Importance, Limits, Message, MessageId};
use crate::store::{IdPart, StoreHandle};

#[derive(Serialize)]
struct SendResult {
    id: MessageId,
    status: &'static str,
    detail: String,
}

/// Queues `message`, then hands it to the relay now: over this agent's connection, or through
/// the `mailslot mcp` process that holds it.
fn queue_and_send(ctx: &Ctx, agent: Agent, message: Message) -> anyhow::Result<()> {
    message.validate(&Limits::default())?;
    let url = ctx.relay_url_or_default();
    let id = message.id;
    let name = agent.name.clone();
    let retry = output::command(&name, "sync");
    let outcome = runtime()?.block_on(async {
        let mailbox =
            Mailbox::open_trusting(agent, url.clone(), ctx.config.trusted_hosts.clone()).await?;
        let outcome = mailbox.send(message).await;
        mailbox.close().await;
        outcome
    });
    let result = match outcome {
        Ok(SendOutcome::Sent) => SendResult {
            id,
            status: "sent",
            detail: format!("accepted by {}", url.authority()),
        },
        Ok(SendOutcome::Queued { reason }) => SendResult {
            id,
            status: "queued",
            detail: format!("{reason}; `{retry}` retries"),
        },
        Err(MailboxError::NotSent(reason)) => {
            bail!(
                "not sent: {reason}. The message is kept in your sent mail, marked failed: `{}` lists it, `{}` sends it again",
                output::command(&name, "sent --state failed"),
                output::command(&name, format!("retry {id}"))
            )
        }
        Err(e) => return Err(e.into()),
    };
    output::emit(ctx.json, &result, |r| {
        format!("{} {}: {}", r.status, r.id, r.detail)
    })
}

/// How a message is marked for its recipients.
pub(super) struct Marks {
    pub importance: Option<Importance>,
    pub ack_required: bool,
    /// Files to attach (`--attach`, repeatable): the owner names them, so any readable file.
    pub attach: Vec<PathBuf>,
}

impl Marks {
    fn apply(self, message: &mut Message) -> anyhow::Result<()> {
        message.importance = self.importance.unwrap_or_default();
        message.ack_required = self.ack_required;
        let limits = Limits::default();
        message.attachments = self
            .attach
            .into_iter()
            .map(|path| {
                load_attachment(
                    "--attach",
                    AttachmentSource::Path(path),
                    &Folders::Anywhere,
                    &limits,
                )
            })
            .collect::<Result<_, _>>()?;
        Ok(())
    }
}

pub(super) struct Recipients {
    pub to: Vec<Address>,
    pub cc: Vec<Address>,
    pub bcc: Vec<Address>,
}

pub(super) fn send(
    ctx: &Ctx,
    rcpt: Recipients,
    subject: String,
    body: super::body::BodySource,
    data: Option<String>,
    marks: Marks,
) -> anyhow::Result<()> {
    let agent = ctx.open_agent()?;
    let body = super::body::read(body)?;
    let mut message = Message::new(agent.address(), rcpt.to, subject, body);
    message.cc = rcpt.cc;
    message.bcc = rcpt.bcc;
    marks.apply(&mut message)?;
    if let Some(json) = data {
        message.data = Some(serde_json::from_str(&json).context("--data is not valid JSON")?);
    }
    queue_and_send(ctx, agent, message)
}

pub(super) fn reply(
    ctx: &Ctx,
    part: IdPart,
    all: bool,
    body: super::body::BodySource,
    marks: Marks,
) -> anyhow::Result<()> {
    let agent = ctx.open_agent()?;
    let (_, original) = super::mail::resolve(&agent, &part)?;
    let url = ctx.relay_url_or_default();
    let body = super::body::read(body)?;
    let mut message = runtime()?.block_on(crate::mailbox::reply_at(
        &original,
        &agent.name,
        &url,
        all,
        body,
    ))?;
    marks.apply(&mut message)?;
    queue_and_send(ctx, agent, message)
}

#[derive(Serialize)]
struct AckResult {
    id: MessageId,
    status: &'static str,
    detail: String,
}

/// Acknowledges a received message: the receipt is queued, then handed to the relay now (over
/// this agent's connection, or through the `mailslot mcp` process that holds it).
pub(super) fn acknowledge(ctx: &Ctx, part: IdPart, answer: Option<String>) -> anyhow::Result<()> {
    let agent = ctx.open_agent()?;
    let (id, _) = super::mail::resolve(&agent, &part)?;
    let url = ctx.relay_url_or_default();
    let retry = output::command(&agent.name, "sync");
    let outcome = runtime()?.block_on(async {
        let mailbox =
            Mailbox::open_trusting(agent, url.clone(), ctx.config.trusted_hosts.clone()).await?;
        let outcome = mailbox.acknowledge(id, answer).await;
        mailbox.close().await;
        outcome
    })?;
    let result = match outcome {
        AckOutcome::Sent(SendOutcome::Sent) => AckResult {
            id,
            status: "acknowledged",
            detail: format!("the receipt was accepted by {}", url.authority()),
        },
        AckOutcome::Sent(SendOutcome::Queued { reason }) => AckResult {
            id,
            status: "queued",
            detail: format!("{reason}; `{retry}` retries"),
        },
        AckOutcome::Already(at) => AckResult {
            id,
            status: "already_acknowledged",
            detail: format!("acknowledged at {at}; nothing was sent again"),
        },
    };
    output::emit(ctx.json, &result, |r| {
        format!("{} {}: {}", r.status, r.id, r.detail)
    })
}

/// Queues failed messages again (`parts`, or every failed one), then sends the outbox.
pub(super) fn retry(ctx: &Ctx, parts: Vec<IdPart>, all_failed: bool) -> anyhow::Result<()> {
    let mut agent = ctx.open_agent()?;
    let ids = if all_failed {
        None
    } else {
        Some(
            parts
                .iter()
                .map(|p| super::mail::resolve(&agent, p).map(|(id, _)| id))
                .collect::<anyhow::Result<Vec<_>>>()?,
        )
    };
    let queued = agent.store.retry_failed(ids.as_deref())?;
    if queued.is_empty() {
        if all_failed {
            // Nothing failed: the outbox is as it should be.
            return output::emit(ctx.json, &serde_json::json!({ "queued_again": 0 }), |_| {
                "no failed mail to retry".to_owned()
            });
        }
        bail!(
            "nothing to retry: those messages have not failed; `{}` lists the failed ones",
            output::command(&agent.name, "sent --state failed")
        );
    }
    eprintln!("mailslot: {} message(s) queued again", queued.len());
    drop(agent);
    sync(ctx)
}

pub(super) fn sync(ctx: &Ctx) -> anyhow::Result<()> {
    let Agent {
        name,
        identity,
        store,
        dir,
        owner,
    } = ctx.open_agent()?;
    // A running `mailslot mcp` for this agent holds its relay connection and syncs all the
    // time; connecting here would knock it off the relay.
    let lock = ConnectionLock::for_agent(&dir);
    let Some(_held) = lock.try_take()? else {
        let pid = lock
            .holder()
            .map(|p| format!(" (pid {p})"))
            .unwrap_or_default();
        let waiting = store.outbox_len()?;
        eprintln!(
            "another mailslot process{pid} holds {name}'s relay connection and sends and receives continuously; {waiting} message(s) wait in the outbox"
        );
        return Ok(());
    };
    let url = ctx.relay_url()?;
    let store = StoreHandle::spawn(store)?;
    let mut bar: Option<Progress> = None;
    let report = runtime()?.block_on(client::sync_with_progress(
        &url,
        &name,
        &identity,
        owner,
        &store,
        &ctx.config.trusted_hosts,
        &mut |received, waiting| {
            let bar = bar.get_or_insert_with(|| Progress::bar(waiting, "receiving mail"));
            bar.set_total(waiting);
            bar.set(received);
        },
    ))?;
    drop(bar);
    output::emit(ctx.json, &report, |r| {
        let mut lines = vec![format!(
            "{} sent, {} received",
            r.sent.len(),
            r.received.len()
        )];
        for (id, reason, retry) in &r.not_sent {
            lines.push(format!(
                "not sent {id}: {reason}{}",
                if *retry { " (will retry)" } else { "" }
            ));
        }
        for (from, id, reason) in &r.unreadable {
            lines.push(format!("refused {id} from {from}: {reason}"));
        }
        for (from, id, _) in &r.parked {
            lines.push(format!(
                "kept {id} from {from}: its relay did not answer for the sender's keys"
            ));
        }
        if r.waiting > 0 {
            lines.push(format!(
                "{} letter(s) wait for their senders' relays; they open when those answer (`mailslot doctor` says more)",
                r.waiting
            ));
        }
        if !r.received.is_empty() {
            lines.push(format!(
                "read it with `{}`",
                output::command(&name, "inbox")
            ));
        }
        lines.join("\n")
    })
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?)
}
