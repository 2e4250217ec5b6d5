//! An agent gives up its name: signed by its own key for this connection, the name is held
//! for `retired_name_days` (answering as unknown, so nobody can take it over while peers
//! still know it), then free. Its contacts, blocks, requests, listing and owner key go at
//! once, and so does the mail still queued for it: nobody may read it any more.

use std::time::Duration;

use super::state::RelayState;
use super::storage::{AckOutcome, Queue, Registry, StorageError};
use super::wire::error_frame;
use crate::crypto::PublicIdentity;
use crate::crypto::sign::{self, Domain};
use crate::protocol::{AgentName, ErrorCode, ServerFrame, Shown, retire_payload};

/// Queued copies read per round while the retired name's queue is emptied.
const DRAIN_BATCH: usize = 256;

/// The sentence for a name that is held after its retirement.
pub fn held_until(agent: &AgentName, until_ms: i64) -> String {
    let when = jiff::Timestamp::from_millisecond(until_ms)
        .map(|t| t.strftime("%Y-%m-%d %H:%M UTC").to_string())
        .unwrap_or_else(|_| "later".into());
    format!("{agent} was retired on this relay; the name is free again after {when}")
}

/// Answers `agent`'s `retire` on the connection challenged with `nonce`.
#[tracing::instrument(level = "debug", name = "request", skip_all, fields(kind = "retire", %agent, r#ref = %reference))]
pub async fn retire<S: Registry + Queue>(
    state: &RelayState<S>,
    (agent, nonce): (&AgentName, &[u8]),
    reference: String,
    signature: Vec<u8>,
) -> ServerFrame {
    let internal = |e: StorageError| {
        error_frame(
            Some(reference.clone()),
            ErrorCode::Internal,
            format!("not retired: {e}"),
            Some(Duration::from_secs(1)),
        )
    };
    let unknown = || {
        error_frame(
            Some(reference.clone()),
            ErrorCode::UnknownAgent,
            format!("{agent} is not registered here"),
            None,
        )
    };
    let keys = match state.storage.keys(agent.clone()).await {
        Ok(Some(keys)) => keys,
        Ok(None) => {
            return unknown();
        }
        Err(e) => return internal(e),
    };
    let signed = PublicIdentity::try_from(keys).is_ok_and(|key| {
        let payload = retire_payload(&state.relay_id, nonce, agent);
        sign::verify_detached(&key, Domain::Retire, &payload, &signature).is_ok()
    });
    if !signed {
        return error_frame(
            Some(reference),
            ErrorCode::AuthFailed,
            format!("the retire is not signed by {agent}'s key for this connection"),
            None,
        );
    }
    let grace = jiff::SignedDuration::from_hours(24 * state.config.retired_name_days as i64);
    let until = (jiff::Timestamp::now() + grace).as_millisecond();
    match state.storage.retire(agent.clone(), until).await {
        Ok(true) => {}
        Ok(false) => {
            return unknown();
        }
        Err(e) => return internal(e),
    }
    state.forget_registered(agent);
    state.presence.retire(agent);
    let dropped = match drop_queue(&state.storage, agent).await {
        Ok(n) => n,
        Err(e) => return internal(e),
    };
    tracing::info!(%agent, dropped, "retired");
    ServerFrame::Done {
        reference,
        detail: format!(
            "{}; {dropped} queued message(s) for it were dropped",
            held_until(agent, until)
        ),
    }
}

/// The operator frees `agent`'s name at once, for an owner who lost its key (nothing can sign
/// a rotation then): as a retirement that is over when it starts, so the owner can register
/// the name again with new keys. Run on a stopped relay (its nodes keep names they have seen
/// in memory). `None` when there is no such agent; else the queued copies dropped.
pub async fn release<S: Registry + Queue>(
    storage: &S,
    agent: &AgentName,
) -> Result<Option<u64>, StorageError> {
    if !storage.retire(agent.clone(), 0).await? {
        return Ok(None);
    }
    let dropped = drop_queue(storage, agent).await?;
    tracing::warn!(%agent, dropped, "released by the operator");
    Ok(Some(dropped))
}

/// Acknowledges everything queued for `agent`, as its last session would have.
async fn drop_queue<S: Queue>(storage: &S, agent: &AgentName) -> Result<u64, StorageError> {
    let mut last = 0;
    loop {
        let batch = storage.pending(agent.clone(), last, DRAIN_BATCH).await?;
        match batch.last() {
            Some(q) => last = q.seq,
            None => break,
        }
    }
    if last == 0 {
        return Ok(0);
    }
    // A claim of its own: the retired agent's sessions, wherever they are, are over. It is
    // no session, so it does not show the agent online.
    let epoch = storage.claim(agent.clone(), Shown::Hidden).await?;
    match storage.ack(agent.clone(), last, epoch).await? {
        AckOutcome::Applied(n) => Ok(n),
        AckOutcome::Fenced => Ok(0),
    }
}
