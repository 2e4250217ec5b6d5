//! The relay's directory: agents that opted in, with their own one-line descriptions. Typed
//! calls on a connection, shared by the CLI and the mailbox.

use super::ask::Ask;
use super::{ClientError, Connection};
use crate::protocol::{ClientFrame, DirectoryEntry, ServerFrame};

/// The agents listed in the relay's directory.
pub async fn list(conn: &mut impl Ask) -> Result<Vec<DirectoryEntry>, ClientError> {
    answer(
        conn.ask(Box::new(|reference| ClientFrame::Directory { reference }))
            .await?,
    )
}

/// Lists the agent with `description`, or takes it out with `None`; the relay's words.
pub async fn set_listing(
    conn: &mut Connection,
    description: Option<String>,
) -> Result<String, ClientError> {
    match conn
        .call(|reference| ClientFrame::SetListing {
            reference,
            description,
        })
        .await?
    {
        ServerFrame::Done { detail, .. } => Ok(detail),
        other => Err(unexpected(&other)),
    }
}

/// The entries of a `directory_list` answer.
fn answer(frame: ServerFrame) -> Result<Vec<DirectoryEntry>, ClientError> {
    match frame {
        ServerFrame::DirectoryList { entries, .. } => Ok(entries),
        other => Err(unexpected(&other)),
    }
}

fn unexpected(frame: &ServerFrame) -> ClientError {
    ClientError::Protocol(format!("unexpected answer {frame:?}"))
}
