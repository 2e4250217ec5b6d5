//! The queue outside of sends (those are `batch`'s): reading a recipient's copies, acks (plain
//! and fenced by the delivery lease), the lease itself, the totals, and expiry.
//!
//! Lock order, the same everywhere so that nothing waits in a circle: a lease row (acks
//! fenced by it), then mailbox rows in name order, then queue rows.

use deadpool_postgres::{Client, GenericClient, Object};
use tokio_postgres::types::ToSql;

use super::pipeline::Open;
use super::{now_ms, seq_to_db, unsigned};
use jiff::Timestamp;

use super::super::queue_of;
use crate::protocol::{
    Address, AgentName, Bounce, CopyKey, MessageId, Online, RelayName, Seq, Shown,
};
use crate::storage::{Committed, CopyStatus, Queued, StorageError};

/// An acknowledged copy still counts as a duplicate this long after its ack, so that a
/// sender's retry racing the recipient's ack is not stored twice (as in the SQLite backend).
const DUPLICATE_LAG_MS: i64 = 2_000;
/// The advisory lock key of expiry ("expiry" in ASCII): one node expires at a time.
const EXPIRY_LOCK: i64 = 0x6578_7069_7279;

pub(super) async fn pending(
    client: &Client,
    agent: &AgentName,
    after: Seq,
    limit: usize,
) -> Result<Vec<Queued>, StorageError> {
    let stmt = client
        .prepare_cached(
            "SELECT seq, envelope, accepted_at FROM queue WHERE recipient = $1 AND seq > $2 ORDER BY seq LIMIT $3",
        )
        .await?;
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    client
        .query(&stmt, &[&agent.as_str(), &seq_to_db(after), &limit])
        .await?
        .into_iter()
        .map(|row| {
            Ok(Queued {
                seq: unsigned(row.try_get(0)?, "sequence number")?,
                envelope: row.try_get(1)?,
                accepted_at_ms: row.try_get(2)?,
            })
        })
        .collect()
}

/// The copies of each recipient numbered from `.1` to `.2`, in order per recipient: those
/// other nodes announced, read for many recipients at once. Copies acknowledged or expired
/// meanwhile are missing (the sessions see the gap and read their queue).
pub(super) async fn committed(
    client: &Client,
    ranges: &[(AgentName, Seq, Seq)],
) -> Result<Vec<Committed>, StorageError> {
    let stmt = client
        .prepare_cached(
            "SELECT q.recipient, q.seq, q.envelope, q.accepted_at
             FROM unnest($1::text[], $2::bigint[], $3::bigint[]) AS w(r, lo, hi)
             JOIN queue q ON q.recipient = w.r AND q.seq BETWEEN w.lo AND w.hi
             ORDER BY q.recipient, q.seq",
        )
        .await?;
    let names: Vec<&str> = ranges.iter().map(|r| r.0.as_str()).collect();
    let from: Vec<i64> = ranges.iter().map(|r| seq_to_db(r.1)).collect();
    let to: Vec<i64> = ranges.iter().map(|r| seq_to_db(r.2)).collect();
    let mut copies = Vec::new();
    for row in client.query(&stmt, &[&names, &from, &to]).await? {
        let name: String = row.try_get(0)?;
        let seq = unsigned(row.try_get(1)?, "sequence number")?;
        let envelope: Vec<u8> = row.try_get(2)?;
        copies.push(Committed {
            recipient: AgentName::from_stored(&name).map_err(|_| corrupt("queue", "recipient"))?,
            seq,
            envelope: envelope.into(),
            accepted_at_ms: row.try_get(3)?,
            // Numbers are dense per recipient (see `schema`).
            prev: seq.checked_sub(1),
        });
    }
    Ok(copies)
}

/// Acks for the session holding lease `epoch`; `None` when the lease has moved on.
///
/// Committed without waiting for the flush (`synchronous_commit = off`): an ack only deletes
/// delivered copies, so one lost in a crash of the database delivers them again, and the
/// client keeps one of each (it deduplicates by message id). It cannot be lost behind a later
/// durable commit that saw it (a claim, a send): the log is flushed in order, so that commit's
/// flush carries the ack too. Its effects are visible, and its locks released, at the commit
/// as usual, so fencing is unchanged.
pub(super) async fn ack_fenced(
    client: Object,
    agent: &AgentName,
    upto: Seq,
    epoch: u64,
) -> Result<Option<u64>, StorageError> {
    let (lease, lock, delete) = futures_util::join!(
        // Shared, held to the commit: a claim (which updates the row) waits for this ack, so
        // once a claim has returned, no ack of an older epoch can still commit.
        client.prepare_cached("SELECT epoch FROM leases WHERE agent = $1 FOR SHARE"),
        // The mailbox next, as a send locks it: a send and an ack of one recipient take turns.
        client.prepare_cached("SELECT 1 FROM mailboxes WHERE recipient = $1 FOR UPDATE"),
        // Deletes only under the epoch read above (the row is locked, so it cannot change),
        // keeping the copies' keys for the duplicate check a moment longer.
        client.prepare_cached(
            "WITH gone AS (
                 DELETE FROM queue WHERE recipient = $1 AND seq <= $2
                     AND EXISTS (SELECT 1 FROM leases WHERE agent = $1 AND epoch = $4)
                 RETURNING message_id, sender, size
             ), kept AS (
                 INSERT INTO acked_copies (message_id, sender, recipient, until_ms)
                 SELECT message_id, sender, $1, $3 FROM gone
                 ON CONFLICT (message_id, sender, recipient) DO UPDATE SET until_ms = excluded.until_ms
             )
             UPDATE mailboxes SET waiting = waiting - t.n, bytes = bytes - t.b
             FROM (SELECT count(*) AS n, coalesce(sum(size), 0)::bigint AS b FROM gone) t
             WHERE recipient = $1 AND t.n > 0
             RETURNING t.n",
        ),
    );
    let (lease, lock, delete) = (lease?, lock?, delete?);
    let name = agent.as_str();
    let (upto, epoch) = (seq_to_db(upto), seq_to_db(epoch));
    let until = now_ms() + DUPLICATE_LAG_MS;
    let by_name: [&(dyn ToSql + Sync); 1] = [&name];
    let by_range: [&(dyn ToSql + Sync); 4] = [&name, &upto, &until, &epoch];
    // The whole transaction in one write (see `pipeline`): the mailbox stays locked only while
    // the server runs it. Fenced or not, the delete changed only what the lease allowed, so
    // it commits whatever the answers say.
    let mut open = Open::new(client);
    let (by_name, by_range, statements) = (&by_name, &by_range, (&lease, &lock, &delete));
    let (quick, current, locked, deleted) = open
        .whole(|c| async move {
            futures_util::join!(
                c.batch_execute("SET LOCAL synchronous_commit = off"),
                c.query_opt(statements.0, by_name),
                c.query_opt(statements.1, by_name),
                c.query_opt(statements.2, by_range),
            )
        })
        .await?;
    quick?;
    let current = current?.map(|row| row.try_get::<_, i64>(0)).transpose()?;
    locked?;
    let count = match deleted? {
        Some(row) => unsigned(row.try_get(0)?, "count")?,
        None => 0,
    };
    Ok((current == Some(epoch)).then_some(count))
}

/// Ends the lease `epoch` of `agent` held by `node` (its session ended, its acks committed),
/// unless a later claim came; tells the other nodes at the commit.
pub(super) async fn release(
    client: &Client,
    agent: &AgentName,
    epoch: u64,
    node: &str,
) -> Result<(), StorageError> {
    let payload = serde_json::json!({ "agent": agent.as_str(), "epoch": epoch, "node": node });
    // One statement, so the notification goes exactly when the row changes.
    client
        .execute(
            "WITH released AS (
                 UPDATE leases SET node = NULL WHERE agent = $1 AND epoch = $2 AND node = $3
                 RETURNING agent
             )
             SELECT pg_notify('mailslot_release', $4) FROM released",
            &[
                &agent.as_str(),
                &seq_to_db(epoch),
                &node,
                &payload.to_string(),
            ],
        )
        .await?;
    Ok(())
}

/// The node whose session holds `agent`'s lease now, if one does (none once released).
pub(super) async fn lease_holder(
    client: &Client,
    agent: &str,
) -> Result<Option<String>, StorageError> {
    let row = client
        .query_opt("SELECT node FROM leases WHERE agent = $1", &[&agent])
        .await?;
    Ok(match row {
        Some(row) => row.try_get(0)?,
        None => None,
    })
}

/// Which of `agents` a session holds the lease of now, with the time of its claim, by name;
/// a hidden session's lease is left out. A released lease has no node; a node that died keeps its leases until their agents
/// connect again (see docs/decisions.md, "Presence").
pub(super) async fn online(
    client: &Client,
    agents: &[AgentName],
) -> Result<Vec<Online>, StorageError> {
    let names: Vec<&str> = agents.iter().map(AgentName::as_str).collect();
    let rows = client
        .query(
            "SELECT agent, claimed_at FROM leases
             WHERE agent = ANY($1) AND node IS NOT NULL AND NOT hidden ORDER BY agent",
            &[&names],
        )
        .await?;
    rows.iter()
        .map(|row| {
            let agent: &str = row.try_get(0)?;
            let at: i64 = row.try_get(1)?;
            Ok(Online {
                agent: AgentName::from_stored(agent)
                    .map_err(|e| StorageError::Database(format!("a leased name: {e}")))?,
                since: Timestamp::from_millisecond(at)
                    .map_err(|e| StorageError::Database(format!("a lease's claim time: {e}")))?,
            })
        })
        .collect()
}

/// Takes `agent`'s lease for `node`, hidden from presence or not; returns the new epoch.
pub(super) async fn claim(
    client: &mut Client,
    (agent, shown): (&AgentName, Shown),
    node: &str,
) -> Result<u64, StorageError> {
    let tx = client.transaction().await?;
    let hidden = shown == Shown::Hidden;
    let epoch: i64 = tx
        .query_one(
            "INSERT INTO leases (agent, epoch, node, claimed_at, hidden) VALUES ($1, 1, $2, $3, $4)
             ON CONFLICT (agent) DO UPDATE
                 SET epoch = leases.epoch + 1, node = excluded.node,
                     claimed_at = excluded.claimed_at, hidden = excluded.hidden
             RETURNING epoch",
            &[&agent.as_str(), &node, &now_ms(), &hidden],
        )
        .await?
        .try_get(0)?;
    let payload = serde_json::json!({ "agent": agent.as_str(), "epoch": epoch, "node": node });
    // Sent at the commit: the other nodes learn of the claim only once it holds.
    tx.execute(
        "SELECT pg_notify('mailslot_lease', $1)",
        &[&payload.to_string()],
    )
    .await?;
    tx.commit().await?;
    unsigned(epoch, "lease epoch")
}

pub(super) async fn waiting(client: &Client, agent: &AgentName) -> Result<u64, StorageError> {
    let row = client
        .query_opt(
            "SELECT waiting FROM mailboxes WHERE recipient = $1",
            &[&agent.as_str()],
        )
        .await?;
    match row {
        Some(row) => unsigned(row.try_get(0)?, "waiting count"),
        None => Ok(0),
    }
}

/// The senders on other relays that bounces wait for, at most `limit`.
pub(super) async fn remote_bounce_senders(
    client: &Client,
    limit: usize,
) -> Result<Vec<AgentName>, StorageError> {
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let rows = client
        .query(
            "SELECT DISTINCT sender FROM bounces WHERE strpos(sender, '@') > 1
             ORDER BY sender LIMIT $1",
            &[&limit],
        )
        .await?;
    rows.iter()
        .map(|row| {
            let name: String = row.try_get(0)?;
            AgentName::from_stored(&name).map_err(|_| corrupt("bounces", "sender"))
        })
        .collect()
}

/// The relays whose mailboxes hold copies.
pub(super) async fn relay_mailboxes(client: &Client) -> Result<Vec<RelayName>, StorageError> {
    let rows = client
        .query(
            "SELECT recipient FROM mailboxes WHERE recipient LIKE '@%' AND waiting > 0",
            &[],
        )
        .await?;
    rows.iter()
        .map(|row| {
            let name: String = row.try_get(0)?;
            AgentName::from_stored(&name)
                .ok()
                .and_then(|n| n.mailbox_relay())
                .ok_or_else(|| corrupt("mailboxes", "recipient"))
        })
        .collect()
}

pub(super) async fn total_waiting(client: &Client) -> Result<u64, StorageError> {
    let row = client
        .query_one(
            "SELECT coalesce(sum(waiting), 0)::bigint FROM mailboxes",
            &[],
        )
        .await?;
    unsigned(row.try_get(0)?, "waiting count")
}

/// Deletes the copies that expired before `now_ms` and records a bounce for each for its
/// sender (relay mailboxes, `@host`, are left to their link), and forgets the duplicate keys past their lag; returns the bounces. Several nodes
/// may call it at once: one does the work, the others return nothing at once.
pub(super) async fn expire(
    client: &mut Client,
    now_ms: i64,
) -> Result<Vec<(AgentName, Bounce)>, StorageError> {
    let tx = client.transaction().await?;
    let mine: bool = tx
        .query_one("SELECT pg_try_advisory_xact_lock($1)", &[&EXPIRY_LOCK])
        .await?
        .try_get(0)?;
    if !mine {
        return Ok(Vec::new());
    }
    // The mailboxes first, in name order, as sends lock them.
    let locked: Vec<String> = tx
        .query(
            "SELECT recipient FROM mailboxes
             WHERE recipient IN (SELECT DISTINCT recipient FROM queue WHERE expires_at < $1)
                 AND recipient NOT LIKE '@%'
             ORDER BY recipient FOR UPDATE",
            &[&now_ms],
        )
        .await?
        .into_iter()
        .map(|row| row.try_get(0))
        .collect::<Result<_, _>>()?;
    let mut bounces = Vec::new();
    if !locked.is_empty() {
        // Every data-changing part runs once, whether the final SELECT reads it or not.
        let gone = tx
            .query(
                "WITH gone AS (
                     DELETE FROM queue WHERE expires_at < $1 AND recipient = ANY($2)
                     RETURNING recipient, size, sender, message_id
                 ), totals AS (
                     SELECT recipient, count(*) AS n, sum(size)::bigint AS b FROM gone GROUP BY recipient
                 ), updated AS (
                     UPDATE mailboxes m SET waiting = m.waiting - t.n, bytes = m.bytes - t.b
                     FROM totals t WHERE m.recipient = t.recipient
                 ), bounced AS (
                     INSERT INTO bounces (sender, message_id, recipient, expired_at)
                     SELECT sender, message_id, recipient, $1 FROM gone
                     ON CONFLICT DO NOTHING
                 )
                 SELECT sender, message_id, recipient FROM gone ORDER BY recipient, message_id",
                &[&now_ms, &locked],
            )
            .await?;
        let expired_at = Timestamp::from_millisecond(now_ms).unwrap_or(Timestamp::UNIX_EPOCH);
        for row in gone {
            let (sender, id, to) = bounce_row(row.try_get(0)?, row.try_get(1)?, row.try_get(2)?)?;
            bounces.push((sender, Bounce { id, to, expired_at }));
        }
    }
    tx.execute("DELETE FROM acked_copies WHERE until_ms < $1", &[&now_ms])
        .await?;
    tx.commit().await?;
    Ok(bounces)
}

/// The bounces waiting for `sender`, oldest first, at most `limit`.
pub(super) async fn bounces(
    client: &Client,
    sender: &AgentName,
    limit: usize,
) -> Result<Vec<Bounce>, StorageError> {
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let rows = client
        .query(
            "SELECT message_id, recipient, expired_at FROM bounces WHERE sender = $1
             ORDER BY expired_at, message_id, recipient LIMIT $2",
            &[&sender.as_str(), &limit],
        )
        .await?;
    let mut bounces = Vec::with_capacity(rows.len());
    for row in rows {
        let (_, id, to) = bounce_row(sender.to_string(), row.try_get(0)?, row.try_get(1)?)?;
        let at: i64 = row.try_get(2)?;
        bounces.push(Bounce {
            id,
            to,
            expired_at: Timestamp::from_millisecond(at)
                .map_err(|_| corrupt("bounce", "expired_at"))?,
        });
    }
    Ok(bounces)
}

/// Where each of `sender`'s copies in `keys` stands, in order: one statement, so one
/// snapshot, in which a copy's expiry and its bounce are one transaction. Both lookups are
/// on unique indexes (`queue`'s dedup key, `bounces`' primary key).
pub(super) async fn copy_statuses(
    client: &Client,
    sender: &AgentName,
    keys: &[CopyKey],
) -> Result<Vec<CopyStatus>, StorageError> {
    let ids: Vec<String> = keys.iter().map(|k| k.id.to_string()).collect();
    let recipients: Vec<String> = keys.iter().map(|k| k.to.to_string()).collect();
    // The queue holds a remote recipient's copy in its relay's mailbox, under its own id.
    let (queues, queued_ids): (Vec<String>, Vec<String>) = keys
        .iter()
        .map(|k| {
            queue_of(k.id, &k.to).map_or_else(
                || (String::new(), String::new()),
                |(q, id)| (q.to_string(), id.to_string()),
            )
        })
        .unzip();
    let rows = client
        .query(
            // Scalar subqueries, probed per key, as in the batch's duplicate check.
            "SELECT (SELECT true FROM queue q WHERE q.message_id = k.queued_id
                              AND q.sender = $1 AND q.recipient = k.queue LIMIT 1) IS NOT NULL,
                    (SELECT true FROM bounces b WHERE b.sender = $1
                              AND b.message_id = k.message_id AND b.recipient = k.recipient LIMIT 1) IS NOT NULL
             FROM unnest($2::text[], $3::text[], $4::text[], $5::text[])
                  WITH ORDINALITY AS k(message_id, recipient, queue, queued_id, n)
             ORDER BY k.n",
            &[&sender.as_str(), &ids, &recipients, &queues, &queued_ids],
        )
        .await?;
    rows.iter()
        .map(|row| {
            Ok(
                match (row.try_get::<_, bool>(0)?, row.try_get::<_, bool>(1)?) {
                    (true, _) => CopyStatus::Queued,
                    (false, true) => CopyStatus::Bounced,
                    (false, false) => CopyStatus::Gone,
                },
            )
        })
        .collect()
}

/// Stores `sender`'s bounces that a link to another relay gave up on, each under its
/// recipient as written (`name@host`); one already stored is kept as it is. One statement,
/// committed durably (the pool's `synchronous_commit = on`).
pub(super) async fn record_bounces(
    client: &Client,
    sender: &AgentName,
    bounces: &[Bounce],
) -> Result<(), StorageError> {
    let ids: Vec<String> = bounces.iter().map(|b| b.id.to_string()).collect();
    let recipients: Vec<String> = bounces.iter().map(|b| b.to.to_string()).collect();
    let expired: Vec<i64> = bounces
        .iter()
        .map(|b| b.expired_at.as_millisecond())
        .collect();
    client
        .execute(
            "INSERT INTO bounces (sender, message_id, recipient, expired_at)
             SELECT $1, k.message_id, k.recipient, k.expired_at
             FROM unnest($2::text[], $3::text[], $4::bigint[]) AS k(message_id, recipient, expired_at)
             ON CONFLICT DO NOTHING",
            &[&sender.as_str(), &ids, &recipients, &expired],
        )
        .await?;
    Ok(())
}

/// Forgets bounces `sender` has recorded; returns how many there were.
pub(super) async fn ack_bounces(
    client: &Client,
    sender: &AgentName,
    keys: &[CopyKey],
) -> Result<u64, StorageError> {
    let ids: Vec<String> = keys.iter().map(|k| k.id.to_string()).collect();
    let recipients: Vec<String> = keys.iter().map(|k| k.to.to_string()).collect();
    let gone = client
        .execute(
            "DELETE FROM bounces b USING unnest($2::text[], $3::text[]) AS k(message_id, recipient)
             WHERE b.sender = $1 AND b.message_id = k.message_id AND b.recipient = k.recipient",
            &[&sender.as_str(), &ids, &recipients],
        )
        .await?;
    Ok(gone)
}

/// A bounce's names and id as stored, checked.
fn bounce_row(
    sender: String,
    id: String,
    to: String,
) -> Result<(AgentName, MessageId, Address), StorageError> {
    Ok((
        AgentName::from_stored(&sender).map_err(|_| corrupt("bounce", "sender"))?,
        MessageId::parse(&id).map_err(|_| corrupt("bounce", "message_id"))?,
        Address::parse(&to).map_err(|_| corrupt("bounce", "recipient"))?,
    ))
}

fn corrupt(row: &str, what: &str) -> StorageError {
    StorageError::Database(format!("a {row} row has an invalid {what}"))
}
