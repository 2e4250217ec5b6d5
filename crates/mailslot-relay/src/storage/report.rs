//! What the storage found wrong with itself: damaged spool records (found at every open, and by
//! `mailslot relay check`), where the last run stopped without closing the spool, and the
//! database's own check. Only routing fields are ever shown, never an envelope.

use serde::Serialize;

use crate::protocol::{AgentName, MessageId, Seq};

/// What a damaged spool record was, as far as its bytes still say.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RecordKind {
    /// A queued copy of a message.
    Copy,
    /// A recipient's acknowledgement of its copies up to a sequence number.
    Ack,
    /// Bookkeeping: the highest sequence number, and where a segment's records end.
    Mark,
    /// Too damaged to tell.
    Unknown,
}

/// What a damaged record costs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Loss {
    /// A queued copy is gone: its recipient never gets it.
    Copy,
    /// Nothing more: its recipient has acknowledged past it (acks are cumulative, so this is
    /// also what a copy lost at an earlier start, and reported then, becomes).
    Delivered,
    /// Nothing: an intact record of the same copy is kept (compaction moved it).
    Kept,
    /// Nothing: the copy was past its time to live.
    Expired,
    /// Copies the recipient had acknowledged up to it may be delivered again; clients drop
    /// the repeats by id.
    Redelivery,
    /// Nothing: bookkeeping only.
    Nothing,
    /// Unknown: the bytes may have held queued copies.
    Unknown,
}

/// A spool record that failed its checksum where a whole record must be. The fields are read
/// from the damaged bytes, so a damaged field may be wrong or missing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DamagedRecord {
    /// The segment's number (`relay.db-spool/NNNNNNNN.seg`).
    pub segment: u32,
    /// Where the record starts in its segment.
    pub offset: u64,
    /// Bytes the damage covers, up to the next whole record (or the segment's end).
    pub bytes: u64,
    /// What it was.
    pub kind: RecordKind,
    /// The copy's or the ack's sequence number.
    pub seq: Option<Seq>,
    /// The message's id.
    pub id: Option<MessageId>,
    /// Who sent the copy.
    pub sender: Option<AgentName>,
    /// Who the copy or the ack is for.
    pub recipient: Option<AgentName>,
    /// What is lost with it.
    pub loss: Loss,
}

impl std::fmt::Display for DamagedRecord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let what = match self.kind {
            RecordKind::Copy => "a queued copy",
            RecordKind::Ack => "an acknowledgement",
            RecordKind::Mark => "a mark",
            RecordKind::Unknown => "unreadable bytes",
        };
        write!(
            f,
            "segment {:08} at byte {} ({} bytes): {what}",
            self.segment, self.offset, self.bytes
        )?;
        if let Some(seq) = self.seq {
            write!(f, ", seq {seq}")?;
        }
        if let Some(id) = &self.id {
            write!(f, ", id {id}")?;
        }
        if let Some(sender) = &self.sender {
            write!(f, ", from {sender}")?;
        }
        if let Some(recipient) = &self.recipient {
            write!(f, ", for {recipient}")?;
        }
        let loss = match self.loss {
            Loss::Copy => "LOST: the recipient will never get it",
            Loss::Delivered => "no longer queued: its recipient acknowledged past it",
            Loss::Kept => "nothing lost: an intact record of it is kept",
            Loss::Expired => "nothing lost: it had expired",
            Loss::Redelivery => "acknowledged copies may be delivered again (clients drop repeats)",
            Loss::Nothing => "nothing lost",
            Loss::Unknown => "may have held queued copies, which are lost",
        };
        write!(f, "; {loss}")
    }
}

/// The newest segment's records ended with no closing mark: the relay stopped without closing
/// the spool (a crash or a kill), and whatever follows is what it had not finished writing.
/// Not damage: nothing there was known to be on disk.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Unclosed {
    /// The segment's number.
    pub segment: u32,
    /// Where its last whole record ends.
    pub end: u64,
}

/// The spool's state, as a scan found it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SpoolReport {
    /// Segments holding records.
    pub segments: usize,
    /// Copies waiting for their recipients (intact, unacknowledged, unexpired).
    pub copies_waiting: u64,
    /// Every damaged record, in spool order.
    pub damaged: Vec<DamagedRecord>,
    /// Where the last run stopped without closing the spool, if it did.
    pub unclosed: Option<Unclosed>,
}

impl SpoolReport {
    /// Queued copies known to be lost.
    pub fn lost_copies(&self) -> usize {
        self.count(Loss::Copy)
    }

    /// Damaged regions too unreadable to say what they held.
    pub fn unreadable(&self) -> usize {
        self.count(Loss::Unknown)
    }

    fn count(&self, loss: Loss) -> usize {
        self.damaged.iter().filter(|d| d.loss == loss).count()
    }

    /// One line: how many segments and copies, and what is damaged.
    pub fn summary(&self) -> String {
        let line = format!(
            "segments: {}, copies waiting: {}, damaged records: {}",
            self.segments,
            self.copies_waiting,
            self.damaged.len()
        );
        if self.damaged.is_empty() {
            return line;
        }
        format!(
            "{line} (queued copies lost: {}, unreadable regions that may have held more: {})",
            self.lost_copies(),
            self.unreadable()
        )
    }
}

/// The database's own check.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DatabaseReport {
    /// Its schema version (`PRAGMA user_version`).
    pub schema: usize,
    /// The schema this build writes; an older one is migrated at the next start.
    pub current_schema: usize,
    /// What `PRAGMA integrity_check` found wrong; empty when it said `ok`.
    pub problems: Vec<String>,
}

/// What `mailslot relay check` found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CheckReport {
    /// The database.
    pub database: DatabaseReport,
    /// The spool beside it.
    pub spool: SpoolReport,
}

impl CheckReport {
    /// Nothing is damaged and the schema is one this build can open.
    pub fn is_clean(&self) -> bool {
        self.database.problems.is_empty()
            && self.database.schema <= self.database.current_schema
            && self.spool.damaged.is_empty()
    }
}
