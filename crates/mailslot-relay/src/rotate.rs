//! An agent replaces its keys: the statement must be for the agent of this session, signed by
//! the keys registered now and by the new ones. The relay then answers lookups with the new
//! keys and the chain of statements, so peers re-pin without asking anyone.

use std::time::Duration;

use super::state::RelayState;
use super::storage::Registry;
use super::wire::error_frame;
use crate::crypto::{PublicIdentity, verify_rotation};
use crate::protocol::{AgentName, ErrorCode, KeyRotation, ServerFrame};

/// Answers `agent`'s `rotate_keys`.
#[tracing::instrument(level = "debug", name = "request", skip_all, fields(kind = "rotate_keys", %agent, r#ref = %reference))]
pub async fn rotate_keys<S: Registry>(
    state: &RelayState<S>,
    agent: &AgentName,
    reference: String,
    rotation: KeyRotation,
) -> ServerFrame {
    let refuse = |message: String| {
        error_frame(
            Some(reference.clone()),
            ErrorCode::BadRotation,
            message,
            None,
        )
    };
    if &rotation.agent != agent {
        return refuse(format!(
            "the rotation is for {}, but this session is {agent}",
            rotation.agent
        ));
    }
    if let Err(e) = verify_rotation(&rotation) {
        return refuse(e.to_string());
    }
    let (old, new) = (rotation.old.clone(), rotation.new.clone());
    match state.storage.rotate(rotation).await {
        Ok(true) => {}
        Ok(false) => {
            return refuse(format!(
                "{agent}'s registered keys are not the rotation's old keys (already rotated, or retired)"
            ));
        }
        Err(e) => {
            return error_frame(
                Some(reference),
                ErrorCode::Internal,
                format!("not rotated: {e}"),
                Some(Duration::from_secs(1)),
            );
        }
    }
    let fingerprint = |k| PublicIdentity::try_from(k).map(|p| p.fingerprint().to_string());
    let (old, new) = (
        fingerprint(old).unwrap_or_default(),
        fingerprint(new).unwrap_or_default(),
    );
    tracing::info!(%agent, %old, %new, "keys rotated");
    ServerFrame::Done {
        reference,
        detail: format!("{agent} now has the keys {new} (were {old})"),
    }
}
