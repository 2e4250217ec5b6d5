//! `directory`: list the agents that opted in to the relay's directory, or join or leave it.

use super::Ctx;
use super::consent::with_relay;
use super::output::{self, outln};
use crate::client::directory;

/// What to do with the directory.
pub(super) enum Action {
    List,
    Join(String),
    Leave,
}

pub(super) fn run(ctx: &Ctx, action: Action) -> anyhow::Result<()> {
    let (me, answer) = with_relay(ctx, async |conn, agent| {
        let answer = match action {
            Action::List => Answer::Listed(directory::list(conn).await?),
            Action::Join(description) => {
                Answer::Done(directory::set_listing(conn, Some(description)).await?)
            }
            Action::Leave => Answer::Done(directory::set_listing(conn, None).await?),
        };
        Ok((agent.name.clone(), answer))
    })?;
    match answer {
        Answer::Listed(entries) => output::emit(ctx.json, &entries, |entries| {
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
        Answer::Done(detail) => {
            outln!("{detail}")?;
            Ok(())
        }
    }
}

/// What the relay answered.
enum Answer {
    Listed(Vec<crate::protocol::DirectoryEntry>),
    Done(String),
}
