//! The `presence` frame: who is online now, and since when. An agent sees only its approved
//! contacts and the agents listed in the directory; anyone else is left out of the answer,
//! never said to be offline, so asking cannot tell whether a name exists.

use std::collections::BTreeSet;

use super::state::RelayState;
use super::storage::{ConsentLedger, Registry, StorageError};
use super::wire::{error_frame, storage_failed};
use crate::protocol::{AgentName, ErrorCode, MAX_PRESENCE_AGENTS, ServerFrame};

/// Answers `agent`'s `presence`: who of `agents` (or of all it may see) is online.
#[tracing::instrument(level = "debug", name = "request", skip_all, fields(kind = "presence", %agent, r#ref = %reference))]
pub async fn presence<S: ConsentLedger + Registry>(
    state: &RelayState<S>,
    agent: &AgentName,
    reference: String,
    agents: Option<Vec<AgentName>>,
) -> ServerFrame {
    if let Some(asked) = &agents
        && asked.len() > MAX_PRESENCE_AGENTS
    {
        return error_frame(
            Some(reference),
            ErrorCode::BadFrame,
            format!(
                "agents names {} agents; ask about at most {MAX_PRESENCE_AGENTS} at a time, or leave it out for everyone you may see",
                asked.len()
            ),
            None,
        );
    }
    let visible = match visible(state, agent).await {
        Ok(v) => v,
        Err(e) => return storage_failed(reference, e),
    };
    let wanted: Vec<AgentName> = match agents {
        Some(asked) => asked
            .into_iter()
            .filter(|a| visible.contains(a))
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect(),
        None => visible.into_iter().collect(),
    };
    match state.presence.online(&wanted).await {
        Ok(online) => ServerFrame::PresenceList { reference, online },
        Err(e) => storage_failed(reference, e),
    }
}

/// Whose presence `agent` may see: its contacts and the listed agents, not itself.
async fn visible<S: ConsentLedger + Registry>(
    state: &RelayState<S>,
    agent: &AgentName,
) -> Result<BTreeSet<AgentName>, StorageError> {
    let consent = state
        .storage
        .consent_state(agent.clone(), jiff::Timestamp::now().as_millisecond())
        .await?;
    let listed = state
        .storage
        .directory(super::directory::MAX_ENTRIES)
        .await?;
    let mut visible: BTreeSet<AgentName> = consent.contacts.into_iter().collect();
    visible.extend(listed.into_iter().map(|(name, _, _)| name));
    visible.remove(agent);
    Ok(visible)
}
