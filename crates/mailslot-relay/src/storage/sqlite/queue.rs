//! The queue role on SQLite: each call goes to the part of the backend that does it. Sends
//! and acks ([`super::accept`]) and expiry ([`super::housekeeping`]) run in the writer's
//! batch; reads copy locations out of the index ([`super::index`]) and read the spool
//! ([`super::read`]); bounces are rows ([`super::bounces`]).

use super::accept::{self, AcceptOp};
use super::{SqliteStorage, bounces, housekeeping, index, read};
use crate::protocol::{AgentName, Bounce, CopyKey, MessageId, Policy, RelayName, Seq, Shown};
use crate::storage::{
    Accepted, AckOutcome, CommitListener, CopyStatus, Epoch, Pending, Queue, Queued, QueuedCopy,
    Quota, StorageError, queue_of,
};

impl Queue for SqliteStorage {
    fn on_commit(&self, listener: CommitListener) {
        let _ = self.listener.set(listener);
    }

    fn accept(
        &self,
        sender: AgentName,
        id: MessageId,
        copies: Vec<QueuedCopy>,
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
        self.writes.enqueue(move |b| accept::accept(b, &op))
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

    /// One node: its hub knows which session is hidden, so the lease need not.
    async fn claim(&self, agent: AgentName, _shown: Shown) -> Result<Epoch, StorageError> {
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
        self.writes
            .enqueue(move |b| accept::ack(b, &agent, upto, epoch))
            .await
    }

    async fn waiting(&self, agent: AgentName) -> Result<u64, StorageError> {
        Ok(index::lock(&self.index).waiting(&agent))
    }

    async fn expire(&self, now_ms: i64) -> Result<Vec<(AgentName, Bounce)>, StorageError> {
        self.writes
            .enqueue(move |b| housekeeping::expire(b, now_ms))
            .await
    }

    async fn bounces(&self, sender: AgentName, limit: usize) -> Result<Vec<Bounce>, StorageError> {
        self.readers
            .read(move |conn| bounces::list(conn, &sender, limit))
            .await
    }

    async fn remote_bounce_senders(&self, limit: usize) -> Result<Vec<AgentName>, StorageError> {
        self.readers
            .read(move |conn| bounces::remote_senders(conn, limit))
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
            let locked = index::lock(&self.index);
            keys.iter()
                .map(|k| {
                    queue_of(k.id, &k.to).is_some_and(|(q, id)| locked.is_queued(&sender, id, &q))
                })
                .collect()
        };
        if queued.iter().all(|&q| q) {
            return Ok(vec![CopyStatus::Queued; keys.len()]);
        }
        let bounced = self
            .readers
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
        records: Vec<Bounce>,
    ) -> Result<(), StorageError> {
        self.writes
            .tables(move |tx| bounces::insert(tx, &sender, &records))
            .await
    }

    async fn ack_bounces(
        &self,
        sender: AgentName,
        keys: Vec<CopyKey>,
    ) -> Result<u64, StorageError> {
        self.writes
            .tables(move |tx| bounces::ack(tx, &sender, &keys))
            .await
    }

    async fn total_waiting(&self) -> Result<u64, StorageError> {
        Ok(index::lock(&self.index).total_waiting())
    }

    async fn relay_mailboxes(&self) -> Result<Vec<RelayName>, StorageError> {
        Ok(index::lock(&self.index).relay_mailboxes())
    }
}
