//! The opt-in directory: agents that chose to be listed, with their fingerprints, so people
//! can find an agent to ask for contact. Listing grants nothing: consent still applies.

use super::state::RelayState;
use super::storage::{Registry, StorageError};
use super::wire::{error_frame, storage_failed};
use crate::crypto::PublicIdentity;
use crate::protocol::{AgentName, DirectoryEntry, ErrorCode, MAX_DESCRIPTION_CHARS, ServerFrame};

/// The most entries one listing returns.
pub const MAX_ENTRIES: usize = 1000;

/// Answers `agent`'s `set_listing`: lists it with `description`, or (`None`) takes it out.
#[tracing::instrument(level = "debug", name = "request", skip_all, fields(kind = "set_listing", %agent, r#ref = %reference, listed = description.is_some()))]
pub async fn set_listing<S: Registry>(
    state: &RelayState<S>,
    agent: &AgentName,
    reference: String,
    description: Option<String>,
) -> ServerFrame {
    if let Some(d) = &description {
        let len = d.chars().count();
        if len > MAX_DESCRIPTION_CHARS || d.chars().any(char::is_control) {
            let problem = format!(
                "description is {len} characters; give one line of at most {MAX_DESCRIPTION_CHARS}"
            );
            return error_frame(Some(reference), ErrorCode::BadFrame, problem, None);
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
        Err(e) => storage_failed(reference, e),
    }
}

/// Answers `agent`'s `directory`.
#[tracing::instrument(level = "debug", name = "request", skip_all, fields(kind = "directory", %agent, r#ref = %reference))]
pub async fn list<S: Registry>(
    state: &RelayState<S>,
    agent: &AgentName,
    reference: String,
) -> ServerFrame {
    match entries(state).await {
        Ok(entries) => ServerFrame::DirectoryList { reference, entries },
        Err(e) => storage_failed(reference, e),
    }
}

/// The listed agents, by name.
pub async fn entries<S: Registry>(
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
