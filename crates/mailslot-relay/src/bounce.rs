//! Bounces: a copy that expires before its recipient takes it is recorded for its sender
//! (in the write that expires it), and kept until the sender asks for it (`bounces`) and says
//! it recorded it (`ack_bounces`). An online sender is told at once with a `bounced` event; an
//! offline one asks when it next connects. So a bounce survives the sender being away and the
//! relay restarting, and is delivered at least once (the sender's store records each once).

use super::state::RelayState;
use super::storage::Queue;
use super::wire::{error_frame, storage_failed};
use crate::protocol::{AgentName, ConsentEvent, CopyKey, ErrorCode, MAX_BOUNCES, ServerFrame};

/// Answers `agent`'s `bounces`: those waiting for it, oldest first.
#[tracing::instrument(level = "debug", name = "request", skip_all, fields(kind = "bounces", %agent, r#ref = %reference))]
pub async fn list<S: Queue>(
    state: &RelayState<S>,
    agent: &AgentName,
    reference: String,
) -> ServerFrame {
    match state.storage.bounces(agent.clone(), MAX_BOUNCES).await {
        Ok(bounces) => ServerFrame::BounceList { reference, bounces },
        Err(e) => storage_failed(reference, e),
    }
}

/// Answers `agent`'s `ack_bounces`: forgets the bounces it recorded.
#[tracing::instrument(level = "debug", name = "request", skip_all, fields(kind = "ack_bounces", %agent, r#ref = %reference, count = bounces.len()))]
pub async fn forget<S: Queue>(
    state: &RelayState<S>,
    agent: &AgentName,
    reference: String,
    bounces: Vec<CopyKey>,
) -> ServerFrame {
    if bounces.len() > MAX_BOUNCES {
        return error_frame(
            Some(reference),
            ErrorCode::BadFrame,
            format!(
                "bounces has {} entries, over the limit of {MAX_BOUNCES}; acknowledge them in parts",
                bounces.len()
            ),
            None,
        );
    }
    match state.storage.ack_bounces(agent.clone(), bounces).await {
        Ok(n) => ServerFrame::Done {
            reference,
            detail: format!("{n} bounce(s) forgotten"),
        },
        Err(e) => storage_failed(reference, e),
    }
}

/// Tells each online sender among `senders` that it has bounces waiting.
pub fn announce<S>(state: &RelayState<S>, senders: impl IntoIterator<Item = AgentName>) {
    let mut told = std::collections::HashSet::new();
    for sender in senders {
        if told.insert(sender.clone()) {
            state.presence.tell(&sender, ConsentEvent::Bounced {});
        }
    }
}
