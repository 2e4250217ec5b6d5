//! `lookup`: an agent's registered keys, with the signed rotations that lead to them, so the
//! asker can follow a key change from the key it pinned.

use super::state::RelayState;
use super::storage::Registry;
use super::wire::{error_frame, storage_failed};
use crate::protocol::{AgentName, ErrorCode, ServerFrame};

/// Answers `agent`'s `lookup` of `wanted`.
#[tracing::instrument(level = "debug", name = "request", skip_all, fields(kind = "lookup", %agent, r#ref = %reference, %wanted))]
pub async fn keys<S: Registry>(
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
        Ok(None) => error_frame(
            Some(reference),
            ErrorCode::UnknownAgent,
            format!("no agent named {wanted} on this relay"),
            None,
        ),
        Err(e) => storage_failed(reference, e),
    }
}
