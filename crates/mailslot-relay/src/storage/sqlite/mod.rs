//! The SQLite backend, the embedded default: one node, one database file and the spool beside
//! it. This file opens the backend and joins its roles into [`Storage`]; each role's trait is
//! implemented in the file named for it.
//!
//! - Roles: `registry` (names, keys, owners, listings, invites), `consent` (the consent
//!   ledger), `queue` (sends, reads, acks, leases, expiry, bounces), `relays` (relay pins),
//!   `reservations` (file reservations).
//! - The queue: copies and acks are records appended to the spool (`spool`, read back by
//!   `scan`); `index` holds the queue in memory (order, totals, duplicate keys, segments' use);
//!   `accept` stores a send and records an ack, `housekeeping` sweeps and expires, `read`
//!   reads copies back, `bounces` keeps the bounces table, `rule` is the consent rule a send
//!   is checked by. A send appends one record per copy and touches no table.
//! - Writing: every write runs on one writer thread in batches (`writer`; what a write sees of
//!   its batch is `batch`), made durable and answered by the syncer thread (`sync`). Reads run
//!   on a small pool of read connections (`connect`).
//! - Around them: `schema` (migrations), `check` (what a scan found; `mailslot relay check`),
//!   `export` (a stopped relay read for `mailslot relay migrate`), `metrics` (the series only
//!   this backend records), `clock` (the time rows and records are stamped with).

mod accept;
mod batch;
mod bounces;
mod check;
mod clock;
mod connect;
mod consent;
mod export;
mod groups;
mod housekeeping;
mod index;
mod metrics;
mod queue;
mod read;
mod registry;
mod relays;
mod reservations;
mod rule;
mod scan;
mod schema;
mod spool;
mod sync;
mod writer;

use std::path::Path;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, OnceLock};

use rusqlite::TransactionBehavior;

use self::clock::now_ms;
use self::connect::Readers;
use self::index::QueueIndex;
use self::metrics::SqliteMetrics;
use self::sync::Syncing;
use self::writer::Writes;
use super::{CheckReport, CommitListener, Snapshot, Storage, StorageError, StorageMetrics};
pub use relays::SqlitePins;

/// SQLite-backed relay storage.
pub struct SqliteStorage {
    /// Dropped first: the writer finishes its batch and closes the spool before the rest goes.
    writes: Writes,
    relay_id: String,
    readers: Readers,
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

impl SqliteStorage {
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
        let mut writer = connect::open(path)?;
        let spool_dir = spool::dir_of(path);
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
        let readers = Readers::open(path)?;
        connect::tune_writer(&writer)?;
        let listener: Arc<OnceLock<CommitListener>> = Arc::new(OnceLock::new());
        let writes = writer::spawn(
            writer,
            connect::open(path)?,
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
            readers,
            index,
            files,
            durable,
            listener,
            metrics,
        })
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
        self.writes.probe().await
    }
}

#[cfg(test)]
mod tests {
    use rusqlite::Connection;

    use super::connect::PAGE_SIZE;
    use super::*;
    use crate::protocol::{AgentName, MessageId, Policy, Seq};
    use crate::storage::{Accepted, Queue, QueuedCopy, Quota};

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
        let used: Vec<u32> = scan::scan(&spool::dir_of(&path))
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
            vec![QueuedCopy {
                id: None,
                recipient: name("bob"),
                envelope: Arc::from(&b"{}"[..]),
                group: None,
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
