//! The queue's index, in memory: each recipient's copies in order with where they are in the
//! spool, the totals its quota is checked against, the key of every stored copy for the
//! duplicate check, how much of each segment is still live (so that dead segments are removed
//! and sparse ones compacted), each agent's latest delivery claim and the consent rules read
//! for sends. It is built from a scan of the spool (see [`super::scan`]).
//!
//! Only the writer changes the index, inside its batch and under the index's lock; a batch
//! that fails makes it reload the index from the spool, so the index never shows anything that
//! was not written. Readers hold the lock only to copy out locations.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::rule::Rule;
use super::scan::ScannedSegment;
use super::spool::{self, Location, Position, Scanned};
use crate::protocol::{AgentName, MessageId, RelayName, Seq};
use crate::storage::queue::is_relay_mailbox;
use crate::storage::{Epoch, Quota};

/// An acknowledged copy still counts as a duplicate this long after its ack, so that a
/// sender's retry racing the recipient's ack is not stored twice.
const DUPLICATE_LAG: Duration = Duration::from_secs(2);

/// An agent's number in the index: names are held once, not in every key.
pub(super) type NameId = u32;

/// What makes a copy a duplicate: the same message id, from the same sender, to the same
/// recipient.
pub(super) type IndexKey = (MessageId, NameId, NameId);

/// A stored copy, as the index knows it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Row {
    pub(super) seq: Seq,
    pub(super) size: u32,
    pub(super) expires_at_ms: i64,
    pub(super) key: IndexKey,
    pub(super) at: Location,
}

/// One recipient's queue: its unacknowledged copies, oldest first, and their bytes; how far it
/// has acknowledged, and the segment holding the record that says so.
struct RecipientQueue {
    name: AgentName,
    rows: VecDeque<Row>,
    bytes: u64,
    acked_upto: Seq,
    ack_seg: Option<u32>,
}

/// How much of a segment still matters.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct SegmentUse {
    /// Unacknowledged, unexpired copies.
    pub(super) live: u32,
    pub(super) live_bytes: u64,
    /// Recipients whose latest ack record is here.
    pub(super) acks: u32,
    /// Dead: removed once a flush covers this position, where the spool ended when that
    /// was decided.
    pub(super) retire_at: Option<Position>,
    /// Compacting it failed on a record that does not read back; it is left as it is.
    pub(super) unreadable: bool,
}

/// The queue's in-memory index (see the module docs).
pub(super) struct QueueIndex {
    ids: HashMap<AgentName, NameId>,
    /// By [`NameId`].
    queues: Vec<RecipientQueue>,
    /// The key of every copy that counts for the duplicate check, with its sequence number
    /// (which says whether it is still queued: see [`QueueIndex::is_queued`]).
    stored: HashMap<IndexKey, Seq>,
    /// Acknowledged copies' keys, with when they stop counting as duplicates; in ack order.
    acked: VecDeque<(Instant, IndexKey)>,
    /// The highest sequence number ever assigned.
    last_seq: Seq,
    segments: BTreeMap<u32, SegmentUse>,
    /// When the housekeeping last ran (see [`super::housekeeping::sweep`]).
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
            queues: Vec::new(),
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
    /// them ([`crate::storage::Queue::expire`]).
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
                        let queue = &mut index.queues[id as usize];
                        queue.acked_upto = queue.acked_upto.max(*upto);
                        queue.ack_seg = Some(at.seg);
                    }
                }
            }
        }
        let now = Instant::now();
        for row in copies.into_values() {
            let queue = &index.queues[row.key.2 as usize];
            let acked = row.seq <= queue.acked_upto;
            if row.expires_at_ms < now_ms && !is_relay_mailbox(&queue.name) {
                if !acked {
                    let (id, from, to) = row.key;
                    let name = |n: NameId| index.queues[n as usize].name.clone();
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
        for seg in index.queues.iter().filter_map(|m| m.ack_seg) {
            index.segments.entry(seg).or_default().acks += 1;
        }
        (index, expired)
    }

    /// The agent's number, given one now if it has none.
    pub(super) fn id(&mut self, name: &AgentName) -> NameId {
        if let Some(&id) = self.ids.get(name) {
            return id;
        }
        let id = self.queues.len() as NameId;
        self.queues.push(RecipientQueue {
            name: name.clone(),
            rows: VecDeque::new(),
            bytes: 0,
            acked_upto: 0,
            ack_seg: None,
        });
        self.ids.insert(name.clone(), id);
        id
    }

    /// The agent's number, if it has one.
    pub(super) fn known(&self, name: &AgentName) -> Option<NameId> {
        self.ids.get(name).copied()
    }

    /// The queue of a name, if it ever had mail.
    fn find(&self, name: &AgentName) -> Option<&RecipientQueue> {
        self.ids.get(name).map(|&id| &self.queues[id as usize])
    }

    /// Puts an unacknowledged copy at the end of its recipient's queue.
    fn insert(&mut self, row: Row) {
        let queue = &mut self.queues[row.key.2 as usize];
        queue.rows.push_back(row);
        queue.bytes += u64::from(row.size);
        self.stored.insert(row.key, row.seq);
        self.born(&row);
    }

    /// A copy just written to the spool: the newest sequence number, at the end of its
    /// recipient's queue.
    pub(super) fn add(&mut self, row: Row) {
        self.last_seq = row.seq;
        self.insert(row);
    }

    /// A copy's record was written at `row.at`: its segment holds one more.
    fn born(&mut self, row: &Row) {
        let used = self.segments.entry(row.at.seg).or_default();
        used.live += 1;
        used.live_bytes += u64::from(row.size);
    }

    /// A copy left its queue (acknowledged or expired): its segment holds one less.
    fn died(&mut self, row: &Row) {
        if let Some(used) = self.segments.get_mut(&row.at.seg) {
            used.live = used.live.saturating_sub(1);
            used.live_bytes = used.live_bytes.saturating_sub(u64::from(row.size));
        }
    }

    /// Acknowledges the recipient's copies up to `upto`; returns how many there were and the
    /// highest sequence number among them.
    pub(super) fn ack(&mut self, recipient: NameId, upto: Seq, now: Instant) -> (u64, Seq) {
        let mut count = 0;
        let mut last = 0;
        while let Some(&row) = self.queues[recipient as usize].rows.front()
            && row.seq <= upto
        {
            let queue = &mut self.queues[recipient as usize];
            queue.rows.pop_front();
            queue.bytes -= u64::from(row.size);
            self.acked.push_back((now + DUPLICATE_LAG, row.key));
            self.died(&row);
            count += 1;
            last = row.seq;
        }
        (count, last)
    }

    /// Records that the recipient's latest ack, up to `upto`, is in segment `seg`.
    pub(super) fn note_ack(&mut self, recipient: NameId, upto: Seq, seg: u32) {
        let queue = &mut self.queues[recipient as usize];
        queue.acked_upto = queue.acked_upto.max(upto);
        let old = queue.ack_seg.replace(seg);
        if old != Some(seg) {
            if let Some(used) = old.and_then(|s| self.segments.get_mut(&s)) {
                used.acks = used.acks.saturating_sub(1);
            }
            self.segments.entry(seg).or_default().acks += 1;
        }
    }

    /// Forgets the keys of copies acknowledged long enough ago; returns how many.
    pub(super) fn forget_acked(&mut self, now: Instant) -> usize {
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
    pub(super) fn expire(&mut self, now_ms: i64) -> Vec<(AgentName, AgentName, MessageId)> {
        let mut gone = Vec::new();
        for queue in self
            .queues
            .iter_mut()
            .filter(|m| !is_relay_mailbox(&m.name))
        {
            let before = gone.len();
            queue.rows.retain(|r| {
                let keep = r.expires_at_ms >= now_ms;
                if !keep {
                    gone.push(*r);
                }
                keep
            });
            queue.bytes -= gone[before..]
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
                let name = |n: NameId| self.queues[n as usize].name.clone();
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

    /// Whether the housekeeping is due at `now`, `every` after it last ran; when it is, it
    /// counts as run now.
    pub(super) fn sweep_due(&mut self, now: Instant, every: Duration) -> bool {
        if self
            .last_sweep
            .is_some_and(|t| now.duration_since(t) < every)
        {
            return false;
        }
        self.last_sweep = Some(now);
        true
    }

    /// Dead segments that a flush up to `flushed` has made safe to remove.
    pub(super) fn retired_by(&self, flushed: Position) -> Vec<u32> {
        self.segments
            .iter()
            .filter(|(_, used)| used.retire_at.is_some_and(|at| at <= flushed))
            .map(|(&seg, _)| seg)
            .collect()
    }

    /// The segments before `head` not yet found dead, with how much of each matters.
    pub(super) fn sealed_before(&self, head: u32) -> Vec<(u32, SegmentUse)> {
        self.segments
            .range(..head)
            .filter(|(_, used)| used.retire_at.is_none())
            .map(|(&seg, &used)| (seg, used))
            .collect()
    }

    /// Segment `seg` is dead: it may go once a flush covers `position`.
    pub(super) fn retire(&mut self, seg: u32, position: Position) {
        if let Some(used) = self.segments.get_mut(&seg) {
            used.retire_at = Some(position);
        }
    }

    /// A record of segment `seg` does not read back: it is no longer compacted.
    pub(super) fn unreadable(&mut self, seg: u32) {
        self.segments.entry(seg).or_default().unreadable = true;
    }

    /// The recipients whose latest ack record is in one of `segs`, with how far they acked.
    pub(super) fn latest_acks_in(&self, segs: &[u32]) -> Vec<(NameId, AgentName, Seq)> {
        self.queues
            .iter()
            .enumerate()
            .filter(|(_, m)| m.ack_seg.is_some_and(|s| segs.contains(&s)))
            .map(|(id, m)| (id as NameId, m.name.clone(), m.acked_upto))
            .collect()
    }

    /// The unacknowledged copies in segment `seg`: each one's recipient, place in its
    /// queue and row.
    pub(super) fn rows_in(&self, seg: u32) -> Vec<(NameId, usize, Row)> {
        self.queues
            .iter()
            .enumerate()
            .flat_map(|(id, m)| {
                m.rows
                    .iter()
                    .enumerate()
                    .filter(|(_, row)| row.at.seg == seg)
                    .map(move |(i, row)| (id as NameId, i, *row))
            })
            .collect()
    }

    /// The copy at place `i` of `recipient`'s queue was written again at `at`.
    pub(super) fn relocate(&mut self, recipient: NameId, i: usize, at: Location) {
        let row = self.queues[recipient as usize].rows[i];
        let moved = Row { at, ..row };
        self.died(&row);
        self.born(&moved);
        self.queues[recipient as usize].rows[i] = moved;
    }

    /// The highest sequence number assigned so far.
    pub(super) fn last_seq(&self) -> Seq {
        self.last_seq
    }

    /// Up to `limit` of `agent`'s unacknowledged copies after `after`, at most `durable`: a
    /// copy written but not yet on disk is not delivered yet.
    pub(super) fn after(
        &self,
        agent: &AgentName,
        after: Seq,
        durable: Seq,
        limit: usize,
    ) -> Vec<(Seq, Location, usize)> {
        let Some(queue) = self.find(agent) else {
            return Vec::new();
        };
        let start = queue.rows.partition_point(|r| r.seq <= after);
        queue
            .rows
            .range(start..)
            .take_while(|r| r.seq <= durable)
            .take(limit)
            .map(|r| {
                let sender = &self.queues[r.key.1 as usize].name;
                (r.seq, r.at, spool::stored_len(agent, sender, r.size))
            })
            .collect()
    }

    /// Whether a copy with this key counts as a duplicate.
    pub(super) fn is_stored(&self, key: &IndexKey) -> bool {
        self.stored.contains_key(key)
    }

    /// Whether one more copy of `bytes` fits `recipient`'s quota.
    pub(super) fn fits(&self, recipient: NameId, quota: Quota, bytes: usize) -> bool {
        let queue = &self.queues[recipient as usize];
        (queue.rows.len() as u64) < quota.count && queue.bytes + bytes as u64 <= quota.bytes
    }

    /// The consent rule remembered for mail from `pair.0` to `pair.1`.
    pub(super) fn rule(&self, pair: (NameId, NameId)) -> Option<Rule> {
        self.rules.get(&pair).copied()
    }

    /// Remembers the consent rule for mail from `pair.0` to `pair.1`.
    pub(super) fn remember_rule(&mut self, pair: (NameId, NameId), rule: Rule) {
        if self.rules.len() >= MAX_RULES {
            self.rules.clear();
        }
        self.rules.insert(pair, rule);
    }

    /// Whether a later claim of `agent`'s delivery session replaced the one of `epoch`.
    pub(super) fn fenced(&self, agent: &AgentName, epoch: Epoch) -> bool {
        self.leases
            .get(agent)
            .is_some_and(|&latest| latest > epoch.get())
    }

    /// Forgets every consent rule read so far: a write is about to change them.
    pub(super) fn forget_rules(&mut self) {
        self.rules.clear();
    }

    /// Whether `recipient`'s copy `seq` is queued (`Some(true)`) or was acknowledged
    /// (`Some(false)`); `None` when it is neither.
    pub(super) fn fate(&self, recipient: &AgentName, seq: Seq) -> Option<bool> {
        let queue = self.find(recipient)?;
        if seq <= queue.acked_upto {
            return Some(false);
        }
        queue
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
        self.queues.iter().map(|m| m.rows.len() as u64).sum()
    }

    /// The relays whose mailboxes hold copies.
    pub(super) fn relay_mailboxes(&self) -> Vec<RelayName> {
        self.queues
            .iter()
            .filter(|m| !m.rows.is_empty())
            .filter_map(|m| m.name.mailbox_relay())
            .collect()
    }

    /// Every unacknowledged copy and where it is: recipient by recipient in name order, each
    /// recipient's in sequence order.
    pub(super) fn waiting_rows(&self) -> Vec<WaitingRow> {
        let mut queues: Vec<&RecipientQueue> =
            self.queues.iter().filter(|m| !m.rows.is_empty()).collect();
        queues.sort_unstable_by(|a, b| a.name.cmp(&b.name));
        queues
            .into_iter()
            .flat_map(|queue| {
                queue.rows.iter().map(|row| WaitingRow {
                    recipient: queue.name.clone(),
                    sender: self.queues[row.key.1 as usize].name.clone(),
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

#[cfg(test)]
mod tests {
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
}
