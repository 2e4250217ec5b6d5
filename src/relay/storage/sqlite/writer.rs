//! The writer thread: the one connection that writes. Writes that arrive while a batch
//! commits go into the next batch together (group commit), and each is answered only once its
//! batch is durable. A second thread checkpoints the WAL.
//!
//! Durability is a pipeline of two threads: the writer commits a batch into the WAL without
//! waiting for the disk (`synchronous = NORMAL`) and goes on with the next batch, while the
//! syncer makes the WAL durable (`fdatasync`) and only then answers the batch's writes,
//! announces its copies and lets readers see them. One sync covers every batch committed
//! before it started, and a slow disk flush no longer holds up the next batch's work.

use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak, mpsc};
use std::thread;
use std::time::{Duration, Instant};

use rusqlite::{Connection, Transaction, TransactionBehavior};
use tokio::sync::oneshot;

use super::queue::{self, QueueIndex};
use crate::protocol::Seq;
use crate::relay::storage::{CommitListener, Committed, StorageError};

/// Writes taken into one transaction at most.
const MAX_BATCH: usize = 1024;
/// How often the WAL is checkpointed.
const CHECKPOINT_EVERY: Duration = Duration::from_millis(500);

/// What a write sees of its batch: the open transaction, the queue index (changed in step
/// with the transaction), and the log of copies the commit will announce.
pub(super) struct Batch<'a, 'c> {
    pub(super) tx: &'a Transaction<'c>,
    pub(super) index: &'a mut QueueIndex,
    pub(super) log: &'a mut Vec<Committed>,
}

/// One write for the writer thread: applied inside the batch's transaction, answered after
/// the commit (or with the commit's error).
pub(super) trait WriteOp: Send {
    fn apply(&mut self, batch: &mut Batch<'_, '_>) -> Result<(), StorageError>;
    fn finish(self: Box<Self>, committed: Result<(), &StorageError>);
}

/// A write and where its answer goes.
pub(super) struct Op<T, F> {
    run: Option<F>,
    value: Option<T>,
    reply: oneshot::Sender<Result<T, StorageError>>,
}

impl<T, F> Op<T, F> {
    pub(super) fn new(run: F, reply: oneshot::Sender<Result<T, StorageError>>) -> Self {
        Self {
            run: Some(run),
            value: None,
            reply,
        }
    }
}

impl<T, F> WriteOp for Op<T, F>
where
    T: Send,
    F: FnOnce(&mut Batch<'_, '_>) -> Result<T, StorageError> + Send,
{
    fn apply(&mut self, batch: &mut Batch<'_, '_>) -> Result<(), StorageError> {
        if let Some(run) = self.run.take() {
            self.value = Some(run(batch)?);
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

/// Starts the writer on `conn`, the syncer on the WAL at `wal`, and the checkpointer on
/// `checkpointer`. The checkpointer stops once `alive` is gone, the writer and the syncer once
/// every sender of the write queue is. `durable` is the highest sequence number made durable.
pub(super) fn spawn(
    conn: Connection,
    checkpointer: Connection,
    wal: PathBuf,
    index: Arc<Mutex<QueueIndex>>,
    listener: Arc<OnceLock<CommitListener>>,
    durable: Arc<AtomicU64>,
    alive: Weak<()>,
) -> Result<mpsc::Sender<Box<dyn WriteOp>>, StorageError> {
    // The syncer makes commits durable; the writer's own commits only write the WAL.
    conn.pragma_update(None, "synchronous", "NORMAL")?;
    let (writes, queue) = mpsc::channel();
    let (ended, to_sync) = mpsc::channel();
    let finish = Arc::new(AtomicBool::new(false));
    let spawn_error = |e: std::io::Error| StorageError::Database(e.to_string());
    thread::Builder::new()
        .name("relay-writer".into())
        .spawn({
            let finish = finish.clone();
            let index = index.clone();
            move || {
                Writer {
                    conn,
                    index,
                    ended,
                    stale: false,
                }
                .run(queue, finish)
            }
        })
        .map_err(spawn_error)?;
    thread::Builder::new()
        .name("relay-sync".into())
        .spawn(move || {
            Syncer {
                wal: Wal {
                    path: wal,
                    file: None,
                },
                listener,
                durable,
            }
            .run(to_sync)
        })
        .map_err(spawn_error)?;
    thread::Builder::new()
        .name("relay-checkpoint".into())
        .spawn(move || checkpoint_loop(checkpointer, alive, finish))
        .map_err(spawn_error)?;
    Ok(writes)
}

/// A batch whose transaction ended, on its way to the syncer.
struct Ended {
    ops: Vec<Box<dyn WriteOp>>,
    log: Vec<Committed>,
    result: Result<(), StorageError>,
    /// The highest sequence number assigned when the batch committed.
    last_seq: Seq,
}

struct Writer {
    conn: Connection,
    index: Arc<Mutex<QueueIndex>>,
    ended: mpsc::Sender<Ended>,
    /// A failed batch left the index unlike the table and reloading it failed too.
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
            if self.commit(batch).is_err() {
                return;
            }
            // Under steady load new frames arrive during every background checkpoint, so it
            // never catches up and the WAL only grows (385 MB after 20,000 messages). Between
            // batches the writer copies the few frames left; its next transaction then
            // restarts the WAL.
            if finish.swap(false, Ordering::AcqRel)
                && let Err(e) =
                    self.conn
                        .query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(()))
            {
                tracing::warn!(error = %e, "WAL checkpoint failed; will retry");
            }
        }
    }

    /// Applies a batch in one transaction and hands it to the syncer, which answers its
    /// writes. If the transaction fails, every write in it gets the error, nothing in it was
    /// stored, and the index is reloaded from the table. `Err` when the syncer is gone.
    fn commit(&mut self, mut batch: Vec<Box<dyn WriteOp>>) -> Result<(), ()> {
        let mut log = Vec::new();
        // Held through the commit: readers never see the index ahead of the table.
        let mut index = queue::lock(&self.index);
        let result = (|| -> Result<(), StorageError> {
            if self.stale {
                *index = QueueIndex::load(&self.conn)?;
                self.stale = false;
            }
            let tx = self
                .conn
                .transaction_with_behavior(TransactionBehavior::Immediate)?;
            let mut b = Batch {
                tx: &tx,
                index: &mut index,
                log: &mut log,
            };
            queue::purge(&mut b, Instant::now())?;
            for op in &mut batch {
                op.apply(&mut b)?;
            }
            tx.commit()?;
            Ok(())
        })();
        if let Err(e) = &result {
            tracing::error!(error = %e, writes = batch.len(), "relay write batch failed; nothing in it was stored");
            log.clear();
            match QueueIndex::load(&self.conn) {
                Ok(fresh) => *index = fresh,
                Err(e) => {
                    tracing::error!(error = %e, "reloading the queue index failed; the next batch tries again");
                    self.stale = true;
                }
            }
        }
        let last_seq = index.last_seq();
        drop(index);
        self.ended
            .send(Ended {
                ops: batch,
                log,
                result,
                last_seq,
            })
            .map_err(|_| ())
    }
}

/// The WAL file, opened for syncing only.
struct Wal {
    path: PathBuf,
    file: Option<File>,
}

impl Wal {
    /// Flushes the WAL to the disk. The file is opened on first use, and again if SQLite
    /// replaced it: a sync through a stale handle would flush nothing that matters.
    fn sync(&mut self) -> std::io::Result<()> {
        let current = std::fs::metadata(&self.path)?.ino();
        if self
            .file
            .as_ref()
            .is_none_or(|f| f.metadata().is_ok_and(|m| m.ino() != current))
        {
            self.file = Some(File::open(&self.path)?);
        }
        match &self.file {
            Some(file) => file.sync_data(),
            None => Ok(()),
        }
    }
}

struct Syncer {
    wal: Wal,
    listener: Arc<OnceLock<CommitListener>>,
    durable: Arc<AtomicU64>,
}

impl Syncer {
    /// Makes ended batches durable, several at a time, then answers them in commit order.
    fn run(mut self, ended: mpsc::Receiver<Ended>) {
        while let Ok(first) = ended.recv() {
            let mut batches = vec![first];
            batches.extend(ended.try_iter());
            let synced = if batches.iter().any(|b| b.result.is_ok()) {
                self.wal.sync().map_err(|e| {
                    tracing::error!(error = %e, "flushing the relay's WAL to disk failed; the writes it covers are refused");
                    StorageError::Database(format!("flushing the WAL to disk failed: {e}"))
                })
            } else {
                Ok(())
            };
            for batch in batches {
                let result = match (&batch.result, &synced) {
                    (Err(e), _) | (Ok(()), Err(e)) => Err(e),
                    (Ok(()), Ok(())) => Ok(()),
                };
                if result.is_ok() {
                    self.durable.fetch_max(batch.last_seq, Ordering::AcqRel);
                    if !batch.log.is_empty()
                        && let Some(listen) = self.listener.get()
                    {
                        listen(batch.log);
                    }
                }
                for op in batch.ops {
                    op.finish(result);
                }
            }
        }
    }
}

/// Checkpoints the WAL every so often (PASSIVE: never waits for writers or readers) until the
/// storage is dropped. When it copied every frame it saw, it asks the writer to finish.
fn checkpoint_loop(conn: Connection, alive: Weak<()>, finish: Arc<AtomicBool>) {
    while alive.upgrade().is_some() {
        thread::sleep(CHECKPOINT_EVERY);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wal_handle_follows_a_replaced_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("relay.db-wal");
        std::fs::write(&path, b"first").unwrap();
        let mut wal = Wal {
            path: path.clone(),
            file: None,
        };
        wal.sync().unwrap();
        let ino = |f: &Option<File>| f.as_ref().unwrap().metadata().unwrap().ino();
        let first = ino(&wal.file);
        let replacement = dir.path().join("new");
        std::fs::write(&replacement, b"second").unwrap();
        std::fs::rename(&replacement, &path).unwrap();
        wal.sync().unwrap();
        assert_ne!(
            ino(&wal.file),
            first,
            "a sync through the old handle flushes the old file"
        );
        assert_eq!(ino(&wal.file), std::fs::metadata(&path).unwrap().ino());
    }
}
