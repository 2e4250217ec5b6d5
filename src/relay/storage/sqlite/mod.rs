//! The SQLite backend, the embedded default. One writer thread commits every write in
//! batches (`writer`); reads run on a small pool of read connections. The queue's copies and
//! acknowledgements are appended to the spool beside the database (`spool`), and its order,
//! totals and duplicate keys are kept in memory (`queue`), so a send appends one record per
//! copy and touches no table.

mod accept;
mod batch;
mod bounces;
mod check;
mod clock;
mod consent;
mod export;
mod housekeeping;
mod index;
mod metrics;
mod read;
mod rule;
mod scan;
mod schema;
mod spool;
mod sync;
mod writer;

use super::relays::{OWN_KEY, compare_own, parse_own_key};
use super::{RelayPin, RelayPins};
use crate::protocol::{RelayKey, RelayName};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, OnceLock, mpsc};
use std::time::{Duration, Instant};

use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};
use tokio::sync::oneshot;

use self::accept::AcceptOp;
use self::batch::{Batch, Op};
use self::clock::now_ms;
use self::index::QueueIndex;
use self::metrics::SqliteMetrics;
use self::sync::Syncing;
use self::writer::WriteQueue;
use super::{
    Accepted, AckOutcome, CheckReport, CommitListener, ConsentChange, ConsentLedger,
    ConsentOutcome, ConsentState, Copy, CopyStatus, Epoch, InviteDigest, Pending, Queue, Queued,
    Quota, Registration, Registry, Snapshot, Storage, StorageError, StorageMetrics, queue_of,
};

/// SQLite's busy and locked answers pass if tried again; every other failure is kept as is.
impl From<rusqlite::Error> for StorageError {
    fn from(e: rusqlite::Error) -> Self {
        match e.sqlite_error_code() {
            Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked) => {
                StorageError::Unavailable(e.to_string())
            }
            _ => StorageError::Database(e.to_string()),
        }
    }
}
use crate::protocol::{
    AgentName, Bounce, CopyKey, KeyRotation, MessageId, OwnerKey, Policy, PublicKeys, RequestCode,
    Seq,
};

const READERS: usize = 4;
/// Database page size for new relay databases. A batch writes every page it touched to the
/// WAL, one frame at a time; at 4 KiB a busy batch spent a third of the writer's time on
/// frame writes, and 16 KiB pages cut flat-out CPU per message by a fifth.
const PAGE_SIZE: i64 = 16 * 1024;
/// The writer's page cache, in KiB. SQLite's default 2 MiB is smaller than one busy batch:
/// it spilled dirty pages to the WAL mid-transaction and read them back.
const WRITER_CACHE_KIB: i64 = 64 * 1024;
/// WAL bytes kept on disk after the WAL restarts.
const WAL_KEEP_BYTES: i64 = 64 * 1024 * 1024;

/// SQLite-backed relay storage.
pub struct SqliteStorage {
    relay_id: String,
    writes: WriteQueue,
    /// Joined on drop, so that a storage opened next on the same files finds the spool closed.
    writer: Option<std::thread::JoinHandle<()>>,
    readers: Arc<Mutex<Vec<Connection>>>,
    /// One permit per read connection: a reader waits here, never finds the pool empty.
    free_readers: Arc<tokio::sync::Semaphore>,
    /// The queue's order, totals and duplicate keys; changed only by the writer.
    index: Arc<Mutex<QueueIndex>>,
    /// The spool's segments, to read envelopes from.
    files: spool::Files,
    /// The highest sequence number on disk: readers deliver nothing above it.
    durable: Arc<AtomicU64>,
    /// Told about every commit's new copies once they are on disk, by the syncer thread.
    listener: Arc<OnceLock<CommitListener>>,
    metrics: StorageMetrics,
}

fn open(path: &Path) -> Result<Connection, StorageError> {
    let conn = Connection::open(path)?;
    conn.busy_timeout(Duration::from_secs(10))?;
    // Only takes effect on a new database (before its first table).
    conn.pragma_update(None, "page_size", PAGE_SIZE)?;
    let _: String = conn.query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))?;
    // FULL, so checkpoints flush the WAL before copying it and the database after; the writer
    // alone commits with NORMAL and leaves the flush to the syncer (see `sync`).
    conn.pragma_update(None, "synchronous", "FULL")?;
    Ok(conn)
}

/// The spool of the database at `path`: the directory beside it, `<name>-spool`.
fn spool_dir(path: &Path) -> PathBuf {
    let mut dir = path.as_os_str().to_owned();
    dir.push("-spool");
    dir.into()
}

impl SqliteStorage {
    /// Adds invites (their digests) to the database at `path`, beside a running relay or
    /// without one; the database must exist with the current schema.
    pub fn add_invites(path: &Path, digests: &[InviteDigest]) -> Result<(), StorageError> {
        if !path.exists() {
            return Err(StorageError::Database(format!(
                "{} does not exist; start the relay with it once, then make invites",
                path.display()
            )));
        }
        let mut conn = open(path)?;
        let version = conn.query_row("PRAGMA user_version", [], |r| r.get::<_, i64>(0))? as usize;
        if version != schema::MIGRATIONS.len() {
            return Err(StorageError::Database(format!(
                "{} has schema {version}, this build {}: start the relay with it once (it brings the schema up to date), then make invites",
                path.display(),
                schema::MIGRATIONS.len()
            )));
        }
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        for digest in digests {
            tx.execute(
                "INSERT INTO invites (digest, created_at) VALUES (?1, ?2)",
                params![digest.as_slice(), now_ms()],
            )?;
        }
        tx.commit()?;
        Ok(())
    }

    /// Checks the database at `path` and its spool without changing either (the relay must
    /// not be running on them): what is damaged, and what is lost with it.
    pub fn check(path: &Path) -> Result<CheckReport, StorageError> {
        check::check(path)
    }

    /// Reads the stopped relay's database at `path` and its spool, changing neither, for a
    /// move to another backend (`mailslot relay migrate`): the tables whole, the waiting copies
    /// recipient by recipient in sequence order, read from the spool in chunks of at most
    /// 4 MiB. Copies past their expiry become bounces, as the relay's next start would make
    /// them; damaged spool records are skipped and counted. The relay must not be running on
    /// the files.
    pub fn export(path: &Path) -> Result<Snapshot, StorageError> {
        export::export(path)
    }

    /// Opens (creating or migrating) the database and its spool, loads the queue index and
    /// starts the writer, syncer and checkpoint threads. Damage found in the spool is logged
    /// and counted, and every intact copy is kept.
    pub fn open(path: &Path) -> Result<Self, StorageError> {
        let mut writer = open(path)?;
        let spool_dir = spool_dir(path);
        let tx = writer.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let moves_queue = schema::migrate(&tx, schema::QUEUE_TABLE)? <= schema::QUEUE_TABLE;
        tx.commit()?;
        if moves_queue {
            schema::move_table_to_spool(&writer, &spool_dir)?;
        }
        let tx = writer.transaction_with_behavior(TransactionBehavior::Immediate)?;
        schema::migrate(&tx, schema::MIGRATIONS.len())?;
        let relay_id = schema::relay_id(&tx)?;
        tx.commit()?;
        let scanned = scan::scan(&spool_dir)?;
        for seg in &scanned.empty {
            spool::remove(&spool_dir, *seg)?;
        }
        let (mut index, expired) = QueueIndex::load_expiring(&scanned.segments, now_ms());
        // Copies that expired while the relay was down bounce like the others.
        if !expired.is_empty() {
            let tx = writer.transaction_with_behavior(TransactionBehavior::Immediate)?;
            bounces::record_expired(&tx, expired, now_ms())?;
            tx.commit()?;
        }
        let report = check::spool_report(scanned, &index, now_ms());
        if let Some(unclosed) = &report.unclosed {
            spool::close_segment(
                &spool_dir,
                unclosed.segment,
                unclosed.end as u32,
                index.last_seq(),
            )?;
        }
        check::log(&report, path);
        let sqlite_metrics = SqliteMetrics::new();
        sqlite_metrics
            .spool_corrupt_records
            .inc_by(report.damaged.len() as u64);
        sqlite_metrics
            .spool_lost_copies
            .inc_by(report.lost_copies() as u64);
        let metrics = StorageMetrics::with_backend(Arc::new(sqlite_metrics.clone()));
        let mut spool = spool::Spool::open(&spool_dir, index.last_seq(), spool::SEGMENT_BYTES)?;
        // Segments the last run left dead go now, not at the first write's sweep: a relay
        // started often and rarely written to would keep one per start. The flush makes the
        // records that killed them durable first.
        let dead = index.dead_segments();
        if !dead.is_empty() {
            spool.sync_all()?;
        }
        for seg in dead {
            spool.remove(seg);
            index.removed(seg);
        }
        let files = spool.files();
        let flushed = spool.flushed();
        let durable = Arc::new(AtomicU64::new(index.last_seq()));
        let index = Arc::new(Mutex::new(index));
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
        let listener: Arc<OnceLock<CommitListener>> = Arc::new(OnceLock::new());
        let (writes, writer) = writer::spawn(
            writer,
            open(path)?,
            spool,
            index.clone(),
            Arc::new(Syncing::new(
                listener.clone(),
                durable.clone(),
                flushed,
                sqlite_metrics.flush_seconds.clone(),
            )),
            metrics.clone(),
            sqlite_metrics.log_restart_seconds.clone(),
        )?;
        Ok(Self {
            relay_id,
            writes,
            writer: Some(writer),
            readers: Arc::new(Mutex::new(readers)),
            free_readers: Arc::new(tokio::sync::Semaphore::new(READERS)),
            index,
            files,
            durable,
            listener,
            metrics,
        })
    }

    /// Queues a write for the writer thread now; the result arrives after its batch commits.
    fn enqueue<T: Send + 'static>(
        &self,
        run: impl FnOnce(&mut Batch<'_, '_>) -> Result<T, StorageError> + Send + 'static,
    ) -> Pending<T> {
        let (reply, answer) = oneshot::channel();
        let arrived = Instant::now();
        let queued = self.writes.send(Box::new(Op::new(run, reply)));
        let latency = self.metrics.write_seconds.clone();
        Box::pin(async move {
            queued.map_err(|_| StorageError::Closed)?;
            let answer = answer.await.map_err(|_| StorageError::Closed)?;
            latency.observe(arrived.elapsed().as_secs_f64());
            answer
        })
    }

    /// A write that touches tables only, not the queue.
    async fn write<T: Send + 'static>(
        &self,
        run: impl FnOnce(&rusqlite::Transaction<'_>) -> Result<T, StorageError> + Send + 'static,
    ) -> Result<T, StorageError> {
        self.enqueue(move |b| run(b.tx)).await
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

impl Drop for SqliteStorage {
    fn drop(&mut self) {
        // The writer stops once its queue is closed; it finishes the batch it holds first.
        drop(std::mem::replace(&mut self.writes, mpsc::channel().0));
        if let Some(writer) = self.writer.take() {
            let _ = writer.join();
        }
    }
}

impl Registry for SqliteStorage {
    async fn register(
        &self,
        name: AgentName,
        keys: PublicKeys,
        invite: Option<InviteDigest>,
    ) -> Result<Registration, StorageError> {
        self.write(move |tx| consent::register(tx, &name, &keys, invite.as_ref()))
            .await
    }

    async fn keys(&self, name: AgentName) -> Result<Option<PublicKeys>, StorageError> {
        self.read(move |conn| {
            let row: Option<(Vec<u8>, Vec<u8>)> = conn
                .prepare_cached(
                    "SELECT signing, sealing FROM agents WHERE name = ?1 AND retired_until IS NULL",
                )?
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

    async fn rotate(&self, rotation: KeyRotation) -> Result<bool, StorageError> {
        self.write(move |tx| consent::rotate(tx, rotation)).await
    }

    async fn rotations(&self, name: AgentName) -> Result<Vec<KeyRotation>, StorageError> {
        self.read(move |conn| consent::rotations(conn, &name)).await
    }

    async fn retire(&self, name: AgentName, until_ms: i64) -> Result<bool, StorageError> {
        self.enqueue(move |b| {
            b.index.forget_rules();
            consent::retire(b.tx, &name, until_ms)
        })
        .await
    }

    async fn owner(&self, name: AgentName) -> Result<Option<OwnerKey>, StorageError> {
        self.read(move |conn| consent::owner(conn, &name)).await
    }

    async fn set_owner(
        &self,
        name: AgentName,
        key: OwnerKey,
        current: Option<OwnerKey>,
    ) -> Result<bool, StorageError> {
        self.write(move |tx| {
            if consent::owner(tx, &name)? != current {
                return Ok(false);
            }
            let changed = tx.execute(
                "UPDATE agents SET owner = ?2 WHERE name = ?1",
                params![name.as_str(), key.as_bytes().as_slice()],
            )?;
            Ok(changed == 1)
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
}

impl ConsentLedger for SqliteStorage {
    async fn consent(&self, change: ConsentChange) -> Result<ConsentOutcome, StorageError> {
        self.enqueue(move |b| {
            b.index.forget_rules();
            consent::consent(b.tx, &change)
        })
        .await
    }

    async fn has_request(
        &self,
        target: AgentName,
        requester: AgentName,
        code: RequestCode,
        now_ms: i64,
    ) -> Result<bool, StorageError> {
        self.read(move |conn| {
            Ok(conn
                .prepare_cached(
                    "SELECT 1 FROM contact_requests WHERE target = ?1 AND requester = ?2 AND code = ?3 AND expires_at >= ?4",
                )?
                .exists(params![target.as_str(), requester.as_str(), code.as_str(), now_ms])?)
        })
        .await
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
                incoming: consent::requests(
                    conn,
                    "SELECT requester, note, code, expires_at FROM contact_requests WHERE target = ?1 AND expires_at >= ?2 ORDER BY expires_at",
                    &agent,
                    now_ms,
                    false,
                )?,
                outgoing: consent::requests(
                    conn,
                    "SELECT target, note, code, expires_at FROM contact_requests WHERE requester = ?1 AND expires_at >= ?2 ORDER BY expires_at",
                    &agent,
                    now_ms,
                    true,
                )?,
                contacts: consent::names(conn, "SELECT peer FROM relations WHERE owner = ?1 AND kind = 'contact' ORDER BY peer", &agent)?,
                blocked: consent::names(conn, "SELECT peer FROM relations WHERE owner = ?1 AND kind = 'blocked' ORDER BY peer", &agent)?,
            })
        })
        .await
    }
}

impl Queue for SqliteStorage {
    fn on_commit(&self, listener: CommitListener) {
        let _ = self.listener.set(listener);
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
        self.enqueue(move |b| accept::accept(b, &op))
    }

    async fn pending(
        &self,
        agent: AgentName,
        after: Seq,
        limit: usize,
    ) -> Result<Vec<Queued>, StorageError> {
        let (index, files, durable) =
            (self.index.clone(), self.files.clone(), self.durable.clone());
        tokio::task::spawn_blocking(move || {
            read::pending(&index, &files, &durable, &agent, after, limit)
        })
        .await
        .map_err(|_| StorageError::Closed)?
    }

    async fn claim(&self, agent: AgentName) -> Result<Epoch, StorageError> {
        Ok(index::lock(&self.index).claim(&agent))
    }

    /// Sessions on one node already follow each other (the hub's turn): nothing to record.
    async fn release(&self, _agent: AgentName, _epoch: Epoch) -> Result<(), StorageError> {
        Ok(())
    }

    async fn ack(
        &self,
        agent: AgentName,
        upto: Seq,
        epoch: Epoch,
    ) -> Result<AckOutcome, StorageError> {
        self.enqueue(move |b| accept::ack(b, &agent, upto, epoch))
            .await
    }

    async fn waiting(&self, agent: AgentName) -> Result<u64, StorageError> {
        Ok(index::lock(&self.index).waiting(&agent))
    }

    async fn expire(&self, now_ms: i64) -> Result<Vec<(AgentName, Bounce)>, StorageError> {
        self.enqueue(move |b| housekeeping::expire(b, now_ms)).await
    }

    async fn bounces(&self, sender: AgentName, limit: usize) -> Result<Vec<Bounce>, StorageError> {
        self.read(move |conn| bounces::list(conn, &sender, limit))
            .await
    }

    async fn remote_bounce_senders(&self, limit: usize) -> Result<Vec<AgentName>, StorageError> {
        self.read(move |conn| bounces::remote_senders(conn, limit))
            .await
    }

    async fn copy_statuses(
        &self,
        sender: AgentName,
        keys: Vec<CopyKey>,
    ) -> Result<Vec<CopyStatus>, StorageError> {
        // The index first: the writer holds its lock through the commit, so a copy it no
        // longer shows was acknowledged, or expired with its bounce committed already.
        let queued: Vec<bool> = {
            let index = index::lock(&self.index);
            keys.iter()
                .map(|k| {
                    queue_of(k.id, &k.to).is_some_and(|(q, id)| index.is_queued(&sender, id, &q))
                })
                .collect()
        };
        if queued.iter().all(|&q| q) {
            return Ok(vec![CopyStatus::Queued; keys.len()]);
        }
        let bounced = self
            .read(move |conn| bounces::bounced(conn, &sender, &keys))
            .await?;
        Ok(queued
            .into_iter()
            .zip(bounced)
            .map(|(queued, bounced)| match (queued, bounced) {
                (true, _) => CopyStatus::Queued,
                (false, true) => CopyStatus::Bounced,
                (false, false) => CopyStatus::Gone,
            })
            .collect())
    }

    async fn record_bounces(
        &self,
        sender: AgentName,
        bounces: Vec<Bounce>,
    ) -> Result<(), StorageError> {
        self.write(move |tx| bounces::insert(tx, &sender, &bounces))
            .await
    }

    async fn ack_bounces(
        &self,
        sender: AgentName,
        keys: Vec<CopyKey>,
    ) -> Result<u64, StorageError> {
        self.write(move |tx| bounces::ack(tx, &sender, &keys)).await
    }

    async fn total_waiting(&self) -> Result<u64, StorageError> {
        Ok(index::lock(&self.index).total_waiting())
    }

    async fn relay_mailboxes(&self) -> Result<Vec<RelayName>, StorageError> {
        Ok(index::lock(&self.index).relay_mailboxes())
    }
}

impl RelayPins for SqliteStorage {
    /// Through the writer, so the first of two racing pins wins and the second compares.
    async fn pin_relay(&self, relay: RelayName, key: RelayKey) -> Result<RelayPin, StorageError> {
        self.write(move |tx| {
            let pinned: Option<Vec<u8>> = tx
                .prepare_cached("SELECT key FROM relay_pins WHERE relay = ?1")?
                .query_row([relay.as_str()], |r| r.get(0))
                .optional()?;
            let Some(pinned) = pinned else {
                tx.execute(
                    "INSERT INTO relay_pins (relay, key, pinned_at) VALUES (?1, ?2, ?3)",
                    params![relay.as_str(), key.as_bytes().as_slice(), now_ms()],
                )?;
                return Ok(RelayPin::Pinned);
            };
            let pinned = RelayKey::from_bytes(pinned.try_into().map_err(|_| {
                StorageError::Database(format!("the key pinned for relay {relay} is not 32 bytes"))
            })?);
            Ok(if pinned == key {
                RelayPin::Matches
            } else {
                RelayPin::Changed { pinned }
            })
        })
        .await
    }

    async fn pin_own_key(&self, key: RelayKey) -> Result<RelayPin, StorageError> {
        self.write(move |tx| {
            let held: Option<String> = tx
                .prepare_cached("SELECT value FROM meta WHERE key = ?1")?
                .query_row([OWN_KEY], |r| r.get(0))
                .optional()?;
            let held = held.map(parse_own_key).transpose()?;
            if held.is_none() {
                tx.execute(
                    "INSERT INTO meta (key, value) VALUES (?1, ?2)",
                    params![OWN_KEY, key.to_base64()],
                )?;
            }
            Ok(compare_own(held, key))
        })
        .await
    }

    async fn pinned_relay(&self, relay: RelayName) -> Result<Option<RelayKey>, StorageError> {
        self.read(move |conn| {
            let pinned: Option<Vec<u8>> = conn
                .prepare_cached("SELECT key FROM relay_pins WHERE relay = ?1")?
                .query_row([relay.as_str()], |r| r.get(0))
                .optional()?;
            pinned
                .map(|bytes| {
                    bytes.try_into().map(RelayKey::from_bytes).map_err(|_| {
                        StorageError::Database(format!(
                            "the key pinned for relay {relay} is not 32 bytes"
                        ))
                    })
                })
                .transpose()
        })
        .await
    }

    async fn relays_pinned_with(&self, key: RelayKey) -> Result<Vec<RelayName>, StorageError> {
        self.read(move |conn| {
            let mut names = conn.prepare_cached("SELECT relay FROM relay_pins WHERE key = ?1")?;
            let rows = names.query_map([key.as_bytes().as_slice()], |r| r.get::<_, String>(0))?;
            rows.map(|name| {
                RelayName::new(&name?)
                    .map_err(|e| StorageError::Database(format!("a pinned relay's name: {e}")))
            })
            .collect()
        })
        .await
    }
}

impl Storage for SqliteStorage {
    fn relay_id(&self) -> &str {
        &self.relay_id
    }

    fn metrics(&self) -> &StorageMetrics {
        &self.metrics
    }

    /// An empty write through the writer: it answers once a batch has passed the writer and
    /// the syncer, and fails once they stopped or a flush failed (every write is refused then).
    async fn check_health(&self) -> Result<(), StorageError> {
        let (reply, answer) = oneshot::channel();
        let probe = |_: &mut Batch<'_, '_>| Ok(());
        self.writes
            .send(Box::new(Op::new(probe, reply)))
            .map_err(|_| StorageError::Closed)?;
        answer.await.map_err(|_| StorageError::Closed)?
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
    fn reopening_removes_the_segments_the_last_run_left_dead() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("relay.db");
        for _ in 0..3 {
            drop(SqliteStorage::open(&path).unwrap());
        }
        let used: Vec<u32> = scan::scan(&spool_dir(&path))
            .unwrap()
            .segments
            .iter()
            .filter(|s| !s.records.is_empty())
            .map(|s| s.seg)
            .collect();
        assert_eq!(
            used.len(),
            1,
            "one segment per start would pile up: {used:?}"
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
            for sql in &schema::MIGRATIONS[..2] {
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
                id: None,
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
