//! Reading the spool back: every valid record, and an account of every place where a valid
//! record should be and is not (docs/decisions.md, "Storage that never loses mail silently").
//!
//! A record is valid when its checksum (over its segment's number and its body) matches and its
//! body reads. After bytes that are not a valid record the scan resynchronizes: it tries every
//! byte from the next one on until a valid record starts, so a damaged length can never hide
//! a whole record behind it; when the length is sound, that is where the damaged record ends.
//! Records of a reused file's old segment fail the checksum, zeros fail the length.
//!
//! Which bytes that are not records are damage:
//! - between two valid records of a segment: always (a record is written only after the one
//!   before it, so nothing but damage leaves a gap);
//! - after the last valid record of a segment with no closing mark:
//!   - the newest segment: what the last run had not finished writing when it stopped (not
//!     damage; the open closes the segment there, so that it is never newest again unclosed);
//!   - an older segment with marks: damage (its closing mark is gone);
//!   - an older segment without marks (written by a build before marks): its end, which cannot
//!     be told from damage.

use std::fs;
use std::io;
use std::path::Path;

use super::spool::{
    self, ACKED, Fields, HEADER, HIGH, Location, STORED, Scanned, decode, whole_record,
};
use crate::protocol::MessageId;
use crate::storage::StorageError;
use crate::storage::report::{DamagedRecord, Loss, RecordKind, Unclosed};

/// The shortest body a valid record has (a plain `High`).
const MIN_BODY: usize = 9;

/// A damaged record as its bytes read, before what it costs is known (see [`Damaged::loss`]).
#[derive(Debug)]
pub(super) struct Damaged {
    pub(super) record: DamagedRecord,
    /// When the copy would have expired, if it was one and that still reads.
    pub(super) expires_at_ms: Option<i64>,
}

/// One segment, as scanned.
pub(super) struct ScannedSegment {
    pub(super) seg: u32,
    pub(super) records: Vec<Scanned>,
    /// Where its last valid record ends.
    end: u32,
    /// Its last valid record is a closing mark.
    closed: bool,
    /// It holds a mark: a build with marks wrote it, so it must end with a closing one.
    marked: bool,
    /// Damaged records between valid ones.
    holes: Vec<Damaged>,
    /// The first record after the last valid one, when the segment goes on after it.
    tail: Option<Damaged>,
}

/// The spool, as scanned.
#[derive(Default)]
pub(super) struct Scan {
    /// Segments holding a valid record, oldest first.
    pub(super) segments: Vec<ScannedSegment>,
    /// Segments holding none: prepared but never used, or never flushed.
    pub(super) empty: Vec<u32>,
    /// Every damaged record, in spool order.
    pub(super) damaged: Vec<Damaged>,
    /// The newest segment, when the last run stopped without closing it.
    pub(super) unclosed: Option<Unclosed>,
}

/// Reads every segment in `dir`, oldest first.
pub(super) fn scan(dir: &Path) -> Result<Scan, StorageError> {
    let mut scan = Scan::default();
    if !dir.exists() {
        return Ok(scan);
    }
    for seg in spool::segments(dir)? {
        let path = spool::segment_path(dir, seg);
        let bytes = match fs::read(&path) {
            Ok(bytes) => bytes,
            // A prepared segment its thread removed on the way out: it held no record.
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(spool::io_error("reading", &path, e)),
        };
        let segment = scan_segment(seg, &bytes).map_err(|(offset, why)| {
            StorageError::Database(format!(
                "{} holds a record at byte {offset} that this build cannot read ({why}); a newer build wrote it, or move the spool aside to start the relay without its mail",
                path.display()
            ))
        })?;
        if segment.records.is_empty() {
            scan.empty.push(seg);
        } else {
            scan.segments.push(segment);
        }
    }
    let newest = scan.segments.last().map(|s| s.seg);
    for segment in &mut scan.segments {
        scan.damaged.append(&mut segment.holes);
        if segment.closed {
            continue;
        }
        let is_newest = Some(segment.seg) == newest;
        if is_newest {
            scan.unclosed = Some(Unclosed {
                segment: segment.seg,
                end: u64::from(segment.end),
            });
        } else if segment.marked {
            // A sealed segment's closing mark is gone, and maybe records before it.
            let seg = segment.seg;
            let end = segment.end;
            scan.damaged.push(
                segment
                    .tail
                    .take()
                    .unwrap_or_else(|| unreadable(seg, end as usize, 0)),
            );
        }
    }
    Ok(scan)
}

/// Reads one segment's records; `Err` when a record with a matching checksum does not read
/// (its offset and why).
fn scan_segment(seg: u32, bytes: &[u8]) -> Result<ScannedSegment, (usize, String)> {
    let mut out = ScannedSegment {
        seg,
        records: Vec::new(),
        end: 0,
        closed: false,
        marked: false,
        holes: Vec::new(),
        tail: None,
    };
    let mut offset = 0;
    while offset < bytes.len() {
        if let Some((body, next)) = whole_record(seg, bytes, offset) {
            let at = Location {
                seg,
                offset: offset as u32,
            };
            let record = decode(at, body).map_err(|why| (offset, why))?;
            if let Scanned::Mark { closes, .. } = record {
                out.marked = true;
                out.closed = closes;
            }
            out.records.push(record);
            out.end = next as u32;
            offset = next;
            if out.closed {
                break;
            }
            continue;
        }
        match resync(seg, bytes, offset + 1) {
            Some(found) => {
                out.holes.extend(damaged(seg, bytes, offset, found));
                offset = found;
            }
            None => {
                out.tail = Some(read_damaged(seg, bytes, offset, bytes.len()).0);
                break;
            }
        }
    }
    Ok(out)
}

/// Where the first valid record at or after `from` starts, trying every byte.
fn resync(seg: u32, bytes: &[u8], mut from: usize) -> Option<usize> {
    while from + HEADER + MIN_BODY <= bytes.len() {
        let len = u32::from_le_bytes([
            bytes[from],
            bytes[from + 1],
            bytes[from + 2],
            bytes[from + 3],
        ]) as usize;
        if len == 0 {
            // A run of zeros (a prepared segment's) holds no record: a record's length has a
            // byte that is not zero, so the next one starts 3 bytes before the run ends at most.
            let zeros = bytes[from..]
                .iter()
                .position(|&b| b != 0)
                .unwrap_or(bytes.len() - from);
            from += zeros.saturating_sub(3).max(1);
            continue;
        }
        if len >= MIN_BODY
            && matches!(bytes[from + HEADER], HIGH | STORED | ACKED)
            && let Some((body, _)) = whole_record(seg, bytes, from)
            && decode(
                Location {
                    seg,
                    offset: from as u32,
                },
                body,
            )
            .is_ok()
        {
            return Some(from);
        }
        from += 1;
    }
    None
}

/// The damaged records in `bytes[start..end]`, read by their lengths while those lead to
/// something that still reads as a record; what is left goes with the record before it.
fn damaged(seg: u32, bytes: &[u8], start: usize, end: usize) -> Vec<Damaged> {
    let mut out = Vec::new();
    let mut at = start;
    while at < end {
        let (mut damaged, next) = read_damaged(seg, bytes, at, end);
        let next = next.filter(|&n| {
            damaged.record.kind != RecordKind::Unknown
                && n < end
                && read_damaged(seg, bytes, n, end).0.record.kind != RecordKind::Unknown
        });
        damaged.record.bytes = (next.unwrap_or(end) - at) as u64;
        out.push(damaged);
        match next {
            Some(n) => at = n,
            None => break,
        }
    }
    out
}

/// What `bytes[offset..limit]` still say of the record that starts there, read without its
/// checksum, and where it ends if its length is within `limit`.
fn read_damaged(seg: u32, bytes: &[u8], offset: usize, limit: usize) -> (Damaged, Option<usize>) {
    let mut damaged = unreadable(seg, offset, limit - offset);
    let Some(head) = bytes
        .get(offset..offset + HEADER)
        .filter(|_| offset + HEADER <= limit)
    else {
        return (damaged, None);
    };
    let len = u32::from_le_bytes([head[0], head[1], head[2], head[3]]) as usize;
    let body = &bytes[offset + HEADER..(offset + HEADER).saturating_add(len).min(limit)];
    let end = (offset + HEADER)
        .checked_add(len)
        .filter(|&e| len > 0 && e <= limit);
    let mut f = Fields(body);
    let record = &mut damaged.record;
    match f.take(1).map(|k| k[0]) {
        Ok(STORED) => {
            record.kind = RecordKind::Copy;
            record.loss = Loss::Copy;
            record.seq = f.u64().ok();
            let _accepted_at_ms = f.i64();
            damaged.expires_at_ms = f.i64().ok();
            record.id = f.text().ok().and_then(|t| MessageId::parse(t).ok());
            record.recipient = f.name().ok();
            record.sender = f.name().ok();
        }
        Ok(ACKED) => {
            record.kind = RecordKind::Ack;
            record.loss = Loss::Redelivery;
            record.seq = f.u64().ok();
            record.recipient = f.name().ok();
        }
        Ok(HIGH) => {
            record.kind = RecordKind::Mark;
            record.loss = Loss::Nothing;
        }
        _ => return (damaged, None),
    }
    (damaged, end)
}

/// Damaged bytes that say nothing.
fn unreadable(seg: u32, offset: usize, bytes: usize) -> Damaged {
    Damaged {
        record: DamagedRecord {
            segment: seg,
            offset: offset as u64,
            bytes: bytes as u64,
            kind: RecordKind::Unknown,
            seq: None,
            id: None,
            sender: None,
            recipient: None,
            loss: Loss::Unknown,
        },
        expires_at_ms: None,
    }
}

impl Damaged {
    /// The record with what it costs, now that the intact records are known: `fate` says
    /// whether its recipient has its sequence number `Some(true)` queued intact, `Some(false)`
    /// acknowledged, or `None` neither.
    pub(super) fn loss(
        self,
        fate: impl FnOnce(&DamagedRecord) -> Option<bool>,
        now_ms: i64,
    ) -> DamagedRecord {
        let mut record = self.record;
        if record.kind == RecordKind::Copy {
            record.loss = match fate(&record) {
                Some(true) => Loss::Kept,
                Some(false) => Loss::Delivered,
                None if self.expires_at_ms.is_some_and(|t| t < now_ms) => Loss::Expired,
                None => Loss::Copy,
            };
        }
        record
    }
}

#[cfg(test)]
mod tests {
    use std::fs::OpenOptions;
    use std::os::unix::fs::FileExt;

    use super::super::check::spool_report;
    use super::super::index::QueueIndex;
    use super::super::spool::{MARK_BYTES, Spool, StoredCopy, checksum, segment_path, stored_len};
    use super::*;
    use crate::protocol::{AgentName, Seq};

    fn name(n: &str) -> AgentName {
        AgentName::new(n).unwrap()
    }

    /// A spool of `n` copies from alice to bob (`segment_bytes` each segment), closed or left as
    /// a crash leaves it; their locations and ids.
    fn spool(
        n: u64,
        segment_bytes: u64,
        close: bool,
    ) -> (tempfile::TempDir, Vec<Location>, Vec<MessageId>) {
        let dir = tempfile::tempdir().unwrap();
        let (alice, bob) = (name("alice"), name("bob"));
        let mut spool = Spool::open(dir.path(), 0, segment_bytes).unwrap();
        let (mut at, mut ids) = (Vec::new(), Vec::new());
        for seq in 1..=n {
            let id = MessageId::new();
            at.push(
                spool
                    .stored(&StoredCopy {
                        seq,
                        accepted_at_ms: 1,
                        expires_at_ms: i64::MAX,
                        id,
                        recipient: &bob,
                        sender: &alice,
                        envelope: &[b'x'; 200],
                    })
                    .unwrap(),
            );
            ids.push(id);
            spool.write().unwrap();
        }
        if close {
            spool.close().unwrap();
        }
        (dir, at, ids)
    }

    fn len() -> u32 {
        stored_len(&name("bob"), &name("alice"), 200) as u32
    }

    fn flip(dir: &Path, seg: u32, offset: u64) {
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .open(segment_path(dir, seg))
            .unwrap();
        let mut b = [0u8];
        f.read_exact_at(&mut b, offset).unwrap();
        f.write_all_at(&[b[0] ^ 0xff], offset).unwrap();
    }

    fn seqs(scan: &Scan) -> Vec<Seq> {
        scan.segments
            .iter()
            .flat_map(|s| &s.records)
            .filter_map(|r| match r {
                Scanned::Stored { seq, .. } => Some(*seq),
                _ => None,
            })
            .collect()
    }

    fn all_but(n: u64, lost: &[Seq]) -> Vec<Seq> {
        (1..=n).filter(|s| !lost.contains(s)).collect()
    }

    /// The damaged records with what they cost.
    fn report(scan: Scan) -> Vec<DamagedRecord> {
        let index = QueueIndex::load(&scan.segments, 0);
        spool_report(scan, &index, 0).damaged
    }

    #[test]
    fn a_damaged_copy_costs_that_copy_and_nothing_else() {
        let (dir, at, ids) = spool(100, 1 << 20, true);
        flip(dir.path(), at[9].seg, u64::from(at[9].offset) + 150);
        let scanned = scan(dir.path()).unwrap();
        assert_eq!(seqs(&scanned), all_but(100, &[10]));
        assert_eq!(
            report(scanned),
            [DamagedRecord {
                segment: at[9].seg,
                offset: u64::from(at[9].offset),
                bytes: u64::from(len()),
                kind: RecordKind::Copy,
                seq: Some(10),
                id: Some(ids[9]),
                sender: Some(name("alice")),
                recipient: Some(name("bob")),
                loss: Loss::Copy,
            }]
        );
    }

    #[test]
    fn a_damaged_first_record_costs_nothing() {
        let (dir, at, _) = spool(100, 1 << 20, true);
        flip(dir.path(), at[0].seg, 12);
        let scanned = scan(dir.path()).unwrap();
        assert_eq!(seqs(&scanned), all_but(100, &[]));
        let damaged = report(scanned);
        assert_eq!(damaged.len(), 1, "{damaged:?}");
        assert_eq!(
            (damaged[0].offset, damaged[0].kind, damaged[0].loss),
            (0, RecordKind::Mark, Loss::Nothing)
        );
    }

    #[test]
    fn a_damaged_checksum_is_reported_with_the_copy_it_guarded() {
        let (dir, at, ids) = spool(20, 1 << 20, true);
        flip(dir.path(), at[4].seg, u64::from(at[4].offset) + 5);
        let scanned = scan(dir.path()).unwrap();
        assert_eq!(seqs(&scanned), all_but(20, &[5]));
        let damaged = report(scanned);
        assert_eq!(damaged.len(), 1);
        assert_eq!(
            (damaged[0].seq, damaged[0].id, damaged[0].loss),
            (Some(5), Some(ids[4]), Loss::Copy)
        );
    }

    #[test]
    fn a_damaged_length_hides_no_whole_record() {
        // One byte of the length flipped, then a length that lands exactly on a later record:
        // the next copy is read either way.
        for bad_len in [(len() - HEADER as u32) ^ 0xff, 2 * len() - HEADER as u32] {
            let (dir, at, _) = spool(20, 1 << 20, true);
            let f = OpenOptions::new()
                .write(true)
                .open(segment_path(dir.path(), at[9].seg))
                .unwrap();
            f.write_all_at(&bad_len.to_le_bytes(), u64::from(at[9].offset))
                .unwrap();
            let scanned = scan(dir.path()).unwrap();
            assert_eq!(seqs(&scanned), all_but(20, &[10]), "length {bad_len}");
            let damaged = report(scanned);
            assert_eq!(damaged.len(), 1, "{damaged:?}");
            assert_eq!(
                (damaged[0].offset, damaged[0].bytes, damaged[0].seq),
                (u64::from(at[9].offset), u64::from(len()), Some(10))
            );
        }
    }

    #[test]
    fn damage_at_the_end_of_a_sealed_segment_is_reported() {
        let (dir, at, _) = spool(12, 2048, true);
        let last = at.iter().rposition(|a| a.seg == at[0].seg).unwrap();
        assert!(last + 1 < at.len(), "the copies fill more than one segment");
        let closing = u64::from(at[last].offset + len());

        // The last copy before the closing mark.
        flip(dir.path(), at[last].seg, u64::from(at[last].offset) + 100);
        let scanned = scan(dir.path()).unwrap();
        assert_eq!(seqs(&scanned), all_but(12, &[last as u64 + 1]));
        let damaged = report(scanned);
        assert_eq!(
            damaged.iter().map(|d| d.seq).collect::<Vec<_>>(),
            [Some(last as u64 + 1)]
        );
        flip(dir.path(), at[last].seg, u64::from(at[last].offset) + 100);

        // The closing mark itself: the segment's end is unknown, nothing is lost.
        flip(dir.path(), at[last].seg, closing + 9);
        let scanned = scan(dir.path()).unwrap();
        assert!(scanned.unclosed.is_none(), "the newest segment was closed");
        assert_eq!(seqs(&scanned), all_but(12, &[]));
        let damaged = report(scanned);
        assert_eq!(damaged.len(), 1, "{damaged:?}");
        assert_eq!(
            (damaged[0].offset, damaged[0].kind, damaged[0].loss),
            (closing, RecordKind::Mark, Loss::Nothing)
        );
    }

    #[test]
    fn every_flipped_byte_costs_at_most_the_record_it_is_in_and_slack_is_never_damage() {
        let (dir, at, _) = spool(8, 2048, true);
        let seg = at[0].seg;
        let in_first: Vec<usize> = (0..at.len()).filter(|&i| at[i].seg == seg).collect();
        let end = u64::from(at[*in_first.last().unwrap()].offset + len()) + MARK_BYTES;
        let size = fs::metadata(segment_path(dir.path(), seg)).unwrap().len();
        for offset in 0..size {
            flip(dir.path(), seg, offset);
            let scanned = scan(dir.path()).unwrap();
            let hit = in_first.iter().copied().find(|&i| {
                (u64::from(at[i].offset)..u64::from(at[i].offset + len())).contains(&offset)
            });
            let lost: Vec<Seq> = hit.map(|i| i as u64 + 1).into_iter().collect();
            assert_eq!(seqs(&scanned), all_but(8, &lost), "byte {offset}");
            let damaged = report(scanned);
            if offset >= end {
                assert!(damaged.is_empty(), "slack at byte {offset}: {damaged:?}");
            } else {
                assert!(!damaged.is_empty(), "byte {offset} went unreported");
                if let Some(i) = hit {
                    assert_eq!(damaged[0].offset, u64::from(at[i].offset), "byte {offset}");
                }
            }
            flip(dir.path(), seg, offset);
        }
    }

    #[test]
    fn the_torn_tail_of_the_newest_segment_is_not_damage() {
        let (dir, at, _) = spool(5, 1 << 20, false);
        let end = u64::from(at[4].offset + len());
        // The first bytes of a record the process died writing.
        let f = OpenOptions::new()
            .write(true)
            .open(segment_path(dir.path(), at[4].seg))
            .unwrap();
        f.write_all_at(&[0x40, 1, 0, 0, 7, 7, 7, 7, STORED, 6], end)
            .unwrap();
        let scanned = scan(dir.path()).unwrap();
        assert_eq!(seqs(&scanned), all_but(5, &[]));
        assert_eq!(
            scanned.unclosed,
            Some(Unclosed {
                segment: at[4].seg,
                end
            })
        );
        assert!(report(scanned).is_empty());
    }

    #[test]
    fn an_unclosed_segment_that_is_not_the_newest_is_damaged_at_its_end() {
        let (dir, at, _) = spool(5, 1 << 20, false);
        // A later run's segment: the one before it should have been closed.
        drop(Spool::open(dir.path(), 5, 4096).unwrap());
        let scanned = scan(dir.path()).unwrap();
        assert_eq!(seqs(&scanned), all_but(5, &[]));
        let damaged = report(scanned);
        assert_eq!(damaged.len(), 1, "{damaged:?}");
        assert_eq!(damaged[0].offset, u64::from(at[4].offset + len()));
    }

    #[test]
    fn segments_of_builds_before_marks_read_as_they_did() {
        let dir = tempfile::tempdir().unwrap();
        let (alice, bob) = (name("alice"), name("bob"));
        // Segment 1 as a build before marks wrote it: a plain `High`, three copies, zeros.
        let mut bytes = Vec::new();
        let record = |body: &[u8], bytes: &mut Vec<u8>| {
            let at = bytes.len();
            bytes.extend_from_slice(&(body.len() as u32).to_le_bytes());
            bytes.extend_from_slice(&checksum(1, body).to_le_bytes());
            bytes.extend_from_slice(body);
            at
        };
        let mut high = vec![HIGH];
        high.extend_from_slice(&0u64.to_le_bytes());
        record(&high, &mut bytes);
        let mut copies = Vec::new();
        for seq in 1..=3u64 {
            let mut body = vec![STORED];
            for n in [seq, 1, i64::MAX as u64] {
                body.extend_from_slice(&n.to_le_bytes());
            }
            for text in [
                &MessageId::new().to_string()[..],
                bob.as_str(),
                alice.as_str(),
            ] {
                body.push(text.len() as u8);
                body.extend_from_slice(text.as_bytes());
            }
            body.extend_from_slice(b"{}");
            copies.push(record(&body, &mut bytes));
        }
        bytes.resize(4096, 0);
        fs::write(segment_path(dir.path(), 1), &bytes).unwrap();
        drop(Spool::open(dir.path(), 3, 4096).unwrap());

        let scanned = scan(dir.path()).unwrap();
        assert_eq!(seqs(&scanned), [1, 2, 3]);
        assert!(report(scanned).is_empty(), "its end is not damage");
        flip(dir.path(), 1, copies[1] as u64 + 30);
        let scanned = scan(dir.path()).unwrap();
        assert_eq!(seqs(&scanned), [1, 3]);
        let damaged = report(scanned);
        assert_eq!(
            damaged.iter().map(|d| (d.seq, d.loss)).collect::<Vec<_>>(),
            [(Some(2), Loss::Copy)]
        );
    }

    #[test]
    fn a_segment_without_a_valid_record_is_listed_empty() {
        let (dir, _, _) = spool(2, 4096, true);
        fs::write(segment_path(dir.path(), 40), [0u8; 64]).unwrap();
        let scanned = scan(dir.path()).unwrap();
        assert_eq!(scanned.empty, [40]);
        assert!(scanned.damaged.is_empty());
    }
}
