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

fn each_message(conn: &Connection) -> Result<u64, StoreError> {
    let mut stmt = conn.prepare(&format!(
        "SELECT {}, id FROM messages ORDER BY seq",
        messages::COLUMNS
    ))?;
    let mut rows = stmt.query([])?;
    let mut n = 0;
    while let Some(row) = rows.next()? {
        let id: String = row.get(messages::COLUMN_COUNT)?;
        messages::decode(messages::from_row(row)?)
            .map_err(|e| in_row(e, format!("message {id}")))?;
        n += 1;
    }
    Ok(n)
}

impl Store {
    /// Reads every stored row back the way the views do; the first row that cannot be read is
    /// the error, named by its id.
    pub fn check_rows(&self) -> Result<RowsChecked, StoreError> {
        let outbox = self.outbox(usize::MAX)?.len() + self.outbox_failed_items(usize::MAX)?.len();
        Ok(RowsChecked {
            messages: each_message(&self.conn)?,
            deliveries: deliveries::check_rows(&self.conn)?,
            memories: memories::check_rows(&self.conn)?,
            outbox: outbox as u64,
            pins: (self.contacts()?.len() + self.pinned_relays()?.len()) as u64,
            parked: self.parked_due(None, usize::MAX)?.len() as u64,
        })
    }
}
