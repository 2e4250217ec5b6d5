//! One write as the writer thread runs it: [`Batch`], what a write sees of the batch it is
//! applied in, and [`WriteOp`], the write itself, applied inside the batch's transaction and
//! answered once the batch is durable. The writer applies them and the syncer answers them;
//! the queue's and the tables' writes are written against `Batch` alone, so none of them
//! knows either thread.

use rusqlite::Transaction;
use tokio::sync::oneshot;

use super::index::QueueIndex;
use super::spool::Spool;
use crate::storage::{Committed, StorageError};

/// What a write sees of its batch: the open transaction, the queue index and the spool
/// (changed in step with the transaction), and the log of copies the commit will announce.
pub(super) struct Batch<'a, 'c> {
    pub(super) tx: &'a Transaction<'c>,
    pub(super) index: &'a mut QueueIndex,
    pub(super) spool: &'a mut Spool,
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
