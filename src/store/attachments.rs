//! Attachments, kept in a table of their own (migration 8): a message's row holds its JSON
//! without them, so listings (inbox, search, thread) read only the attachments' names, types,
//! sizes and digests, and reading one attachment reads only its bytes. Messages stored before
//! migration 8 keep theirs inside their JSON and are read the same way.

use rusqlite::{OptionalExtension, Transaction, params};
use serde::{Deserialize, Serialize};

use super::{Store, StoreError};
use crate::protocol::{Attachment, Message, MessageId};

/// What a listing shows of an attachment: everything but its bytes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttachmentInfo {
    /// The sender's file name (its words: show it fenced).
    pub name: String,
    /// The sender's media type.
    pub media_type: String,
    /// Bytes.
    pub size: u32,
    /// Lowercase hex SHA-256 of the bytes, checked when the message was opened.
    pub sha256: String,
}

impl AttachmentInfo {
    /// The listing view of `a`.
    pub fn of(a: &Attachment) -> Self {
        Self {
            name: a.name.clone(),
            media_type: a.media_type.clone(),
            size: a.size,
            sha256: a.sha256.clone(),
        }
    }
}

/// Decodes the attachments column of a message row (`messages::COLUMNS`).
pub(super) fn infos(json: Option<&str>) -> Result<Vec<AttachmentInfo>, StoreError> {
    json.map_or(Ok(Vec::new()), |j| {
        serde_json::from_str(j).map_err(|e| StoreError::Corrupt {
            what: "attachment",
            detail: e.to_string(),
        })
    })
}

/// `m` as its row stores it: without its attachments (they go to their own table).
pub(super) fn bare_json(m: &Message) -> String {
    if m.attachments.is_empty() {
        return serde_json::to_string(m).expect("a message always serializes");
    }
    let mut bare = m.clone();
    bare.attachments.clear();
    serde_json::to_string(&bare).expect("a message always serializes")
}

/// Stores `m`'s attachments, inside the caller's transaction.
pub(super) fn insert(tx: &Transaction<'_>, m: &Message) -> Result<(), StoreError> {
    let mut stmt = tx.prepare_cached(
        "INSERT INTO attachments (message_id, idx, name, media_type, size, sha256, bytes)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7) ON CONFLICT DO NOTHING",
    )?;
    for (i, a) in m.attachments.iter().enumerate() {
        stmt.execute(params![
            m.id.to_string(),
            i as i64,
            a.name,
            a.media_type,
            a.size,
            a.sha256,
            a.bytes
        ])?;
    }
    Ok(())
}

/// An attachment from `SELECT name, media_type, size, sha256, bytes`.
fn attachment_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<Attachment> {
    Ok(Attachment {
        name: r.get(0)?,
        media_type: r.get(1)?,
        size: r.get(2)?,
        sha256: r.get(3)?,
        bytes: r.get(4)?,
    })
}

/// Every attachment of message `id`, bytes and all, in order (for sending it).
pub(super) fn all_of(
    conn: &rusqlite::Connection,
    id: &MessageId,
) -> Result<Vec<Attachment>, StoreError> {
    let mut stmt = conn.prepare_cached(
        "SELECT name, media_type, size, sha256, bytes FROM attachments WHERE message_id = ?1 ORDER BY idx",
    )?;
    let rows = stmt.query_map([id.to_string()], attachment_row)?;
    Ok(rows.collect::<Result<_, _>>()?)
}

impl Store {
    /// Attachment `index` (from 0) of message `id`, bytes and all; `None` when the message
    /// or the attachment does not exist.
    pub fn attachment(
        &self,
        id: &MessageId,
        index: usize,
    ) -> Result<Option<Attachment>, StoreError> {
        let found = self
            .conn
            .query_row(
                "SELECT name, media_type, size, sha256, bytes FROM attachments WHERE message_id = ?1 AND idx = ?2",
                params![id.to_string(), index as i64],
                attachment_row,
            )
            .optional()?;
        if found.is_some() {
            return Ok(found);
        }
        // A message stored before migration 8 carries its attachments in its JSON.
        let json: Option<String> = self
            .conn
            .query_row(
                "SELECT json FROM messages WHERE id = ?1",
                [id.to_string()],
                |r| r.get(0),
            )
            .optional()?;
        let Some(json) = json else {
            return Ok(None);
        };
        let mut m: Message = serde_json::from_str(&json).map_err(|e| StoreError::Corrupt {
            what: "message",
            detail: e.to_string(),
        })?;
        Ok((index < m.attachments.len()).then(|| m.attachments.swap_remove(index)))
    }
}
