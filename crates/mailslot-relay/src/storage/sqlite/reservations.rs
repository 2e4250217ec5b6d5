//! File reservations on SQLite. Every write runs on the writer, one at a time, so reading a
//! project's live reservations and inserting a granted one cannot interleave with another
//! agent's reserve; the answer comes once the batch is durable.

use rusqlite::{Connection, params};

use super::SqliteStorage;
use crate::protocol::{
    AgentName, ProjectName, Reservation, ReservationId, ReservationRequest, Ttl,
};
use crate::storage::reservations::{Row, decide, expiry, named};
use crate::storage::{Reservations, Reserve, StorageError, Which};

impl Reservations for SqliteStorage {
    async fn reserve(
        &self,
        holder: AgentName,
        wanted: ReservationRequest,
        now_ms: i64,
    ) -> Result<Reserve, StorageError> {
        self.writes
            .tables(move |tx| {
                // Expired rows are dead weight everywhere: each grant sweeps them.
                tx.prepare_cached("DELETE FROM reservations WHERE expires_at <= ?1")?
                    .execute([now_ms])?;
                let outcome = decide(&live(tx, &wanted.project, now_ms)?, &holder, wanted, now_ms)?;
                if let Reserve::Granted(r) = &outcome {
                    insert(tx, r)?;
                }
                Ok(outcome)
            })
            .await
    }

    async fn release_reserved(
        &self,
        holder: AgentName,
        project: ProjectName,
        which: Which,
        now_ms: i64,
    ) -> Result<Vec<ReservationId>, StorageError> {
        self.writes
            .tables(move |tx| {
                let mut gone = Vec::new();
                for r in live(tx, &project, now_ms)? {
                    if r.holder == holder && named(&r, &which) {
                        tx.prepare_cached("DELETE FROM reservations WHERE id = ?1")?
                            .execute([r.id.to_string()])?;
                        gone.push(r.id);
                    }
                }
                Ok(gone)
            })
            .await
    }

    async fn renew_reserved(
        &self,
        holder: AgentName,
        project: ProjectName,
        ids: Vec<ReservationId>,
        ttl: Ttl,
        now_ms: i64,
    ) -> Result<Vec<Reservation>, StorageError> {
        self.writes
            .tables(move |tx| {
                let until = expiry(now_ms, ttl);
                let mut renewed = Vec::new();
                for mut r in live(tx, &project, now_ms)? {
                    if r.holder == holder && (ids.is_empty() || ids.contains(&r.id)) {
                        tx.prepare_cached("UPDATE reservations SET expires_at = ?2 WHERE id = ?1")?
                            .execute(params![r.id.to_string(), until])?;
                        r.expires_at = jiff::Timestamp::from_millisecond(until)
                            .map_err(|e| StorageError::Database(e.to_string()))?;
                        renewed.push(r);
                    }
                }
                Ok(renewed)
            })
            .await
    }

    async fn reservations(
        &self,
        project: ProjectName,
        now_ms: i64,
    ) -> Result<Vec<Reservation>, StorageError> {
        self.readers
            .read(move |conn| live(conn, &project, now_ms))
            .await
    }
}

/// The live reservations of `project`, oldest first.
fn live(
    conn: &Connection,
    project: &ProjectName,
    now_ms: i64,
) -> Result<Vec<Reservation>, StorageError> {
    let mut stmt = conn.prepare_cached(
        "SELECT id, project, holder, patterns, mode, reason, created_at, expires_at
         FROM reservations WHERE project = ?1 AND expires_at > ?2
         ORDER BY created_at, id",
    )?;
    let mut rows = stmt.query(params![project.as_str(), now_ms])?;
    let mut out = Vec::new();
    while let Some(r) = rows.next()? {
        out.push(
            Row {
                id: r.get(0)?,
                project: r.get(1)?,
                holder: r.get(2)?,
                patterns: r.get(3)?,
                mode: r.get(4)?,
                reason: r.get(5)?,
                created_at: r.get(6)?,
                expires_at: r.get(7)?,
            }
            .read()?,
        );
    }
    Ok(out)
}

fn insert(conn: &Connection, r: &Reservation) -> Result<(), StorageError> {
    let row = Row::of(r);
    conn.prepare_cached(
        "INSERT INTO reservations
         (id, project, holder, patterns, mode, reason, created_at, expires_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
    )?
    .execute(params![
        row.id,
        row.project,
        row.holder,
        row.patterns,
        row.mode,
        row.reason,
        row.created_at,
        row.expires_at
    ])?;
    Ok(())
}
