//! Denials a requester did not hear of when they were made (it was offline, or the event was
//! dropped): handed over as the same `denied` event a connected requester gets, at its next
//! login, once each — the storage deletes what it hands out. The live event goes through here
//! too, so a denial handed at login is not handed again by its event.

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
