//! Letters waiting for their sender's relay: mail from an agent of another relay that could
//! not be opened because that relay did not answer for the sender's keys (down, timing out,
//! answering 5xx). Kept sealed, exactly as delivered, so the agent's own relay can be
//! acknowledged: acknowledgements are cumulative, and one unreachable relay must never hold
//! up mail from everyone else. The client opens them when that relay answers again.

use std::time::Duration;

use jiff::Timestamp;
use rusqlite::{OptionalExtension, params};

use super::time::{from_ms, to_ms};
use super::{Store, StoreError};
use crate::protocol::{Address, MessageId, SealedEnvelope};

/// The most letters kept waiting; beyond it a letter whose relay is out of reach is refused
/// as unreadable (one relay that never answers cannot fill the store).
pub const MAX_PARKED: u64 = 1_000;
/// How long a letter waits for its sender's relay before it is given up: as long as a relay
/// keeps a copy nobody takes.
pub const PARKED_FOR: Duration = Duration::from_secs(7 * 24 * 3600);
/// The first wait before trying again; it doubles per failed try, up to [`RETRY_MAX`].
pub const RETRY_FIRST: Duration = Duration::from_secs(15);
/// The longest wait between tries.
pub const RETRY_MAX: Duration = Duration::from_secs(15 * 60);

/// A letter waiting for its sender's relay.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParkedLetter {
    /// As delivered.
    pub envelope: SealedEnvelope,
    /// When it was first kept.
    pub parked_at: Timestamp,
    /// Failed tries to open it since.
    pub attempts: u32,
    /// Why the last try failed.
    pub last_error: String,
}

/// What [`Store::park`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Parking {
    /// Kept now (or already kept: a redelivery).
    Kept,
    /// Not kept: [`MAX_PARKED`] letters already wait.
    Full,
}

/// The wait after `attempts` failed tries.
fn backoff(attempts: u32) -> Duration {
    RETRY_FIRST
        .saturating_mul(1u32 << attempts.min(16))
        .min(RETRY_MAX)
}

fn at_plus(at: Timestamp, wait: Duration) -> i64 {
    to_ms(at).saturating_add(i64::try_from(wait.as_millis()).unwrap_or(i64::MAX))
}

impl Store {
    /// Keeps `envelope` until its sender's relay answers; `error` is why it could not be
    /// opened now.
    pub fn park(
        &mut self,
        envelope: &SealedEnvelope,
        error: &str,
        now: Timestamp,
    ) -> Result<Parking, StoreError> {
        let tx = self.write_tx()?;
        let kept: i64 = tx.query_row("SELECT count(*) FROM parked", [], |r| r.get(0))?;
        let already: Option<i64> = tx
            .query_row(
                "SELECT 1 FROM parked WHERE id = ?1",
                [envelope.id.to_string()],
                |r| r.get(0),
            )
            .optional()?;
        if already.is_none() && kept.unsigned_abs() >= MAX_PARKED {
            return Ok(Parking::Full);
        }
        let json = serde_json::to_string(envelope).map_err(|e| StoreError::Corrupt {
            what: "parked letter",
            detail: e.to_string(),
        })?;
        tx.execute(
            "INSERT INTO parked (id, sender, envelope, parked_at, attempts, next_at, last_error)
             VALUES (?1, ?2, ?3, ?4, 0, ?5, ?6) ON CONFLICT (id) DO NOTHING",
            params![
                envelope.id.to_string(),
                envelope.from.to_string(),
                json,
                to_ms(now),
                at_plus(now, backoff(0)),
                error
            ],
        )?;
        tx.commit()?;
        Ok(Parking::Kept)
    }

    /// Letters whose next try is due at `now` (all of them with `now` = `None`), oldest
    /// first, at most `limit`.
    pub fn parked_due(
        &self,
        now: Option<Timestamp>,
        limit: usize,
    ) -> Result<Vec<ParkedLetter>, StoreError> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT envelope, parked_at, attempts, last_error FROM parked
             WHERE next_at <= ?1 ORDER BY parked_at, id LIMIT ?2",
        )?;
        let until = now.map_or(i64::MAX, to_ms);
        let rows = stmt.query_map(params![until, limit as i64], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, i64>(1)?,
                r.get::<_, u32>(2)?,
                r.get::<_, String>(3)?,
            ))
        })?;
        rows.map(|row| {
            let (json, parked_at, attempts, last_error) = row?;
            Ok(ParkedLetter {
                envelope: serde_json::from_str(&json).map_err(|e| StoreError::Corrupt {
                    what: "parked letter",
                    detail: e.to_string(),
                })?,
                parked_at: from_ms(parked_at)?,
                attempts,
                last_error,
            })
        })
        .collect()
    }

    /// When the next letter is due, if any waits.
    pub fn parked_next(&self) -> Result<Option<Timestamp>, StoreError> {
        let next: Option<i64> =
            self.conn
                .query_row("SELECT min(next_at) FROM parked", [], |r| r.get(0))?;
        next.map(from_ms).transpose()
    }

    /// How many letters wait, and the senders of the oldest few.
    pub fn parked_summary(&self) -> Result<(u64, Vec<Address>), StoreError> {
        let count: i64 = self
            .conn
            .query_row("SELECT count(*) FROM parked", [], |r| r.get(0))?;
        let count = count.unsigned_abs();
        let senders: Vec<String> = self
            .conn
            .prepare_cached("SELECT DISTINCT sender FROM parked ORDER BY sender LIMIT 5")?
            .query_map([], |r| r.get(0))?
            .collect::<Result<_, _>>()?;
        let senders = senders
            .iter()
            .map(|s| {
                Address::parse(s).map_err(|e| StoreError::Corrupt {
                    what: "parked letter",
                    detail: e.to_string(),
                })
            })
            .collect::<Result<_, _>>()?;
        Ok((count, senders))
    }

    /// A try to open the letter `id` failed again with `error` at `now`: the next try waits
    /// longer.
    pub fn park_again(
        &mut self,
        id: &MessageId,
        error: &str,
        now: Timestamp,
    ) -> Result<(), StoreError> {
        let attempts: Option<u32> = self
            .conn
            .query_row(
                "SELECT attempts FROM parked WHERE id = ?1",
                [id.to_string()],
                |r| r.get(0),
            )
            .optional()?;
        let attempts = attempts.unwrap_or(0).saturating_add(1);
        self.conn.execute(
            "UPDATE parked SET attempts = ?2, next_at = ?3, last_error = ?4 WHERE id = ?1",
            params![
                id.to_string(),
                attempts,
                at_plus(now, backoff(attempts)),
                error
            ],
        )?;
        Ok(())
    }

    /// The letter `id` is settled (opened and stored, or given up).
    pub fn unpark(&mut self, id: &MessageId) -> Result<(), StoreError> {
        self.conn
            .execute("DELETE FROM parked WHERE id = ?1", [id.to_string()])?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wait_doubles_from_the_first_up_to_the_cap() {
        assert_eq!(backoff(0), RETRY_FIRST);
        assert_eq!(backoff(1), RETRY_FIRST * 2);
        assert_eq!(backoff(40), RETRY_MAX);
    }
}
