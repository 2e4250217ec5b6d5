//! The spool: the queue's copies and acknowledgements, appended as records to segment files in
//! a directory beside the database (`relay.db-spool/00000001.seg`, ...).
//!
//! A send appends its copies and nothing else, so a flush writes a few KiB where a SQLite
//! commit rewrote several 16 KiB pages, and no WAL checkpoint ever stalls the writer for it
//! (docs/decisions.md, "The queue lives in a spool"). The queue's index (`index.rs`) is
//! rebuilt from these records at open (`scan.rs`).
//!
//! Records are `[body length: u32][crc32 of segment number and body: u32][body]`, little
//! endian. The next segment is prepared ahead by a thread of its own, so that records are
//! written into blocks that already exist and `fdatasync` can skip the file system's journal
//! (half the flush time, measured): a removed segment's file is reused under the new number
//! (its old records fail the checksum, which covers the segment number), else a new file is
//! filled with zeros and flushed.
//!
//! Marks say where a segment's records are (docs/decisions.md, "Storage that never loses mail
//! silently"): every segment starts with a `High` and an opening mark, and its last record is
//! a closing mark, written when the next segment starts or the spool is closed (or, after a
//! crash, by the next open). Marks are `High` records with a flag byte more, which builds
//! before them read as a plain `High`.
use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, mpsc};
use std::thread;

use crate::protocol::{AgentName, MessageId, Seq};
use crate::storage::StorageError;

/// Bytes a segment is prepared with. A record that does not fit in the rest of the current
/// segment starts the next one; a record larger than a segment makes its segment grow.
pub(super) const SEGMENT_BYTES: u64 = 16 << 20;
/// Bytes before a record's body: its length and checksum.
pub(super) const HEADER: usize = 8;
/// Body bytes of a plain `High`. A segment's first record is one: builds before marks read
/// exactly this many bytes to tell a used segment from a prepared one.
const HIGH_BODY: usize = 1 + 8;
/// Body bytes of a mark: `High`, then whether it opens or closes its segment.
const MARK_BODY: usize = HIGH_BODY + 1;
/// Bytes of a mark record. Room for a closing mark is kept at the end of every segment.
pub(super) const MARK_BYTES: u64 = (HEADER + MARK_BODY) as u64;
/// Bytes of the records that open every segment: its `High` and opening mark.
const OPENING_BYTES: u64 = (HEADER + HIGH_BODY) as u64 + MARK_BYTES;
/// A mark's flag byte: the first record after a segment's `High`.
const OPENS: u8 = 0;
/// A mark's flag byte: the last record of its segment.
const CLOSES: u8 = 1;
/// Removed segments kept for reuse at most; more are deleted.
const KEEP_FOR_REUSE: usize = 2;
/// The name prefix of a removed segment kept for reuse: not a segment, never scanned.
const REUSE_PREFIX: &str = "reuse-";

pub(super) const HIGH: u8 = 1;
pub(super) const STORED: u8 = 2;
pub(super) const ACKED: u8 = 3;

/// Where a record starts: its segment's number and its offset in that segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Location {
    pub(super) seg: u32,
    pub(super) offset: u32,
}

/// Where the spool ends: ordered like the records (segment, then offset).
pub(super) type Position = u64;

fn position(seg: u32, offset: u64) -> Position {
    (u64::from(seg) << 32) | offset.min(u64::from(u32::MAX))
}

/// A copy as the spool stores it.
pub(super) struct StoredCopy<'a> {
    pub(super) seq: Seq,
    pub(super) accepted_at_ms: i64,
    pub(super) expires_at_ms: i64,
    pub(super) id: MessageId,
    pub(super) recipient: &'a AgentName,
    pub(super) sender: &'a AgentName,
    pub(super) envelope: &'a [u8],
}

/// A record read back when the spool is scanned.
#[derive(Debug)]
pub(super) enum Scanned {
    /// The highest sequence number assigned when it was written.
    High(Seq),
    /// A `High` that opens its segment or, when `closes`, says that no record of the segment
    /// follows it.
    Mark { high: Seq, closes: bool },
    /// A copy (its envelope stays on disk).
    Stored {
        at: Location,
        seq: Seq,
        size: u32,
        expires_at_ms: i64,
        id: MessageId,
        recipient: AgentName,
        sender: AgentName,
    },
    /// The recipient acknowledged every copy up to `upto`.
    Acked {
        at: Location,
        recipient: AgentName,
        upto: Seq,
    },
}

/// The open segments by number, shared by the writer (which adds and removes them) and the
/// readers. Removing a segment unlinks its file; a reader that took its handle first still
/// reads it.
pub(super) type Files = Arc<Mutex<HashMap<u32, Arc<File>>>>;

/// The handle of segment `seg`, if it is still open.
pub(super) fn file(files: &Files, seg: u32) -> Option<Arc<File>> {
    lock(files).get(&seg).cloned()
}

fn lock(files: &Files) -> MutexGuard<'_, HashMap<u32, Arc<File>>> {
    // Poisoned only by a panic between an insert and a remove; the map is still whole.
    files.lock().unwrap_or_else(|e| e.into_inner())
}

/// The spool of the database at `db`: the directory beside it, `<name>-spool`.
pub(super) fn dir_of(db: &Path) -> PathBuf {
    let mut dir = db.as_os_str().to_owned();
    dir.push("-spool");
    dir.into()
}

pub(super) fn segment_path(dir: &Path, seg: u32) -> PathBuf {
    dir.join(format!("{seg:08}.seg"))
}

pub(super) fn io_error(what: &str, path: &Path, e: io::Error) -> StorageError {
    StorageError::Database(format!("{what} {}: {e}", path.display()))
}

pub(super) fn checksum(seg: u32, body: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(&seg.to_le_bytes());
    h.update(body);
    h.finalize()
}

/// Reads the segment numbers in `dir`, ascending; other files are left alone.
pub(super) fn segments(dir: &Path) -> Result<Vec<u32>, StorageError> {
    let mut segs = Vec::new();
    for entry in fs::read_dir(dir).map_err(|e| io_error("reading the spool", dir, e))? {
        let entry = entry.map_err(|e| io_error("reading the spool", dir, e))?;
        let name = entry.file_name();
        if let Some(seg) = name
            .to_str()
            .and_then(|n| n.strip_suffix(".seg"))
            .filter(|n| n.len() == 8)
            .and_then(|n| n.parse().ok())
        {
            segs.push(seg);
        }
    }
    segs.sort_unstable();
    Ok(segs)
}

/// Removes segment `seg` of `dir`, which holds no record: prepared but never used, or never
/// flushed.
pub(super) fn remove(dir: &Path, seg: u32) -> Result<(), StorageError> {
    let path = segment_path(dir, seg);
    match fs::remove_file(&path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(io_error("removing", &path, e)),
        _ => Ok(()),
    }
}

/// A record header's body length and checksum.
pub(super) fn header(bytes: [u8; HEADER]) -> (usize, u32) {
    let [l0, l1, l2, l3, c0, c1, c2, c3] = bytes;
    (
        u32::from_le_bytes([l0, l1, l2, l3]) as usize,
        u32::from_le_bytes([c0, c1, c2, c3]),
    )
}

/// The body of the record at `offset` and the offset after it, if a whole record is there.
pub(super) fn whole_record(seg: u32, bytes: &[u8], offset: usize) -> Option<(&[u8], usize)> {
    let (len, crc) = header(bytes.get(offset..offset + HEADER)?.try_into().ok()?);
    let body = bytes.get(offset + HEADER..(offset + HEADER).checked_add(len)?)?;
    (len > 0 && checksum(seg, body) == crc).then_some((body, offset + HEADER + len))
}

/// Reads fields off the front of a record body.
pub(super) struct Fields<'a>(pub(super) &'a [u8]);

impl<'a> Fields<'a> {
    pub(super) fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        if self.0.len() < n {
            return Err("it is shorter than its fields".into());
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    pub(super) fn u64(&mut self) -> Result<u64, String> {
        Ok(u64::from_le_bytes(
            self.take(8)?.try_into().map_err(|_| "short")?,
        ))
    }

    pub(super) fn i64(&mut self) -> Result<i64, String> {
        Ok(self.u64()? as i64)
    }

    pub(super) fn text(&mut self) -> Result<&'a str, String> {
        let len = self.take(1)?[0] as usize;
        std::str::from_utf8(self.take(len)?).map_err(|e| e.to_string())
    }

    /// A queue name: an agent's, or a relay mailbox.
    pub(super) fn name(&mut self) -> Result<AgentName, String> {
        AgentName::from_stored(self.text()?).map_err(|e| e.to_string())
    }
}

pub(super) fn decode(at: Location, body: &[u8]) -> Result<Scanned, String> {
    let mut f = Fields(body);
    match f.take(1)?[0] {
        HIGH if body.len() == HIGH_BODY => Ok(Scanned::High(f.u64()?)),
        HIGH if body.len() == MARK_BODY => {
            let high = f.u64()?;
            match f.take(1)?[0] {
                flag @ (OPENS | CLOSES) => Ok(Scanned::Mark {
                    high,
                    closes: flag == CLOSES,
                }),
                flag => Err(format!("unknown mark flag {flag}")),
            }
        }
        HIGH => Err(format!("a high record of {} bytes", body.len())),
        STORED => {
            let seq = f.u64()?;
            let _accepted_at_ms = f.i64()?;
            let expires_at_ms = f.i64()?;
            let id = MessageId::parse(f.text()?).map_err(|e| e.to_string())?;
            let recipient = f.name()?;
            let sender = f.name()?;
            let size = u32::try_from(f.0.len()).map_err(|e| e.to_string())?;
            Ok(Scanned::Stored {
                at,
                seq,
                size,
                expires_at_ms,
                id,
                recipient,
                sender,
            })
        }
        ACKED => {
            let acked = Scanned::Acked {
                at,
                upto: f.u64()?,
                recipient: f.name()?,
            };
            if f.0.is_empty() {
                Ok(acked)
            } else {
                Err("an ack with bytes after its fields".into())
            }
        }
        kind => Err(format!("unknown record kind {kind}")),
    }
}

fn unreadable(at: Location, why: String) -> StorageError {
    StorageError::Database(format!(
        "spool segment {} at byte {}: {why}",
        at.seg, at.offset
    ))
}

/// Reads the body of the record at `at` from its segment, checking it is whole.
pub(super) fn read_body(file: &File, at: Location) -> Result<Vec<u8>, StorageError> {
    let bad = |why: String| unreadable(at, why);
    let mut head = [0u8; HEADER];
    file.read_exact_at(&mut head, u64::from(at.offset))
        .map_err(|e| bad(e.to_string()))?;
    let (len, crc) = header(head);
    let mut body = vec![0u8; len];
    file.read_exact_at(&mut body, u64::from(at.offset) + HEADER as u64)
        .map_err(|e| bad(e.to_string()))?;
    if checksum(at.seg, &body) != crc {
        return Err(bad("the record's checksum does not match".into()));
    }
    Ok(body)
}

/// Bytes a stored copy's record takes, header included (see [`Spool::stored`]): readers
/// compute it to read a run of records with one call.
pub(super) fn stored_len(recipient: &AgentName, sender: &AgentName, envelope: u32) -> usize {
    const ID_LEN: usize = 36;
    HEADER
        + 1
        + 3 * 8
        + (1 + ID_LEN)
        + (1 + recipient.as_str().len())
        + (1 + sender.as_str().len())
        + envelope as usize
}

/// Reads `len` bytes of consecutive records, from `at` on.
pub(super) fn read_run(file: &File, at: Location, len: usize) -> Result<Vec<u8>, StorageError> {
    let mut bytes = vec![0u8; len];
    file.read_exact_at(&mut bytes, u64::from(at.offset))
        .map_err(|e| unreadable(at, e.to_string()))?;
    Ok(bytes)
}

/// The stored copy whose whole record, read from `at`, is `record`: its sequence number, when
/// it was accepted, and its envelope.
pub(super) fn parse_stored(
    at: Location,
    record: &[u8],
) -> Result<(Seq, i64, Vec<u8>), StorageError> {
    let bad = |why: String| unreadable(at, why);
    let (body, _) = whole_record(at.seg, record, 0)
        .filter(|&(_, end)| end == record.len())
        .ok_or_else(|| bad("the record is not whole or its checksum does not match".into()))?;
    let mut f = Fields(body);
    if f.take(1).map_err(bad)?[0] != STORED {
        return Err(bad("not a stored copy".into()));
    }
    let seq = f.u64().map_err(bad)?;
    let accepted_at_ms = f.i64().map_err(bad)?;
    f.i64().map_err(bad)?;
    for _ in 0..3 {
        f.text().map_err(bad)?;
    }
    Ok((seq, accepted_at_ms, f.0.to_vec()))
}

/// A stored copy read back by its location alone (the record's length from its header).
#[cfg(test)]
fn read_stored(file: &File, at: Location) -> Result<(Seq, i64, Vec<u8>), StorageError> {
    let len = HEADER + read_body(file, at)?.len();
    parse_stored(at, &read_run(file, at, len)?)
}

/// What a flush must make durable: the segments written since the last one, and the position
/// it covers.
pub(super) struct Unflushed {
    pub(super) files: Vec<Arc<File>>,
    pub(super) end: Position,
}

/// The writer's end of the spool: appends records, starts segments, removes dead ones.
pub(super) struct Spool {
    dir: PathBuf,
    files: Files,
    segment_bytes: u64,
    head: u32,
    head_file: Arc<File>,
    /// Bytes written to the head segment.
    written: u64,
    /// Records appended since the last write, to go at `written`.
    buf: Vec<u8>,
    /// Segments written since the last flush was taken, in order.
    unflushed: Vec<Arc<File>>,
    /// The highest sequence number of any record, carried into each new segment.
    high: Seq,
    /// The position every flush so far covers; set by the syncer.
    flushed: Arc<AtomicU64>,
    prepared: mpsc::Receiver<io::Result<(u32, File)>>,
    /// The preparing thread, joined on drop so that no segment is made after the spool is gone.
    preparer: Option<thread::JoinHandle<()>>,
    /// Removed segments' files, renamed, for the preparing thread to reuse.
    reuse: mpsc::Sender<PathBuf>,
    /// How many of them wait there.
    reusable: Arc<AtomicUsize>,
    /// Why a write failed, once one has: nothing more is written.
    broken: Option<String>,
}

impl Spool {
    /// Opens the spool in `dir` (creating it) and starts a new head segment after the
    /// existing ones. `high` is the highest sequence number assigned so far.
    pub(super) fn open(dir: &Path, high: Seq, segment_bytes: u64) -> Result<Self, StorageError> {
        fs::create_dir_all(dir).map_err(|e| io_error("creating the spool", dir, e))?;
        let existing = segments(dir)?;
        let last = existing.last().copied().unwrap_or(0);
        let files: Files = Arc::default();
        for seg in existing {
            let path = segment_path(dir, seg);
            let file = File::open(&path).map_err(|e| io_error("opening", &path, e))?;
            lock(&files).insert(seg, Arc::new(file));
        }
        for entry in fs::read_dir(dir).map_err(|e| io_error("reading the spool", dir, e))? {
            let entry = entry.map_err(|e| io_error("reading the spool", dir, e))?;
            if entry
                .file_name()
                .to_string_lossy()
                .starts_with(REUSE_PREFIX)
            {
                let _ = fs::remove_file(entry.path());
            }
        }
        let (prepare, prepared) = mpsc::sync_channel(0);
        let (reuse, reused) = mpsc::channel();
        let reusable = Arc::new(AtomicUsize::new(0));
        let first = last
            .checked_add(1)
            .ok_or_else(|| StorageError::Database("the spool ran out of segment numbers".into()))?;
        let preparer = thread::Builder::new()
            .name("relay-spool-prep".into())
            .spawn({
                let dir = dir.to_owned();
                let reusable = reusable.clone();
                move || {
                    Preparer {
                        dir,
                        bytes: segment_bytes,
                        reused,
                        reusable,
                    }
                    .run(first, &prepare)
                }
            })
            .map_err(|e| StorageError::Database(e.to_string()))?;
        let (head, file) = take_prepared(&prepared)?;
        let head_file = Arc::new(file);
        lock(&files).insert(head, head_file.clone());
        let mut spool = Self {
            dir: dir.to_owned(),
            files,
            segment_bytes,
            head,
            head_file: head_file.clone(),
            written: 0,
            buf: Vec::new(),
            unflushed: vec![head_file],
            high,
            flushed: Arc::default(),
            prepared,
            broken: None,
            reuse,
            reusable,
            preparer: Some(preparer),
        };
        spool.open_segment()?;
        spool.write()?;
        Ok(spool)
    }

    /// The directory the segments are in.
    pub(super) fn dir(&self) -> &Path {
        &self.dir
    }

    /// The segments, shared with readers.
    pub(super) fn files(&self) -> Files {
        self.files.clone()
    }

    /// The position flushes have covered, for the syncer to advance.
    pub(super) fn flushed(&self) -> Arc<AtomicU64> {
        self.flushed.clone()
    }

    /// The head segment's number: every lower one is sealed.
    pub(super) fn head(&self) -> u32 {
        self.head
    }

    /// Bytes a segment is prepared with.
    pub(super) fn segment_bytes(&self) -> u64 {
        self.segment_bytes
    }

    /// Where the spool ends, appended records included.
    pub(super) fn position(&self) -> Position {
        position(self.head, self.written + self.buf.len() as u64)
    }

    /// Why a write failed, once one has.
    pub(super) fn broken(&self) -> Option<&str> {
        self.broken.as_deref()
    }

    /// Appends a stored copy.
    pub(super) fn stored(&mut self, copy: &StoredCopy<'_>) -> Result<Location, StorageError> {
        self.high = self.high.max(copy.seq);
        let id = copy.id.to_string();
        self.append(|b| {
            b.push(STORED);
            b.extend_from_slice(&copy.seq.to_le_bytes());
            b.extend_from_slice(&copy.accepted_at_ms.to_le_bytes());
            b.extend_from_slice(&copy.expires_at_ms.to_le_bytes());
            for text in [&id[..], copy.recipient.as_str(), copy.sender.as_str()] {
                b.push(text.len() as u8);
                b.extend_from_slice(text.as_bytes());
            }
            b.extend_from_slice(copy.envelope);
        })
    }

    /// Appends an acknowledgement of `recipient`'s copies up to `upto`.
    pub(super) fn acked(
        &mut self,
        recipient: &AgentName,
        upto: Seq,
    ) -> Result<Location, StorageError> {
        self.append(|b| {
            b.push(ACKED);
            b.extend_from_slice(&upto.to_le_bytes());
            b.push(recipient.as_str().len() as u8);
            b.extend_from_slice(recipient.as_str().as_bytes());
        })
    }

    /// Appends a record read from an older segment (see [`read_body`]) unchanged.
    pub(super) fn copy(&mut self, body: &[u8]) -> Result<Location, StorageError> {
        self.append(|b| b.extend_from_slice(body))
    }

    /// Starts the head segment: its `High`, then the opening mark that tells it from a
    /// segment written before marks.
    fn open_segment(&mut self) -> Result<(), StorageError> {
        let high = self.high;
        self.append(|b| {
            b.push(HIGH);
            b.extend_from_slice(&high.to_le_bytes());
        })?;
        self.push_mark(OPENS);
        Ok(())
    }

    /// Appends a mark to the head segment, never starting the next for it: the room a closing
    /// mark needs is kept free (see [`Spool::append`]).
    fn push_mark(&mut self, flag: u8) {
        let start = self.buf.len();
        self.buf.extend_from_slice(&[0; HEADER]);
        self.buf.extend_from_slice(&mark_body(self.high, flag));
        self.seal(start);
    }

    fn append(&mut self, body: impl FnOnce(&mut Vec<u8>)) -> Result<Location, StorageError> {
        if let Some(why) = &self.broken {
            return Err(StorageError::Database(why.clone()));
        }
        let start = self.buf.len();
        self.buf.extend_from_slice(&[0; HEADER]);
        body(&mut self.buf);
        let fits = self.written + self.buf.len() as u64 + MARK_BYTES <= self.segment_bytes;
        // A segment holds its opening records and at least one more.
        if !fits && self.written + start as u64 > OPENING_BYTES {
            let record = self.buf.split_off(start);
            self.rotate()?;
            let at = self.buf.len();
            self.buf.extend_from_slice(&record);
            return Ok(self.seal(at));
        }
        Ok(self.seal(start))
    }

    /// Fills in the header of the record at `start` in the buffer.
    fn seal(&mut self, start: usize) -> Location {
        let len = (self.buf.len() - start - HEADER) as u32;
        let crc = checksum(self.head, &self.buf[start + HEADER..]);
        self.buf[start..start + 4].copy_from_slice(&len.to_le_bytes());
        self.buf[start + 4..start + HEADER].copy_from_slice(&crc.to_le_bytes());
        Location {
            seg: self.head,
            offset: (self.written + start as u64) as u32,
        }
    }

    /// Writes what was appended into the head segment.
    pub(super) fn write(&mut self) -> Result<(), StorageError> {
        if self.buf.is_empty() {
            return Ok(());
        }
        if let Some(why) = &self.broken {
            return Err(StorageError::Database(why.clone()));
        }
        if let Err(e) = self.head_file.write_all_at(&self.buf, self.written) {
            let why = format!(
                "writing spool segment {} failed ({e}); the relay refuses writes until it is restarted",
                segment_path(&self.dir, self.head).display()
            );
            self.broken = Some(why.clone());
            return Err(StorageError::Database(why));
        }
        self.written += self.buf.len() as u64;
        self.buf.clear();
        if !self
            .unflushed
            .last()
            .is_some_and(|f| Arc::ptr_eq(f, &self.head_file))
        {
            self.unflushed.push(self.head_file.clone());
        }
        Ok(())
    }

    /// Forgets what was appended since the last write (its batch failed).
    pub(super) fn discard(&mut self) {
        self.buf.clear();
    }

    /// What the next flush must cover; written records only.
    pub(super) fn take_unflushed(&mut self) -> Unflushed {
        Unflushed {
            files: std::mem::take(&mut self.unflushed),
            end: position(self.head, self.written),
        }
    }

    /// Seals the head segment with a closing mark and starts the next.
    fn rotate(&mut self) -> Result<(), StorageError> {
        self.push_mark(CLOSES);
        self.write()?;
        let (seg, file) = take_prepared(&self.prepared)?;
        self.head = seg;
        self.head_file = Arc::new(file);
        self.written = 0;
        lock(&self.files).insert(seg, self.head_file.clone());
        self.open_segment()
    }

    /// Closes the spool: flushes what was written, then ends the head segment with a closing
    /// mark, flushed too, so that the next open knows where its records end. Nothing is
    /// written after it.
    pub(super) fn close(&mut self) -> Result<(), StorageError> {
        self.write()?;
        let flush = |file: &File| {
            file.sync_data()
                .map_err(|e| StorageError::Database(format!("flushing the spool: {e}")))
        };
        for file in std::mem::take(&mut self.unflushed) {
            flush(&file)?;
        }
        flush(&self.head_file)?;
        self.push_mark(CLOSES);
        self.write()?;
        flush(&self.head_file)?;
        self.broken = Some("the spool is closed".into());
        Ok(())
    }

    /// Flushes every segment.
    pub(super) fn sync_all(&self) -> Result<(), StorageError> {
        let files: Vec<_> = lock(&self.files).values().cloned().collect();
        for file in files {
            file.sync_data()
                .map_err(|e| StorageError::Database(format!("flushing the spool: {e}")))?;
        }
        Ok(())
    }

    /// Removes a sealed segment whose records are all dead and whose successors are durable.
    pub(super) fn remove(&mut self, seg: u32) {
        debug_assert!(seg < self.head);
        lock(&self.files).remove(&seg);
        let path = segment_path(&self.dir, seg);
        if self.reusable.load(Ordering::Acquire) < KEEP_FOR_REUSE {
            // A rename that a crash undoes leaves a dead segment, which a scan reads harmlessly.
            let kept = self.dir.join(format!("{REUSE_PREFIX}{seg:08}"));
            if fs::rename(&path, &kept).is_ok() {
                self.reusable.fetch_add(1, Ordering::AcqRel);
                let _ = self.reuse.send(kept);
                return;
            }
        }
        if let Err(e) = fs::remove_file(&path) {
            tracing::warn!(segment = %path.display(), error = %e, "removing a dead spool segment failed; it is read again at the next start");
        }
    }
}

impl Drop for Spool {
    fn drop(&mut self) {
        // Closing the channel stops the preparer: its hand-over fails, it removes the segment
        // nobody took and the files kept for reuse.
        let (_, closed) = mpsc::sync_channel(0);
        drop(std::mem::replace(&mut self.prepared, closed));
        if let Some(preparer) = self.preparer.take() {
            let _ = preparer.join();
        }
    }
}

/// A mark's body: the highest sequence number and its flag.
fn mark_body(high: Seq, flag: u8) -> [u8; MARK_BODY] {
    let mut body = [0u8; MARK_BODY];
    body[0] = HIGH;
    body[1..9].copy_from_slice(&high.to_le_bytes());
    body[9] = flag;
    body
}

/// Ends segment `seg` in `dir`, whose records stop at byte `end` with no closing mark (the
/// relay stopped without closing the spool), with one, flushed: the bytes after `end` are
/// what that run had not finished writing, and from now on anything missing before the mark
/// is damage.
pub(super) fn close_segment(dir: &Path, seg: u32, end: u32, high: Seq) -> Result<(), StorageError> {
    let path = segment_path(dir, seg);
    let fail = |e| io_error("closing", &path, e);
    let file = OpenOptions::new().write(true).open(&path).map_err(fail)?;
    file.sync_data().map_err(fail)?;
    let body = mark_body(high, CLOSES);
    let mut record = Vec::with_capacity(HEADER + MARK_BODY);
    record.extend_from_slice(&(MARK_BODY as u32).to_le_bytes());
    record.extend_from_slice(&checksum(seg, &body).to_le_bytes());
    record.extend_from_slice(&body);
    file.write_all_at(&record, u64::from(end)).map_err(fail)?;
    file.sync_data().map_err(fail)
}

fn take_prepared(
    prepared: &mpsc::Receiver<io::Result<(u32, File)>>,
) -> Result<(u32, File), StorageError> {
    match prepared.recv() {
        Ok(Ok(segment)) => Ok(segment),
        Ok(Err(e)) => Err(StorageError::Database(format!(
            "preparing a spool segment failed ({e}); check the disk space of the relay's data directory"
        ))),
        Err(_) => Err(StorageError::Database(
            "the spool's segment thread stopped".into(),
        )),
    }
}

/// The thread that prepares the next segment, one ahead of the writer.
struct Preparer {
    dir: PathBuf,
    bytes: u64,
    reused: mpsc::Receiver<PathBuf>,
    reusable: Arc<AtomicUsize>,
}

impl Preparer {
    /// Prepares segments `first`, `first + 1`, ... until the writer is gone.
    fn run(self, first: u32, out: &mpsc::SyncSender<io::Result<(u32, File)>>) {
        for seg in first..=u32::MAX {
            let path = segment_path(&self.dir, seg);
            let prepared = self.prepare(&path);
            let failed = prepared.is_err();
            if out.send(prepared.map(|f| (seg, f))).is_err() || failed {
                // Nobody took it: it holds no record, and the next open would remove it.
                let _ = fs::remove_file(&path);
                break;
            }
        }
        while let Ok(kept) = self.reused.try_recv() {
            let _ = fs::remove_file(kept);
        }
    }

    /// A removed segment's file under the new number, or else a new file of zeros; either is
    /// flushed with its directory entry before the writer gets it.
    fn prepare(&self, path: &Path) -> io::Result<File> {
        if let Ok(kept) = self.reused.try_recv() {
            self.reusable.fetch_sub(1, Ordering::AcqRel);
            if fs::rename(&kept, path).is_ok() {
                let file = OpenOptions::new().read(true).write(true).open(path)?;
                File::open(&self.dir)?.sync_all()?;
                return Ok(file);
            }
            let _ = fs::remove_file(kept);
        }
        create_zeroed(&self.dir, path, self.bytes)
    }
}

/// Creates the segment at `path` filled with `bytes` zeros, flushed with its directory entry.
fn create_zeroed(dir: &Path, path: &Path, bytes: u64) -> io::Result<File> {
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(path)?;
    // Flushed a MiB at a time: the writer's flushes share the disk, and one 16 MiB flush
    // held them up for tens of milliseconds.
    let zeros = vec![0u8; 1 << 20];
    let mut left = bytes;
    while left > 0 {
        let n = left.min(zeros.len() as u64) as usize;
        file.write_all(&zeros[..n])?;
        file.sync_data()?;
        left -= n as u64;
    }
    file.sync_all()?;
    File::open(dir)?.sync_all()?;
    Ok(file)
}

#[cfg(test)]
mod tests {
    use super::super::scan::scan;
    use super::*;

    fn name(n: &str) -> AgentName {
        AgentName::new(n).unwrap()
    }

    fn copy<'a>(seq: Seq, recipient: &'a AgentName, envelope: &'a [u8]) -> StoredCopy<'a> {
        StoredCopy {
            seq,
            accepted_at_ms: 7,
            expires_at_ms: 9,
            id: MessageId::new(),
            recipient,
            sender: recipient,
            envelope,
        }
    }

    fn records(dir: &Path) -> Vec<Scanned> {
        let scanned = scan(dir).unwrap();
        assert!(scanned.damaged.is_empty(), "{:?}", scanned.damaged);
        scanned
            .segments
            .into_iter()
            .flat_map(|s| s.records)
            .collect()
    }

    fn stored_seqs(records: &[Scanned]) -> Vec<Seq> {
        records
            .iter()
            .filter_map(|r| match r {
                Scanned::Stored { seq, .. } => Some(*seq),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn records_read_back_across_segments_and_a_torn_tail_ends_its_segment() {
        let dir = tempfile::tempdir().unwrap();
        let bob = name("bob");
        // Room for the opening records, two copies and the closing mark.
        let bytes = OPENING_BYTES + 2 * stored_len(&bob, &bob, 100) as u64 + MARK_BYTES;
        let mut spool = Spool::open(dir.path(), 0, bytes).unwrap();
        let first = spool.stored(&copy(1, &bob, &[1; 100])).unwrap();
        let second = spool.stored(&copy(2, &bob, &[2; 100])).unwrap();
        let ack = spool.acked(&bob, 1).unwrap();
        spool.write().unwrap();
        assert_eq!(first.seg, second.seg);
        assert_eq!(
            (second.offset - first.offset) as usize,
            stored_len(&bob, &bob, 100),
            "readers compute a record's length"
        );
        assert!(ack.seg > first.seg, "a full segment starts the next");
        let (seq, accepted, envelope) =
            read_stored(&file(&spool.files(), second.seg).unwrap(), second).unwrap();
        assert_eq!((seq, accepted, envelope), (2, 7, vec![2; 100]));
        // A record half written when the process died.
        let head = segment_path(dir.path(), ack.seg);
        let f = OpenOptions::new().write(true).open(&head).unwrap();
        f.write_all_at(&[50, 0, 0, 0, 1, 2], u64::from(ack.offset) + 40)
            .unwrap();
        drop(spool);

        let scanned = scan(dir.path()).unwrap();
        assert!(scanned.damaged.is_empty(), "a torn tail is not damage");
        let unclosed = scanned.unclosed.as_ref().unwrap();
        assert_eq!(unclosed.segment, ack.seg);
        assert_eq!(unclosed.end, u64::from(ack.offset) + 21, "after the ack");
        let all: Vec<Scanned> = scanned
            .segments
            .into_iter()
            .flat_map(|s| s.records)
            .collect();
        assert_eq!(stored_seqs(&all), [1, 2]);
        for r in &all {
            if let Scanned::Stored { size, .. } = r {
                assert_eq!(*size, 100);
            }
        }
        let acks = all
            .iter()
            .filter(|r| matches!(r, Scanned::Acked { upto: 1, .. }))
            .count();
        assert_eq!(acks, 1);
        let highs: Vec<Seq> = all
            .iter()
            .filter_map(|r| match r {
                Scanned::High(h) => Some(*h),
                _ => None,
            })
            .collect();
        assert_eq!(highs, [0, 2], "a new segment carries the highest number");
        let closing: Vec<bool> = all
            .iter()
            .filter_map(|r| match r {
                Scanned::Mark { closes, .. } => Some(*closes),
                _ => None,
            })
            .collect();
        assert_eq!(
            closing,
            [false, true, false],
            "opened, closed when full, opened; the head was left unclosed"
        );

        let reopened = Spool::open(dir.path(), 2, bytes).unwrap();
        assert!(reopened.head() > ack.seg, "an open starts a new segment");
    }

    #[test]
    fn a_closed_spool_ends_its_head_with_a_closing_mark() {
        let dir = tempfile::tempdir().unwrap();
        let bob = name("bob");
        let mut spool = Spool::open(dir.path(), 0, 1 << 16).unwrap();
        spool.stored(&copy(1, &bob, b"one")).unwrap();
        spool.write().unwrap();
        spool.close().unwrap();
        assert!(spool.stored(&copy(2, &bob, b"two")).is_err(), "closed");
        drop(spool);
        let scanned = scan(dir.path()).unwrap();
        assert!(scanned.unclosed.is_none());
        assert!(matches!(
            scanned.segments[0].records.last(),
            Some(Scanned::Mark { closes: true, .. })
        ));
    }

    #[test]
    fn a_removed_segment_is_reused_and_its_old_records_do_not_read_back() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        let bob = name("bob");
        let mut spool = Spool::open(dir.path(), 0, 380).unwrap();
        let mut seq = 0;
        let mut send = |spool: &mut Spool| {
            seq += 1;
            let at = spool.stored(&copy(seq, &bob, &[seq as u8; 100])).unwrap();
            spool.write().unwrap();
            (seq, at)
        };
        let (mut last, first) = send(&mut spool);
        while spool.head() == first.seg {
            last = send(&mut spool).0;
        }
        let ino = fs::metadata(segment_path(dir.path(), first.seg))
            .unwrap()
            .ino();
        let removed: Vec<Seq> = (1..last).collect();
        spool.remove(first.seg);
        // The segment prepared before the removal comes first, then the reused file.
        let mut kept = vec![last];
        while spool.head() < first.seg + 4 {
            kept.push(send(&mut spool).0);
        }
        let reused = segments(dir.path())
            .unwrap()
            .into_iter()
            .any(|s| fs::metadata(segment_path(dir.path(), s)).unwrap().ino() == ino);
        assert!(
            reused,
            "the removed segment's file came back as a new segment"
        );
        assert_eq!(
            stored_seqs(&records(dir.path())),
            kept,
            "nothing of {removed:?} reads back, and its old records are not damage"
        );
    }
}
