//! Reading a recipient's waiting copies back from the spool: their locations copied out of
//! the index under its lock, then the records read without it.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use super::index::{QueueIndex, lock};
use super::spool::{self, Files};
use crate::protocol::{AgentName, Seq};
use crate::storage::{Queued, StorageError};

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
