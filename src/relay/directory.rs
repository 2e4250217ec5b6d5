//! The opt-in directory: agents that chose to be listed, with their fingerprints, so people
//! can find an agent to ask for contact. Listing grants nothing: consent still applies.

use std::time::Duration;

use super::state::RelayState;
use super::storage::{Storage, StorageError};
use super::wire::error_frame;
use crate::crypto::PublicIdentity;
use crate::protocol::{
    AgentName, ClientFrame, DirectoryEntry, ErrorCode, MAX_DESCRIPTION_CHARS, ServerFrame,
};

/// The most entries one listing returns.
pub const MAX_ENTRIES: usize = 1000;

/// Answers a directory frame from `agent`; gives back frames that are not about the directory.
pub async fn handle<S: Storage>(
    state: &RelayState<S>,
    agent: &AgentName,
    frame: ClientFrame,
) -> Result<ServerFrame, ClientFrame> {
    Ok(match frame {
        ClientFrame::SetListing {
            reference,
            description,
        } => {
            if let Some(d) = &description {
                let len = d.chars().count();
                if len > MAX_DESCRIPTION_CHARS || d.chars().any(char::is_control) {
                    let problem = format!(
                        "description is {len} characters; give one line of at most {MAX_DESCRIPTION_CHARS}"
                    );
                    return Ok(error_frame(
                        Some(reference),
                        ErrorCode::BadFrame,
                        problem,
                        None,
                    ));
                }
            }
            let listed = description.is_some();
            match state.storage.set_listing(agent.clone(), description).await {
                Ok(()) => ServerFrame::Done {
                    reference,
                    detail: if listed {
                        format!("{agent} is listed in the directory")
                    } else {
                        format!("{agent} is no longer listed")
                    },
                },
                Err(e) => error_frame(
                    Some(reference),
                    ErrorCode::Internal,
                    e.to_string(),
                    Some(Duration::from_secs(1)),
                ),
            }
        }
        ClientFrame::Directory { reference } => match entries(state).await {
            Ok(entries) => ServerFrame::DirectoryList { reference, entries },
            Err(e) => error_frame(
                Some(reference),
                ErrorCode::Internal,
                e.to_string(),
                Some(Duration::from_secs(1)),
            ),
        },
        other => return Err(other),
    })
}

/// The listed agents, by name.
pub async fn entries<S: Storage>(
    state: &RelayState<S>,
) -> Result<Vec<DirectoryEntry>, StorageError> {
    let listed = state.storage.directory(MAX_ENTRIES).await?;
    listed
        .into_iter()
        .map(|(agent, keys, description)| {
            let fingerprint = PublicIdentity::try_from(keys)
                .map_err(|e| StorageError::Database(e.to_string()))?
                .fingerprint();
            Ok(DirectoryEntry {
                agent,
                fingerprint,
                description,
            })
        })
        .collect()
}
