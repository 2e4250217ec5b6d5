//! `mailslot wait`: block until mail arrives, for shell scripts and agents without push.
//! Exits 0 with the mail (marked read), or 3 when the time runs out. The text output is
//! framed like every path that may put another agent's words in front of a model (an agent
//! with a shell may be the one waiting); `--json` gives scripts the raw messages.

use std::process::ExitCode;
use std::time::Duration;

use serde::Serialize;
use tokio_util::sync::CancellationToken;

use super::{Ctx, output};
use crate::doorbell::frame::{SenderFacts, frame_message};
use crate::mailbox::Mailbox;
use crate::store::StoredMessage;

/// The exit code when no mail came in time.
const TIMED_OUT: u8 = 3;
/// The most messages one wait prints.
const WAIT_MESSAGES: usize = 50;

#[derive(Serialize)]
struct Waited<'a> {
    messages: Vec<&'a StoredMessage>,
    timed_out: bool,
}

pub(super) fn run(ctx: &Ctx, timeout_secs: u64) -> anyhow::Result<ExitCode> {
    let agent = ctx.open_agent()?;
    let agent_name = agent.name.clone();
    let relay = ctx.relay_url_or_default();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let delivered = runtime.block_on(async {
        let mailbox =
            Mailbox::open_trusting(agent, relay, ctx.config.trusted_hosts.clone()).await?;
        let stop = CancellationToken::new();
        tokio::spawn({
            let stop = stop.clone();
            async move {
                let _ = tokio::signal::ctrl_c().await;
                stop.cancel();
            }
        });
        let delivered = mailbox
            .wait_for_unread(Duration::from_secs(timeout_secs), WAIT_MESSAGES, &stop)
            .await;
        mailbox.close().await;
        delivered
    })?;
    let waited = Waited {
        messages: delivered.iter().map(|(m, _)| m).collect(),
        timed_out: delivered.is_empty(),
    };
    output::emit(ctx.json, &waited, |w| {
        if w.timed_out {
            return format!("no mail in {timeout_secs} s");
        }
        delivered
            .iter()
            .map(|(stored, contact)| {
                let hint = format!(
                    "To answer: {}",
                    output::command(
                        &agent_name,
                        format_args!("reply {} --body TEXT", stored.message.id)
                    )
                );
                frame_message(
                    stored,
                    SenderFacts {
                        contact: contact.as_ref(),
                    },
                    &hint,
                )
            })
            .collect::<Vec<_>>()
            .join("\n\n")
    })?;
    Ok(if waited.timed_out {
        ExitCode::from(TIMED_OUT)
    } else {
        ExitCode::SUCCESS
    })
}
