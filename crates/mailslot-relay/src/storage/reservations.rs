//! The reservations role: file reservations in a project's namespace, each held by the agent
//! that made it until it is released or its TTL passes. Whether a new one is granted is
//! decided here, once, over the project's live reservations that the backend read inside the
//! transaction that then inserts it: two agents racing for the same files cannot both win.

use std::future::Future;

use jiff::Timestamp;

use super::StorageError;
use crate::protocol::{
    AgentName, MAX_HELD_PER_PROJECT, MAX_PROJECT_RESERVATIONS, Pattern, ProjectName, Reason,
    Reservation, ReservationId, ReservationMode, ReservationRequest, Ttl,
};

/// What a `reserve` came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reserve {
    /// Granted and stored.
    Granted(Reservation),
    /// Other holders' live reservations are in the way; nothing was stored.
    Conflicts(Vec<Reservation>),
    /// The holder already has [`MAX_HELD_PER_PROJECT`] live ones in the project, or the
    /// project has [`MAX_PROJECT_RESERVATIONS`]; nothing was stored.
    TooMany {
        /// Whose limit: the holder's (`true`) or the project's.
        holders: bool,
        /// The limit.
        limit: usize,
    },
}

/// Which of its reservations an agent releases.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Which {
    /// These ids (others' and unknown ones are left alone).
    Ids(Vec<ReservationId>),
    /// Those holding one of these patterns, exactly as reserved.
    Patterns(Vec<Pattern>),
    /// Every one in the project.
    All,
}

/// File reservations, shared by every node of a relay. Times are milliseconds since the
/// epoch, passed in so that expiry is the caller's clock; a reservation whose expiry is at
/// or before `now_ms` is gone: never shown, counted, renewed or in anyone's way.
pub trait Reservations: Send + Sync + 'static {
    /// Grants `wanted` to `holder` unless another holder's live reservation conflicts or a
    /// limit is reached; the check and the insert are one transaction.
    fn reserve(
        &self,
        holder: AgentName,
        wanted: ReservationRequest,
        now_ms: i64,
    ) -> impl Future<Output = Result<Reserve, StorageError>> + Send;

    /// Releases `holder`'s reservations in `project` that `which` names; their ids.
    fn release_reserved(
        &self,
        holder: AgentName,
        project: ProjectName,
        which: Which,
        now_ms: i64,
    ) -> impl Future<Output = Result<Vec<ReservationId>, StorageError>> + Send;

    /// Gives `holder`'s live reservations in `project` (those in `ids`, or all when it is
    /// empty) the expiry `now_ms` + `ttl`; the renewed ones.
    fn renew_reserved(
        &self,
        holder: AgentName,
        project: ProjectName,
        ids: Vec<ReservationId>,
        ttl: Ttl,
        now_ms: i64,
    ) -> impl Future<Output = Result<Vec<Reservation>, StorageError>> + Send;

    /// The live reservations of `project`, oldest first.
    fn reservations(
        &self,
        project: ProjectName,
        now_ms: i64,
    ) -> impl Future<Output = Result<Vec<Reservation>, StorageError>> + Send;
}

/// Decides `holder`'s request over the project's live reservations: the reservation to
/// insert, or why not.
pub(crate) fn decide(
    live: &[Reservation],
    holder: &AgentName,
    wanted: ReservationRequest,
    now_ms: i64,
) -> Result<Reserve, StorageError> {
    let conflicts: Vec<Reservation> = live
        .iter()
        .filter(|r| r.conflicts_with(holder, wanted.mode, &wanted.patterns))
        .cloned()
        .collect();
    if !conflicts.is_empty() {
        return Ok(Reserve::Conflicts(conflicts));
    }
    if live.iter().filter(|r| &r.holder == holder).count() >= MAX_HELD_PER_PROJECT {
        return Ok(Reserve::TooMany {
            holders: true,
            limit: MAX_HELD_PER_PROJECT,
        });
    }
    if live.len() >= MAX_PROJECT_RESERVATIONS {
        return Ok(Reserve::TooMany {
            holders: false,
            limit: MAX_PROJECT_RESERVATIONS,
        });
    }
    Ok(Reserve::Granted(Reservation {
        id: ReservationId::new(),
        project: wanted.project,
        holder: holder.clone(),
        patterns: wanted.patterns,
        mode: wanted.mode,
        reason: wanted.reason,
        created_at: timestamp(now_ms)?,
        expires_at: timestamp(expiry(now_ms, wanted.ttl))?,
    }))
}

/// When a reservation made or renewed at `now_ms` lapses.
pub(crate) fn expiry(now_ms: i64, ttl: Ttl) -> i64 {
    now_ms + i64::from(ttl.secs()) * 1000
}

/// Whether `r` is one of those `which` names.
pub(crate) fn named(r: &Reservation, which: &Which) -> bool {
    match which {
        Which::Ids(ids) => ids.contains(&r.id),
        Which::Patterns(patterns) => r.patterns.iter().any(|p| patterns.contains(p)),
        Which::All => true,
    }
}

/// A row as both backends store it, read back and checked.
pub(crate) struct Row {
    pub id: String,
    pub project: String,
    pub holder: String,
    pub patterns: String,
    pub mode: String,
    pub reason: String,
    pub created_at: i64,
    pub expires_at: i64,
}

impl Row {
    /// The stored form of `r`.
    pub fn of(r: &Reservation) -> Self {
        Self {
            id: r.id.to_string(),
            project: r.project.to_string(),
            holder: r.holder.to_string(),
            patterns: serde_json::to_string(&r.patterns).expect("patterns serialize"),
            mode: r.mode.as_str().to_owned(),
            reason: r.reason.to_string(),
            created_at: r.created_at.as_millisecond(),
            expires_at: r.expires_at.as_millisecond(),
        }
    }

    /// The reservation it holds; a row that breaks the protocol's rules is damage.
    pub fn read(self) -> Result<Reservation, StorageError> {
        let damaged = |what: &str, e: &dyn std::fmt::Display| {
            StorageError::Database(format!("a stored reservation's {what}: {e}"))
        };
        let mode = match self.mode.as_str() {
            "exclusive" => ReservationMode::Exclusive,
            "shared" => ReservationMode::Shared,
            other => return Err(damaged("mode", &other)),
        };
        Ok(Reservation {
            id: ReservationId::parse(&self.id).map_err(|e| damaged("id", &e))?,
            project: ProjectName::new(&self.project).map_err(|e| damaged("project", &e))?,
            holder: AgentName::from_stored(&self.holder).map_err(|e| damaged("holder", &e))?,
            patterns: serde_json::from_str(&self.patterns).map_err(|e| damaged("patterns", &e))?,
            mode,
            reason: Reason::new(&self.reason).map_err(|e| damaged("reason", &e))?,
            created_at: timestamp(self.created_at)?,
            expires_at: timestamp(self.expires_at)?,
        })
    }
}

fn timestamp(ms: i64) -> Result<Timestamp, StorageError> {
    Timestamp::from_millisecond(ms)
        .map_err(|e| StorageError::Database(format!("a reservation's time {ms}: {e}")))
}
