//! The `presence` frame: who is online now, and since when. An agent sees only its approved
//! contacts and the agents listed in the directory; anyone else is left out of the answer,
//! never said to be offline, so asking cannot tell whether a name exists.

use std::collections::BTreeSet;
use std::time::Duration;

use super::state::RelayState;
use super::storage::{Storage, StorageError};
use super::wire::error_frame;
use crate::protocol::{AgentName, ClientFrame, ErrorCode, MAX_PRESENCE_AGENTS, ServerFrame};

/// Answers a presence frame from `agent`; gives back frames that are not about presence.
pub async fn handle<S: Storage>(
    state: &RelayState<S>,
    agent: &AgentName,
    frame: ClientFrame,
) -> Result<ServerFrame, ClientFrame> {
    let ClientFrame::Presence { reference, agents } = frame else {
        return Err(frame);
    };
    if let Some(asked) = &agents
        && asked.len() > MAX_PRESENCE_AGENTS
    {
        return Ok(error_frame(
            Some(reference),
            ErrorCode::BadFrame,
            format!(
                "agents names {} agents; ask about at most {MAX_PRESENCE_AGENTS} at a time, or leave it out for everyone you may see",
                asked.len()
            ),
            None,
        ));
    }
    let visible = match visible(state, agent).await {
        Ok(v) => v,
        Err(e) => return Ok(internal(reference, e)),
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
    Ok(match state.presence.online(&wanted).await {
        Ok(online) => ServerFrame::PresenceList { reference, online },
        Err(e) => internal(reference, e),
    })
}

/// Whose presence `agent` may see: its contacts and the listed agents, not itself.
async fn visible<S: Storage>(
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

fn internal(reference: String, e: StorageError) -> ServerFrame {
    error_frame(
        Some(reference),
        ErrorCode::Internal,
        e.to_string(),
        Some(Duration::from_secs(1)),
    )
}
