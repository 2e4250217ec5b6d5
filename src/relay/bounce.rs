//! Bounces: a copy that expires before its recipient takes it is recorded for its sender
//! (in the write that expires it), and kept until the sender asks for it (`bounces`) and says
//! it recorded it (`ack_bounces`). An online sender is told at once with a `bounced` event; an
//! offline one asks when it next connects. So a bounce survives the sender being away and the
//! relay restarting, and is delivered at least once (the sender's store records each once).

use std::time::Duration;

use super::state::RelayState;
use super::storage::Storage;
use super::wire::error_frame;
use crate::protocol::{AgentName, ClientFrame, ConsentEvent, ErrorCode, MAX_BOUNCES, ServerFrame};

/// Answers a bounce frame from `agent`; gives back frames that are not about bounces.
pub async fn handle<S: Storage>(
    state: &RelayState<S>,
    agent: &AgentName,
    frame: ClientFrame,
) -> Result<ServerFrame, ClientFrame> {
    let failed = |reference, e: super::storage::StorageError| {
        error_frame(
            Some(reference),
            ErrorCode::Internal,
            e.to_string(),
            Some(Duration::from_secs(1)),
        )
    };
    Ok(match frame {
        ClientFrame::Bounces { reference } => {
            match state.storage.bounces(agent.clone(), MAX_BOUNCES).await {
                Ok(bounces) => ServerFrame::BounceList { reference, bounces },
                Err(e) => failed(reference, e),
            }
        }
        ClientFrame::AckBounces { reference, bounces } => {
            if bounces.len() > MAX_BOUNCES {
                return Ok(error_frame(
                    Some(reference),
                    ErrorCode::BadFrame,
                    format!(
                        "bounces has {} entries, over the limit of {MAX_BOUNCES}; acknowledge them in parts",
                        bounces.len()
                    ),
                    None,
                ));
            }
            match state.storage.ack_bounces(agent.clone(), bounces).await {
                Ok(n) => ServerFrame::Done {
                    reference,
                    detail: format!("{n} bounce(s) forgotten"),
                },
                Err(e) => failed(reference, e),
            }
        }
        other => return Err(other),
    })
}

/// Tells each online sender among `senders` that it has bounces waiting.
pub fn announce<S: Storage>(state: &RelayState<S>, senders: impl IntoIterator<Item = AgentName>) {
    let mut told = std::collections::HashSet::new();
    for sender in senders {
        if told.insert(sender.clone()) {
            state.presence.tell(&sender, ConsentEvent::Bounced {});
        }
    }
}
