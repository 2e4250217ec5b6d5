//! The queue: envelopes waiting for their recipients. Rows live in the `queue` table, which
//! has no secondary index; [`QueueIndex`], in memory, holds what indexes held before: each
//! recipient's rows in order, the totals its quota is checked against, and the key of every
//! stored copy for the duplicate check. Storing a copy writes its row at the end of the table
//! and nothing else, where each index entry had been one more page rewritten per commit.
//!
//! Only the writer changes the index, inside its batch and under the index's lock; a batch
//! that fails makes it reload the index from the table, so the index never shows anything that
//! was not committed. Readers hold the lock only to copy out sequence numbers.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use rusqlite::{Connection, OptionalExtension, params};

use super::consent::Rule;
use super::now_ms;
use super::writer::Batch;
use crate::protocol::{AgentName, MessageId, Policy, Seq};
use crate::relay::storage::{Accepted, Committed, Copy, Queued, Quota, StorageError};

/// Acknowledged rows are deleted this long after their ack. By then most rows stored around
/// them are acknowledged too, so a purge frees whole table pages in sequence order instead of
/// rewriting a page for each row.
const PURGE_LAG: Duration = Duration::from_secs(2);
/// How often a batch purges, unless the last purge stopped at its limit.
const PURGE_EVERY: Duration = Duration::from_millis(100);
/// Rows one purge deletes at most, so that no batch carries a long one.
const PURGE_ROWS: usize = 1024;

/// An agent's number in the index: names are held once, not in every key.
type NameId = u32;

/// What makes a copy a duplicate: the same message id, from the same sender, to the same
/// recipient.
type CopyKey = (MessageId, NameId, NameId);

/// A row of the queue table, as the index knows it.
#[derive(Debug, Clone, Copy)]
struct Row {
    seq: Seq,
    size: u32,
    expires_at_ms: i64,
    key: CopyKey,
}

/// One recipient's unacknowledged rows, oldest first, and their bytes.
#[derive(Default)]
struct Mailbox {
    rows: VecDeque<Row>,
    bytes: u64,
}

impl Mailbox {
    fn push(&mut self, row: Row) {
        self.rows.push_back(row);
        self.bytes += u64::from(row.size);
    }
}

/// The queue's in-memory index (see the module docs).
pub(super) struct QueueIndex {
    ids: HashMap<AgentName, NameId>,
    /// By [`NameId`].
    boxes: Vec<Mailbox>,
    /// The key of every row in the table.
    stored: HashSet<CopyKey>,
    /// Acknowledged rows still in the table, with when they may be deleted; in ack order.
    acked: VecDeque<(Instant, Row)>,
    /// The highest sequence number ever assigned.
    last_seq: Seq,
    last_purge: Option<Instant>,
    /// The last purge stopped at [`PURGE_ROWS`]: the next batch goes on at once.
    behind: bool,
    /// Consent rules read for sends, by (sender, recipient). Every consent change clears
    /// them (see [`QueueIndex::forget_rules`]); reading them was the writer's one query per
    /// copy.
    rules: HashMap<(NameId, NameId), Rule>,
}

/// Consent rules kept at most; beyond that they are forgotten and read again.
const MAX_RULES: usize = 65_536;

/// The storage's handle on the index.
pub(super) fn lock(index: &Mutex<QueueIndex>) -> MutexGuard<'_, QueueIndex> {
    // Poisoned only if the writer thread panicked, and then every write fails anyway.
    index.lock().unwrap_or_else(|e| e.into_inner())
}

fn corrupt(seq: i64, what: impl std::fmt::Display) -> StorageError {
    StorageError::Database(format!("queue row {seq} is invalid: {what}"))
}

impl QueueIndex {
    /// Builds the index from the table: one pass in sequence order.
    pub(super) fn load(conn: &Connection) -> Result<Self, StorageError> {
        let mut index = Self {
            ids: HashMap::new(),
            boxes: Vec::new(),
            stored: HashSet::new(),
            acked: VecDeque::new(),
            last_seq: 0,
            last_purge: None,
            behind: false,
            rules: HashMap::new(),
        };
        let acked: HashMap<String, i64> = conn
            .prepare("SELECT recipient, seq FROM acked")?
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
            .collect::<Result<_, _>>()?;
        let high: Option<String> = conn
            .query_row("SELECT value FROM meta WHERE key = 'seq_high'", [], |r| {
                r.get(0)
            })
            .optional()?;
        if let Some(high) = high {
            index.last_seq = high.parse().map_err(|_| {
                StorageError::Database(format!("meta seq_high {high:?} is not a number"))
            })?;
        }
        let now = Instant::now();
        let mut stmt = conn.prepare(
            "SELECT seq, recipient, sender, message_id, size, expires_at FROM queue ORDER BY seq",
        )?;
        let mut rows = stmt.query([])?;
        while let Some(r) = rows.next()? {
            let seq: i64 = r.get(0)?;
            let recipient: String = r.get(1)?;
            let name = |s: &str| AgentName::new(s).map_err(|e| corrupt(seq, e));
            let rid = index.id(&name(&recipient)?);
            let sid = index.id(&name(&r.get::<_, String>(2)?)?);
            let id = MessageId::parse(&r.get::<_, String>(3)?).map_err(|e| corrupt(seq, e))?;
            let size: i64 = r.get(4)?;
            let row = Row {
                seq: u64::try_from(seq).map_err(|e| corrupt(seq, e))?,
                size: u32::try_from(size).map_err(|e| corrupt(seq, e))?,
                expires_at_ms: r.get(5)?,
                key: (id, sid, rid),
            };
            index.stored.insert(row.key);
            index.last_seq = index.last_seq.max(row.seq);
            if seq <= acked.get(&recipient).copied().unwrap_or(0) {
                index.acked.push_back((now, row));
            } else {
                index.boxes[rid as usize].push(row);
            }
        }
        Ok(index)
    }

    /// The agent's number, given one now if it has none.
    fn id(&mut self, name: &AgentName) -> NameId {
        if let Some(&id) = self.ids.get(name) {
            return id;
        }
        let id = self.boxes.len() as NameId;
        self.boxes.push(Mailbox::default());
        self.ids.insert(name.clone(), id);
        id
    }

    /// The mailbox of a name, if it ever had mail.
    fn find(&self, name: &AgentName) -> Option<&Mailbox> {
        self.ids.get(name).map(|&id| &self.boxes[id as usize])
    }

    /// Stores a row in the index; returns its new sequence number.
    fn store(&mut self, size: u32, expires_at_ms: i64, key: CopyKey) -> Seq {
        self.last_seq += 1;
        let row = Row {
            seq: self.last_seq,
            size,
            expires_at_ms,
            key,
        };
        self.boxes[key.2 as usize].push(row);
        self.stored.insert(key);
        row.seq
    }

    /// Acknowledges the recipient's rows up to `upto`; returns how many there were.
    fn ack(&mut self, recipient: NameId, upto: Seq, now: Instant) -> u64 {
        let mailbox = &mut self.boxes[recipient as usize];
        let mut count = 0;
        while let Some(&row) = mailbox.rows.front()
            && row.seq <= upto
        {
            mailbox.rows.pop_front();
            mailbox.bytes -= u64::from(row.size);
            self.acked.push_back((now + PURGE_LAG, row));
            count += 1;
        }
        count
    }

    /// The acknowledged rows a batch starting `now` deletes, in sequence order (none when it
    /// is not time yet), taken out of the index.
    fn due(&mut self, now: Instant) -> Vec<Seq> {
        let waited = self
            .last_purge
            .is_none_or(|t| now.duration_since(t) >= PURGE_EVERY);
        if !(self.behind || waited) {
            return Vec::new();
        }
        let mut seqs = Vec::new();
        while seqs.len() < PURGE_ROWS
            && let Some(&(at, row)) = self.acked.front()
            && at <= now
        {
            self.acked.pop_front();
            self.stored.remove(&row.key);
            seqs.push(row.seq);
        }
        if !seqs.is_empty() {
            self.last_purge = Some(now);
            self.behind = seqs.len() == PURGE_ROWS;
            seqs.sort_unstable();
        }
        seqs
    }

    /// Takes the unacknowledged rows that expired before `now_ms` out of the index; returns
    /// their sequence numbers, in order.
    fn expire(&mut self, now_ms: i64) -> Vec<Seq> {
        let mut gone = Vec::new();
        for mailbox in &mut self.boxes {
            let before = gone.len();
            mailbox.rows.retain(|r| {
                let keep = r.expires_at_ms >= now_ms;
                if !keep {
                    gone.push(*r);
                }
                keep
            });
            mailbox.bytes -= gone[before..]
                .iter()
                .map(|r| u64::from(r.size))
                .sum::<u64>();
        }
        for row in &gone {
            self.stored.remove(&row.key);
        }
        let mut seqs: Vec<Seq> = gone.iter().map(|r| r.seq).collect();
        seqs.sort_unstable();
        seqs
    }

    /// The highest sequence number assigned so far.
    pub(super) fn last_seq(&self) -> Seq {
        self.last_seq
    }

    /// Up to `limit` sequence numbers of `agent`'s unacknowledged rows after `after`, at most
    /// `durable`: a row committed but not yet on disk is not delivered yet.
    fn after(&self, agent: &AgentName, after: Seq, durable: Seq, limit: usize) -> Vec<Seq> {
        let Some(mailbox) = self.find(agent) else {
            return Vec::new();
        };
        let start = mailbox.rows.partition_point(|r| r.seq <= after);
        mailbox
            .rows
            .range(start..)
            .take_while(|r| r.seq <= durable)
            .take(limit)
            .map(|r| r.seq)
            .collect()
    }

    /// Forgets every consent rule read so far: a write is about to change them.
    pub(super) fn forget_rules(&mut self) {
        self.rules.clear();
    }

    /// Messages waiting for `agent`.
    pub(super) fn waiting(&self, agent: &AgentName) -> u64 {
        self.find(agent).map_or(0, |m| m.rows.len() as u64)
    }

    /// Messages waiting for everyone.
    pub(super) fn total_waiting(&self) -> u64 {
        self.boxes.iter().map(|m| m.rows.len() as u64).sum()
    }
}

/// A send, as the writer applies it.
pub(super) struct AcceptOp {
    pub(super) sender: AgentName,
    pub(super) id: MessageId,
    pub(super) copies: Vec<Copy>,
    pub(super) quota: Quota,
    pub(super) expires_at_ms: i64,
    pub(super) default: Policy,
}

/// Stores the copies of a send that are not stored yet, all or none (see
/// [`crate::relay::storage::Storage::accept`]).
pub(super) fn accept(b: &mut Batch<'_, '_>, op: &AcceptOp) -> Result<Accepted, StorageError> {
    let sender = b.index.id(&op.sender);
    let mut fresh = Vec::with_capacity(op.copies.len());
    for copy in &op.copies {
        let recipient = b.index.id(&copy.recipient);
        let key = (op.id, sender, recipient);
        // A copy acknowledged and deleted earlier is indistinguishable from a new one; the
        // client's store deduplicates by id, so a late re-send is still shown once.
        if b.index.stored.contains(&key) {
            continue;
        }
        if copy.recipient != op.sender
            && !rule(b, (sender, &op.sender), (recipient, &copy.recipient))?.allows(op.default)
        {
            return Ok(Accepted::NotAllowed(copy.recipient.clone()));
        }
        let mailbox = &b.index.boxes[recipient as usize];
        if mailbox.rows.len() as u64 + 1 > op.quota.count
            || mailbox.bytes + copy.envelope.len() as u64 > op.quota.bytes
        {
            return Ok(Accepted::QuotaFull(copy.recipient.clone()));
        }
        fresh.push((copy, key));
    }
    if fresh.is_empty() {
        return Ok(Accepted::Duplicate);
    }
    let now = now_ms();
    let id = op.id.to_string();
    let mut insert = b.tx.prepare_cached(
        "INSERT INTO queue (seq, recipient, sender, message_id, envelope, size, accepted_at, expires_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
    )?;
    let mut recipients = Vec::with_capacity(fresh.len());
    for (copy, key) in fresh {
        let size = u32::try_from(copy.envelope.len())
            .map_err(|_| StorageError::Database("an envelope over 4 GiB".into()))?;
        let seq = b.index.store(size, op.expires_at_ms, key);
        insert.execute(params![
            seq as i64,
            copy.recipient.as_str(),
            op.sender.as_str(),
            id,
            &copy.envelope[..],
            size,
            now,
            op.expires_at_ms
        ])?;
        recipients.push(copy.recipient.clone());
        b.log.push(Committed {
            recipient: copy.recipient.clone(),
            seq,
            envelope: copy.envelope.clone(),
            accepted_at_ms: now,
        });
    }
    Ok(Accepted::Stored(recipients))
}

/// The consent rule for mail from `sender` to `recipient`, remembered from an earlier send or
/// read now.
fn rule(
    b: &mut Batch<'_, '_>,
    (sender, sender_name): (NameId, &AgentName),
    (recipient, recipient_name): (NameId, &AgentName),
) -> Result<Rule, StorageError> {
    if let Some(rule) = b.index.rules.get(&(sender, recipient)) {
        return Ok(*rule);
    }
    let rule = Rule::read(b.tx, sender_name, recipient_name)?;
    if b.index.rules.len() >= MAX_RULES {
        b.index.rules.clear();
    }
    b.index.rules.insert((sender, recipient), rule);
    Ok(rule)
}

/// Records a cumulative ack; returns how many rows it acknowledged. The rows stay in the
/// table until a later purge (see [`PURGE_LAG`]).
pub(super) fn ack(
    b: &mut Batch<'_, '_>,
    agent: &AgentName,
    upto: Seq,
) -> Result<u64, StorageError> {
    let Some(&recipient) = b.index.ids.get(agent) else {
        return Ok(0);
    };
    let count = b.index.ack(recipient, upto, Instant::now());
    if count > 0 {
        b.tx.prepare_cached(
            "INSERT INTO acked (recipient, seq) VALUES (?1, ?2)
             ON CONFLICT (recipient) DO UPDATE SET seq = max(seq, excluded.seq)",
        )?
        .execute(params![agent.as_str(), upto as i64])?;
    }
    Ok(count)
}

/// Deletes the acknowledged rows whose purge is due.
pub(super) fn purge(b: &mut Batch<'_, '_>, now: Instant) -> Result<(), StorageError> {
    let seqs = b.index.due(now);
    delete(b, &seqs)
}

/// Deletes the unacknowledged rows past their TTL; returns how many.
pub(super) fn expire(b: &mut Batch<'_, '_>, now_ms: i64) -> Result<u64, StorageError> {
    let seqs = b.index.expire(now_ms);
    delete(b, &seqs)?;
    Ok(seqs.len() as u64)
}

/// Deletes rows by sequence number (ascending), a run of consecutive numbers per statement,
/// and records the highest number assigned so far: a deleted number never comes back.
fn delete(b: &mut Batch<'_, '_>, seqs: &[Seq]) -> Result<(), StorageError> {
    if seqs.is_empty() {
        return Ok(());
    }
    let mut stmt =
        b.tx.prepare_cached("DELETE FROM queue WHERE seq BETWEEN ?1 AND ?2")?;
    let mut runs = seqs.iter().copied().peekable();
    while let Some(first) = runs.next() {
        let mut last = first;
        while let Some(next) = runs.next_if(|&n| n == last + 1) {
            last = next;
        }
        stmt.execute(params![first as i64, last as i64])?;
    }
    b.tx.prepare_cached(
        "INSERT INTO meta (key, value) VALUES ('seq_high', ?1)
         ON CONFLICT (key) DO UPDATE SET value = excluded.value",
    )?
    .execute([b.index.last_seq.to_string()])?;
    Ok(())
}

/// Up to `limit` of `agent`'s unacknowledged envelopes after `after`, in order, among those
/// made durable up to `durable`. Reads one snapshot that holds every commit the index showed.
pub(super) fn pending(
    conn: &Connection,
    index: &Mutex<QueueIndex>,
    durable: &AtomicU64,
    agent: &AgentName,
    after: Seq,
    limit: usize,
) -> Result<Vec<Queued>, StorageError> {
    let mut out = Vec::with_capacity(limit.min(1024));
    let mut cursor = after;
    while out.len() < limit {
        let want = limit - out.len();
        let seqs = lock(index).after(agent, cursor, durable.load(Ordering::Acquire), want);
        let Some(&last) = seqs.last() else { break };
        let tx = conn.unchecked_transaction()?;
        let mut stmt =
            tx.prepare_cached("SELECT envelope, accepted_at FROM queue WHERE seq = ?1")?;
        for &seq in &seqs {
            // A row that expired since the index was read is gone; the next ones follow.
            if let Some((envelope, accepted_at_ms)) = stmt
                .query_row([seq as i64], |r| Ok((r.get(0)?, r.get(1)?)))
                .optional()?
            {
                out.push(Queued {
                    seq,
                    envelope,
                    accepted_at_ms,
                });
            }
        }
        if seqs.len() < want {
            break;
        }
        cursor = last;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn index() -> QueueIndex {
        let conn = Connection::open_in_memory().unwrap();
        for sql in super::super::schema::MIGRATIONS {
            conn.execute_batch(sql).unwrap();
        }
        QueueIndex::load(&conn).unwrap()
    }

    fn name(n: &str) -> AgentName {
        AgentName::new(n).unwrap()
    }

    #[test]
    fn acked_rows_are_purged_after_the_lag_in_order_and_the_limit_carries_over() {
        let mut ix = index();
        let (alice, bob) = (ix.id(&name("alice")), ix.id(&name("bob")));
        let seqs: Vec<Seq> = (0..PURGE_ROWS + 10)
            .map(|_| ix.store(10, i64::MAX, (MessageId::new(), alice, bob)))
            .collect();
        let t0 = Instant::now();
        assert_eq!(ix.ack(bob, seqs[PURGE_ROWS + 4], t0), PURGE_ROWS as u64 + 5);
        assert_eq!(ix.waiting(&name("bob")), 5);
        assert!(ix.due(t0 + PURGE_LAG / 2).is_empty(), "not old enough yet");
        let first = ix.due(t0 + PURGE_LAG);
        assert_eq!(first, seqs[..PURGE_ROWS].to_vec());
        assert_eq!(
            ix.due(t0 + PURGE_LAG + Duration::from_millis(1)),
            seqs[PURGE_ROWS..PURGE_ROWS + 5].to_vec(),
            "the limit stopped the first purge: the next goes on at once"
        );
        assert!(ix.acked.is_empty());
        assert_eq!(ix.stored.len(), 5, "purged copies are no longer duplicates");
    }

    #[test]
    fn expiry_takes_only_unacknowledged_rows_past_their_ttl() {
        let mut ix = index();
        let (alice, bob) = (ix.id(&name("alice")), ix.id(&name("bob")));
        let old = ix.store(10, 1_000, (MessageId::new(), alice, bob));
        let acked_old = ix.store(10, 1_000, (MessageId::new(), alice, alice));
        let young = ix.store(10, 5_000, (MessageId::new(), alice, bob));
        ix.ack(alice, acked_old, Instant::now());
        assert_eq!(ix.expire(2_000), vec![old]);
        assert_eq!(ix.after(&name("bob"), 0, Seq::MAX, 10), vec![young]);
        assert_eq!(ix.total_waiting(), 1);
        assert_eq!(ix.find(&name("bob")).unwrap().bytes, 10);
    }

    #[test]
    fn after_reads_past_the_cursor_up_to_the_limit() {
        let mut ix = index();
        let (alice, bob) = (ix.id(&name("alice")), ix.id(&name("bob")));
        let seqs: Vec<Seq> = (0..5)
            .map(|_| ix.store(1, i64::MAX, (MessageId::new(), alice, bob)))
            .collect();
        assert_eq!(
            ix.after(&name("bob"), seqs[1], Seq::MAX, 2),
            seqs[2..4].to_vec()
        );
        assert_eq!(
            ix.after(&name("bob"), 0, seqs[2], 10),
            seqs[..3].to_vec(),
            "rows not yet durable wait"
        );
        assert!(ix.after(&name("carol"), 0, Seq::MAX, 10).is_empty());
    }
}
