//! Bounces between relays. A copy that came over a link and expired here before its
//! recipient took it bounces to a sender on another relay: this relay tells that relay
//! (`bounced`, a one-shot link request), which records the bounce for its agent as for its
//! own relay's; only then are they forgotten here. Until the other relay answers they wait,
//! and are offered again at every expiry round.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use super::super::bounce;
use super::super::state::RelayState;
use super::super::storage::{Queue, RelayPins, StorageError};
use crate::protocol::{
    Address, AgentName, Bounce, CopyKey, LinkAnswer, LinkRequest, MAX_LINK_BOUNCES, RelayName,
    RemoteBounce,
};

/// Senders asked about per round.
const SENDERS: usize = 100;

/// Offers the bounces waiting for other relays' agents to their relays, every expiry round.
pub async fn carry<S: Queue + RelayPins>(state: Arc<RelayState<S>>) {
    let mut tick = tokio::time::interval(Duration::from_secs(
        state.config.expiry_interval_secs.max(1),
    ));
    loop {
        tick.tick().await;
        if let Err(e) = carry_once(&state).await {
            tracing::warn!(error = %e, "cannot read the bounces waiting for other relays; will retry");
        }
    }
}

async fn carry_once<S: Queue + RelayPins>(state: &RelayState<S>) -> Result<(), StorageError> {
    let mut by_relay: BTreeMap<RelayName, Vec<(AgentName, Bounce)>> = BTreeMap::new();
    for sender in state.storage.remote_bounce_senders(SENDERS).await? {
        let Some(relay) = sender.stored_address().host().cloned() else {
            continue;
        };
        let room = MAX_LINK_BOUNCES.saturating_sub(by_relay.get(&relay).map_or(0, Vec::len));
        for b in state.storage.bounces(sender.clone(), room).await? {
            by_relay
                .entry(relay.clone())
                .or_default()
                .push((sender.clone(), b));
        }
    }
    for (relay, waiting) in by_relay {
        let bounces = waiting
            .iter()
            .map(|(sender, b)| RemoteBounce {
                from: sender.stored_address(),
                id: b.id,
                to: Address::remote(b.to.name().clone(), state.name.clone()),
                expired_at: b.expired_at,
            })
            .collect();
        match super::ask(state, &relay, LinkRequest::Bounced { bounces }).await {
            Ok(LinkAnswer::Done {}) => {
                let mut by_sender: BTreeMap<AgentName, Vec<CopyKey>> = BTreeMap::new();
                for (sender, b) in waiting {
                    by_sender.entry(sender).or_default().push(b.key());
                }
                for (sender, keys) in by_sender {
                    state.storage.ack_bounces(sender, keys).await?;
                }
            }
            outcome => {
                tracing::info!(%relay, ?outcome, "could not hand bounces to their senders' relay; will retry");
            }
        }
    }
    Ok(())
}

/// Records bounces `relay` reports for this relay's agents, as its own relay's bounces are.
pub async fn take<S: Queue>(
    state: &RelayState<S>,
    relay: &RelayName,
    bounces: Vec<RemoteBounce>,
) -> LinkAnswer {
    if bounces.len() > MAX_LINK_BOUNCES {
        return LinkAnswer::Refused {
            code: crate::protocol::ErrorCode::BadFrame,
            message: format!("at most {MAX_LINK_BOUNCES} bounces at once"),
        };
    }
    let mut by_sender: BTreeMap<AgentName, Vec<Bounce>> = BTreeMap::new();
    for b in bounces {
        // Only this relay's agents' mail, to the telling relay's agents.
        let (Some(sender), true) = (state.local_name(&b.from), b.to.host() == Some(relay)) else {
            tracing::warn!(%relay, from = %b.from, to = %b.to, "another relay reported a bounce that is not its to report; ignored");
            continue;
        };
        by_sender.entry(sender.clone()).or_default().push(Bounce {
            id: b.id,
            to: b.to,
            expired_at: b.expired_at,
        });
    }
    let senders: Vec<AgentName> = by_sender.keys().cloned().collect();
    for (sender, bounces) in by_sender {
        if let Err(e) = state.storage.record_bounces(sender, bounces).await {
            return LinkAnswer::Refused {
                code: crate::protocol::ErrorCode::Internal,
                message: e.to_string(),
            };
        }
    }
    bounce::announce(state, senders);
    LinkAnswer::Done {}
}
