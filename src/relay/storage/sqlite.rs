//! The SQLite backend. One writer thread commits concurrent writes in batches (group commit:
//! one fsync for many sends); reads run on a small pool of read connections.

use std::collections::VecDeque;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, mpsc};
use std::thread;
use std::time::{Duration, Instant};

use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};
use tokio::sync::oneshot;

use super::{
    Accepted, CommitListener, Committed, ConsentChange, ConsentOutcome, ConsentState, Copy,
    Pending, Queued, Quota, Registration, Storage, StorageError,
};
use crate::protocol::{AgentName, MessageId, Policy, PublicKeys, RequestCode, RequestView, Seq};

/// Writes taken into one transaction at most.
const MAX_BATCH: usize = 1024;
const READERS: usize = 4;
/// How often acknowledged rows are deleted, inside the next batch's transaction.
const PURGE_EVERY: Duration = Duration::from_millis(100);
/// Acknowledged rows are deleted once everything stored around them is this old, when nearly
/// all of it is acknowledged too: then a purge frees whole table pages in sequence order.
/// Deleting the rows of each ack as it came (64 rows of one recipient lie on 64 pages among
/// everyone else's) made purges of 17–50 ms at 5,000 messages/s.
const PURGE_LAG: Duration = Duration::from_secs(2);
/// Rows one batch deletes at most; the next batch goes on if there were more.
const PURGE_ROWS: usize = 1024;
/// How often the WAL is checkpointed.
const CHECKPOINT_EVERY: Duration = Duration::from_millis(500);
/// Database page size for new relay databases. A batch writes every page it touched to the
/// WAL, one frame at a time; at 4 KiB a busy batch spent a third of the writer's time on
/// frame writes, and 16 KiB pages cut flat-out CPU per message by a fifth.
const PAGE_SIZE: i64 = 16 * 1024;
/// The writer's page cache, in KiB. SQLite's default 2 MiB is smaller than one busy batch:
/// it spilled dirty pages to the WAL mid-transaction and read them back.
const WRITER_CACHE_KIB: i64 = 64 * 1024;
/// WAL bytes kept on disk after the WAL restarts.
const WAL_KEEP_BYTES: i64 = 64 * 1024 * 1024;

/// Schema versions, applied in order and tracked in `user_version`; never edit a shipped one.
const MIGRATIONS: &[&str] = &[
    r#"
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL) STRICT;
CREATE TABLE agents (
    name          TEXT PRIMARY KEY,
    signing       BLOB NOT NULL,
    sealing       BLOB NOT NULL,
    registered_at INTEGER NOT NULL,
    policy        TEXT CHECK (policy IN ('open', 'contacts', 'closed')),
    -- Present when the agent opted in to the public directory.
    listing       TEXT
) STRICT;
CREATE TABLE queue (
    seq         INTEGER PRIMARY KEY AUTOINCREMENT,
    recipient   TEXT NOT NULL,
    sender      TEXT NOT NULL,
    message_id  TEXT NOT NULL,
    envelope    BLOB NOT NULL,
    size        INTEGER NOT NULL,
    accepted_at INTEGER NOT NULL,
    expires_at  INTEGER NOT NULL,
    UNIQUE (sender, message_id, recipient)
) STRICT;
CREATE INDEX queue_recipient ON queue(recipient, seq);
CREATE INDEX queue_expiry ON queue(expires_at);
-- Running totals per recipient, so a quota check never scans the queue.
CREATE TABLE queue_totals (
    recipient TEXT PRIMARY KEY,
    count     INTEGER NOT NULL,
    bytes     INTEGER NOT NULL
) STRICT;
CREATE TABLE contact_requests (
    requester  TEXT NOT NULL,
    target     TEXT NOT NULL,
    note       TEXT NOT NULL,
    code       TEXT NOT NULL,
    expires_at INTEGER NOT NULL,
    PRIMARY KEY (requester, target)
) STRICT;
CREATE INDEX contact_requests_target ON contact_requests(target, code);
-- owner -> peer: 'contact' (stored both ways) or 'blocked' (one way).
CREATE TABLE relations (
    owner TEXT NOT NULL,
    peer  TEXT NOT NULL,
    kind  TEXT NOT NULL CHECK (kind IN ('contact', 'blocked')),
    since INTEGER NOT NULL,
    PRIMARY KEY (owner, peer)
) STRICT;
"#,
    r#"
-- Acknowledged up to this sequence number: rows at or below it are no longer the recipient's
-- (not counted, never delivered) and the writer deletes them in bulk (see `PURGE_EVERY`).
ALTER TABLE queue_totals ADD COLUMN acked INTEGER NOT NULL DEFAULT 0;
"#,
    r#"
-- The duplicate check's key leads with the message id: ids are time-ordered (UUIDv7), so new
-- entries land at one end of the index instead of in every sender's range, and a busy batch
-- rewrites a few index pages instead of one per sender.
CREATE TABLE queue_v3 (
    seq         INTEGER PRIMARY KEY AUTOINCREMENT,
    recipient   TEXT NOT NULL,
    sender      TEXT NOT NULL,
    message_id  TEXT NOT NULL,
    envelope    BLOB NOT NULL,
    size        INTEGER NOT NULL,
    accepted_at INTEGER NOT NULL,
    expires_at  INTEGER NOT NULL,
    UNIQUE (message_id, sender, recipient)
) STRICT;
INSERT INTO queue_v3 (seq, recipient, sender, message_id, envelope, size, accepted_at, expires_at)
    SELECT seq, recipient, sender, message_id, envelope, size, accepted_at, expires_at FROM queue;
-- Sequence numbers are never reused: the counter carries over, past rows already purged.
DELETE FROM sqlite_sequence WHERE name = 'queue_v3';
INSERT INTO sqlite_sequence (name, seq) SELECT 'queue_v3', seq FROM sqlite_sequence WHERE name = 'queue';
DROP TABLE queue;
ALTER TABLE queue_v3 RENAME TO queue;
CREATE INDEX queue_recipient ON queue(recipient, seq);
CREATE INDEX queue_expiry ON queue(expires_at);
"#,
];

/// One write for the writer thread: applied inside the batch's transaction, answered after
/// the commit (or with the commit's error).
trait WriteOp: Send {
    fn apply(
        &mut self,
        tx: &rusqlite::Transaction<'_>,
        log: &mut Vec<Committed>,
    ) -> Result<(), StorageError>;
    fn finish(self: Box<Self>, committed: Result<(), &StorageError>);
}

struct Op<T, F> {
    run: Option<F>,
    value: Option<T>,
    reply: oneshot::Sender<Result<T, StorageError>>,
}

impl<T, F> WriteOp for Op<T, F>
where
    T: Send,
    F: FnOnce(&rusqlite::Transaction<'_>, &mut Vec<Committed>) -> Result<T, StorageError> + Send,
{
    fn apply(
        &mut self,
        tx: &rusqlite::Transaction<'_>,
        log: &mut Vec<Committed>,
    ) -> Result<(), StorageError> {
        if let Some(run) = self.run.take() {
            self.value = Some(run(tx, log)?);
        }
        Ok(())
    }

    fn finish(self: Box<Self>, committed: Result<(), &StorageError>) {
        let answer = match (committed, self.value) {
            (Ok(()), Some(v)) => Ok(v),
            (Err(e), _) => Err(StorageError::Database(e.to_string())),
            (Ok(()), None) => Err(StorageError::Database("the write was not applied".into())),
        };
        let _ = self.reply.send(answer);
    }
}

struct AcceptOp {
    sender: AgentName,
    id: MessageId,
    copies: Vec<Copy>,
    quota: Quota,
    expires_at_ms: i64,
    default: Policy,
}

/// SQLite-backed relay storage.
pub struct SqliteStorage {
    relay_id: String,
    writes: mpsc::Sender<Box<dyn WriteOp>>,
    readers: Arc<Mutex<Vec<Connection>>>,
    /// One permit per read connection: a reader waits here, never finds the pool empty.
    free_readers: Arc<tokio::sync::Semaphore>,
    /// Dropped with the storage, which tells the checkpoint thread to stop.
    _alive: Arc<()>,
    /// Told about every commit's new copies, by the writer thread.
    listener: Arc<OnceLock<CommitListener>>,
}

fn open(path: &Path) -> Result<Connection, StorageError> {
    let conn = Connection::open(path)?;
    conn.busy_timeout(Duration::from_secs(10))?;
    // Only takes effect on a new database (before its first table).
    conn.pragma_update(None, "page_size", PAGE_SIZE)?;
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
        let version = tx.query_row("PRAGMA user_version", [], |r| r.get::<_, i64>(0))? as usize;
        if version > MIGRATIONS.len() {
            return Err(StorageError::Database(format!(
                "the relay database has schema {version}, newer than this build's {}; upgrade mailslot",
                MIGRATIONS.len()
            )));
        }
        for sql in &MIGRATIONS[version..] {
            tx.execute_batch(sql)?;
        }
        tx.pragma_update(None, "user_version", MIGRATIONS.len() as i64)?;
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
        // Checkpoints move the WAL into the database file with an fsync of their own; done by
        // the committing writer they would stall every send behind them, so a separate thread
        // does them without blocking writers.
        writer.pragma_update(None, "wal_autocheckpoint", 0)?;
        writer.pragma_update(None, "cache_size", -WRITER_CACHE_KIB)?;
        // A restarted WAL is truncated to this, so one burst does not hold its disk space.
        writer.pragma_update(None, "journal_size_limit", WAL_KEEP_BYTES)?;
        let checkpointer = open(path)?;
        let (writes, queue) = mpsc::channel();
        let listener: Arc<OnceLock<CommitListener>> = Arc::new(OnceLock::new());
        let finish = Arc::new(AtomicBool::new(false));
        thread::Builder::new()
            .name("relay-writer".into())
            .spawn({
                let listener = listener.clone();
                let finish = finish.clone();
                move || writer_loop(writer, queue, listener, finish)
            })
            .map_err(|e| StorageError::Database(e.to_string()))?;
        let alive_marker = Arc::new(());
        let alive = Arc::downgrade(&alive_marker);
        thread::Builder::new()
            .name("relay-checkpoint".into())
            .spawn(move || checkpoint_loop(checkpointer, alive, finish))
            .map_err(|e| StorageError::Database(e.to_string()))?;
        Ok(Self {
            relay_id,
            writes,
            readers: Arc::new(Mutex::new(readers)),
            free_readers: Arc::new(tokio::sync::Semaphore::new(READERS)),
            _alive: alive_marker,
            listener,
        })
    }

    /// Queues a write for the writer thread now; the result arrives after its batch commits.
    fn enqueue<T: Send + 'static>(
        &self,
        run: impl FnOnce(&rusqlite::Transaction<'_>, &mut Vec<Committed>) -> Result<T, StorageError>
        + Send
        + 'static,
    ) -> Pending<T> {
        let (reply, answer) = oneshot::channel();
        let queued = self.writes.send(Box::new(Op {
            run: Some(run),
            value: None,
            reply,
        }));
        Box::pin(async move {
            queued.map_err(|_| StorageError::Closed)?;
            answer.await.map_err(|_| StorageError::Closed)?
        })
    }

    async fn write<T: Send + 'static>(
        &self,
        run: impl FnOnce(&rusqlite::Transaction<'_>) -> Result<T, StorageError> + Send + 'static,
    ) -> Result<T, StorageError> {
        self.enqueue(move |tx, _| run(tx)).await
    }

    async fn read<R: Send + 'static>(
        &self,
        f: impl FnOnce(&Connection) -> Result<R, StorageError> + Send + 'static,
    ) -> Result<R, StorageError> {
        let permit = self
            .free_readers
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| StorageError::Closed)?;
        let readers = self.readers.clone();
        tokio::task::spawn_blocking(move || {
            let conn = readers.lock().map_err(|_| StorageError::Closed)?.pop();
            let Some(conn) = conn else {
                return Err(StorageError::Database(
                    "read pool out of step with its permits".into(),
                ));
            };
            let result = f(&conn);
            if let Ok(mut pool) = readers.lock() {
                pool.push(conn);
            }
            drop(permit);
            result
        })
        .await
        .map_err(|_| StorageError::Closed)?
    }
}

/// Checkpoints the WAL every so often (PASSIVE: never waits for writers or readers) until the
/// storage is dropped. When it copied every frame it saw, it asks the writer to finish.
fn checkpoint_loop(conn: Connection, alive: std::sync::Weak<()>, finish: Arc<AtomicBool>) {
    while alive.upgrade().is_some() {
        std::thread::sleep(CHECKPOINT_EVERY);
        match conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| {
            Ok((r.get::<_, i64>(1)?, r.get::<_, i64>(2)?))
        }) {
            Ok((frames, copied)) if frames > 0 && copied == frames => {
                finish.store(true, Ordering::Release);
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "WAL checkpoint failed; will retry"),
        }
    }
}

fn writer_loop(
    mut conn: Connection,
    queue: mpsc::Receiver<Box<dyn WriteOp>>,
    listener: Arc<OnceLock<CommitListener>>,
    finish: Arc<AtomicBool>,
) {
    let mut purger = Purger::default();
    while let Ok(first) = queue.recv() {
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match queue.try_recv() {
                Ok(w) => batch.push(w),
                Err(_) => break,
            }
        }
        commit_batch(&mut conn, batch, &listener, &mut purger);
        // Under steady load new frames arrive during every background checkpoint, so it never
        // catches up and the WAL only grows (385 MB after 20,000 messages). Between batches the
        // writer copies the few frames left; its next transaction then restarts the WAL.
        if finish.swap(false, Ordering::AcqRel)
            && let Err(e) = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(()))
        {
            tracing::warn!(error = %e, "WAL checkpoint failed; will retry");
        }
    }
}

/// Applies a batch in one transaction and answers every write only after the commit; if the
/// transaction fails, every write in it gets the error and nothing in it was stored.
fn commit_batch(
    conn: &mut Connection,
    mut batch: Vec<Box<dyn WriteOp>>,
    listener: &OnceLock<CommitListener>,
    purger: &mut Purger,
) {
    let mut log = Vec::new();
    let mut purged = None;
    let result = (|| -> Result<(), StorageError> {
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        if let Some(horizon) = purger.due(Instant::now()) {
            purged = Some(purge(&tx, horizon, PURGE_ROWS)?);
        }
        for op in &mut batch {
            op.apply(&tx, &mut log)?;
        }
        tx.commit()?;
        Ok(())
    })();
    if result.is_ok() {
        purger.committed(Instant::now(), log.last().map(|c| c.seq), purged);
    }
    match &result {
        Ok(()) if !log.is_empty() => {
            if let Some(listen) = listener.get() {
                listen(log);
            }
        }
        Ok(()) => {}
        Err(e) => {
            tracing::error!(error = %e, writes = batch.len(), "relay write batch failed; nothing in it was stored")
        }
    }
    for op in batch {
        op.finish(result.as_ref().map(|_| ()));
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

fn accept(
    tx: &rusqlite::Transaction<'_>,
    op: &AcceptOp,
    log: &mut Vec<Committed>,
) -> Result<Accepted, StorageError> {
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
            if copy.recipient != op.sender && !allows(tx, &op.sender, &copy.recipient, op.default)?
            {
                return Ok(Accepted::NotAllowed(copy.recipient.clone()));
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
        "INSERT INTO queue (recipient, sender, message_id, envelope, size, accepted_at, expires_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
    )?;
    let mut total = tx.prepare_cached(
        "INSERT INTO queue_totals (recipient, count, bytes) VALUES (?1, 1, ?2)
         ON CONFLICT (recipient) DO UPDATE SET count = count + 1, bytes = bytes + excluded.bytes",
    )?;
    let mut recipients = Vec::with_capacity(fresh.len());
    for copy in fresh {
        let size = copy.envelope.len() as i64;
        insert.execute(params![
            copy.recipient.as_str(),
            op.sender.as_str(),
            id,
            &copy.envelope[..],
            size,
            now,
            op.expires_at_ms
        ])?;
        let seq = tx.last_insert_rowid() as Seq;
        total.execute(params![copy.recipient.as_str(), size])?;
        recipients.push(copy.recipient.clone());
        log.push(Committed {
            recipient: copy.recipient.clone(),
            seq,
            envelope: copy.envelope.clone(),
            accepted_at_ms: now,
        });
    }
    Ok(Accepted::Stored(recipients))
}

/// Whether `recipient` accepts mail from `sender`: blocks always refuse; contacts pass unless
/// the recipient is closed; anyone else passes only an open policy.
fn allows(
    tx: &rusqlite::Transaction<'_>,
    sender: &AgentName,
    recipient: &AgentName,
    default: Policy,
) -> Result<bool, StorageError> {
    let (policy, kind): (Option<String>, Option<String>) = tx
        .prepare_cached("SELECT a.policy, (SELECT kind FROM relations WHERE owner = a.name AND peer = ?2) FROM agents a WHERE a.name = ?1")?
        .query_row([recipient.as_str(), sender.as_str()], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()?
        .unwrap_or((None, None));
    let policy = policy.and_then(|p| p.parse().ok()).unwrap_or(default);
    Ok(match kind.as_deref() {
        Some("blocked") => false,
        Some("contact") => policy != Policy::Closed,
        _ => policy == Policy::Open,
    })
}

/// Records a cumulative ack and keeps the recipient's totals right. The rows stay until the
/// writer's next purge: deleting them here, 64 rows spread over as many table pages among
/// other recipients' mail, made every ack rewrite ~150 pages and half the WAL volume.
fn ack(tx: &rusqlite::Transaction<'_>, agent: &AgentName, upto: Seq) -> Result<u64, StorageError> {
    let (count, bytes): (i64, i64) = tx
        .prepare_cached(
            "SELECT count(*), coalesce(sum(size), 0) FROM queue WHERE recipient = ?1 AND seq <= ?2
             AND seq > coalesce((SELECT acked FROM queue_totals WHERE recipient = ?1), 0)",
        )?
        .query_row(params![agent.as_str(), upto as i64], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })?;
    if count == 0 {
        return Ok(0);
    }
    tx.prepare_cached(
        "UPDATE queue_totals SET count = count - ?2, bytes = bytes - ?3, acked = max(acked, ?4) WHERE recipient = ?1",
    )?
    .execute(params![agent.as_str(), count, bytes, upto as i64])?;
    Ok(count as u64)
}

/// When the writer deletes acknowledged rows, and up to where (see [`PURGE_LAG`]).
#[derive(Default)]
struct Purger {
    /// The highest sequence number stored, sampled every [`PURGE_EVERY`], oldest first.
    marks: VecDeque<(Instant, Seq)>,
    /// Rows at or below this may be deleted once acknowledged.
    horizon: Seq,
    last: Option<Instant>,
    /// The last purge stopped at its row limit.
    more: bool,
}

impl Purger {
    /// The horizon, if a batch starting `now` should purge.
    fn due(&mut self, now: Instant) -> Option<Seq> {
        while let Some(&(at, seq)) = self.marks.front()
            && now.duration_since(at) >= PURGE_LAG
        {
            self.horizon = seq;
            self.marks.pop_front();
        }
        let waited = self
            .last
            .is_none_or(|t| now.duration_since(t) >= PURGE_EVERY);
        (self.horizon > 0 && (self.more || waited)).then_some(self.horizon)
    }

    /// Records a commit: the highest sequence number it stored, and how many rows its purge
    /// deleted, if it purged.
    fn committed(&mut self, now: Instant, stored: Option<Seq>, purged: Option<usize>) {
        if let Some(rows) = purged {
            self.last = Some(now);
            self.more = rows >= PURGE_ROWS;
        }
        if let Some(seq) = stored
            && self
                .marks
                .back()
                .is_none_or(|(at, _)| now.duration_since(*at) >= PURGE_EVERY)
        {
            self.marks.push_back((now, seq));
        }
    }
}

/// Deletes up to `limit` acknowledged rows at or below `horizon`; returns how many.
fn purge(
    tx: &rusqlite::Transaction<'_>,
    horizon: Seq,
    limit: usize,
) -> Result<usize, StorageError> {
    Ok(tx
        .prepare_cached(
            "DELETE FROM queue WHERE seq IN
             (SELECT q.seq FROM queue_totals t
              JOIN queue q ON q.recipient = t.recipient AND q.seq <= min(t.acked, ?1) LIMIT ?2)",
        )?
        .execute(params![horizon as i64, limit as i64])?)
}

/// Removes envelopes past their TTL and keeps every recipient's totals right.
fn expire(tx: &rusqlite::Transaction<'_>, now: i64) -> Result<u64, StorageError> {
    let expired: Vec<(String, i64, i64)> = tx
        .prepare_cached(
            "SELECT q.recipient, count(*), sum(q.size) FROM queue q LEFT JOIN queue_totals t ON t.recipient = q.recipient
             WHERE q.expires_at < ?1 AND q.seq > coalesce(t.acked, 0) GROUP BY q.recipient",
        )?
        .query_map([now], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
        .collect::<Result<_, _>>()?;
    let mut total = 0;
    for (recipient, count, bytes) in expired {
        tx.prepare_cached(
            "UPDATE queue_totals SET count = count - ?2, bytes = bytes - ?3 WHERE recipient = ?1",
        )?
        .execute(params![recipient, count, bytes])?;
        total += count as u64;
    }
    tx.prepare_cached("DELETE FROM queue WHERE expires_at < ?1")?
        .execute([now])?;
    Ok(total)
}

fn relation(
    tx: &rusqlite::Transaction<'_>,
    owner: &AgentName,
    peer: &AgentName,
) -> Result<Option<String>, StorageError> {
    Ok(tx
        .query_row(
            "SELECT kind FROM relations WHERE owner = ?1 AND peer = ?2",
            [owner.as_str(), peer.as_str()],
            |r| r.get(0),
        )
        .optional()?)
}

fn consent(
    tx: &rusqlite::Transaction<'_>,
    change: &ConsentChange,
) -> Result<ConsentOutcome, StorageError> {
    let now = now_ms();
    tx.execute("DELETE FROM contact_requests WHERE expires_at < ?1", [now])?;
    let add_contacts = |a: &AgentName, b: &AgentName| -> Result<(), StorageError> {
        for (owner, peer) in [(a, b), (b, a)] {
            tx.execute(
                "INSERT INTO relations (owner, peer, kind, since) VALUES (?1, ?2, 'contact', ?3)
                 ON CONFLICT (owner, peer) DO UPDATE SET kind = 'contact', since = excluded.since
                 WHERE relations.kind != 'blocked'",
                params![owner.as_str(), peer.as_str(), now],
            )?;
        }
        Ok(())
    };
    Ok(match change {
        ConsentChange::Request {
            from,
            to,
            note,
            code,
            expires_at_ms,
            max_pending,
        } => {
            let policy: Option<String> = tx
                .query_row(
                    "SELECT policy FROM agents WHERE name = ?1",
                    [to.as_str()],
                    |r| r.get(0),
                )
                .optional()?
                .flatten();
            if relation(tx, to, from)?.as_deref() == Some("blocked")
                || policy.as_deref() == Some("closed")
            {
                return Ok(ConsentOutcome::NotAllowed);
            }
            if relation(tx, from, to)?.as_deref() == Some("contact") {
                return Ok(ConsentOutcome::AlreadyContacts);
            }
            let pending: u32 = tx.query_row(
                "SELECT count(*) FROM contact_requests WHERE requester = ?1 AND target != ?2",
                [from.as_str(), to.as_str()],
                |r| r.get(0),
            )?;
            if pending >= *max_pending {
                return Ok(ConsentOutcome::TooManyPending);
            }
            // Asking again replaces the earlier request (new code, new expiry).
            tx.execute(
                "INSERT INTO contact_requests (requester, target, note, code, expires_at) VALUES (?1, ?2, ?3, ?4, ?5)
                 ON CONFLICT (requester, target) DO UPDATE SET note = excluded.note, code = excluded.code, expires_at = excluded.expires_at",
                params![from.as_str(), to.as_str(), note, code.as_str(), expires_at_ms],
            )?;
            ConsentOutcome::Applied(None)
        }
        ConsentChange::Approve {
            target,
            requester,
            code,
        } => {
            let n = tx.execute(
                "DELETE FROM contact_requests WHERE target = ?1 AND requester = ?2 AND code = ?3",
                [target.as_str(), requester.as_str(), code.as_str()],
            )?;
            if n == 0 {
                return Ok(ConsentOutcome::NoSuchRequest);
            }
            add_contacts(target, requester)?;
            ConsentOutcome::Applied(Some(requester.clone()))
        }
        ConsentChange::Deny { target, requester } => {
            let n = tx.execute(
                "DELETE FROM contact_requests WHERE requester = ?1 AND target = ?2",
                [requester.as_str(), target.as_str()],
            )?;
            changed(n, Some(requester.clone()))
        }
        ConsentChange::Block { owner, peer } => {
            tx.execute(
                "DELETE FROM contact_requests WHERE (requester = ?1 AND target = ?2) OR (requester = ?2 AND target = ?1)",
                [owner.as_str(), peer.as_str()],
            )?;
            tx.execute(
                "DELETE FROM relations WHERE owner = ?1 AND peer = ?2 AND kind = 'contact'",
                [peer.as_str(), owner.as_str()],
            )?;
            tx.execute(
                "INSERT INTO relations (owner, peer, kind, since) VALUES (?1, ?2, 'blocked', ?3)
                 ON CONFLICT (owner, peer) DO UPDATE SET kind = 'blocked', since = excluded.since",
                params![owner.as_str(), peer.as_str(), now],
            )?;
            ConsentOutcome::Applied(None)
        }
        ConsentChange::Unblock { owner, peer } => {
            let n = tx.execute(
                "DELETE FROM relations WHERE owner = ?1 AND peer = ?2 AND kind = 'blocked'",
                [owner.as_str(), peer.as_str()],
            )?;
            changed(n, None)
        }
        ConsentChange::Remove { owner, peer } => {
            let n = tx.execute(
                "DELETE FROM relations WHERE kind = 'contact' AND ((owner = ?1 AND peer = ?2) OR (owner = ?2 AND peer = ?1))",
                [owner.as_str(), peer.as_str()],
            )?;
            changed(n, None)
        }
        ConsentChange::SetPolicy { owner, policy } => {
            tx.execute(
                "UPDATE agents SET policy = ?2 WHERE name = ?1",
                [owner.as_str(), policy.as_str()],
            )?;
            ConsentOutcome::Applied(None)
        }
    })
}

/// `Applied` when a statement changed rows, `NoSuchRequest` when there was nothing to change.
fn changed(rows: usize, requester: Option<AgentName>) -> ConsentOutcome {
    if rows == 0 {
        ConsentOutcome::NoSuchRequest
    } else {
        ConsentOutcome::Applied(requester)
    }
}

fn names(conn: &Connection, sql: &str, agent: &AgentName) -> Result<Vec<AgentName>, StorageError> {
    let mut stmt = conn.prepare_cached(sql)?;
    let rows = stmt.query_map([agent.as_str()], |r| r.get::<_, String>(0))?;
    rows.map(|r| AgentName::new(&r?).map_err(|e| StorageError::Database(e.to_string())))
        .collect()
}

fn requests(
    conn: &Connection,
    sql: &str,
    agent: &AgentName,
    now: i64,
    with_code: bool,
) -> Result<Vec<RequestView>, StorageError> {
    let mut stmt = conn.prepare_cached(sql)?;
    let rows = stmt.query_map(params![agent.as_str(), now], |r| {
        Ok((
            r.get::<_, String>(0)?,
            r.get::<_, String>(1)?,
            r.get::<_, String>(2)?,
            r.get::<_, i64>(3)?,
        ))
    })?;
    rows.map(|row| {
        let (other, note, code, expires) = row?;
        let bad = |e: String| StorageError::Database(e);
        Ok(RequestView {
            agent: AgentName::new(&other).map_err(|e| bad(e.to_string()))?,
            note,
            expires_at: jiff::Timestamp::from_millisecond(expires)
                .map_err(|e| bad(e.to_string()))?,
            code: if with_code {
                Some(RequestCode::parse(&code).map_err(|e| bad(e.to_string()))?)
            } else {
                None
            },
        })
    })
    .collect()
}

impl Storage for SqliteStorage {
    fn relay_id(&self) -> &str {
        &self.relay_id
    }

    fn on_commit(&self, listener: CommitListener) {
        let _ = self.listener.set(listener);
    }

    async fn register(
        &self,
        name: AgentName,
        keys: PublicKeys,
    ) -> Result<Registration, StorageError> {
        self.write(move |tx| register(tx, &name, &keys)).await
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

    fn accept(
        &self,
        sender: AgentName,
        id: MessageId,
        copies: Vec<Copy>,
        quota: Quota,
        expires_at_ms: i64,
        default: Policy,
    ) -> Pending<Accepted> {
        let op = AcceptOp {
            sender,
            id,
            copies,
            quota,
            expires_at_ms,
            default,
        };
        self.enqueue(move |tx, log| accept(tx, &op, log))
    }

    async fn pending(
        &self,
        agent: AgentName,
        after: Seq,
        limit: usize,
    ) -> Result<Vec<Queued>, StorageError> {
        self.read(move |conn| {
            let mut stmt = conn.prepare_cached(
                "SELECT seq, envelope, accepted_at FROM queue WHERE recipient = ?1
                 AND seq > max(?2, coalesce((SELECT acked FROM queue_totals WHERE recipient = ?1), 0))
                 ORDER BY seq LIMIT ?3",
            )?;
            let rows = stmt.query_map(params![agent.as_str(), after as i64, limit as i64], |r| {
                Ok(Queued { seq: r.get::<_, i64>(0)? as Seq, envelope: r.get(1)?, accepted_at_ms: r.get(2)? })
            })?;
            Ok(rows.collect::<Result<Vec<_>, _>>()?)
        })
        .await
    }

    async fn ack(&self, agent: AgentName, upto: Seq) -> Result<u64, StorageError> {
        self.write(move |tx| ack(tx, &agent, upto)).await
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
        self.write(move |tx| expire(tx, now_ms)).await
    }

    async fn consent(&self, change: ConsentChange) -> Result<ConsentOutcome, StorageError> {
        self.write(move |tx| consent(tx, &change)).await
    }

    async fn consent_state(
        &self,
        agent: AgentName,
        now_ms: i64,
    ) -> Result<ConsentState, StorageError> {
        self.read(move |conn| {
            let policy: Option<String> = conn
                .prepare_cached("SELECT policy FROM agents WHERE name = ?1")?
                .query_row([agent.as_str()], |r| r.get(0))
                .optional()?
                .flatten();
            Ok(ConsentState {
                policy: policy.and_then(|p| p.parse().ok()),
                incoming: requests(
                    conn,
                    "SELECT requester, note, code, expires_at FROM contact_requests WHERE target = ?1 AND expires_at >= ?2 ORDER BY expires_at",
                    &agent,
                    now_ms,
                    false,
                )?,
                outgoing: requests(
                    conn,
                    "SELECT target, note, code, expires_at FROM contact_requests WHERE requester = ?1 AND expires_at >= ?2 ORDER BY expires_at",
                    &agent,
                    now_ms,
                    true,
                )?,
                contacts: names(conn, "SELECT peer FROM relations WHERE owner = ?1 AND kind = 'contact' ORDER BY peer", &agent)?,
                blocked: names(conn, "SELECT peer FROM relations WHERE owner = ?1 AND kind = 'blocked' ORDER BY peer", &agent)?,
            })
        })
        .await
    }

    async fn set_listing(
        &self,
        agent: AgentName,
        description: Option<String>,
    ) -> Result<(), StorageError> {
        self.write(move |tx| {
            tx.execute(
                "UPDATE agents SET listing = ?2 WHERE name = ?1",
                params![agent.as_str(), description],
            )?;
            Ok(())
        })
        .await
    }

    async fn directory(
        &self,
        limit: usize,
    ) -> Result<Vec<(AgentName, PublicKeys, String)>, StorageError> {
        self.read(move |conn| {
            let mut stmt = conn.prepare_cached("SELECT name, signing, sealing, listing FROM agents WHERE listing IS NOT NULL ORDER BY name LIMIT ?1")?;
            let rows = stmt.query_map([limit as i64], |r| {
                Ok((r.get::<_, String>(0)?, r.get::<_, Vec<u8>>(1)?, r.get::<_, Vec<u8>>(2)?, r.get::<_, String>(3)?))
            })?;
            rows.map(|row| {
                let (name, signing, sealing, listing) = row?;
                let bad = |what: &str| StorageError::Database(format!("stored {what} of {name} is invalid"));
                let keys = PublicKeys {
                    signing: signing.try_into().map_err(|_| bad("signing key"))?,
                    sealing: sealing.try_into().map_err(|_| bad("sealing key"))?,
                };
                Ok((AgentName::new(&name).map_err(|_| bad("name"))?, keys, listing))
            })
            .collect()
        })
        .await
    }

    async fn total_waiting(&self) -> Result<u64, StorageError> {
        self.read(|conn| {
            Ok(conn.query_row(
                "SELECT coalesce(sum(count), 0) FROM queue_totals",
                [],
                |r| r.get::<_, i64>(0),
            )? as u64)
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_database_gets_the_large_page_size() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("relay.db");
        let storage = SqliteStorage::open(&path).unwrap();
        drop(storage);
        let conn = Connection::open(&path).unwrap();
        let size: i64 = conn
            .query_row("PRAGMA page_size", [], |r| r.get(0))
            .unwrap();
        assert_eq!(size, PAGE_SIZE);
    }

    #[test]
    fn purges_wait_for_the_lag_and_go_on_while_rows_remain() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let mut p = Purger::default();
        p.committed(at(0), Some(10), None);
        assert_eq!(p.due(at(1000)), None, "nothing is old enough yet");
        p.committed(at(1000), Some(20), None);
        assert_eq!(
            p.due(at(2000)),
            Some(10),
            "rows stored by 0 s, once 2 s old"
        );
        p.committed(at(2000), Some(30), Some(5));
        assert_eq!(p.due(at(2050)), None, "purged 50 ms ago, all of it");
        assert_eq!(p.due(at(2100)), Some(10));
        p.committed(at(2100), None, Some(PURGE_ROWS));
        assert_eq!(
            p.due(at(2110)),
            Some(10),
            "the limit stopped it: go on at once"
        );
        p.committed(at(2110), None, Some(0));
        assert_eq!(
            p.due(at(3000)),
            Some(20),
            "the horizon moves with the marks"
        );
    }

    fn name(n: &str) -> AgentName {
        AgentName::new(n).unwrap()
    }

    #[tokio::test]
    async fn migrating_the_queue_keeps_its_mail_duplicates_and_sequence() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("relay.db");
        let (kept, purged_up_to) = (MessageId::new(), 50);
        {
            // A database as schema 2 left it: one queued copy, and a counter past rows that
            // were delivered, acknowledged and purged.
            let conn = Connection::open(&path).unwrap();
            for sql in &MIGRATIONS[..2] {
                conn.execute_batch(sql).unwrap();
            }
            conn.execute_batch(&format!(
                "PRAGMA user_version = 2;
                 INSERT INTO queue (seq, recipient, sender, message_id, envelope, size, accepted_at, expires_at)
                     VALUES (7, 'bob', 'alice', '{kept}', X'7B7D', 2, 0, 9000000000000);
                 UPDATE sqlite_sequence SET seq = {purged_up_to} WHERE name = 'queue';
                 INSERT INTO queue_totals (recipient, count, bytes) VALUES ('bob', 1, 2);"
            ))
            .unwrap();
        }
        let storage = SqliteStorage::open(&path).unwrap();
        let copy = || {
            vec![Copy {
                recipient: name("bob"),
                envelope: Arc::from(&b"{}"[..]),
            }]
        };
        let quota = Quota {
            count: 100,
            bytes: 1 << 20,
        };
        let accept = |id| {
            storage.accept(
                name("alice"),
                id,
                copy(),
                quota,
                9_000_000_000_000,
                Policy::Open,
            )
        };
        assert_eq!(accept(kept).await.unwrap(), Accepted::Duplicate);
        assert!(matches!(
            accept(MessageId::new()).await.unwrap(),
            Accepted::Stored(_)
        ));
        let seqs: Vec<Seq> = storage
            .pending(name("bob"), 0, 10)
            .await
            .unwrap()
            .iter()
            .map(|q| q.seq)
            .collect();
        assert_eq!(seqs.len(), 2, "{seqs:?}");
        assert_eq!(seqs[0], 7);
        assert!(
            seqs[1] > purged_up_to,
            "a purged sequence number came back: {seqs:?}"
        );
    }
}
