//! File reservations on PostgreSQL. Every write takes the project's advisory lock for its
//! transaction, so one node's read of the live reservations and its insert of a granted one
//! cannot interleave with another node's reserve in the same project.

use deadpool_postgres::{Client, GenericClient, Transaction};

use crate::protocol::{
    AgentName, ProjectName, Reservation, ReservationId, ReservationRequest, Ttl,
};
use crate::storage::reservations::{Row, decide, expiry, named};
use crate::storage::{Reserve, StorageError, Which};

/// The first half of a project's advisory lock key ("reserve" in ASCII, as a number); the
/// second is the project name's hash.
const PROJECT_LOCK: i32 = 0x7265_7376;

/// Opens a transaction holding `project`'s lock until it ends.
async fn locked<'a>(
    client: &'a mut Client,
    project: &ProjectName,
) -> Result<Transaction<'a>, StorageError> {
    let tx = client.transaction().await?;
    tx.execute(
        "SELECT pg_advisory_xact_lock($1, hashtext($2))",
        &[&PROJECT_LOCK, &project.as_str()],
    )
    .await?;
    Ok(tx)
}

pub(super) async fn reserve(
    client: &mut Client,
    holder: &AgentName,
    wanted: ReservationRequest,
    now_ms: i64,
) -> Result<Reserve, StorageError> {
    let tx = locked(client, &wanted.project).await?;
    // Expired rows are dead weight everywhere: each grant sweeps them.
    tx.execute(
        "DELETE FROM reservations WHERE expires_at <= $1",
        &[&now_ms],
    )
    .await?;
    let live = live(&tx, &wanted.project, now_ms).await?;
    let outcome = decide(&live, holder, wanted, now_ms)?;
    if let Reserve::Granted(r) = &outcome {
        let row = Row::of(r);
        tx.execute(
            "INSERT INTO reservations
             (id, project, holder, patterns, mode, reason, created_at, expires_at)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
            &[
                &row.id,
                &row.project,
                &row.holder,
                &row.patterns,
                &row.mode,
                &row.reason,
                &row.created_at,
                &row.expires_at,
            ],
        )
        .await?;
    }
    tx.commit().await?;
    Ok(outcome)
}

pub(super) async fn release(
    client: &mut Client,
    holder: &AgentName,
    project: &ProjectName,
    which: &Which,
    now_ms: i64,
) -> Result<Vec<ReservationId>, StorageError> {
    let tx = locked(client, project).await?;
    let mut gone = Vec::new();
    for r in live(&tx, project, now_ms).await? {
        if &r.holder == holder && named(&r, which) {
            tx.execute(
                "DELETE FROM reservations WHERE id = $1",
                &[&r.id.to_string()],
            )
            .await?;
            gone.push(r.id);
        }
    }
    tx.commit().await?;
    Ok(gone)
}

pub(super) async fn renew(
    client: &mut Client,
    holder: &AgentName,
    project: &ProjectName,
    (ids, ttl): (&[ReservationId], Ttl),
    now_ms: i64,
) -> Result<Vec<Reservation>, StorageError> {
    let tx = locked(client, project).await?;
    let until = expiry(now_ms, ttl);
    let mut renewed = Vec::new();
    for mut r in live(&tx, project, now_ms).await? {
        if &r.holder == holder && (ids.is_empty() || ids.contains(&r.id)) {
            tx.execute(
                "UPDATE reservations SET expires_at = $2 WHERE id = $1",
                &[&r.id.to_string(), &until],
            )
            .await?;
            r.expires_at = jiff::Timestamp::from_millisecond(until)
                .map_err(|e| StorageError::Database(e.to_string()))?;
            renewed.push(r);
        }
    }
    tx.commit().await?;
    Ok(renewed)
}

/// The live reservations of `project`, oldest first.
pub(super) async fn live(
    client: &impl GenericClient,
    project: &ProjectName,
    now_ms: i64,
) -> Result<Vec<Reservation>, StorageError> {
    let rows = client
        .query(
            "SELECT id, project, holder, patterns, mode, reason, created_at, expires_at
             FROM reservations WHERE project = $1 AND expires_at > $2
             ORDER BY created_at, id",
            &[&project.as_str(), &now_ms],
        )
        .await?;
    rows.into_iter()
        .map(|r| {
            Row {
                id: r.try_get(0)?,
                project: r.try_get(1)?,
                holder: r.try_get(2)?,
                patterns: r.try_get(3)?,
                mode: r.try_get(4)?,
                reason: r.try_get(5)?,
                created_at: r.try_get(6)?,
                expires_at: r.try_get(7)?,
            }
            .read()
        })
        .collect()
}
