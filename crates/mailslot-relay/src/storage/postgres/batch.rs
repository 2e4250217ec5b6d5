//! Group commit: one writer task per node takes the sends queued while its last batch
//! committed and applies them in one durable transaction, answering each
//! only after the commit. A batch reads everything it decides on in a few statements (the
//! recipients' mailboxes, locked in name order; which copies are already stored; the consent
//! rules), decides every send in memory in call order, and writes the stored copies in one
//! statement, so a send refused for quota or consent never fails the others.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use deadpool_postgres::{Client, Object, Pool};
use tokio::sync::{mpsc, oneshot};
use tokio_postgres::types::ToSql;
use tokio_postgres::{Row, Statement};

use super::consent::Rule;
use super::pipeline::{Open, unflushed};
use super::{describe, now_ms, retryable, seq_to_db, unsigned};
use crate::protocol::{AgentName, MessageId, Policy, Seq};
use crate::storage::queue::is_relay_mailbox;
use crate::storage::{
    Accepted, CommitListener, Committed, QueuedCopy, Quota, StorageError, StorageMetrics,
};

/// Sends taken into one transaction at most (as in the SQLite writer). Flat out, batches are
/// full and hold their recipients' mailbox rows from the lock to the flush, which the other
/// nodes' batches for those recipients wait for; larger ones pay that wait, the round trips
/// and the flush for more sends each.
const MAX_BATCH: usize = 1024;
/// Times a batch is run again after it met another transaction (deadlock, serialization).
const RETRIES: usize = 3;

/// A send waiting for the writer, and where its answer goes.
pub(super) struct AcceptOp {
    pub(super) sender: AgentName,
    pub(super) id: MessageId,
    pub(super) copies: Vec<QueuedCopy>,
    pub(super) quota: Quota,
    pub(super) expires_at_ms: i64,
    pub(super) default: Policy,
    pub(super) reply: oneshot::Sender<Result<Accepted, StorageError>>,
}

/// What the writer task needs.
pub(super) struct Writer {
    pub(super) pool: Pool,
    /// The writer's own connection, kept from one batch to the next. Taken from the pool anew
    /// for each batch, the writer met every pooled connection in turn, and on each the first
    /// batch prepared its statements and planned them in a backend that had not read these
    /// tables yet: 20–40 ms, while every send behind it waited (performance log).
    pub(super) connection: Option<Object>,
    pub(super) listener: Arc<OnceLock<CommitListener>>,
    pub(super) metrics: StorageMetrics,
    pub(super) node_id: String,
}

/// Runs batches until every sender of `queue` is gone (the storage was dropped).
pub(super) async fn run(mut writer: Writer, mut queue: mpsc::UnboundedReceiver<AcceptOp>) {
    while let Some(first) = queue.recv().await {
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match queue.try_recv() {
                Ok(op) => batch.push(op),
                Err(_) => break,
            }
        }
        writer.commit(batch).await;
    }
}

/// One recipient's `mailboxes` row as the batch changes it.
struct MailboxRow {
    next_seq: i64,
    waiting: i64,
    bytes: i64,
    changed: bool,
}

/// A statement parameter.
type Param<'a> = dyn ToSql + Sync + 'a;

/// A copy's duplicate key: message id, sender, recipient.
type Key = (String, String, String);

/// The rows a batch inserts, column by column (the shape `unnest` takes).
#[derive(Default)]
struct Rows<'a> {
    recipient: Vec<&'a str>,
    seq: Vec<i64>,
    sender: Vec<&'a str>,
    message_id: Vec<String>,
    envelope: Vec<&'a [u8]>,
    size: Vec<i64>,
    expires_at: Vec<i64>,
}

impl Writer {
    async fn commit(&mut self, batch: Vec<AcceptOp>) {
        let started = Instant::now();
        self.metrics.batch_writes.observe(batch.len() as f64);
        let mut attempt = 0;
        let result = loop {
            match self.apply(&batch).await {
                Err(Failure::Database(e)) if retryable(&e) && attempt < RETRIES => {
                    attempt += 1;
                    tracing::debug!(error = %describe(&e), attempt, "relay write batch met another transaction; running it again");
                }
                other => break other,
            }
        };
        self.metrics
            .commit_seconds
            .observe(started.elapsed().as_secs_f64());
        match result {
            Ok((outcomes, log)) => {
                if !log.is_empty()
                    && let Some(listener) = self.listener.get()
                {
                    listener(log);
                }
                for (op, outcome) in batch.into_iter().zip(outcomes) {
                    let _ = op.reply.send(Ok(outcome));
                }
            }
            Err(failure) => {
                let why = failure.to_string();
                tracing::error!(error = %why, writes = batch.len(), "relay write batch failed; its writes were refused");
                for op in batch {
                    let _ = op.reply.send(Err(StorageError::Database(why.clone())));
                }
            }
        }
    }

    /// Applies and commits `batch`; its outcomes in order, and the copies it stored in
    /// commit order.
    async fn apply(
        &mut self,
        batch: &[AcceptOp],
    ) -> Result<(Vec<Accepted>, Vec<Committed>), Failure> {
        let mut names: Vec<&str> = batch
            .iter()
            .flat_map(|op| op.copies.iter().map(|c| c.recipient.as_str()))
            .collect();
        names.sort_unstable();
        names.dedup();
        if names.is_empty() {
            return Ok((
                batch.iter().map(|_| Accepted::Duplicate).collect(),
                Vec::new(),
            ));
        }
        let connection = match self.connection.take() {
            Some(kept) if !kept.is_closed() => kept,
            _ => self.pool.get().await?,
        };
        let mut open = Open::new(connection);
        let result = self.apply_in(&mut open, batch, &names).await;
        if result.is_err() {
            // Kept for the batch's next attempt, unless the connection failed.
            let _ = open.rollback().await;
        }
        self.connection = open.into_idle();
        result
    }

    /// [`Writer::apply`] on the connection `open`, whose transaction it begins and commits.
    async fn apply_in(
        &self,
        open: &mut Open,
        batch: &[AcceptOp],
        names: &[&str],
    ) -> Result<(Vec<Accepted>, Vec<Committed>), Failure> {
        let statements = Statements::prepare(open.client()).await?;
        let st = &statements;
        let keys = KeyParams::of(batch);
        let pairs = PairParams::of(batch);
        // Pipelined (see `pipeline`): `BEGIN` and the four run in this order with one wait,
        // so the mailboxes exist before they are locked and the lookups run after the lock,
        // as if each waited for the one before (a deadlock stays retryable). The transaction
        // is durable (`synchronous_commit = on`) by the pool's connection options.
        let now = now_ms();
        let by_name: [&Param<'_>; 1] = [&names];
        let by_key: [&Param<'_>; 4] = [&keys.ids, &keys.senders, &keys.recipients, &now];
        let by_pair: [&Param<'_>; 2] = [&pairs.senders, &pairs.recipients];
        let (by_name, by_key, by_pair) = (&by_name, &by_key, &by_pair);
        let (created, locked, stored, rules) = open
            .begin(|c| async move {
                futures_util::join!(
                    c.execute(&st.create, by_name),
                    c.query(&st.lock, by_name),
                    c.query(&st.stored, by_key),
                    c.query(&st.rules, by_pair),
                )
            })
            .await?;
        created?;
        let mut boxes = mailboxes(locked?)?;
        let stored = stored_keys(stored?)?;
        let rules = rules_of(pairs.pairs, rules?)?;

        let mut outcomes = Vec::with_capacity(batch.len());
        let mut log = Vec::new();
        let mut rows = Rows::default();
        let mut fresh_keys: HashSet<Key> = HashSet::new();
        for op in batch {
            let id = op.id.to_string();
            let mut fresh: Vec<(&QueuedCopy, Key)> = Vec::with_capacity(op.copies.len());
            let mut skipped = Vec::new();
            let mut refused = None;
            for copy in &op.copies {
                let key = (
                    copy.id.map_or_else(|| id.clone(), |c| c.to_string()),
                    op.sender.as_str().to_owned(),
                    copy.recipient.as_str().to_owned(),
                );
                if stored.contains(&key) || fresh_keys.contains(&key) {
                    continue;
                }
                // A relay mailbox takes mail from anyone: the relay it leads to applies its
                // agents' consent.
                let checked = copy.recipient != op.sender && !is_relay_mailbox(&copy.recipient);
                let to = copy.recipient.as_str();
                let of_sender = rules.get(&(op.sender.as_str(), to));
                match &copy.group {
                    Some(group) if checked => {
                        let joined = rules.get(&(group.as_str(), to)).is_some_and(Rule::joined);
                        if !joined || of_sender.is_some_and(Rule::blocked) {
                            skipped.push(copy.recipient.clone());
                            continue;
                        }
                    }
                    None if checked && !of_sender.is_some_and(|r| r.allows(op.default)) => {
                        refused = Some(Accepted::NotAllowed(copy.recipient.clone()));
                        break;
                    }
                    _ => {}
                }
                let mailbox = mailbox(&boxes, copy.recipient.as_str())?;
                let size = size_of(copy);
                if mailbox.waiting.unsigned_abs() + 1 > op.quota.count
                    || (mailbox.bytes + size).unsigned_abs() > op.quota.bytes
                {
                    refused = Some(Accepted::QuotaFull(copy.recipient.clone()));
                    break;
                }
                fresh.push((copy, key));
            }
            if let Some(refusal) = refused {
                outcomes.push(refusal);
                continue;
            }
            let fanned = op.copies.iter().any(|c| c.group.is_some());
            if fresh.is_empty() && !fanned {
                outcomes.push(Accepted::Duplicate);
                continue;
            }
            let mut recipients = Vec::with_capacity(fresh.len());
            for (copy, key) in fresh {
                let mailbox = boxes
                    .get_mut(copy.recipient.as_str())
                    .ok_or_else(|| missing(copy.recipient.as_str()))?;
                let seq = mailbox.next_seq;
                let size = size_of(copy);
                mailbox.next_seq += 1;
                mailbox.waiting += 1;
                mailbox.bytes += size;
                mailbox.changed = true;
                rows.recipient.push(copy.recipient.as_str());
                rows.seq.push(seq);
                rows.sender.push(op.sender.as_str());
                rows.message_id.push(key.0.clone());
                rows.envelope.push(&copy.envelope);
                rows.size.push(size);
                rows.expires_at.push(op.expires_at_ms);
                fresh_keys.insert(key);
                recipients.push(copy.recipient.clone());
                log.push(Committed {
                    recipient: copy.recipient.clone(),
                    seq: unsigned(seq, "sequence number")?,
                    envelope: copy.envelope.clone(),
                    accepted_at_ms: now,
                    // Numbers are dense per recipient (see `schema`).
                    prev: Some(unsigned(seq - 1, "sequence number")?),
                });
            }
            outcomes.push(if fanned {
                Accepted::Fanned {
                    stored: recipients,
                    skipped,
                }
            } else {
                Accepted::Stored(recipients)
            });
        }
        // The two writes, `COMMIT`, and the wakes go out in one write and take one wait (see
        // `pipeline`), so the recipients' mailboxes stay locked only while the server runs
        // them and flushes.
        //
        // The wakes run behind the commit in a transaction of their own that writes nothing
        // else and commits without waiting for its flush (`pipeline::unflushed`): PostgreSQL
        // serialises the commits of every transaction that notifies, on the whole server,
        // until their flush is done (so that notifications queue in commit order); inside the
        // batch that made the nodes' writers commit one at a time. A node that dies between
        // the two leaves its last wakes unsent: that mail waits for the recipient's next read
        // (another wake, or its next connection). A failure here fails no send. After a
        // failed write or commit the wakes still go: they announce copies that readers do not
        // find, or, once the batch ran again with the same numbers, find twice (a session
        // skips what it has sent).
        let changed = Changed::of(&boxes);
        let payloads = wake_payloads(&log, &self.node_id);
        let copies: [&Param<'_>; 8] = [
            &rows.recipient,
            &rows.seq,
            &rows.sender,
            &rows.message_id,
            &rows.envelope,
            &rows.size,
            &now,
            &rows.expires_at,
        ];
        let counters: [&Param<'_>; 4] = [
            &changed.names,
            &changed.next,
            &changed.waiting,
            &changed.bytes,
        ];
        let wakes: [&Param<'_>; 1] = [&payloads];
        let (copies, counters, wakes) = (&copies, &counters, &wakes);
        let (writes, none) = (!rows.seq.is_empty(), payloads.is_empty());
        let (written, woken) = open
            .finish(
                |c| async move {
                    if !writes {
                        return Ok(());
                    }
                    let (inserted, updated) = futures_util::join!(
                        c.execute(&st.insert, copies),
                        c.execute(&st.update, counters),
                    );
                    inserted?;
                    updated.map(drop)
                },
                |c| async move {
                    if none {
                        return Ok(Ok(0));
                    }
                    unflushed(c, |c| c.execute(&st.wake, wakes)).await
                },
            )
            .await?;
        written?;
        if let Err(e) = woken.and_then(|woken| woken) {
            tracing::warn!(error = %describe(&e), "could not wake the other relay nodes after a commit");
        }
        Ok((outcomes, log))
    }
}

/// Why a batch failed.
#[derive(Debug, thiserror::Error)]
enum Failure {
    #[error("{}", describe(.0))]
    Database(#[from] tokio_postgres::Error),
    #[error(transparent)]
    Storage(#[from] StorageError),
}

impl From<deadpool_postgres::PoolError> for Failure {
    fn from(e: deadpool_postgres::PoolError) -> Self {
        Failure::Storage(e.into())
    }
}

fn missing(name: &str) -> StorageError {
    StorageError::Database(format!("the mailbox of {name} was not locked by its batch"))
}

fn mailbox<'a>(
    boxes: &'a HashMap<String, MailboxRow>,
    name: &str,
) -> Result<&'a MailboxRow, StorageError> {
    boxes.get(name).ok_or_else(|| missing(name))
}

fn size_of(copy: &QueuedCopy) -> i64 {
    i64::try_from(copy.envelope.len()).unwrap_or(i64::MAX)
}

/// The batch's statements, prepared once per pooled connection (`prepare_cached`).
struct Statements {
    create: Statement,
    lock: Statement,
    stored: Statement,
    rules: Statement,
    insert: Statement,
    update: Statement,
    wake: Statement,
}

impl Statements {
    async fn prepare(tx: &Client) -> Result<Self, Failure> {
        let (create, lock, stored, rules, insert, update, wake) = futures_util::join!(
            // Every recipient gets a mailbox row, so that the lock below finds them all.
            tx.prepare_cached(
                "INSERT INTO mailboxes (recipient)
                 SELECT r FROM unnest($1::text[]) WITH ORDINALITY AS n(r, i) ORDER BY i
                 ON CONFLICT (recipient) DO NOTHING",
            ),
            // Locks the recipients in name order until the commit: the batch's sequence
            // numbers for them commit before any later batch's (on any node), and batches
            // that share recipients never wait for each other in a circle.
            tx.prepare_cached(
                "SELECT recipient, next_seq, waiting, bytes FROM mailboxes
                 WHERE recipient = ANY($1) ORDER BY recipient FOR UPDATE",
            ),
            // The keys of the batch's copies that are stored already, or were acknowledged
            // a moment ago. Scalar subqueries, not `EXISTS`: the planner may run an `EXISTS`
            // as one hash of the whole table, which a generic plan made while the table was
            // small keeps doing at every run once it is large (see `connect::session_options`).
            tx.prepare_cached(
                "SELECT k.id, k.sender, k.recipient
                 FROM unnest($1::text[], $2::text[], $3::text[]) AS k(id, sender, recipient)
                 WHERE (SELECT true FROM queue q
                        WHERE q.message_id = k.id AND q.sender = k.sender AND q.recipient = k.recipient
                        LIMIT 1)
                    OR (SELECT true FROM acked_copies a
                        WHERE a.message_id = k.id AND a.sender = k.sender AND a.recipient = k.recipient
                          AND a.until_ms >= $4
                        LIMIT 1)",
            ),
            // The consent rule of every (sender, recipient) pair, in the pairs' order.
            tx.prepare_cached(
                // The sender's own row first, else a block of its whole relay (`*@host`).
                "SELECT a.policy,
                        (SELECT r.kind FROM relations r WHERE r.owner = k.recipient
                             AND r.peer IN (k.sender, '*@' || split_part(k.sender, '@', 2))
                         ORDER BY r.peer = k.sender DESC LIMIT 1)
                 FROM unnest($1::text[], $2::text[]) WITH ORDINALITY AS k(sender, recipient, i)
                 LEFT JOIN agents a ON a.name = k.recipient
                 ORDER BY k.i",
            ),
            tx.prepare_cached(
                "INSERT INTO queue (recipient, seq, sender, message_id, envelope, size, accepted_at, expires_at)
                 SELECT r, s, f, m, e, z, $7, x
                 FROM unnest($1::text[], $2::bigint[], $3::text[], $4::text[], $5::bytea[], $6::bigint[], $8::bigint[])
                     AS c(r, s, f, m, e, z, x)",
            ),
            tx.prepare_cached(
                "UPDATE mailboxes m SET next_seq = v.n, waiting = v.w, bytes = v.b
                 FROM unnest($1::text[], $2::bigint[], $3::bigint[], $4::bigint[]) AS v(r, n, w, b)
                 WHERE m.recipient = v.r",
            ),
            // One `mailslot_wake` per recipient, after the commit, so that
            // other nodes fetch at once.
            tx.prepare_cached("SELECT pg_notify('mailslot_wake', p) FROM unnest($1::text[]) AS p"),
        );
        Ok(Self {
            create: create?,
            lock: lock?,
            stored: stored?,
            rules: rules?,
            insert: insert?,
            update: update?,
            wake: wake?,
        })
    }
}

/// The locked mailbox rows, by recipient.
fn mailboxes(rows: Vec<Row>) -> Result<HashMap<String, MailboxRow>, Failure> {
    let mut boxes = HashMap::with_capacity(rows.len());
    for row in rows {
        boxes.insert(
            row.try_get(0)?,
            MailboxRow {
                next_seq: row.try_get(1)?,
                waiting: row.try_get(2)?,
                bytes: row.try_get(3)?,
                changed: false,
            },
        );
    }
    Ok(boxes)
}

/// Every copy's duplicate key, column by column.
struct KeyParams<'a> {
    ids: Vec<String>,
    senders: Vec<&'a str>,
    recipients: Vec<&'a str>,
}

impl<'a> KeyParams<'a> {
    fn of(batch: &'a [AcceptOp]) -> Self {
        let (mut ids, mut senders, mut recipients) = (Vec::new(), Vec::new(), Vec::new());
        for op in batch {
            let id = op.id.to_string();
            for copy in &op.copies {
                ids.push(copy.id.map_or_else(|| id.clone(), |c| c.to_string()));
                senders.push(op.sender.as_str());
                recipients.push(copy.recipient.as_str());
            }
        }
        Self {
            ids,
            senders,
            recipients,
        }
    }
}

fn stored_keys(rows: Vec<Row>) -> Result<HashSet<Key>, Failure> {
    rows.into_iter()
        .map(|row| Ok((row.try_get(0)?, row.try_get(1)?, row.try_get(2)?)))
        .collect()
}

/// The batch's distinct (sender, recipient) pairs, other than a copy to oneself.
struct PairParams<'a> {
    pairs: Vec<(&'a str, &'a str)>,
    senders: Vec<&'a str>,
    recipients: Vec<&'a str>,
}

impl<'a> PairParams<'a> {
    fn of(batch: &'a [AcceptOp]) -> Self {
        let mut pairs: Vec<(&str, &str)> = batch
            .iter()
            .flat_map(|op| {
                op.copies
                    .iter()
                    .filter(|c| c.recipient != op.sender && !is_relay_mailbox(&c.recipient))
                    .flat_map(|c| {
                        // A group copy is checked against the group as well as the sender.
                        let group = c.group.as_ref().map(|g| (g.as_str(), c.recipient.as_str()));
                        std::iter::once((op.sender.as_str(), c.recipient.as_str())).chain(group)
                    })
            })
            .collect();
        pairs.sort_unstable();
        pairs.dedup();
        let (senders, recipients) = pairs.iter().copied().unzip();
        Self {
            pairs,
            senders,
            recipients,
        }
    }
}

/// The consent rule of every pair, from the rows read in the batch's transaction.
fn rules_of<'a>(
    pairs: Vec<(&'a str, &'a str)>,
    rows: Vec<Row>,
) -> Result<HashMap<(&'a str, &'a str), Rule>, Failure> {
    let mut rules = HashMap::with_capacity(pairs.len());
    for (pair, row) in pairs.into_iter().zip(rows) {
        let policy: Option<String> = row.try_get(0)?;
        rules.insert(
            pair,
            Rule {
                policy: policy.and_then(|p| p.parse().ok()),
                relation: row.try_get(1)?,
            },
        );
    }
    Ok(rules)
}

/// The new counters of the mailboxes the batch changed, column by column.
struct Changed<'a> {
    names: Vec<&'a str>,
    next: Vec<i64>,
    waiting: Vec<i64>,
    bytes: Vec<i64>,
}

impl<'a> Changed<'a> {
    fn of(boxes: &'a HashMap<String, MailboxRow>) -> Self {
        let mut changed = Self {
            names: Vec::new(),
            next: Vec::new(),
            waiting: Vec::new(),
            bytes: Vec::new(),
        };
        for (name, mailbox) in boxes.iter().filter(|(_, m)| m.changed) {
            changed.names.push(name.as_str());
            changed.next.push(mailbox.next_seq);
            changed.waiting.push(mailbox.waiting);
            changed.bytes.push(mailbox.bytes);
        }
        changed
    }
}

/// One `mailslot_wake` payload per recipient: its lowest and highest new sequence numbers
/// (`from`, `seq`; the batch numbered every one between), and this node.
fn wake_payloads(log: &[Committed], node: &str) -> Vec<String> {
    let mut ranges: HashMap<&str, (Seq, Seq)> = HashMap::new();
    for c in log {
        let range = ranges.entry(c.recipient.as_str()).or_insert((c.seq, c.seq));
        *range = (range.0.min(c.seq), range.1.max(c.seq));
    }
    ranges
        .into_iter()
        .map(|(recipient, (from, seq))| {
            serde_json::json!({
                "recipient": recipient,
                "from": seq_to_db(from),
                "seq": seq_to_db(seq),
                "node": node,
            })
            .to_string()
        })
        .collect()
}
