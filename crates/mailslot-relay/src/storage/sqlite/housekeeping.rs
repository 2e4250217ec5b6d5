//! The queue's upkeep, done by the writer inside its batches: the sweep before each batch
//! (old duplicate keys forgotten, dead segments removed, lone acks re-appended, sparse
//! segments compacted), and expiry, which takes copies past their TTL out of the queue and
//! records their bounces.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::batch::Batch;
use super::bounces;
use super::spool;
use crate::protocol::{AgentName, Bounce};
use crate::storage::StorageError;

/// How often a batch looks for segments to remove or compact.
const SWEEP_EVERY: Duration = Duration::from_millis(100);
/// A sealed segment this many segments behind the head, with under a quarter of it live, has
/// its live copies moved to the head. Younger segments are left to their acks.
const COMPACT_BEHIND: u32 = 3;

/// Each batch's housekeeping, every [`SWEEP_EVERY`]: forgets old duplicate keys, removes dead
/// segments once a flush covers what killed them, re-appends the latest ack of recipients
/// whose ack record is all that keeps a segment, and moves the live copies out of old sparse
/// segments.
pub(super) fn sweep(b: &mut Batch<'_, '_>, now: Instant) -> Result<(), StorageError> {
    b.index.forget_acked(now);
    if !b.index.sweep_due(now, SWEEP_EVERY) {
        return Ok(());
    }
    let flushed = b.spool.flushed().load(Ordering::Acquire);
    for seg in b.index.retired_by(flushed) {
        b.spool.remove(seg);
        b.index.removed(seg);
    }
    let head = b.spool.head();
    let mut keep_acks = Vec::new();
    for (seg, used) in b.index.sealed_before(head) {
        if used.live == 0 && used.acks == 0 {
            // Whatever made it dead is written by now; it goes once that is flushed.
            b.index.retire(seg, b.spool.position());
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
        for (recipient, name, upto) in b.index.latest_acks_in(&keep_acks) {
            let at = b.spool.acked(&name, upto)?;
            b.index.note_ack(recipient, upto, at.seg);
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
    for (recipient, i, row) in b.index.rows_in(seg) {
        let body = match spool::read_body(&file, row.at) {
            Ok(body) => body,
            Err(e) => {
                tracing::error!(error = %e, "a queued copy does not read back; its spool segment is kept as it is");
                b.index.unreadable(seg);
                return Ok(());
            }
        };
        let at = b.spool.copy(&body)?;
        b.index.relocate(recipient, i, at);
    }
    Ok(())
}

/// Takes the unacknowledged copies past their TTL out of the queue and records a bounce for
/// each one's sender, in the batch's transaction; returns the bounces by sender. Nothing is
/// written to the spool: a scan leaves expired copies out.
pub(super) fn expire(
    b: &mut Batch<'_, '_>,
    now_ms: i64,
) -> Result<Vec<(AgentName, Bounce)>, StorageError> {
    let gone = b.index.expire(now_ms);
    bounces::record_expired(b.tx, gone, now_ms)
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicU64;
    use std::sync::{Arc, Mutex};

    use rusqlite::Connection;

    use super::super::accept::{AcceptOp, accept, ack};
    use super::super::clock::now_ms;
    use super::super::index::{QueueIndex, lock};
    use super::super::read::pending;
    use super::super::spool::Spool;
    use super::super::{scan, schema};
    use super::*;
    use crate::protocol::{MessageId, Policy, Seq};
    use crate::storage::{Accepted, Epoch, QueuedCopy, Quota};

    fn name(n: &str) -> AgentName {
        AgentName::new(n).unwrap()
    }

    /// A writer over a real spool with small segments, for the sweep.
    struct Rig {
        _dir: tempfile::TempDir,
        dir: std::path::PathBuf,
        conn: Connection,
        index: Mutex<QueueIndex>,
        spool: Spool,
        now: Instant,
    }

    impl Rig {
        fn new() -> Self {
            let dir = tempfile::tempdir().unwrap();
            let spool_dir = dir.path().join("spool");
            let conn = Connection::open_in_memory().unwrap();
            for sql in schema::MIGRATIONS {
                conn.execute_batch(sql).unwrap();
            }
            Self {
                spool: Spool::open(&spool_dir, 0, 4096).unwrap(),
                dir: spool_dir,
                _dir: dir,
                conn,
                index: Mutex::new(QueueIndex::load(&[], now_ms())),
                now: Instant::now(),
            }
        }

        /// One batch, written and flushed; the sweep runs first, as in the writer.
        fn batch<T>(&mut self, f: impl FnOnce(&mut Batch<'_, '_>) -> T) -> T {
            self.now += SWEEP_EVERY;
            let tx = self.conn.transaction().unwrap();
            let mut log = Vec::new();
            let out = {
                let mut index = lock(&self.index);
                let mut b = Batch {
                    tx: &tx,
                    index: &mut index,
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
                copies: vec![QueuedCopy {
                    id: None,
                    recipient: name(to),
                    envelope: Arc::from(vec![7u8; 500]),
                    group: None,
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

        /// The segment holding `who`'s first waiting copy.
        fn first_segment(&self, who: &str) -> u32 {
            lock(&self.index).after(&name(who), 0, Seq::MAX, 1)[0].1.seg
        }

        fn pending(&self, index: &Mutex<QueueIndex>, who: &str) -> Vec<Seq> {
            pending(
                index,
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
        let first = rig.first_segment("carol");
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
        assert_ne!(
            rig.first_segment("carol"),
            first,
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

        let reloaded = Mutex::new(QueueIndex::load(
            &scan::scan(&rig.dir).unwrap().segments,
            now_ms(),
        ));
        assert_eq!(lock(&reloaded).last_seq(), lock(&rig.index).last_seq());
        assert_eq!(lock(&reloaded).waiting(&name("carol")), 1);
        assert_eq!(
            lock(&reloaded).waiting(&name("bob")),
            0,
            "bob's ack outlived its segment"
        );
        assert_eq!(lock(&reloaded).waiting(&name("dave")), 0);
        assert_eq!(rig.pending(&reloaded, "carol"), [1]);
    }
}
