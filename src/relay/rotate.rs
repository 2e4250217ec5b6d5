//! An agent replaces its keys: the statement must be for the agent of this session, signed by
//! the keys registered now and by the new ones. The relay then answers lookups with the new
//! keys and the chain of statements, so peers re-pin without asking anyone.

use std::time::Duration;

use super::state::RelayState;
use super::storage::Storage;
use super::wire::error_frame;
use crate::crypto::{PublicIdentity, verify_rotation};
use crate::protocol::{AgentName, ClientFrame, ErrorCode, ServerFrame};

/// Answers a `rotate_keys` from `agent`; gives back other frames.
pub async fn handle<S: Storage>(
    state: &RelayState<S>,
    agent: &AgentName,
    frame: ClientFrame,
) -> Result<ServerFrame, ClientFrame> {
    let ClientFrame::RotateKeys {
        reference,
        rotation,
    } = frame
    else {
        return Err(frame);
    };
    let refuse = |message: String| {
        error_frame(
            Some(reference.clone()),
            ErrorCode::BadRotation,
            message,
            None,
        )
    };
    if &rotation.agent != agent {
        return Ok(refuse(format!(
            "the rotation is for {}, but this session is {agent}",
            rotation.agent
        )));
    }
    if let Err(e) = verify_rotation(&rotation) {
        return Ok(refuse(e.to_string()));
    }
    let (old, new) = (rotation.old.clone(), rotation.new.clone());
    match state.storage.rotate(rotation).await {
        Ok(true) => {}
        Ok(false) => {
            return Ok(refuse(format!(
                "{agent}'s registered keys are not the rotation's old keys (already rotated, or retired)"
            )));
        }
        Err(e) => {
            return Ok(error_frame(
                Some(reference),
                ErrorCode::Internal,
                format!("not rotated: {e}"),
                Some(Duration::from_secs(1)),
            ));
        }
    }
    let fingerprint = |k| PublicIdentity::try_from(k).map(|p| p.fingerprint().to_string());
    let (old, new) = (
        fingerprint(old).unwrap_or_default(),
        fingerprint(new).unwrap_or_default(),
    );
    tracing::info!(%agent, %old, %new, "keys rotated");
    Ok(ServerFrame::Done {
        reference,
        detail: format!("{agent} now has the keys {new} (were {old})"),
    })
}
