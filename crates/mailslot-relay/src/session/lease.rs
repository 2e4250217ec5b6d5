//! A delivery session's hold on its agent: its entry in the presence hub, its turn (the
//! agent's earlier sessions here have ended), and the delivery lease in storage (sessions
//! elsewhere have ended, and acks from any session it replaced are fenced).

use axum::extract::ws::WebSocket;
use tokio::sync::OwnedMutexGuard;

use super::super::presence::Attached;
use super::super::state::RelayState;
use super::super::storage::{Epoch, Queue, Registry};
use super::super::wire::{Ending, refuse};
use super::endings::{internal, kicked, shutting_down};
use super::handshake::welcome;
use crate::protocol::{AgentName, Shown};

/// What a delivery session holds until it ends.
pub(super) struct Lease {
    /// Its entry in the presence hub: pushes, events, and the kick.
    pub attached: Attached,
    /// The delivery lease.
    pub epoch: Epoch,
    turn: OwnedMutexGuard<()>,
}

/// Takes `agent`'s turn and claims its lease, then welcomes the client; a refusal is sent
/// here (`None`).
pub(super) async fn claim<S: Registry + Queue>(
    state: &RelayState<S>,
    socket: &mut WebSocket,
    (agent, shown): (&AgentName, Shown),
) -> Option<Lease> {
    let mut attached = state.presence.attach(agent);
    let refused = async |socket: &mut WebSocket, attached: Attached, ending: Ending| {
        state.presence.detach(agent, attached.conn);
        state.metrics.reject(ending.code);
        refuse(socket, ending).await;
    };
    // The agent's previous session, if any, ends first (it was just kicked): its acks are
    // then committed, and this session neither counts nor delivers acknowledged mail.
    let turn = match take_turn(state, agent, &mut attached).await {
        Ok(turn) => turn,
        Err(ending) => {
            refused(socket, attached, ending).await;
            return None;
        }
    };
    // A session of the agent on another node ends first, likewise (within a bound: a node
    // that died answers nothing); the lease then fences acks from any session it replaced.
    state.presence.take_over(agent).await;
    let epoch = match state.storage.claim(agent.clone(), shown).await {
        Ok(epoch) => epoch,
        Err(e) => {
            let ending = internal(format!(
                "could not claim the delivery session: {e}; reconnect"
            ));
            refused(socket, attached, ending).await;
            return None;
        }
    };
    // Online from the claim, before the welcome: an agent told it is connected is shown so
    // (unless the connection asked to be hidden).
    state.presence.claimed(agent, attached.conn, (epoch, shown));
    if let Err(ending) = welcome(state, socket, agent).await {
        // Released, or the agent would stay online on PostgreSQL until its next claim.
        if let Err(e) = state.storage.release(agent.clone(), epoch).await {
            tracing::warn!(%agent, error = %e, "could not release the delivery lease");
        }
        refused(socket, attached, ending).await;
        return None;
    }
    Some(Lease {
        attached,
        epoch,
        turn,
    })
}

/// Gives the lease back. Every ack the session read is committed by then (they are applied
/// before the next frame is read), so the agent's next session may read the queue, here or
/// elsewhere.
pub(super) async fn release<S: Queue>(state: &RelayState<S>, agent: &AgentName, lease: Lease) {
    if let Err(e) = state.storage.release(agent.clone(), lease.epoch).await {
        tracing::warn!(%agent, error = %e, "could not release the delivery lease; a session elsewhere waits for its bound");
    }
    state.presence.detach(agent, lease.attached.conn);
    drop(lease.turn);
}

/// Waits until the agent's earlier sessions have ended, unless this one is replaced or the
/// relay shuts down first.
async fn take_turn<S>(
    state: &RelayState<S>,
    agent: &AgentName,
    attached: &mut Attached,
) -> Result<OwnedMutexGuard<()>, Ending> {
    let mut shutdown = state.shutdown.clone();
    tokio::select! {
        biased;
        _ = shutdown.changed() => Err(shutting_down()),
        kick = &mut attached.kicked => Err(kicked(agent, kick.ok())),
        turn = attached.turn.clone().take() => Ok(turn),
    }
}
