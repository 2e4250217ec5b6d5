//! `lookup`: an agent's registered keys, with the signed rotations that lead to them, so the
//! asker can follow a key change from the key it pinned.

use std::time::Duration;

use super::state::RelayState;
use super::storage::Registry;
use super::wire::error_frame;
use crate::protocol::{AgentName, ErrorCode, ServerFrame};

/// Answers `agent`'s `lookup` of `wanted`.
#[tracing::instrument(level = "debug", name = "request", skip_all, fields(kind = "lookup", %agent, r#ref = %reference, %wanted))]
pub async fn keys<S: Registry>(
    state: &RelayState<S>,
    agent: &AgentName,
    reference: String,
    wanted: AgentName,
) -> ServerFrame {
    let failed = |reference, e: super::storage::StorageError| {
        error_frame(
            Some(reference),
            ErrorCode::Internal,
            e.to_string(),
            Some(Duration::from_secs(1)),
        )
    };
    match state.storage.keys(wanted.clone()).await {
        Ok(Some(keys)) => match state.storage.rotations(wanted.clone()).await {
            Ok(rotations) => ServerFrame::Keys {
                reference,
                agent: wanted,
                keys,
                rotations,
            },
            Err(e) => failed(reference, e),
        },
        Ok(None) => error_frame(
            Some(reference),
            ErrorCode::UnknownAgent,
            format!("no agent named {wanted} on this relay"),
            None,
        ),
        Err(e) => failed(reference, e),
    }
}
