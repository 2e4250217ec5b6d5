//! The SQLite backend. One writer thread commits concurrent writes in batches (group commit:
//! one fsync for many sends); reads run on a small pool of read connections.

use std::path::Path;
use std::sync::{Arc, Mutex, mpsc};
use std::thread;
use std::time::Duration;

use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};
use tokio::sync::oneshot;

use super::{Accepted, Copy, Queued, Quota, Registration, Storage, StorageError};
use crate::protocol::{AgentName, MessageId, PublicKeys, Seq};

/// Writes taken into one transaction at most.
const MAX_BATCH: usize = 1024;
const READERS: usize = 4;

const SCHEMA: &str = r#"
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL) STRICT;
CREATE TABLE IF NOT EXISTS agents (
    name          TEXT PRIMARY KEY,
    signing       BLOB NOT NULL,
    sealing       BLOB NOT NULL,
    registered_at INTEGER NOT NULL
) STRICT;
CREATE TABLE IF NOT EXISTS queue (
    seq         INTEGER PRIMARY KEY AUTOINCREMENT,
    recipient   TEXT NOT NULL,
    sender      TEXT NOT NULL,
    message_id  TEXT NOT NULL,
    envelope    BLOB NOT NULL,
    accepted_at INTEGER NOT NULL,
    expires_at  INTEGER NOT NULL,
    UNIQUE (sender, message_id, recipient)
) STRICT;
CREATE INDEX IF NOT EXISTS queue_recipient ON queue(recipient, seq);
CREATE INDEX IF NOT EXISTS queue_expiry ON queue(expires_at);
-- Running totals per recipient, so a quota check never scans the queue.
CREATE TABLE IF NOT EXISTS queue_totals (
    recipient TEXT PRIMARY KEY,
    count     INTEGER NOT NULL,
    bytes     INTEGER NOT NULL
) STRICT;
"#;

enum Write {
    Register(
        AgentName,
        PublicKeys,
        oneshot::Sender<Result<Registration, StorageError>>,
    ),
    Accept(AcceptOp, oneshot::Sender<Result<Accepted, StorageError>>),
    Ack(AgentName, Seq, oneshot::Sender<Result<u64, StorageError>>),
    Expire(i64, oneshot::Sender<Result<u64, StorageError>>),
}

struct AcceptOp {
    sender: AgentName,
    id: MessageId,
    copies: Vec<Copy>,
    quota: Quota,
    expires_at_ms: i64,
}

/// SQLite-backed relay storage.
pub struct SqliteStorage {
    relay_id: String,
    writes: mpsc::Sender<Write>,
    readers: Arc<Mutex<Vec<Connection>>>,
}

fn open(path: &Path) -> Result<Connection, StorageError> {
    let conn = Connection::open(path)?;
    conn.busy_timeout(Duration::from_secs(10))?;
    let _: String = conn.query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))?;
    // FULL: `sent` means the envelope survives power loss.
    conn.pragma_update(None, "synchronous", "FULL")?;
    Ok(conn)
}

fn now_ms() -> i64 {
    jiff::Timestamp::now().as_millisecond()
}

impl SqliteStorage {
    /// Opens (creating) the database and starts the writer thread.
    pub fn open(path: &Path) -> Result<Self, StorageError> {
        let mut writer = open(path)?;
        let tx = writer.transaction_with_behavior(TransactionBehavior::Immediate)?;
        tx.execute_batch(SCHEMA)?;
        let existing: Option<String> = tx
            .query_row("SELECT value FROM meta WHERE key = 'relay_id'", [], |r| {
                r.get(0)
            })
            .optional()?;
        let relay_id = match existing {
            Some(id) => id,
            None => {
                let mut raw = [0u8; 8];
                getrandom::fill(&mut raw).map_err(|e| StorageError::Database(e.to_string()))?;
                let id = format!(
                    "relay-{}",
                    raw.iter().map(|b| format!("{b:02x}")).collect::<String>()
                );
                tx.execute(
                    "INSERT INTO meta (key, value) VALUES ('relay_id', ?1)",
                    [&id],
                )?;
                id
            }
        };
        tx.commit()?;
        let readers = (0..READERS)
            .map(|_| open(path))
            .collect::<Result<Vec<_>, _>>()?;
        let (writes, queue) = mpsc::channel();
        thread::Builder::new()
            .name("relay-writer".into())
            .spawn(move || writer_loop(writer, queue))
            .map_err(|e| StorageError::Database(e.to_string()))?;
        Ok(Self {
            relay_id,
            writes,
            readers: Arc::new(Mutex::new(readers)),
        })
    }

    async fn write<R>(
        &self,
        make: impl FnOnce(oneshot::Sender<Result<R, StorageError>>) -> Write,
    ) -> Result<R, StorageError> {
        let (tx, rx) = oneshot::channel();
        self.writes
            .send(make(tx))
            .map_err(|_| StorageError::Closed)?;
        rx.await.map_err(|_| StorageError::Closed)?
    }

    async fn read<R: Send + 'static>(
        &self,
        f: impl FnOnce(&Connection) -> Result<R, StorageError> + Send + 'static,
    ) -> Result<R, StorageError> {
        let readers = self.readers.clone();
        tokio::task::spawn_blocking(move || {
            let conn = readers.lock().map_err(|_| StorageError::Closed)?.pop();
            let conn = match conn {
                Some(c) => c,
                None => return Err(StorageError::Database("no free read connection".into())),
            };
            let result = f(&conn);
            if let Ok(mut pool) = readers.lock() {
                pool.push(conn);
            }
            result
        })
        .await
        .map_err(|_| StorageError::Closed)?
    }
}

fn writer_loop(mut conn: Connection, queue: mpsc::Receiver<Write>) {
    while let Ok(first) = queue.recv() {
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match queue.try_recv() {
                Ok(w) => batch.push(w),
                Err(_) => break,
            }
        }
        commit_batch(&mut conn, batch);
    }
}

enum Outcome {
    Registration(Registration),
    Accepted(Accepted),
    Count(u64),
}

fn apply(tx: &rusqlite::Transaction<'_>, write: &Write) -> Result<Outcome, StorageError> {
    Ok(match write {
        Write::Register(name, keys, _) => Outcome::Registration(register(tx, name, keys)?),
        Write::Accept(op, _) => Outcome::Accepted(accept(tx, op)?),
        Write::Ack(agent, upto, _) => Outcome::Count(ack(tx, agent, *upto)?),
        Write::Expire(now, _) => Outcome::Count(expire(tx, *now)?),
    })
}

/// Applies a batch in one transaction and answers every write only after the commit; if the
/// transaction fails, every write in it gets the error and nothing in it was stored.
fn commit_batch(conn: &mut Connection, batch: Vec<Write>) {
    let result = (|| -> Result<Vec<Outcome>, StorageError> {
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let outcomes = batch
            .iter()
            .map(|w| apply(&tx, w))
            .collect::<Result<Vec<_>, _>>()?;
        tx.commit()?;
        Ok(outcomes)
    })();
    match result {
        Ok(outcomes) => {
            for (write, outcome) in batch.into_iter().zip(outcomes) {
                match (write, outcome) {
                    (Write::Register(.., r), Outcome::Registration(v)) => drop(r.send(Ok(v))),
                    (Write::Accept(_, r), Outcome::Accepted(v)) => drop(r.send(Ok(v))),
                    (Write::Ack(.., r), Outcome::Count(v))
                    | (Write::Expire(_, r), Outcome::Count(v)) => drop(r.send(Ok(v))),
                    _ => unreachable!("apply answers each write with its own kind"),
                }
            }
        }
        Err(e) => {
            tracing::error!(error = %e, writes = batch.len(), "relay write batch failed; nothing in it was stored");
            let err = || StorageError::Database(e.to_string());
            for write in batch {
                match write {
                    Write::Register(.., r) => drop(r.send(Err(err()))),
                    Write::Accept(_, r) => drop(r.send(Err(err()))),
                    Write::Ack(.., r) | Write::Expire(_, r) => drop(r.send(Err(err()))),
                }
            }
        }
    }
}

fn register(
    tx: &rusqlite::Transaction<'_>,
    name: &AgentName,
    keys: &PublicKeys,
) -> Result<Registration, StorageError> {
    let existing: Option<(Vec<u8>, Vec<u8>)> = tx
        .query_row(
            "SELECT signing, sealing FROM agents WHERE name = ?1",
            [name.as_str()],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .optional()?;
    Ok(match existing {
        None => {
            tx.execute(
                "INSERT INTO agents (name, signing, sealing, registered_at) VALUES (?1, ?2, ?3, ?4)",
                params![name.as_str(), keys.signing.as_slice(), keys.sealing.as_slice(), now_ms()],
            )?;
            Registration::Created
        }
        Some((s, x)) if s == keys.signing && x == keys.sealing => Registration::Unchanged,
        Some(_) => Registration::NameTaken,
    })
}

fn accept(tx: &rusqlite::Transaction<'_>, op: &AcceptOp) -> Result<Accepted, StorageError> {
    let id = op.id.to_string();
    let mut fresh = Vec::with_capacity(op.copies.len());
    {
        let mut exists = tx.prepare_cached(
            "SELECT 1 FROM queue WHERE sender = ?1 AND message_id = ?2 AND recipient = ?3",
        )?;
        let mut totals =
            tx.prepare_cached("SELECT count, bytes FROM queue_totals WHERE recipient = ?1")?;
        for copy in &op.copies {
            // A copy acknowledged and deleted earlier is indistinguishable from a new one; the
            // client's store deduplicates by id, so a late re-send is still shown once.
            if exists.exists(params![op.sender.as_str(), id, copy.recipient.as_str()])? {
                continue;
            }
            let (count, bytes): (i64, i64) = totals
                .query_row([copy.recipient.as_str()], |r| Ok((r.get(0)?, r.get(1)?)))
                .optional()?
                .unwrap_or((0, 0));
            if count as u64 + 1 > op.quota.count
                || bytes as u64 + copy.envelope.len() as u64 > op.quota.bytes
            {
                return Ok(Accepted::QuotaFull(copy.recipient.clone()));
            }
            fresh.push(copy);
        }
    }
    if fresh.is_empty() {
        return Ok(Accepted::Duplicate);
    }
    let now = now_ms();
    let mut insert = tx.prepare_cached(
        "INSERT INTO queue (recipient, sender, message_id, envelope, accepted_at, expires_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
    )?;
    let mut total = tx.prepare_cached(
        "INSERT INTO queue_totals (recipient, count, bytes) VALUES (?1, 1, ?2)
         ON CONFLICT (recipient) DO UPDATE SET count = count + 1, bytes = bytes + excluded.bytes",
    )?;
    let mut recipients = Vec::with_capacity(fresh.len());
    for copy in fresh {
        insert.execute(params![
            copy.recipient.as_str(),
            op.sender.as_str(),
            id,
            copy.envelope,
            now,
            op.expires_at_ms
        ])?;
        total.execute(params![copy.recipient.as_str(), copy.envelope.len() as i64])?;
        recipients.push(copy.recipient.clone());
    }
    Ok(Accepted::Stored(recipients))
}

/// Deletes rows matching `filter` and keeps the per-recipient totals right.
fn delete_where(
    tx: &rusqlite::Transaction<'_>,
    filter: &str,
    args: &[&dyn rusqlite::ToSql],
) -> Result<u64, StorageError> {
    tx.execute(
        &format!(
            "UPDATE queue_totals SET
                count = count - (SELECT count(*) FROM queue q WHERE q.recipient = queue_totals.recipient AND {filter}),
                bytes = bytes - (SELECT coalesce(sum(length(q.envelope)), 0) FROM queue q WHERE q.recipient = queue_totals.recipient AND {filter})
             WHERE recipient IN (SELECT DISTINCT recipient FROM queue q WHERE {filter})"
        ),
        args,
    )?;
    Ok(tx.execute(&format!("DELETE FROM queue AS q WHERE {filter}"), args)? as u64)
}

fn ack(tx: &rusqlite::Transaction<'_>, agent: &AgentName, upto: Seq) -> Result<u64, StorageError> {
    delete_where(
        tx,
        "q.recipient = ?1 AND q.seq <= ?2",
        &[&agent.as_str(), &(upto as i64)],
    )
}

fn expire(tx: &rusqlite::Transaction<'_>, now: i64) -> Result<u64, StorageError> {
    delete_where(tx, "q.expires_at < ?1", &[&now])
}

impl Storage for SqliteStorage {
    fn relay_id(&self) -> &str {
        &self.relay_id
    }

    async fn register(
        &self,
        name: AgentName,
        keys: PublicKeys,
    ) -> Result<Registration, StorageError> {
        self.write(|r| Write::Register(name, keys, r)).await
    }

    async fn keys(&self, name: AgentName) -> Result<Option<PublicKeys>, StorageError> {
        self.read(move |conn| {
            let row: Option<(Vec<u8>, Vec<u8>)> = conn
                .prepare_cached("SELECT signing, sealing FROM agents WHERE name = ?1")?
                .query_row([name.as_str()], |r| Ok((r.get(0)?, r.get(1)?)))
                .optional()?;
            row.map(|(s, x)| {
                let bad =
                    |_| StorageError::Database(format!("stored keys of {name} are not 32 bytes"));
                Ok(PublicKeys {
                    signing: s.try_into().map_err(bad)?,
                    sealing: x.try_into().map_err(bad)?,
                })
            })
            .transpose()
        })
        .await
    }

    async fn accept(
        &self,
        sender: AgentName,
        id: MessageId,
        copies: Vec<Copy>,
        quota: Quota,
        expires_at_ms: i64,
    ) -> Result<Accepted, StorageError> {
        self.write(|r| {
            Write::Accept(
                AcceptOp {
                    sender,
                    id,
                    copies,
                    quota,
                    expires_at_ms,
                },
                r,
            )
        })
        .await
    }

    async fn pending(
        &self,
        agent: AgentName,
        after: Seq,
        limit: usize,
    ) -> Result<Vec<Queued>, StorageError> {
        self.read(move |conn| {
            let mut stmt = conn.prepare_cached(
                "SELECT seq, envelope, accepted_at FROM queue WHERE recipient = ?1 AND seq > ?2 ORDER BY seq LIMIT ?3",
            )?;
            let rows = stmt.query_map(params![agent.as_str(), after as i64, limit as i64], |r| {
                Ok(Queued { seq: r.get::<_, i64>(0)? as Seq, envelope: r.get(1)?, accepted_at_ms: r.get(2)? })
            })?;
            Ok(rows.collect::<Result<Vec<_>, _>>()?)
        })
        .await
    }

    async fn ack(&self, agent: AgentName, upto: Seq) -> Result<u64, StorageError> {
        self.write(|r| Write::Ack(agent, upto, r)).await
    }

    async fn waiting(&self, agent: AgentName) -> Result<u64, StorageError> {
        self.read(move |conn| {
            Ok(conn
                .prepare_cached("SELECT count FROM queue_totals WHERE recipient = ?1")?
                .query_row([agent.as_str()], |r| r.get::<_, i64>(0))
                .optional()?
                .unwrap_or(0) as u64)
        })
        .await
    }

    async fn expire(&self, now_ms: i64) -> Result<u64, StorageError> {
        self.write(|r| Write::Expire(now_ms, r)).await
    }
}
