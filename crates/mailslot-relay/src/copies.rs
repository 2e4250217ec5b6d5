//! Where a sender's copies stand (`copies`): how a sender learns its mail was delivered. The
//! relay keeps no record of deliveries: a copy its recipient acknowledged is simply gone
//! from the queue, and one that expired left a bounce in the same write. So the answer is
//! read from what the relay keeps anyway (the queue's dedup key, the bounces), and neither
//! this request nor the ack path writes anything for it.

use std::collections::HashMap;

use super::state::RelayState;
use super::storage::{CopyStatus, Queue, Registry, StorageError};
use super::wire::{error_frame, storage_failed};
use crate::protocol::{
    Address, AgentName, CopyFate, CopyKey, CopyState, ErrorCode, MAX_COPY_CHECKS, ServerFrame,
};

/// Answers `agent`'s `copies`: where each of its copies stands.
#[tracing::instrument(level = "debug", name = "request", skip_all, fields(kind = "copies", %agent, r#ref = %reference, count = copies.len()))]
pub async fn states<S: Queue + Registry>(
    state: &RelayState<S>,
    agent: &AgentName,
    reference: String,
    copies: Vec<CopyKey>,
) -> ServerFrame {
    if copies.len() > MAX_COPY_CHECKS {
        return error_frame(
            Some(reference),
            ErrorCode::BadFrame,
            format!(
                "copies has {} entries, over the limit of {MAX_COPY_CHECKS}; ask in parts",
                copies.len()
            ),
            None,
        );
    }
    match fates(state, agent, copies).await {
        Ok(copies) => ServerFrame::CopyStates { reference, copies },
        Err(e) => storage_failed(reference, e),
    }
}

/// Each copy's fate: a copy that is neither queued nor bounced was taken by its recipient,
/// unless the recipient is not registered any more (a retired name's queue is emptied
/// without anyone taking it), which makes it unknown.
async fn fates<S: Queue + Registry>(
    state: &RelayState<S>,
    agent: &AgentName,
    copies: Vec<CopyKey>,
) -> Result<Vec<CopyState>, StorageError> {
    // Asked as written, looked up as stored: a local recipient by its bare name (however the
    // sender spelt it), a remote one by its full address.
    let keys = copies
        .iter()
        .map(|k| CopyKey {
            id: k.id,
            to: match state.local_name(&k.to) {
                Some(name) => Address::local(name.clone()),
                None => k.to.clone(),
            },
        })
        .collect();
    let statuses = state.storage.copy_statuses(agent.clone(), keys).await?;
    let mut registered: HashMap<AgentName, bool> = HashMap::new();
    let mut out = Vec::with_capacity(copies.len());
    for (key, status) in copies.into_iter().zip(statuses) {
        let state = match status {
            CopyStatus::Queued => CopyFate::Waiting,
            CopyStatus::Bounced => CopyFate::Bounced,
            // A remote copy no longer queued here was taken by its relay.
            CopyStatus::Gone if state.local_name(&key.to).is_none() => CopyFate::Gone,
            CopyStatus::Gone => {
                let name = key.to.name();
                let known = match registered.get(name) {
                    Some(&known) => known,
                    None => {
                        let known = state.storage.keys(name.clone()).await?.is_some();
                        registered.insert(name.clone(), known);
                        known
                    }
                };
                if known {
                    CopyFate::Gone
                } else {
                    CopyFate::Unknown
                }
            }
        };
        out.push(CopyState {
            id: key.id,
            to: key.to,
            state,
        });
    }
    Ok(out)
}
