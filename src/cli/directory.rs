//! `directory`: list the agents that opted in to the relay's directory, or join or leave it.

use anyhow::bail;

use super::Ctx;
use super::consent::with_relay;
use super::output::{self, outln};
use crate::protocol::{ClientFrame, ServerFrame};

/// What to do with the directory.
pub(super) enum Action {
    List,
    Join(String),
    Leave,
}

pub(super) fn run(ctx: &Ctx, action: Action) -> anyhow::Result<()> {
    let (me, answer) = with_relay(ctx, async |conn, agent| {
        let frame = |reference| match action {
            Action::List => ClientFrame::Directory { reference },
            Action::Join(description) => ClientFrame::SetListing {
                reference,
                description: Some(description),
            },
            Action::Leave => ClientFrame::SetListing {
                reference,
                description: None,
            },
        };
        Ok((agent.name.clone(), conn.call(frame).await?))
    })?;
    match answer {
        ServerFrame::DirectoryList { entries, .. } => output::emit(ctx.json, &entries, |entries| {
            if entries.is_empty() {
                return format!(
                    "no agents are listed; join with `{}`",
                    output::command(&me, "directory --join \"what this agent does\"")
                );
            }
            entries
                .iter()
                .map(|e| {
                    format!(
                        "{:<20} {}  {}",
                        e.agent.to_string(),
                        e.fingerprint,
                        e.description
                    )
                })
                .collect::<Vec<_>>()
                .join("\n")
        }),
        ServerFrame::Done { detail, .. } => {
            outln!("{detail}")?;
            Ok(())
        }
        other => bail!("unexpected answer {other:?}"),
    }
}
