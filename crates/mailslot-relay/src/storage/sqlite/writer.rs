//! The writer thread: the one connection that writes, and the one writer of the spool. Writes
//! that arrive while a batch commits go into the next batch together (group commit), and each
//! is answered only once its batch is durable. Another thread checkpoints the WAL.
//!
//! Durability is a pipeline: the writer commits a batch into the WAL without waiting for the
//! disk (`synchronous = NORMAL`), writes its spool records, and goes on with the next batch,
//! while the syncer (see [`super::sync`]) flushes what the batch wrote and only then answers
//! its writes, announces its copies and lets readers see them.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak, mpsc};
use std::thread;
use std::time::{Duration, Instant};

use prometheus_client::metrics::histogram::Histogram;
use rusqlite::{Connection, Transaction, TransactionBehavior};
use tokio::sync::oneshot;

use super::batch::{Batch, Op, WriteOp};
use super::clock::now_ms;
use super::housekeeping;
use super::index::{self, QueueIndex};
use super::scan;
use super::spool::Spool;
use super::sync::{Ended, Syncing, Wal};
use crate::storage::{Pending, StorageError, StorageMetrics};

/// Writes taken into one transaction at most.
const MAX_BATCH: usize = 1024;
/// How often the WAL is checkpointed.
const CHECKPOINT_EVERY: Duration = Duration::from_millis(500);

/// The storage's end of the writer: writes go in here, in call order, and are answered once
/// their batch is durable. Dropping it stops the writer and waits for it.
pub(super) struct Writes {
    queue: mpsc::Sender<Box<dyn WriteOp>>,
    /// Joined on drop, so that a storage opened next on the same files finds the spool closed.
    thread: Option<thread::JoinHandle<()>>,
    /// Seconds from a write's arrival to its answer.
    write_seconds: Histogram,
}

impl Writes {
    /// Queues a write for the writer thread now; the result arrives after its batch is
    /// durable.
    pub(super) fn enqueue<T: Send + 'static>(
        &self,
        run: impl FnOnce(&mut Batch<'_, '_>) -> Result<T, StorageError> + Send + 'static,
    ) -> Pending<T> {
        let (reply, answer) = oneshot::channel();
        let arrived = Instant::now();
        let queued = self.queue.send(Box::new(Op::new(run, reply)));
        let latency = self.write_seconds.clone();
        Box::pin(async move {
            queued.map_err(|_| StorageError::Closed)?;
            let answer = answer.await.map_err(|_| StorageError::Closed)?;
            latency.observe(arrived.elapsed().as_secs_f64());
            answer
        })
    }

    /// A write that touches tables only, not the queue.
    pub(super) async fn tables<T: Send + 'static>(
        &self,
        run: impl FnOnce(&Transaction<'_>) -> Result<T, StorageError> + Send + 'static,
    ) -> Result<T, StorageError> {
        self.enqueue(move |b| run(b.tx)).await
    }

    /// An empty write: it answers once a batch has passed the writer and the syncer, and
    /// fails once they stopped or a flush failed (every write is refused then).
    pub(super) async fn probe(&self) -> Result<(), StorageError> {
        let (reply, answer) = oneshot::channel();
        let probe = |_: &mut Batch<'_, '_>| Ok(());
        self.queue
            .send(Box::new(Op::new(probe, reply)))
            .map_err(|_| StorageError::Closed)?;
        answer.await.map_err(|_| StorageError::Closed)?
    }
}

impl Drop for Writes {
    fn drop(&mut self) {
        // The writer stops once its queue is closed; it finishes the batch it holds first.
        drop(std::mem::replace(&mut self.queue, mpsc::channel().0));
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Starts the writer on `conn` and `spool`, the syncer (sharing `syncing`) on their WAL and
/// segments, and the checkpointer on `checkpointer`. The writer and the syncer stop once every
/// sender of the write queue is gone, the checkpointer once the writer has stopped. The writer
/// records its batches in `metrics` and its WAL restarts in `log_restart_seconds`. The writer
/// has closed the spool when it ends.
pub(super) fn spawn(
    conn: Connection,
    checkpointer: Connection,
    spool: Spool,
    index: Arc<Mutex<QueueIndex>>,
    syncing: Arc<Syncing>,
    metrics: StorageMetrics,
    log_restart_seconds: Histogram,
) -> Result<Writes, StorageError> {
    // The syncer makes commits durable; the writer's own commits only write the WAL.
    conn.pragma_update(None, "synchronous", "NORMAL")?;
    let wal = PathBuf::from(format!("{}-wal", conn.path().unwrap_or_default()));
    let write_seconds = metrics.write_seconds.clone();
    let (writes, queue) = mpsc::channel();
    let finish = Arc::new(AtomicBool::new(false));
    let spawn_error = |e: std::io::Error| StorageError::Database(e.to_string());
    thread::Builder::new()
        .name("relay-sync".into())
        .spawn({
            let syncing = syncing.clone();
            move || syncing.run(Wal::new(wal))
        })
        .map_err(spawn_error)?;
    thread::Builder::new()
        .name("relay-checkpoint".into())
        .spawn({
            let finish = Arc::downgrade(&finish);
            move || checkpoint_loop(checkpointer, finish)
        })
        .map_err(spawn_error)?;
    let writer = thread::Builder::new()
        .name("relay-writer".into())
        .spawn(move || {
            Writer {
                conn,
                spool,
                index,
                syncing,
                metrics,
                log_restart_seconds,
                stale: false,
            }
            .run(queue, finish)
        })
        .map_err(spawn_error)?;
    Ok(Writes {
        queue: writes,
        thread: Some(writer),
        write_seconds,
    })
}

struct Writer {
    conn: Connection,
    spool: Spool,
    index: Arc<Mutex<QueueIndex>>,
    syncing: Arc<Syncing>,
    metrics: StorageMetrics,
    log_restart_seconds: Histogram,
    /// A failed batch left the index unlike the spool and reloading it failed too.
    stale: bool,
}

impl Writer {
    fn run(mut self, queue: mpsc::Receiver<Box<dyn WriteOp>>, finish: Arc<AtomicBool>) {
        while let Ok(first) = queue.recv() {
            let mut batch = vec![first];
            while batch.len() < MAX_BATCH {
                match queue.try_recv() {
                    Ok(w) => batch.push(w),
                    Err(_) => break,
                }
            }
            self.commit(batch);
            // Under steady load new frames arrive during every background checkpoint, so it
            // never catches up and the WAL only grows (385 MB after 20,000 messages). Between
            // batches the writer copies the few frames left; its next transaction then
            // restarts the WAL.
            if finish.swap(false, Ordering::AcqRel) {
                let started = Instant::now();
                if let Err(e) =
                    self.conn
                        .query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(()))
                {
                    tracing::warn!(error = %e, "WAL checkpoint failed; will retry");
                }
                self.log_restart_seconds
                    .observe(started.elapsed().as_secs_f64());
            }
        }
        // A closed spool tells the next open where the head's records end. Not after a failed
        // flush: the pages it failed on may be gone, so nothing may be claimed on disk.
        if self.syncing.failure().is_none()
            && let Err(e) = self.spool.close()
        {
            tracing::warn!(error = %e, "closing the spool failed; the next start reads its last segment as cut off");
        }
        self.syncing.close();
    }

    /// Applies a batch in one transaction and hands it to the syncer, which answers its
    /// writes. If the batch fails, every write in it gets the error and the index is rebuilt
    /// from the spool's written records. Once a flush has failed, the batch is
    /// refused without a transaction (see [`super::sync`]).
    fn commit(&mut self, mut batch: Vec<Box<dyn WriteOp>>) {
        if let Some(refused) = self.syncing.failure() {
            for op in batch {
                op.finish(Err(&refused));
            }
            return;
        }
        let started = Instant::now();
        self.metrics.batch_writes.observe(batch.len() as f64);
        let mut log = Vec::new();
        let changes = self.conn.total_changes();
        // Held through the commit and the spool write: readers never see the index ahead of
        // what is written.
        let mut index = index::lock(&self.index);
        let result = (|| -> Result<(), StorageError> {
            if self.stale {
                let mut fresh = reload(&self.spool)?;
                fresh.keep_leases(&mut index);
                *index = fresh;
                self.stale = false;
            }
            let tx = self
                .conn
                .transaction_with_behavior(TransactionBehavior::Immediate)?;
            let mut b = Batch {
                tx: &tx,
                index: &mut index,
                spool: &mut self.spool,
                log: &mut log,
            };
            housekeeping::sweep(&mut b, Instant::now())?;
            for op in &mut batch {
                op.apply(&mut b)?;
            }
            tx.commit()?;
            self.spool.write()
        })();
        if let Err(e) = &result {
            tracing::error!(error = %e, writes = batch.len(), "relay write batch failed; its writes were refused");
            log.clear();
            self.spool.discard();
            if let Some(why) = self.spool.broken() {
                self.syncing.fail(why);
            }
            match reload(&self.spool) {
                Ok(fresh) => *index = fresh,
                Err(e) => {
                    tracing::error!(error = %e, "reloading the queue index failed; the next batch tries again");
                    self.stale = true;
                }
            }
        }
        let last_seq = index.last_seq();
        drop(index);
        self.metrics
            .commit_seconds
            .observe(started.elapsed().as_secs_f64());
        self.syncing.push(Ended {
            ops: batch,
            log,
            result,
            last_seq,
            wal: self.conn.total_changes() != changes,
            spool: self.spool.take_unflushed(),
        });
    }
}

/// The queue index as the spool's written records make it.
fn reload(spool: &Spool) -> Result<QueueIndex, StorageError> {
    Ok(QueueIndex::load(
        &scan::scan(spool.dir())?.segments,
        now_ms(),
    ))
}

/// Checkpoints the WAL every so often (PASSIVE: never waits for writers or readers) until the
/// writer has stopped (it holds `finish`). When it copied every frame it saw, it asks the
/// writer to finish.
fn checkpoint_loop(conn: Connection, finish: Weak<AtomicBool>) {
    loop {
        thread::sleep(CHECKPOINT_EVERY);
        let Some(finish) = finish.upgrade() else {
            return;
        };
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
