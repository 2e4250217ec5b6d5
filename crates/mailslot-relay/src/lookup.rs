//! `lookup`: an agent's registered keys, with the signed rotations that lead to them, so the
//! asker can follow a key change from the key it pinned; for a group's name, the group and its
//! roster (to those who may read it).

use super::groups::may_read;
use super::state::RelayState;
use super::storage::{Groups, Registry};
use super::wire::{error_frame, storage_failed};
use crate::protocol::{AgentName, ErrorCode, ServerFrame};

/// Answers `agent`'s `lookup` of `wanted`.
#[tracing::instrument(level = "debug", name = "request", skip_all, fields(kind = "lookup", %agent, r#ref = %reference, %wanted))]
pub async fn keys<S: Registry + Groups>(
    state: &RelayState<S>,
    agent: &AgentName,
    reference: String,
    wanted: AgentName,
) -> ServerFrame {
    match state.storage.keys(wanted.clone()).await {
        Ok(Some(keys)) => match state.storage.rotations(wanted.clone()).await {
            Ok(rotations) => ServerFrame::Keys {
                reference,
                agent: wanted,
                keys,
                rotations,
            },
            Err(e) => storage_failed(reference, e),
        },
        Ok(None) => group(state, agent, reference, wanted).await,
        Err(e) => storage_failed(reference, e),
    }
}

/// The answer for a name no agent has: the group of that name, if `agent` may read it.
async fn group<S: Registry + Groups>(
    state: &RelayState<S>,
    agent: &AgentName,
    reference: String,
    wanted: AgentName,
) -> ServerFrame {
    let found = match state.storage.group(wanted.clone()).await {
        Ok(found) => found,
        Err(e) => return storage_failed(reference, e),
    };
    let Some(group) = found else {
        return error_frame(
            Some(reference),
            ErrorCode::UnknownAgent,
            format!("no agent named {wanted} on this relay"),
            None,
        );
    };
    match state.storage.owner(agent.clone()).await {
        Ok(owner) if may_read(&group, agent, owner) => ServerFrame::Group { reference, group },
        Ok(_) => error_frame(
            Some(reference),
            ErrorCode::NotAllowed,
            format!(
                "{wanted} is a group whose roster only its members and posters read; ask its owner to add {agent}"
            ),
            None,
        ),
        Err(e) => storage_failed(reference, e),
    }
}
