//! Denials kept for a requester: handed over as the same `denied` event a connected requester
//! gets at once, at its next login — the storage deletes what it hands out. A denial told live
//! is kept too (the connection may close before its client reads it) and told again at the
//! next login: at least once on the wire, once in the client, whose store knows it heard it.

use super::super::state::RelayState;
use super::super::storage::ConsentLedger;
use super::super::wire::Outgoing;
use crate::protocol::{AgentName, ConsentEvent, ServerFrame};

/// Sends `agent` every denial kept for it; `false` when the client is gone. A storage error
/// leaves them kept, for the next login.
pub(super) async fn hand_over<S: ConsentLedger>(
    state: &RelayState<S>,
    agent: &AgentName,
    out: &Outgoing,
) -> bool {
    let now = jiff::Timestamp::now().as_millisecond();
    let targets = match state.storage.take_denials(agent.clone(), now).await {
        Ok(targets) => targets,
        Err(e) => {
            tracing::warn!(%agent, error = %e, "kept denials could not be read; they wait for the next login");
            return true;
        }
    };
    targets.iter().all(|target| {
        out.frame(&ServerFrame::Event {
            event: ConsentEvent::Denied {
                by: target.stored_address(),
            },
        })
    })
}
