//! The syncer: a thread that makes ended batches durable (`fdatasync` of the spool segments
//! they wrote, and of the WAL when they changed a table) and only then answers their writes,
//! announces their copies and lets readers see them.
//!
//! One flush covers every batch ended before it started, so the syncer takes all of them at
//! once and answers them in commit order. (Two syncers flushing side by side were tried and
//! measured worse; see docs/decisions.md, session 5.)
//!
//! After a failed flush the storage refuses every write until the relay restarts. Linux may
//! have dropped the pages that failed, so a later flush that succeeds proves nothing about
//! them, and the relay cannot tell which writes they held.

use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::time::Instant;

use prometheus_client::metrics::histogram::Histogram;

use super::batch::WriteOp;
use super::spool::Unflushed;
use crate::protocol::Seq;
use crate::storage::{CommitListener, Committed, StorageError};

/// A batch whose transaction ended, waiting to be made durable and answered.
pub(super) struct Ended {
    pub(super) ops: Vec<Box<dyn WriteOp>>,
    pub(super) log: Vec<Committed>,
    pub(super) result: Result<(), StorageError>,
    /// The highest sequence number assigned when the batch committed.
    pub(super) last_seq: Seq,
    /// The batch changed a table: the WAL needs a flush too.
    pub(super) wal: bool,
    /// The spool segments it wrote.
    pub(super) spool: Unflushed,
}

/// What the writer and the syncer share.
pub(super) struct Syncing {
    state: Mutex<State>,
    /// Signalled when a batch ends or the writer stops.
    work: Condvar,
    listener: Arc<OnceLock<CommitListener>>,
    /// The highest sequence number made durable; readers deliver nothing above it.
    durable: Arc<AtomicU64>,
    /// The spool position every flush so far covers; the writer removes dead segments by it.
    flushed: Arc<AtomicU64>,
    flush_seconds: Histogram,
}

#[derive(Default)]
struct State {
    /// Ended batches no flush has taken yet, oldest first.
    waiting: Vec<Ended>,
    /// The writer has stopped: the syncer stops once nothing waits.
    closed: bool,
    /// Why a flush failed, once one has.
    failed: Option<String>,
}

fn lock(m: &Mutex<State>) -> MutexGuard<'_, State> {
    // Poisoned only if the syncer panicked in an answer; the state is still consistent.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Syncing {
    pub(super) fn new(
        listener: Arc<OnceLock<CommitListener>>,
        durable: Arc<AtomicU64>,
        flushed: Arc<AtomicU64>,
        flush_seconds: Histogram,
    ) -> Self {
        Self {
            state: Mutex::default(),
            work: Condvar::new(),
            listener,
            durable,
            flushed,
            flush_seconds,
        }
    }

    /// Hands over a batch the writer has ended.
    pub(super) fn push(&self, ended: Ended) {
        lock(&self.state).waiting.push(ended);
        self.work.notify_one();
    }

    /// The writer has stopped; the syncer finishes what was handed over, then stops.
    pub(super) fn close(&self) {
        lock(&self.state).closed = true;
        self.work.notify_all();
    }

    /// A write to disk failed (see the module docs): every later write is refused.
    pub(super) fn fail(&self, why: &str) {
        let mut state = lock(&self.state);
        if state.failed.is_none() {
            state.failed = Some(why.to_owned());
        }
    }

    /// The error every write gets once a flush has failed.
    pub(super) fn failure(&self) -> Option<StorageError> {
        lock(&self.state).failed.as_deref().map(refusal)
    }

    /// Runs the syncer until the writer has stopped and every batch is answered.
    pub(super) fn run(&self, mut wal: Wal) {
        while let Some(batches) = self.take() {
            let started = Instant::now();
            let flushed = flush(&mut wal, &batches).map_err(|e| e.to_string());
            self.flush_seconds.observe(started.elapsed().as_secs_f64());
            if flushed.is_ok()
                && let Some(end) = batches.iter().map(|b| b.spool.end).max()
            {
                self.flushed.fetch_max(end, Ordering::AcqRel);
            }
            self.answer(batches, flushed);
        }
    }

    /// Waits for ended batches and takes all of them; `None` once closed and drained.
    fn take(&self) -> Option<Vec<Ended>> {
        let mut state = lock(&self.state);
        while state.waiting.is_empty() && !state.closed {
            state = self.work.wait(state).unwrap_or_else(|e| e.into_inner());
        }
        (!state.waiting.is_empty()).then(|| std::mem::take(&mut state.waiting))
    }

    /// Answers `batches`, in commit order, after a flush that started once they had ended.
    fn answer(&self, batches: Vec<Ended>, flushed: Result<(), String>) {
        let failed = {
            let mut state = lock(&self.state);
            if let Err(e) = flushed
                && state.failed.is_none()
            {
                tracing::error!(error = %e, "flushing the relay's storage to disk failed; the relay refuses every write until it is restarted");
                state.failed = Some(e);
            }
            state.failed.as_deref().map(refusal)
        };
        for batch in batches {
            let result = match (&batch.result, &failed) {
                (Err(e), _) | (Ok(()), Some(e)) => Err(e),
                (Ok(()), None) => Ok(()),
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

fn refusal(why: &str) -> StorageError {
    StorageError::Database(format!(
        "writing the relay's storage to disk failed ({why}); the relay refuses writes until it is restarted"
    ))
}

/// Flushes what `batches` wrote: the WAL if one changed a table, then each spool segment
/// once.
fn flush(wal: &mut Wal, batches: &[Ended]) -> std::io::Result<()> {
    if batches.iter().any(|b| b.wal) {
        wal.sync()?;
    }
    let mut done: Vec<&Arc<File>> = Vec::new();
    for file in batches.iter().flat_map(|b| &b.spool.files) {
        if !done.iter().any(|d| Arc::ptr_eq(d, file)) {
            file.sync_data()?;
            done.push(file);
        }
    }
    Ok(())
}

/// The WAL file, opened for syncing only.
pub(super) struct Wal {
    path: PathBuf,
    file: Option<File>,
}

impl Wal {
    pub(super) fn new(path: PathBuf) -> Self {
        Self { path, file: None }
    }

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::sqlite::batch::Batch;
    use tokio::sync::oneshot;

    #[test]
    fn the_wal_handle_follows_a_replaced_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("relay.db-wal");
        std::fs::write(&path, b"first").unwrap();
        let mut wal = Wal::new(path.clone());
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

    /// A write that reports how its batch ended.
    struct Probe(oneshot::Sender<Result<(), String>>);

    impl WriteOp for Probe {
        fn apply(&mut self, _: &mut Batch<'_, '_>) -> Result<(), StorageError> {
            Ok(())
        }

        fn finish(self: Box<Self>, committed: Result<(), &StorageError>) {
            let _ = self.0.send(committed.map_err(|e| e.to_string()));
        }
    }

    /// A batch of one write whose answer arrives on the returned receiver.
    fn batch(last_seq: Seq) -> (Ended, oneshot::Receiver<Result<(), String>>) {
        let (tx, rx) = oneshot::channel();
        let ended = Ended {
            ops: vec![Box::new(Probe(tx))],
            log: Vec::new(),
            result: Ok(()),
            last_seq,
            wal: false,
            spool: Unflushed {
                files: Vec::new(),
                end: 0,
            },
        };
        (ended, rx)
    }

    #[test]
    fn a_flush_answers_every_batch_ended_before_it_in_order_and_a_failed_one_refuses_all_after() {
        let durable = Arc::new(AtomicU64::new(0));
        let syncing = Syncing::new(
            Arc::new(OnceLock::new()),
            durable.clone(),
            Arc::default(),
            Histogram::new([0.001]),
        );
        let (first, mut first_rx) = batch(1);
        let (second, mut second_rx) = batch(2);
        syncing.push(first);
        syncing.push(second);
        let both = syncing.take().unwrap();
        assert_eq!(
            both.iter().map(|b| b.last_seq).collect::<Vec<_>>(),
            [1, 2],
            "one flush covers every batch ended before it, oldest first"
        );
        syncing.answer(both, Ok(()));
        assert_eq!(first_rx.try_recv().unwrap(), Ok(()));
        assert_eq!(second_rx.try_recv().unwrap(), Ok(()));
        assert_eq!(durable.load(Ordering::Acquire), 2);

        let (third, mut third_rx) = batch(3);
        syncing.push(third);
        let taken = syncing.take().unwrap();
        syncing.answer(taken, Err("EIO".into()));
        let refused = third_rx.try_recv().unwrap().unwrap_err();
        assert!(
            refused.contains("EIO") && refused.contains("restarted"),
            "{refused}"
        );
        assert_eq!(
            durable.load(Ordering::Acquire),
            2,
            "nothing refused is readable"
        );
        assert!(
            syncing.failure().is_some(),
            "the writer refuses new writes too"
        );

        let (fourth, mut fourth_rx) = batch(4);
        syncing.push(fourth);
        let taken = syncing.take().unwrap();
        syncing.answer(taken, Ok(()));
        assert!(
            fourth_rx.try_recv().unwrap().is_err(),
            "a later flush that succeeds does not vouch for the failed one"
        );
        syncing.close();
        assert!(
            syncing.take().is_none(),
            "closed and drained: the syncer stops"
        );
    }
}
