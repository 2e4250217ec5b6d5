//! File reservations on the relay: typed calls on whichever connection a caller holds (the
//! CLI's control connection, the mailbox's session), shared by the CLI, the MCP tools and
//! `mailslot guard`.

use super::ClientError;
use super::ask::Ask;
use crate::protocol::{
    ClientFrame, Pattern, ProjectName, Reservation, ReservationId, ReservationRequest, ServerFrame,
    Ttl,
};

/// What a reserve came to.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum Reserved {
    /// Granted.
    Granted {
        /// The reservation.
        reservation: Reservation,
    },
    /// Refused: these live reservations of other holders are in the way (each holder was
    /// told that someone waits).
    Refused {
        /// The reservations in the way.
        conflicts: Vec<Reservation>,
    },
}

/// Which of its reservations an agent releases.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Release {
    /// By id.
    Ids(Vec<ReservationId>),
    /// By pattern, exactly as reserved.
    Patterns(Vec<Pattern>),
    /// Every one in the project.
    All,
}

/// Asks the relay to reserve `wanted` for this agent.
pub async fn reserve(
    conn: &mut impl Ask,
    wanted: ReservationRequest,
) -> Result<Reserved, ClientError> {
    let answer = conn
        .ask(Box::new(move |reference| ClientFrame::Reserve {
            reference,
            project: wanted.project,
            patterns: wanted.patterns,
            mode: wanted.mode,
            reason: wanted.reason,
            ttl: wanted.ttl,
        }))
        .await?;
    match answer {
        ServerFrame::Reserved { reservation, .. } => Ok(Reserved::Granted { reservation }),
        ServerFrame::ReservationConflict { conflicts, .. } => Ok(Reserved::Refused { conflicts }),
        other => Err(unexpected(&other)),
    }
}

/// Releases this agent's reservations in `project` that `which` names; the ids released.
pub async fn release(
    conn: &mut impl Ask,
    project: ProjectName,
    which: Release,
) -> Result<Vec<ReservationId>, ClientError> {
    let (ids, patterns, all) = match which {
        Release::Ids(ids) => (ids, Vec::new(), false),
        Release::Patterns(patterns) => (Vec::new(), patterns, false),
        Release::All => (Vec::new(), Vec::new(), true),
    };
    match conn
        .ask(Box::new(move |reference| ClientFrame::Release {
            reference,
            project,
            ids,
            patterns,
            all,
        }))
        .await?
    {
        ServerFrame::Released { ids, .. } => Ok(ids),
        other => Err(unexpected(&other)),
    }
}

/// Gives this agent's reservations in `project` (those in `ids`, or all when it is empty) a
/// new TTL from now; the renewed ones.
pub async fn renew(
    conn: &mut impl Ask,
    project: ProjectName,
    ids: Vec<ReservationId>,
    ttl: Ttl,
) -> Result<Vec<Reservation>, ClientError> {
    match conn
        .ask(Box::new(move |reference| ClientFrame::Renew {
            reference,
            project,
            ids,
            ttl,
        }))
        .await?
    {
        ServerFrame::Renewed { reservations, .. } => Ok(reservations),
        other => Err(unexpected(&other)),
    }
}

/// The live reservations in `project`, every holder's, oldest first.
pub async fn list(
    conn: &mut impl Ask,
    project: ProjectName,
) -> Result<Vec<Reservation>, ClientError> {
    match conn
        .ask(Box::new(move |reference| ClientFrame::Reservations {
            reference,
            project,
        }))
        .await?
    {
        ServerFrame::ReservationList { reservations, .. } => Ok(reservations),
        other => Err(unexpected(&other)),
    }
}

fn unexpected(frame: &ServerFrame) -> ClientError {
    ClientError::Protocol(format!("unexpected answer {frame:?}"))
}
