//! Reading every stored row back, as the views do: `PRAGMA integrity_check` only says SQLite
//! can read its pages, not that mailslot can read what is in them. A store is called intact
//! only when every message (with its bounces, receipts, deliveries and attachments), every
//! open copy, memory, outbox entry, contact, pinned relay and waiting letter decodes.

use rusqlite::Connection;

use super::{Store, StoreError, deliveries, memories, messages};

/// How many rows of each kind were read back.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RowsChecked {
    /// Messages, sent and received, receipts included.
    pub messages: u64,
    /// Recipients' copies of sent mail.
    pub deliveries: u64,
    /// Memories.
    pub memories: u64,
    /// Outbox entries.
    pub outbox: u64,
    /// Contacts and pinned relays.
    pub pins: u64,
    /// Letters waiting for their senders' relays.
    pub parked: u64,
    /// The owner's messages (`mailslot tell`) whose owner signature verified.
    pub owner_verified: u64,
    /// Messages that carry an owner signature this home's confirmed owner key did not make
    /// (or that the store was opened without a key to check): shown as unverified claims.
    pub owner_unverified: u64,
}

/// Names the row that failed, so the owner can find it.
fn in_row(e: StoreError, row: String) -> StoreError {
    match e {
        StoreError::Corrupt { what, detail } => StoreError::Corrupt {
            what,
            detail: format!("{row}: {detail}"),
        },
        other => other,
    }
}

/// How many messages were read back, and how many of them are the owner's, verified or not.
fn each_message(
    conn: &Connection,
    check: Option<&messages::OwnerCheck>,
) -> Result<(u64, u64, u64), StoreError> {
    let mut stmt = conn.prepare(&format!(
        "SELECT {}, id FROM messages ORDER BY seq",
        messages::COLUMNS
    ))?;
    let mut rows = stmt.query([])?;
    let (mut n, mut verified, mut unverified) = (0, 0, 0);
    while let Some(row) = rows.next()? {
        let id: String = row.get(messages::COLUMN_COUNT)?;
        let stored = messages::decode(messages::from_row(row)?, check)
            .map_err(|e| in_row(e, format!("message {id}")))?;
        match stored.owner {
            Some(messages::OwnerVoice::Verified(_)) => verified += 1,
            Some(messages::OwnerVoice::Unverified) => unverified += 1,
            None => {}
        }
        n += 1;
    }
    Ok((n, verified, unverified))
}

impl Store {
    /// Reads every stored row back the way the views do; the first row that cannot be read is
    /// the error, named by its id.
    pub fn check_rows(&self) -> Result<RowsChecked, StoreError> {
        let outbox = self.outbox(usize::MAX)?.len() + self.outbox_failed_items(usize::MAX)?.len();
        let (messages, owner_verified, owner_unverified) =
            each_message(&self.conn, self.owner_check.as_ref())?;
        Ok(RowsChecked {
            messages,
            owner_verified,
            owner_unverified,
            deliveries: deliveries::check_rows(&self.conn)?,
            memories: memories::check_rows(&self.conn)?,
            outbox: outbox as u64,
            pins: (self.contacts()?.len() + self.pinned_relays()?.len()) as u64,
            parked: self.parked_due(None, usize::MAX)?.len() as u64,
        })
    }
}
