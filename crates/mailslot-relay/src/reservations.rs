//! File reservations: an agent reserves paths or globs in a project, releases and renews its
//! own, and lists everyone's. The holder is always the session's agent. A refused reserve
//! names what is in the way, and each holder in the way is told that someone waits (once a
//! minute at most per waiter and holder).

use std::collections::BTreeMap;

use super::state::RelayState;
use super::storage::{Reservations, Reserve, Which};
use super::wire::{error_frame, storage_failed};
use crate::protocol::{
    AgentName, ConsentEvent, ErrorCode, MAX_HELD_PER_PROJECT, MAX_PATTERNS, Pattern, ProjectName,
    Reservation, ReservationId, ReservationRequest, ServerFrame, Ttl, Waiting, validate_patterns,
};

/// Answers `agent`'s `reserve`.
#[tracing::instrument(level = "debug", name = "request", skip_all, fields(kind = "reserve", %agent, r#ref = %reference, project = %wanted.project))]
pub async fn reserve<S: Reservations>(
    state: &RelayState<S>,
    agent: &AgentName,
    reference: String,
    wanted: ReservationRequest,
) -> ServerFrame {
    if let Err(e) = validate_patterns(&wanted.patterns) {
        return error_frame(Some(reference), ErrorCode::BadFrame, e.to_string(), None);
    }
    if let Some(refusal) = too_short(state, &reference, wanted.ttl) {
        return refusal;
    }
    let (project, patterns, reason) = (
        wanted.project.clone(),
        wanted.patterns.clone(),
        wanted.reason.clone(),
    );
    match state.storage.reserve(agent.clone(), wanted, now_ms()).await {
        Ok(Reserve::Granted(reservation)) => ServerFrame::Reserved {
            reference,
            reservation,
        },
        Ok(Reserve::Conflicts(conflicts)) => {
            let mut held: BTreeMap<&AgentName, Vec<&Reservation>> = BTreeMap::new();
            for r in &conflicts {
                held.entry(&r.holder).or_default().push(r);
            }
            for (holder, in_way) in held {
                if state
                    .waits_told
                    .take(&(agent.clone(), holder.clone()))
                    .is_err()
                {
                    continue;
                }
                let waiting = Waiting {
                    by: agent.clone(),
                    project: project.clone(),
                    patterns: wanted_of(&patterns, &in_way),
                    reason: reason.clone(),
                    held: in_way.iter().map(|r| r.id).collect(),
                };
                state.presence.tell(holder, ConsentEvent::Waiting(waiting));
            }
            ServerFrame::ReservationConflict {
                reference,
                conflicts,
            }
        }
        Ok(Reserve::TooMany { holders, limit }) => {
            let message = if holders {
                format!(
                    "{agent} already holds {limit} live reservations in {project}, the most one agent may; release some (`mailslot release`) or reserve a wider glob"
                )
            } else {
                format!(
                    "{project} already has {limit} live reservations, the most one project may; ask their holders to release what they are done with"
                )
            };
            error_frame(
                Some(reference),
                ErrorCode::TooManyReservations,
                message,
                None,
            )
        }
        Err(e) => storage_failed(reference, e),
    }
}

/// Answers `agent`'s `release`.
#[tracing::instrument(level = "debug", name = "request", skip_all, fields(kind = "release", %agent, r#ref = %reference, %project))]
pub async fn release<S: Reservations>(
    state: &RelayState<S>,
    agent: &AgentName,
    reference: String,
    project: ProjectName,
    (ids, patterns, all): (Vec<ReservationId>, Vec<Pattern>, bool),
) -> ServerFrame {
    let which = match (ids.is_empty(), patterns.is_empty(), all) {
        (false, true, false) if ids.len() <= MAX_HELD_PER_PROJECT => Which::Ids(ids),
        (true, false, false) if patterns.len() <= MAX_PATTERNS => Which::Patterns(patterns),
        (true, true, true) => Which::All,
        _ => {
            let message = format!(
                "name what to release in one way: ids (at most {MAX_HELD_PER_PROJECT}), patterns as reserved (at most {MAX_PATTERNS}), or all"
            );
            return error_frame(Some(reference), ErrorCode::BadFrame, message, None);
        }
    };
    match state
        .storage
        .release_reserved(agent.clone(), project, which, now_ms())
        .await
    {
        Ok(ids) => ServerFrame::Released { reference, ids },
        Err(e) => storage_failed(reference, e),
    }
}

/// Answers `agent`'s `renew`.
#[tracing::instrument(level = "debug", name = "request", skip_all, fields(kind = "renew", %agent, r#ref = %reference, %project))]
pub async fn renew<S: Reservations>(
    state: &RelayState<S>,
    agent: &AgentName,
    reference: String,
    project: ProjectName,
    (ids, ttl): (Vec<ReservationId>, Ttl),
) -> ServerFrame {
    if ids.len() > MAX_HELD_PER_PROJECT {
        let message = format!(
            "names {} reservations, over the limit of {MAX_HELD_PER_PROJECT}; name none to renew all of this agent's in the project",
            ids.len()
        );
        return error_frame(Some(reference), ErrorCode::BadFrame, message, None);
    }
    if let Some(refusal) = too_short(state, &reference, ttl) {
        return refusal;
    }
    match state
        .storage
        .renew_reserved(agent.clone(), project, ids, ttl, now_ms())
        .await
    {
        Ok(reservations) => ServerFrame::Renewed {
            reference,
            reservations,
        },
        Err(e) => storage_failed(reference, e),
    }
}

/// Answers `agent`'s `reservations`.
#[tracing::instrument(level = "debug", name = "request", skip_all, fields(kind = "reservations", %agent, r#ref = %reference, %project))]
pub async fn list<S: Reservations>(
    state: &RelayState<S>,
    agent: &AgentName,
    reference: String,
    project: ProjectName,
) -> ServerFrame {
    match state.storage.reservations(project, now_ms()).await {
        Ok(reservations) => ServerFrame::ReservationList {
            reference,
            reservations,
        },
        Err(e) => storage_failed(reference, e),
    }
}

/// Bytes of the waiter's patterns one `waiting` event names at most (past the first): the
/// event crosses nodes in a PostgreSQL notification, whose payload is bounded (8000 bytes).
const WAITING_PATTERN_BYTES: usize = 2048;

/// The waiter's patterns that overlap the holder's reservations in its way, within
/// [`WAITING_PATTERN_BYTES`].
fn wanted_of(patterns: &[Pattern], in_way: &[&Reservation]) -> Vec<Pattern> {
    let mut bytes = 0;
    patterns
        .iter()
        .filter(|p| {
            in_way
                .iter()
                .any(|r| r.patterns.iter().any(|held| held.overlaps(p)))
        })
        .filter(|p| {
            bytes += p.as_str().len();
            bytes == p.as_str().len() || bytes <= WAITING_PATTERN_BYTES
        })
        .cloned()
        .collect()
}

/// The refusal of a TTL under this relay's minimum.
fn too_short<S>(state: &RelayState<S>, reference: &str, ttl: Ttl) -> Option<ServerFrame> {
    let min = state.config.reservation_min_ttl_secs;
    (ttl.secs() < min).then(|| {
        let message = format!(
            "ttl is {ttl}, under this relay's minimum of {min} s; ask for {min} s or more (like 30m)"
        );
        error_frame(Some(reference.to_owned()), ErrorCode::BadFrame, message, None)
    })
}

/// Now, in milliseconds since the epoch: the clock reservations lapse by.
fn now_ms() -> i64 {
    jiff::Timestamp::now().as_millisecond()
}
