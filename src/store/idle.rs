//! Which doorbell wakes a client session's model while it is idle: the `mailslot mcp`
//! process serving a Claude Code session claims its session here when it rings the channel
//! or the session's inbox socket, so the rewake hook of the same session stays quiet (one
//! path per session, never two rings for one message).

use jiff::Timestamp;
use rusqlite::{OptionalExtension, params};

use super::time::{from_ms, to_ms};
use super::{SessionKey, Store, StoreError};
use crate::protocol::now_millis;

/// Turn rows older than this are dropped: a session that old is long over.
const KEEP_MS: i64 = 30 * 24 * 3600 * 1000;
/// How long a hook's word that a turn runs holds without another (each prompt and tool call
/// renews it).
pub const BUSY_FOR_MS: i64 = 60 * 1000;

/// A path that wakes an idle session from inside the `mailslot mcp` process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdlePath {
    /// Claude Code's channel (`notifications/claude/channel`).
    Channel,
    /// Claude Code's session inbox socket.
    Socket,
}

impl IdlePath {
    /// The name stored and shown.
    pub fn as_str(self) -> &'static str {
        match self {
            IdlePath::Channel => "channel",
            IdlePath::Socket => "socket",
        }
    }
}

/// A session's claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdleClaim {
    /// The path.
    pub path: IdlePath,
    /// The claiming process.
    pub pid: u32,
    /// When it claimed.
    pub since: Timestamp,
}

impl Store {
    /// Records that process `pid` wakes `session` by `path` (replacing an older claim).
    pub fn claim_idle_path(
        &mut self,
        session: &SessionKey,
        path: IdlePath,
        pid: u32,
    ) -> Result<(), StoreError> {
        let tx = self.write_tx()?;
        tx.execute(
            "INSERT INTO doorbells (session, path, pid, since) VALUES (?1, ?2, ?3, ?4)
             ON CONFLICT (session) DO UPDATE SET path = ?2, pid = ?3, since = ?4",
            params![session.as_str(), path.as_str(), pid, to_ms(now_millis())],
        )?;
        tx.commit()?;
        Ok(())
    }

    /// Drops `session`'s claim if process `pid` holds it.
    pub fn release_idle_path(&mut self, session: &SessionKey, pid: u32) -> Result<(), StoreError> {
        let tx = self.write_tx()?;
        tx.execute(
            "DELETE FROM doorbells WHERE session = ?1 AND pid = ?2",
            params![session.as_str(), pid],
        )?;
        tx.commit()?;
        Ok(())
    }

    /// Records whether `session` is in a turn (its hooks say so: a prompt or a tool call
    /// starts one, a Stop that lets it stop ends it). Rows older than 30 days are dropped.
    pub fn set_busy(&mut self, session: &SessionKey, busy: bool) -> Result<(), StoreError> {
        let now = to_ms(now_millis());
        // Hooks run on every prompt and tool call: write only a change, or a renewal due.
        let current: Option<(bool, i64)> = self
            .conn
            .query_row(
                "SELECT busy, at FROM turns WHERE session = ?1",
                [session.as_str()],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()?;
        if current.is_some_and(|(was, at)| was == busy && now - at < BUSY_FOR_MS / 3) {
            return Ok(());
        }
        let tx = self.write_tx()?;
        tx.execute(
            "INSERT INTO turns (session, busy, at) VALUES (?1, ?2, ?3)
             ON CONFLICT (session) DO UPDATE SET busy = ?2, at = ?3",
            params![session.as_str(), busy, now],
        )?;
        tx.execute("DELETE FROM turns WHERE at < ?1", [now - KEEP_MS])?;
        tx.commit()?;
        Ok(())
    }

    /// Whether `session` is in a turn, as its hooks last said within [`BUSY_FOR_MS`] (not
    /// known: not busy). A turn that ended without its Stop hook (interrupted) must not keep
    /// the session from being woken for long.
    pub fn is_busy(&self, session: &SessionKey) -> Result<bool, StoreError> {
        let since = to_ms(now_millis()) - BUSY_FOR_MS;
        Ok(self
            .conn
            .query_row(
                "SELECT busy AND at >= ?2 FROM turns WHERE session = ?1",
                params![session.as_str(), since],
                |r| r.get(0),
            )
            .optional()?
            .unwrap_or(false))
    }

    /// `session`'s claim, if any (the caller checks that its process still runs).
    pub fn idle_claim(&self, session: &SessionKey) -> Result<Option<IdleClaim>, StoreError> {
        let row: Option<(String, i64, i64)> = self
            .conn
            .query_row(
                "SELECT path, pid, since FROM doorbells WHERE session = ?1",
                [session.as_str()],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )
            .optional()?;
        let Some((path, pid, since)) = row else {
            return Ok(None);
        };
        let path = match path.as_str() {
            "channel" => IdlePath::Channel,
            "socket" => IdlePath::Socket,
            other => {
                return Err(StoreError::Corrupt {
                    what: "doorbell path",
                    detail: format!("{other:?} is not channel or socket"),
                });
            }
        };
        let pid = u32::try_from(pid).map_err(|_| StoreError::Corrupt {
            what: "doorbell pid",
            detail: pid.to_string(),
        })?;
        Ok(Some(IdleClaim {
            path,
            pid,
            since: from_ms(since)?,
        }))
    }
}
