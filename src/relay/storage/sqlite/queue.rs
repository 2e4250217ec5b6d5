//! The queue: envelopes waiting for their recipients. Copies and acknowledgements are records
//! in the spool (see [`super::spool`]); [`QueueIndex`], in memory, holds each recipient's
//! copies in order with where they are, the totals its quota is checked against, the key of
//! every stored copy for the duplicate check, and how much of each segment is still live, so
//! that dead segments are removed and sparse ones compacted.
//!
//! Only the writer changes the index, inside its batch and under the index's lock; a batch
//! that fails makes it reload the index from the spool, so the index never shows anything that
//! was not written. Readers hold the lock only to copy out locations.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use rusqlite::{Connection, OptionalExtension};

use super::batch::Batch;
use super::consent::Rule;
use super::now_ms;
use super::scan::ScannedSegment;
use super::spool::{self, Files, Location, Position, Scanned, Spool, StoredCopy};
use jiff::Timestamp;

use crate::protocol::{Address, AgentName, Bounce, CopyKey, MessageId, Policy, RelayName, Seq};
use crate::relay::storage::queue::is_relay_mailbox;
use crate::relay::storage::{
    Accepted, AckOutcome, Committed, Copy, Epoch, Queued, Quota, StorageError,
};

/// An acknowledged copy still counts as a duplicate this long after its ack, so that a
/// sender's retry racing the recipient's ack is not stored twice.
const DUPLICATE_LAG: Duration = Duration::from_secs(2);
/// How often a batch looks for segments to remove or compact.
const SWEEP_EVERY: Duration = Duration::from_millis(100);
/// A sealed segment this many segments behind the head, with under a quarter of it live, has
/// its live copies moved to the head. Younger segments are left to their acks.
const COMPACT_BEHIND: u32 = 3;

/// An agent's number in the index: names are held once, not in every key.
type NameId = u32;

/// What makes a copy a duplicate: the same message id, from the same sender, to the same
/// recipient.
type IndexKey = (MessageId, NameId, NameId);

/// A stored copy, as the index knows it.
#[derive(Debug, Clone, Copy)]
struct Row {
    seq: Seq,
    size: u32,
    expires_at_ms: i64,
    key: IndexKey,
    at: Location,
}

/// One recipient: its unacknowledged copies, oldest first, and their bytes; how far it has
/// acknowledged, and the segment holding the record that says so.
struct Mailbox {
    name: AgentName,
    rows: VecDeque<Row>,
    bytes: u64,
    acked_upto: Seq,
    ack_seg: Option<u32>,
}

/// How much of a segment still matters.
#[derive(Debug, Default, Clone, Copy)]
struct SegmentUse {
    /// Unacknowledged, unexpired copies.
    live: u32,
    live_bytes: u64,
    /// Recipients whose latest ack record is here.
    acks: u32,
    /// Dead: removed once a flush covers this position, where the spool ended when that
    /// was decided.
    retire_at: Option<Position>,
    /// Compacting it failed on a record that does not read back; it is left as it is.
    unreadable: bool,
}

/// The queue's in-memory index (see the module docs).
pub(super) struct QueueIndex {
    ids: HashMap<AgentName, NameId>,
    /// By [`NameId`].
    boxes: Vec<Mailbox>,
    /// The key of every copy that counts for the duplicate check, with its sequence number
    /// (which says whether it is still queued: see [`QueueIndex::is_queued`]).
    stored: HashMap<IndexKey, Seq>,
    /// Acknowledged copies' keys, with when they stop counting as duplicates; in ack order.
    acked: VecDeque<(Instant, IndexKey)>,
    /// The highest sequence number ever assigned.
    last_seq: Seq,
    segments: BTreeMap<u32, SegmentUse>,
    last_sweep: Option<Instant>,
    /// Consent rules read for sends, by (sender, recipient). Every consent change clears
    /// them (see [`QueueIndex::forget_rules`]); reading them was the writer's one query per
    /// copy.
    rules: HashMap<(NameId, NameId), Rule>,
    /// Each agent's latest delivery claim. Not durable: after a restart no session is left
    /// to fence.
    leases: HashMap<AgentName, u64>,
}

/// Consent rules kept at most; beyond that they are forgotten and read again.
const MAX_RULES: usize = 65_536;

/// The storage's handle on the index.
pub(super) fn lock(index: &Mutex<QueueIndex>) -> MutexGuard<'_, QueueIndex> {
    // Poisoned only if the writer thread panicked, and then every write fails anyway.
    index.lock().unwrap_or_else(|e| e.into_inner())
}

impl QueueIndex {
    fn empty() -> Self {
        Self {
            ids: HashMap::new(),
            boxes: Vec::new(),
            stored: HashMap::new(),
            acked: VecDeque::new(),
            last_seq: 0,
            segments: BTreeMap::new(),
            last_sweep: None,
            rules: HashMap::new(),
            leases: HashMap::new(),
        }
    }

    /// A new claim of `agent`'s delivery session, later than every earlier one.
    pub(super) fn claim(&mut self, agent: &AgentName) -> Epoch {
        let epoch = self.leases.entry(agent.clone()).or_insert(0);
        *epoch += 1;
        Epoch::new(*epoch)
    }

    /// Carries the claims over to a rebuilt index.
    pub(super) fn keep_leases(&mut self, from: &mut QueueIndex) {
        self.leases = std::mem::take(&mut from.leases);
    }

    /// Builds the index from the spool's records: the last record of a copy says where it
    /// is, the highest ack per recipient which copies are done, and copies past their expiry
    /// are left out.
    pub(super) fn load(segments: &[ScannedSegment], now_ms: i64) -> Self {
        Self::load_expiring(segments, now_ms).0
    }

    /// [`QueueIndex::load`], and the unacknowledged copies it left out as expired: their
    /// sender, recipient and message id, to bounce. (A copy that expired and bounced before a
    /// restart is among them while its record is in the spool: its sender's store records a
    /// bounce once.) Copies in relay mailboxes stay however old they are: their link expires
    /// them ([`crate::relay::storage::Queue::expire`]).
    pub(super) fn load_expiring(
        segments: &[ScannedSegment],
        now_ms: i64,
    ) -> (Self, Vec<(AgentName, AgentName, MessageId)>) {
        let mut index = Self::empty();
        let mut expired = Vec::new();
        let mut copies: BTreeMap<Seq, Row> = BTreeMap::new();
        for segment in segments {
            index.segments.insert(segment.seg, SegmentUse::default());
            for record in &segment.records {
                match record {
                    Scanned::High(high) | Scanned::Mark { high, .. } => {
                        index.last_seq = index.last_seq.max(*high);
                    }
                    Scanned::Stored {
                        at,
                        seq,
                        size,
                        expires_at_ms,
                        id,
                        recipient,
                        sender,
                    } => {
                        let key = (*id, index.id(sender), index.id(recipient));
                        index.last_seq = index.last_seq.max(*seq);
                        copies.insert(
                            *seq,
                            Row {
                                seq: *seq,
                                size: *size,
                                expires_at_ms: *expires_at_ms,
                                key,
                                at: *at,
                            },
                        );
                    }
                    Scanned::Acked {
                        at,
                        recipient,
                        upto,
                    } => {
                        let id = index.id(recipient);
                        let mailbox = &mut index.boxes[id as usize];
                        mailbox.acked_upto = mailbox.acked_upto.max(*upto);
                        mailbox.ack_seg = Some(at.seg);
                    }
                }
            }
        }
        let now = Instant::now();
        for row in copies.into_values() {
            let mailbox = &index.boxes[row.key.2 as usize];
            let acked = row.seq <= mailbox.acked_upto;
            if row.expires_at_ms < now_ms && !is_relay_mailbox(&mailbox.name) {
                if !acked {
                    let (id, from, to) = row.key;
                    let name = |n: NameId| index.boxes[n as usize].name.clone();
                    expired.push((name(from), name(to), id));
                }
                continue;
            }
            if acked {
                index.stored.insert(row.key, row.seq);
                index.acked.push_back((now, row.key));
            } else {
                index.insert(row);
            }
        }
        for seg in index.boxes.iter().filter_map(|m| m.ack_seg) {
            index.segments.entry(seg).or_default().acks += 1;
        }
        (index, expired)
    }

    /// The agent's number, given one now if it has none.
    fn id(&mut self, name: &AgentName) -> NameId {
        if let Some(&id) = self.ids.get(name) {
            return id;
        }
        let id = self.boxes.len() as NameId;
        self.boxes.push(Mailbox {
            name: name.clone(),
            rows: VecDeque::new(),
            bytes: 0,
            acked_upto: 0,
            ack_seg: None,
        });
        self.ids.insert(name.clone(), id);
        id
    }

    /// The mailbox of a name, if it ever had mail.
    fn find(&self, name: &AgentName) -> Option<&Mailbox> {
        self.ids.get(name).map(|&id| &self.boxes[id as usize])
    }

    /// Puts an unacknowledged copy at the end of its recipient's mailbox.
    fn insert(&mut self, row: Row) {
        let mailbox = &mut self.boxes[row.key.2 as usize];
        mailbox.rows.push_back(row);
        mailbox.bytes += u64::from(row.size);
        self.stored.insert(row.key, row.seq);
        self.born(&row);
    }

    /// A copy's record was written at `row.at`: its segment holds one more.
    fn born(&mut self, row: &Row) {
        let used = self.segments.entry(row.at.seg).or_default();
        used.live += 1;
        used.live_bytes += u64::from(row.size);
    }

    /// A copy left its mailbox (acknowledged or expired): its segment holds one less.
    fn died(&mut self, row: &Row) {
        if let Some(used) = self.segments.get_mut(&row.at.seg) {
            used.live = used.live.saturating_sub(1);
            used.live_bytes = used.live_bytes.saturating_sub(u64::from(row.size));
        }
    }

    /// Acknowledges the recipient's copies up to `upto`; returns how many there were and the
    /// highest sequence number among them.
    fn ack(&mut self, recipient: NameId, upto: Seq, now: Instant) -> (u64, Seq) {
        let mut count = 0;
        let mut last = 0;
        while let Some(&row) = self.boxes[recipient as usize].rows.front()
            && row.seq <= upto
        {
            let mailbox = &mut self.boxes[recipient as usize];
            mailbox.rows.pop_front();
            mailbox.bytes -= u64::from(row.size);
            self.acked.push_back((now + DUPLICATE_LAG, row.key));
            self.died(&row);
            count += 1;
            last = row.seq;
        }
        (count, last)
    }

    /// Records that the recipient's latest ack, up to `upto`, is in segment `seg`.
    fn note_ack(&mut self, recipient: NameId, upto: Seq, seg: u32) {
        let mailbox = &mut self.boxes[recipient as usize];
        mailbox.acked_upto = mailbox.acked_upto.max(upto);
        let old = mailbox.ack_seg.replace(seg);
        if old != Some(seg) {
            if let Some(used) = old.and_then(|s| self.segments.get_mut(&s)) {
                used.acks = used.acks.saturating_sub(1);
            }
            self.segments.entry(seg).or_default().acks += 1;
        }
    }

    /// Forgets the keys of copies acknowledged long enough ago; returns how many.
    fn forget_acked(&mut self, now: Instant) -> usize {
        let mut count = 0;
        while let Some(&(at, key)) = self.acked.front()
            && at <= now
        {
            self.acked.pop_front();
            self.stored.remove(&key);
            count += 1;
        }
        count
    }

    /// Takes the unacknowledged copies that expired before `now_ms` out of the index, except
    /// those in relay mailboxes (their link expires them); returns each one's sender,
    /// recipient and message id.
    fn expire(&mut self, now_ms: i64) -> Vec<(AgentName, AgentName, MessageId)> {
        let mut gone = Vec::new();
        for mailbox in self.boxes.iter_mut().filter(|m| !is_relay_mailbox(&m.name)) {
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
            self.died(row);
        }
        gone.iter()
            .map(|r| {
                let (id, from, to) = r.key;
                let name = |n: NameId| self.boxes[n as usize].name.clone();
                (name(from), name(to), id)
            })
            .collect()
    }

    /// Segments nothing in the index needs: no live copy, no recipient's latest ack.
    pub(super) fn dead_segments(&self) -> Vec<u32> {
        self.segments
            .iter()
            .filter(|(_, used)| used.live == 0 && used.acks == 0)
            .map(|(&seg, _)| seg)
            .collect()
    }

    /// Forgets a segment that was removed.
    pub(super) fn removed(&mut self, seg: u32) {
        self.segments.remove(&seg);
    }

    /// The highest sequence number assigned so far.
    pub(super) fn last_seq(&self) -> Seq {
        self.last_seq
    }

    /// Up to `limit` of `agent`'s unacknowledged copies after `after`, at most `durable`: a
    /// copy written but not yet on disk is not delivered yet.
    fn after(
        &self,
        agent: &AgentName,
        after: Seq,
        durable: Seq,
        limit: usize,
    ) -> Vec<(Seq, Location, usize)> {
        let Some(mailbox) = self.find(agent) else {
            return Vec::new();
        };
        let start = mailbox.rows.partition_point(|r| r.seq <= after);
        mailbox
            .rows
            .range(start..)
            .take_while(|r| r.seq <= durable)
            .take(limit)
            .map(|r| {
                let sender = &self.boxes[r.key.1 as usize].name;
                (r.seq, r.at, spool::stored_len(agent, sender, r.size))
            })
            .collect()
    }

    /// Forgets every consent rule read so far: a write is about to change them.
    pub(super) fn forget_rules(&mut self) {
        self.rules.clear();
    }

    /// Whether `recipient`'s copy `seq` is queued (`Some(true)`) or was acknowledged
    /// (`Some(false)`); `None` when it is neither.
    pub(super) fn fate(&self, recipient: &AgentName, seq: Seq) -> Option<bool> {
        let mailbox = self.find(recipient)?;
        if seq <= mailbox.acked_upto {
            return Some(false);
        }
        mailbox
            .rows
            .binary_search_by_key(&seq, |r| r.seq)
            .is_ok()
            .then_some(true)
    }

    /// Whether `sender`'s copy of message `id` for `recipient` is queued (stored and neither
    /// acknowledged nor expired).
    pub(super) fn is_queued(
        &self,
        sender: &AgentName,
        id: MessageId,
        recipient: &AgentName,
    ) -> bool {
        let (Some(&from), Some(&to)) = (self.ids.get(sender), self.ids.get(recipient)) else {
            return false;
        };
        self.stored
            .get(&(id, from, to))
            .is_some_and(|&seq| self.fate(recipient, seq) == Some(true))
    }

    /// Messages waiting for `agent`.
    pub(super) fn waiting(&self, agent: &AgentName) -> u64 {
        self.find(agent).map_or(0, |m| m.rows.len() as u64)
    }

    /// Messages waiting for everyone.
    pub(super) fn total_waiting(&self) -> u64 {
        self.boxes.iter().map(|m| m.rows.len() as u64).sum()
    }

    /// The relays whose mailboxes hold copies.
    pub(super) fn relay_mailboxes(&self) -> Vec<RelayName> {
        self.boxes
            .iter()
            .filter(|m| !m.rows.is_empty())
            .filter_map(|m| m.name.mailbox_relay())
            .collect()
    }

    /// Every unacknowledged copy and where it is: recipient by recipient in name order, each
    /// recipient's in sequence order.
    pub(super) fn waiting_rows(&self) -> Vec<WaitingRow> {
        let mut boxes: Vec<&Mailbox> = self.boxes.iter().filter(|m| !m.rows.is_empty()).collect();
        boxes.sort_unstable_by(|a, b| a.name.cmp(&b.name));
        boxes
            .into_iter()
            .flat_map(|mailbox| {
                mailbox.rows.iter().map(|row| WaitingRow {
                    recipient: mailbox.name.clone(),
                    sender: self.boxes[row.key.1 as usize].name.clone(),
                    id: row.key.0,
                    seq: row.seq,
                    expires_at_ms: row.expires_at_ms,
                    size: row.size,
                    at: row.at,
                })
            })
            .collect()
    }
}

/// An unacknowledged copy as the index knows it: enough to read it back from the spool.
pub(super) struct WaitingRow {
    pub(super) recipient: AgentName,
    pub(super) sender: AgentName,
    pub(super) id: MessageId,
    pub(super) seq: Seq,
    pub(super) expires_at_ms: i64,
    /// The envelope's bytes.
    pub(super) size: u32,
    pub(super) at: Location,
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
        let key = (copy.id.unwrap_or(op.id), sender, recipient);
        // A copy acknowledged a while ago is indistinguishable from a new one; the client's
        // store deduplicates by id, so a late re-send is still shown once.
        if b.index.stored.contains_key(&key) {
            continue;
        }
        // A relay mailbox takes mail from anyone: the relay it leads to applies its agents'
        // consent.
        if copy.recipient != op.sender
            && !is_relay_mailbox(&copy.recipient)
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
    let mut recipients = Vec::with_capacity(fresh.len());
    for (copy, key) in fresh {
        let size = u32::try_from(copy.envelope.len())
            .map_err(|_| StorageError::Database("an envelope over 4 GiB".into()))?;
        let seq = b.index.last_seq + 1;
        let at = b.spool.stored(&StoredCopy {
            seq,
            accepted_at_ms: now,
            expires_at_ms: op.expires_at_ms,
            id: key.0,
            recipient: &copy.recipient,
            sender: &op.sender,
            envelope: &copy.envelope,
        })?;
        b.index.last_seq = seq;
        b.index.insert(Row {
            seq,
            size,
            expires_at_ms: op.expires_at_ms,
            key,
            at,
        });
        recipients.push(copy.recipient.clone());
        b.log.push(Committed {
            recipient: copy.recipient.clone(),
            seq,
            envelope: copy.envelope.clone(),
            accepted_at_ms: now,
            prev: None,
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

/// Records a cumulative ack; returns how many copies it acknowledged.
pub(super) fn ack(
    b: &mut Batch<'_, '_>,
    agent: &AgentName,
    upto: Seq,
    epoch: Epoch,
) -> Result<AckOutcome, StorageError> {
    // Claims take the index lock, which the writer holds through the commit: an ack is
    // either committed before a later claim or checked against it.
    if b.index
        .leases
        .get(agent)
        .is_some_and(|&latest| latest > epoch.get())
    {
        return Ok(AckOutcome::Fenced);
    }
    let Some(&recipient) = b.index.ids.get(agent) else {
        return Ok(AckOutcome::Applied(0));
    };
    let (count, last) = b.index.ack(recipient, upto, Instant::now());
    if count > 0 {
        // The highest copy acknowledged, not `upto`: a number past every copy would hide
        // the next ones after a restart.
        let at = b.spool.acked(agent, last)?;
        b.index.note_ack(recipient, last, at.seg);
    }
    Ok(AckOutcome::Applied(count))
}

/// Takes the unacknowledged copies past their TTL out of the queue and records a bounce for
/// each one's sender, in the batch's transaction; returns the bounces by sender. Nothing is
/// written to the spool: a scan leaves expired copies out.
pub(super) fn expire(
    b: &mut Batch<'_, '_>,
    now_ms: i64,
) -> Result<Vec<(AgentName, Bounce)>, StorageError> {
    let gone = b.index.expire(now_ms);
    record_bounces(b.tx, gone, now_ms)
}

/// Records a bounce for each expired copy (sender, recipient, id); returns them by sender.
pub(super) fn record_bounces(
    conn: &Connection,
    expired: Vec<(AgentName, AgentName, MessageId)>,
    now_ms: i64,
) -> Result<Vec<(AgentName, Bounce)>, StorageError> {
    let expired_at = Timestamp::from_millisecond(now_ms).unwrap_or(Timestamp::UNIX_EPOCH);
    let bounces: Vec<(AgentName, Bounce)> = expired
        .into_iter()
        .map(|(sender, recipient, id)| {
            let to = Address::local(recipient);
            (sender, Bounce { id, to, expired_at })
        })
        .collect();
    for (sender, bounce) in &bounces {
        insert_bounces(conn, sender, std::slice::from_ref(bounce))?;
    }
    Ok(bounces)
}

/// Stores `sender`'s bounces, each under its recipient as written (a bare name for a local
/// agent, `name@host` for one on another relay); one already stored is kept as it is.
pub(super) fn insert_bounces(
    conn: &Connection,
    sender: &AgentName,
    bounces: &[Bounce],
) -> Result<(), StorageError> {
    let mut insert = conn.prepare_cached(
        "INSERT INTO bounces (sender, message_id, recipient, expired_at) VALUES (?1, ?2, ?3, ?4)
         ON CONFLICT DO NOTHING",
    )?;
    for b in bounces {
        insert.execute(rusqlite::params![
            sender.as_str(),
            b.id.to_string(),
            b.to.to_string(),
            b.expired_at.as_millisecond()
        ])?;
    }
    Ok(())
}

/// The bounces waiting for `sender`, oldest first, at most `limit`.
pub(super) fn bounces(
    conn: &Connection,
    sender: &AgentName,
    limit: usize,
) -> Result<Vec<Bounce>, StorageError> {
    let mut stmt = conn.prepare_cached(
        "SELECT message_id, recipient, expired_at FROM bounces WHERE sender = ?1
         ORDER BY expired_at, message_id, recipient LIMIT ?2",
    )?;
    let rows = stmt.query_map(rusqlite::params![sender.as_str(), limit as i64], |r| {
        Ok((
            r.get::<_, String>(0)?,
            r.get::<_, String>(1)?,
            r.get::<_, i64>(2)?,
        ))
    })?;
    let mut bounces = Vec::new();
    for row in rows {
        let (id, to, at) = row?;
        let corrupt =
            |what: &str| StorageError::Database(format!("a bounce row has an invalid {what}"));
        bounces.push(Bounce {
            id: MessageId::parse(&id).map_err(|_| corrupt("message_id"))?,
            to: Address::parse(&to).map_err(|_| corrupt("recipient"))?,
            expired_at: Timestamp::from_millisecond(at).map_err(|_| corrupt("expired_at"))?,
        });
    }
    Ok(bounces)
}

/// The senders on other relays that bounces wait for, at most `limit`.
pub(super) fn remote_bounce_senders(
    conn: &Connection,
    limit: usize,
) -> Result<Vec<AgentName>, StorageError> {
    let mut stmt = conn.prepare_cached(
        "SELECT DISTINCT sender FROM bounces WHERE instr(sender, '@') > 1 ORDER BY sender LIMIT ?1",
    )?;
    let rows = stmt.query_map([limit as i64], |r| r.get::<_, String>(0))?;
    rows.map(|r| {
        AgentName::from_stored(&r?)
            .map_err(|e| StorageError::Database(format!("a bounce row has an invalid sender: {e}")))
    })
    .collect()
}

/// Whether a bounce waits for `sender` for each of `keys`, in order.
pub(super) fn bounced(
    conn: &Connection,
    sender: &AgentName,
    keys: &[CopyKey],
) -> Result<Vec<bool>, StorageError> {
    let mut stmt = conn.prepare_cached(
        "SELECT EXISTS (SELECT 1 FROM bounces WHERE sender = ?1 AND message_id = ?2 AND recipient = ?3)",
    )?;
    keys.iter()
        .map(|k| {
            Ok(stmt.query_row(
                rusqlite::params![sender.as_str(), k.id.to_string(), k.to.to_string()],
                |r| r.get::<_, bool>(0),
            )?)
        })
        .collect()
}

/// Forgets bounces `sender` has recorded; returns how many there were.
pub(super) fn ack_bounces(
    tx: &rusqlite::Transaction<'_>,
    sender: &AgentName,
    keys: &[CopyKey],
) -> Result<u64, StorageError> {
    let mut delete = tx.prepare_cached(
        "DELETE FROM bounces WHERE sender = ?1 AND message_id = ?2 AND recipient = ?3",
    )?;
    let mut gone = 0;
    for key in keys {
        gone += delete.execute(rusqlite::params![
            sender.as_str(),
            key.id.to_string(),
            key.to.to_string()
        ])? as u64;
    }
    Ok(gone)
}

/// Each batch's housekeeping, every [`SWEEP_EVERY`]: forgets old duplicate keys, removes dead
/// segments once a flush covers what killed them, re-appends the latest ack of recipients
/// whose ack record is all that keeps a segment, and moves the live copies out of old sparse
/// segments.
pub(super) fn sweep(b: &mut Batch<'_, '_>, now: Instant) -> Result<(), StorageError> {
    b.index.forget_acked(now);
    if b.index
        .last_sweep
        .is_some_and(|t| now.duration_since(t) < SWEEP_EVERY)
    {
        return Ok(());
    }
    b.index.last_sweep = Some(now);
    let flushed = b.spool.flushed().load(Ordering::Acquire);
    let due: Vec<u32> = b
        .index
        .segments
        .iter()
        .filter(|(_, used)| used.retire_at.is_some_and(|at| at <= flushed))
        .map(|(&seg, _)| seg)
        .collect();
    for seg in due {
        b.spool.remove(seg);
        b.index.segments.remove(&seg);
    }
    let head = b.spool.head();
    let sealed: Vec<(u32, SegmentUse)> = b
        .index
        .segments
        .range(..head)
        .filter(|(_, used)| used.retire_at.is_none())
        .map(|(&seg, &used)| (seg, used))
        .collect();
    let mut keep_acks = Vec::new();
    for (seg, used) in sealed {
        if used.live == 0 && used.acks == 0 {
            // Whatever made it dead is written by now; it goes once that is flushed.
            let position = b.spool.position();
            if let Some(used) = b.index.segments.get_mut(&seg) {
                used.retire_at = Some(position);
            }
        } else if used.live == 0 {
            keep_acks.push(seg);
        } else if seg + COMPACT_BEHIND <= head
            && used.live_bytes * 4 < b.spool.segment_bytes()
            && !used.unreadable
        {
            compact(b, seg)?;
        }
    }
    if !keep_acks.is_empty() {
        for recipient in 0..b.index.boxes.len() {
            let mailbox = &b.index.boxes[recipient];
            if mailbox.ack_seg.is_some_and(|s| keep_acks.contains(&s)) {
                let upto = mailbox.acked_upto;
                let at = b.spool.acked(&mailbox.name.clone(), upto)?;
                b.index.note_ack(recipient as NameId, upto, at.seg);
            }
        }
    }
    Ok(())
}

/// Moves the live copies of segment `seg` to the head, unchanged. A copy that does not read
/// back stops the compaction and leaves the segment where it is, logged, rather than fail
/// every batch after it; only a failed write to the head is an error.
fn compact(b: &mut Batch<'_, '_>, seg: u32) -> Result<(), StorageError> {
    let Some(file) = spool::file(&b.spool.files(), seg) else {
        return Ok(());
    };
    for recipient in 0..b.index.boxes.len() {
        for i in 0..b.index.boxes[recipient].rows.len() {
            let row = b.index.boxes[recipient].rows[i];
            if row.at.seg != seg {
                continue;
            }
            let body = match spool::read_body(&file, row.at) {
                Ok(body) => body,
                Err(e) => {
                    tracing::error!(error = %e, "a queued copy does not read back; its spool segment is kept as it is");
                    b.index.segments.entry(seg).or_default().unreadable = true;
                    return Ok(());
                }
            };
            let moved = Row {
                at: b.spool.copy(&body)?,
                ..row
            };
            b.index.died(&row);
            b.index.born(&moved);
            b.index.boxes[recipient].rows[i] = moved;
        }
    }
    Ok(())
}

/// Bytes one read of a recipient's consecutive records takes at most.
const READ_RUN: usize = 1 << 20;

/// Up to `limit` of `agent`'s unacknowledged envelopes after `after`, in order, among those
/// made durable up to `durable`. Records that follow each other in a segment (a backlog
/// usually does) are read with one call.
pub(super) fn pending(
    index: &Mutex<QueueIndex>,
    files: &Files,
    durable: &AtomicU64,
    agent: &AgentName,
    after: Seq,
    limit: usize,
) -> Result<Vec<Queued>, StorageError> {
    let (rows, handles) = {
        let index = lock(index);
        let rows = index.after(agent, after, durable.load(Ordering::Acquire), limit);
        // Taken under the index's lock: the writer removes a segment under it too, and never
        // one that holds a live copy.
        let handles: HashMap<u32, _> = rows
            .iter()
            .filter_map(|(_, at, _)| spool::file(files, at.seg).map(|f| (at.seg, f)))
            .collect();
        (rows, handles)
    };
    let mut out = Vec::with_capacity(rows.len());
    let mut rest = &rows[..];
    while let Some(&(first_seq, first, _)) = rest.first() {
        // The run: records back to back in one segment, up to READ_RUN bytes (at least one).
        let mut end = u64::from(first.offset);
        let mut count = 0;
        for &(_, at, len) in rest {
            let fits = end + len as u64 - u64::from(first.offset) <= READ_RUN as u64;
            if at.seg != first.seg || u64::from(at.offset) != end || (count > 0 && !fits) {
                break;
            }
            end += len as u64;
            count += 1;
        }
        let file = handles.get(&first.seg).ok_or_else(|| {
            StorageError::Database(format!(
                "spool segment {} of copy {first_seq} is gone",
                first.seg
            ))
        })?;
        let bytes = spool::read_run(file, first, (end - u64::from(first.offset)) as usize)?;
        let mut offset = 0;
        for &(seq, at, len) in &rest[..count] {
            let (stored, accepted_at_ms, envelope) =
                spool::parse_stored(at, &bytes[offset..offset + len])?;
            if stored != seq {
                return Err(StorageError::Database(format!(
                    "spool segment {} at byte {} holds copy {stored}, not {seq}",
                    at.seg, at.offset
                )));
            }
            out.push(Queued {
                seq,
                envelope,
                accepted_at_ms,
            });
            offset += len;
        }
        rest = &rest[count..];
    }
    Ok(out)
}

/// Moves the queue of a database from before the spool (schema 4) into the spool at `dir`:
/// its unacknowledged rows, and the highest sequence number assigned. The rows stay in the
/// table until the caller's migration drops it after this returns, so a crash in between
/// moves them again, and the scan keeps one record per sequence number.
pub(super) fn move_table_to_spool(conn: &Connection, dir: &Path) -> Result<(), StorageError> {
    let high: Option<String> = conn
        .query_row("SELECT value FROM meta WHERE key = 'seq_high'", [], |r| {
            r.get(0)
        })
        .optional()?;
    let high: Seq = match high {
        Some(h) => h
            .parse()
            .map_err(|_| StorageError::Database(format!("meta seq_high {h:?} is not a number")))?,
        None => 0,
    };
    let acked: HashMap<String, i64> = conn
        .prepare("SELECT recipient, seq FROM acked")?
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
        .collect::<Result<_, _>>()?;
    let max: Option<i64> = conn.query_row("SELECT max(seq) FROM queue", [], |r| r.get(0))?;
    if max.is_none() && high == 0 {
        return Ok(());
    }
    let mut spool = Spool::open(
        dir,
        high.max(max.unwrap_or(0).max(0) as Seq),
        spool::SEGMENT_BYTES,
    )?;
    let mut stmt = conn.prepare(
        "SELECT seq, recipient, sender, message_id, envelope, accepted_at, expires_at FROM queue ORDER BY seq",
    )?;
    let mut rows = stmt.query([])?;
    while let Some(r) = rows.next()? {
        let seq: i64 = r.get(0)?;
        let recipient: String = r.get(1)?;
        if seq <= acked.get(&recipient).copied().unwrap_or(0) {
            continue;
        }
        let corrupt =
            |what: String| StorageError::Database(format!("queue row {seq} is invalid: {what}"));
        let name = |s: &str| AgentName::from_stored(s).map_err(|e| corrupt(e.to_string()));
        let envelope: Vec<u8> = r.get(4)?;
        spool.stored(&StoredCopy {
            seq: Seq::try_from(seq).map_err(|e| corrupt(e.to_string()))?,
            accepted_at_ms: r.get(5)?,
            expires_at_ms: r.get(6)?,
            id: MessageId::parse(&r.get::<_, String>(3)?).map_err(|e| corrupt(e.to_string()))?,
            recipient: &name(&recipient)?,
            sender: &name(&r.get::<_, String>(2)?)?,
            envelope: &envelope,
        })?;
        spool.write()?;
    }
    spool.close()
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::super::scan;
    use super::*;

    fn name(n: &str) -> AgentName {
        AgentName::new(n).unwrap()
    }

    fn row(ix: &mut QueueIndex, to: NameId, from: NameId, size: u32, expires_at_ms: i64) -> Seq {
        ix.last_seq += 1;
        let row = Row {
            seq: ix.last_seq,
            size,
            expires_at_ms,
            key: (MessageId::new(), from, to),
            at: Location { seg: 1, offset: 0 },
        };
        ix.insert(row);
        row.seq
    }

    #[test]
    fn acknowledged_copies_stay_duplicates_for_the_lag_then_are_forgotten() {
        let mut ix = QueueIndex::empty();
        let (alice, bob) = (ix.id(&name("alice")), ix.id(&name("bob")));
        let seqs: Vec<Seq> = (0..5)
            .map(|_| row(&mut ix, bob, alice, 10, i64::MAX))
            .collect();
        let t0 = Instant::now();
        assert_eq!(ix.ack(bob, seqs[2], t0), (3, seqs[2]));
        assert_eq!(
            ix.ack(bob, Seq::MAX, t0).1,
            seqs[4],
            "the highest copy, not the ack's number"
        );
        assert_eq!(ix.waiting(&name("bob")), 0);
        assert_eq!(
            ix.forget_acked(t0 + DUPLICATE_LAG / 2),
            0,
            "not old enough yet"
        );
        assert_eq!(ix.stored.len(), 5);
        assert_eq!(ix.forget_acked(t0 + DUPLICATE_LAG), 5);
        assert!(
            ix.stored.is_empty(),
            "forgotten copies are no longer duplicates"
        );
        assert_eq!(ix.segments[&1].live, 0);
    }

    #[test]
    fn expiry_takes_only_unacknowledged_copies_past_their_ttl() {
        let mut ix = QueueIndex::empty();
        let (alice, bob) = (ix.id(&name("alice")), ix.id(&name("bob")));
        let old = row(&mut ix, bob, alice, 10, 1_000);
        let acked_old = row(&mut ix, alice, alice, 10, 1_000);
        let young = row(&mut ix, bob, alice, 10, 5_000);
        ix.ack(alice, acked_old, Instant::now());
        assert_eq!(ix.expire(2_000).len(), 1);
        assert_eq!(ix.after(&name("bob"), 0, Seq::MAX, 10)[0].0, young);
        assert_ne!(old, young);
        assert_eq!(ix.total_waiting(), 1);
        assert_eq!(ix.find(&name("bob")).unwrap().bytes, 10);
        assert_eq!(ix.segments[&1].live, 1);
    }

    #[test]
    fn after_reads_past_the_cursor_up_to_the_limit() {
        let mut ix = QueueIndex::empty();
        let (alice, bob) = (ix.id(&name("alice")), ix.id(&name("bob")));
        let seqs: Vec<Seq> = (0..5)
            .map(|_| row(&mut ix, bob, alice, 1, i64::MAX))
            .collect();
        let after = |ix: &QueueIndex, cursor, durable, limit| -> Vec<Seq> {
            ix.after(&name("bob"), cursor, durable, limit)
                .iter()
                .map(|r| r.0)
                .collect()
        };
        assert_eq!(after(&ix, seqs[1], Seq::MAX, 2), seqs[2..4].to_vec());
        assert_eq!(
            after(&ix, 0, seqs[2], 10),
            seqs[..3].to_vec(),
            "copies not yet durable wait"
        );
        assert!(ix.after(&name("carol"), 0, Seq::MAX, 10).is_empty());
    }

    /// A writer over a real spool with small segments, for the sweep.
    struct Rig {
        _dir: tempfile::TempDir,
        dir: std::path::PathBuf,
        conn: Connection,
        index: QueueIndex,
        spool: Spool,
        now: Instant,
    }

    impl Rig {
        fn new() -> Self {
            let dir = tempfile::tempdir().unwrap();
            let spool_dir = dir.path().join("spool");
            let conn = Connection::open_in_memory().unwrap();
            for sql in super::super::schema::MIGRATIONS {
                conn.execute_batch(sql).unwrap();
            }
            Self {
                spool: Spool::open(&spool_dir, 0, 4096).unwrap(),
                dir: spool_dir,
                _dir: dir,
                conn,
                index: QueueIndex::empty(),
                now: Instant::now(),
            }
        }

        /// One batch, written and flushed; the sweep runs first, as in the writer.
        fn batch<T>(&mut self, f: impl FnOnce(&mut Batch<'_, '_>) -> T) -> T {
            self.now += SWEEP_EVERY;
            let tx = self.conn.transaction().unwrap();
            let mut log = Vec::new();
            let out = {
                let mut b = Batch {
                    tx: &tx,
                    index: &mut self.index,
                    spool: &mut self.spool,
                    log: &mut log,
                };
                sweep(&mut b, self.now).unwrap();
                f(&mut b)
            };
            tx.commit().unwrap();
            self.spool.write().unwrap();
            let end = self.spool.take_unflushed().end;
            self.spool.flushed().store(end, Ordering::Release);
            out
        }

        fn send(&mut self, to: &str) {
            let op = AcceptOp {
                sender: name("alice"),
                id: MessageId::new(),
                copies: vec![Copy {
                    id: None,
                    recipient: name(to),
                    envelope: Arc::from(vec![7u8; 500]),
                }],
                quota: Quota {
                    count: 1000,
                    bytes: 1 << 30,
                },
                expires_at_ms: i64::MAX,
                default: Policy::Open,
            };
            let accepted = self.batch(|b| accept(b, &op).unwrap());
            assert!(matches!(accepted, Accepted::Stored(_)), "{accepted:?}");
        }

        fn on_disk(&self) -> Vec<u32> {
            scan::scan(&self.dir)
                .unwrap()
                .segments
                .iter()
                .map(|s| s.seg)
                .collect()
        }

        fn pending(&self, index: &QueueIndex, who: &str) -> Vec<Seq> {
            let index = Mutex::new(QueueIndex {
                boxes: index
                    .boxes
                    .iter()
                    .map(|m| Mailbox {
                        name: m.name.clone(),
                        rows: m.rows.clone(),
                        bytes: m.bytes,
                        acked_upto: m.acked_upto,
                        ack_seg: m.ack_seg,
                    })
                    .collect(),
                ids: index.ids.clone(),
                ..QueueIndex::empty()
            });
            pending(
                &index,
                &self.spool.files(),
                &AtomicU64::new(Seq::MAX),
                &name(who),
                0,
                100,
            )
            .unwrap()
            .iter()
            .map(|q| {
                assert_eq!(q.envelope, vec![7u8; 500]);
                q.seq
            })
            .collect()
        }
    }

    #[test]
    fn dead_segments_go_sparse_ones_are_compacted_and_a_scan_agrees() {
        let mut rig = Rig::new();
        rig.send("carol");
        for _ in 0..40 {
            rig.send("bob");
        }
        let first = rig.index.boxes[rig.index.ids[&name("carol")] as usize].rows[0]
            .at
            .seg;
        let before = rig.on_disk();
        assert!(before.len() >= 5, "small segments fill: {before:?}");
        assert_eq!(
            rig.pending(&rig.index, "bob"),
            (2..=41).collect::<Vec<Seq>>(),
            "runs of records read across segments"
        );
        rig.batch(|b| ack(b, &name("bob"), Seq::MAX, Epoch::new(0)).unwrap());
        // Enough batches for the head to move on and each step of the sweep to run.
        for _ in 0..10 {
            rig.send("dave");
            rig.batch(|b| ack(b, &name("dave"), Seq::MAX, Epoch::new(0)).unwrap());
        }
        let after = rig.on_disk();
        let carol = rig.index.boxes[rig.index.ids[&name("carol")] as usize].rows[0];
        assert_ne!(
            carol.at.seg, first,
            "carol's copy moved out of its sparse segment"
        );
        assert!(
            !after.contains(&first),
            "the old segment is gone: {after:?}"
        );
        assert!(
            after.len() < before.len(),
            "dead segments were removed: {before:?} then {after:?}"
        );
        assert_eq!(rig.pending(&rig.index, "carol"), [1]);

        let reloaded = QueueIndex::load(&scan::scan(&rig.dir).unwrap().segments, now_ms());
        assert_eq!(reloaded.last_seq(), rig.index.last_seq());
        assert_eq!(reloaded.waiting(&name("carol")), 1);
        assert_eq!(
            reloaded.waiting(&name("bob")),
            0,
            "bob's ack outlived its segment"
        );
        assert_eq!(reloaded.waiting(&name("dave")), 0);
        assert_eq!(rig.pending(&reloaded, "carol"), [1]);
    }
}
