//! Receipts: what the recipients of this agent's sent mail said about it (read,
//! acknowledged), and what this agent said about mail it received. One row per (message,
//! recipient, kind), so a receipt delivered twice is recorded once. Receipts this agent sends
//! are queued in the outbox like mail (marked `is_receipt`, never listed as mail).

use jiff::Timestamp;
use rusqlite::{Connection, OptionalExtension, Row, Transaction, params};

use super::messages::ReceiptRecord;
use super::outbox::queue_in;
use super::time::{from_ms, to_ms};
use super::{Store, StoreError};
use crate::protocol::{Address, Message, MessageId, Receipt, ReceiptKind, ThreadId, now_millis};

/// The meta key of the owner's read-receipt setting (absent: off).
const READ_RECEIPTS: &str = "read_receipts";

/// What became of a receipt that arrived.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReceiptOutcome {
    /// Recorded now.
    Recorded(ReceiptRecord),
    /// Already recorded (a redelivery or a second receipt of the same kind); nothing changed.
    Duplicate,
    /// This agent sent no message with that id.
    NotSent,
    /// The receipt's sender is not a recipient of that message.
    NotRecipient,
}

/// Whether the owner turned read receipts on.
pub(super) fn read_receipts_on(conn: &Connection) -> Result<bool, StoreError> {
    Ok(conn
        .query_row(
            "SELECT value FROM meta WHERE key = ?1",
            [READ_RECEIPTS],
            |r| r.get::<_, String>(0),
        )
        .optional()?
        .is_some_and(|v| v == "on"))
}

/// The message this agent sent with id `of`, if it sent one (receipts excluded).
/// Who received `sent`'s copies: its recipients, or for a group send the members that got
/// one (a receipt from a member answers the group's message).
fn recipients_of(conn: &Connection, sent: &Message) -> Result<Vec<Address>, StoreError> {
    let copies: Vec<String> = conn
        .prepare_cached("SELECT recipient FROM deliveries WHERE message_id = ?1")?
        .query_map([sent.id.to_string()], |r| r.get(0))?
        .collect::<Result<_, _>>()?;
    let copies = copies
        .iter()
        .map(|a| {
            Address::parse(a).map_err(|e| StoreError::Corrupt {
                what: "delivery",
                detail: e.to_string(),
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(match sent.to.as_slice() {
        [group]
            if sent.cc.is_empty()
                && sent.bcc.is_empty()
                && super::messages::is_group_send(group, &copies) =>
        {
            copies
        }
        _ => sent.recipients().cloned().collect(),
    })
}

fn sent_message(conn: &Connection, of: &MessageId) -> Result<Option<Message>, StoreError> {
    let json: Option<String> = conn
        .query_row(
            "SELECT json FROM messages WHERE id = ?1 AND direction = 'out' AND is_receipt = 0",
            [of.to_string()],
            |r| r.get(0),
        )
        .optional()?;
    json.map(|json| {
        serde_json::from_str(&json).map_err(|e| StoreError::Corrupt {
            what: "message",
            detail: e.to_string(),
        })
    })
    .transpose()
}

/// Records that `me` gives `receipt` about a received message from `to`, and queues the
/// receipt to `to`, inside the caller's transaction; the queued receipt's id, or `None` when
/// `me` already gave one of that kind (nothing is queued again).
fn queue_receipt_in(
    tx: &Transaction<'_>,
    me: &Address,
    to: Address,
    thread: ThreadId,
    receipt: Receipt,
) -> Result<Option<MessageId>, StoreError> {
    let message = Message::receipt(me.clone(), to, thread, receipt.clone());
    let new = tx.execute(
        "INSERT INTO receipts (message_id, recipient, kind, at, answer)
         SELECT id, ?2, ?3, ?4, ?5 FROM messages WHERE id = ?1 AND direction = 'in'
         ON CONFLICT DO NOTHING",
        params![
            receipt.of.to_string(),
            me.to_string(),
            receipt.kind.as_str(),
            to_ms(message.sent_at),
            receipt.answer
        ],
    )?;
    if new == 0 {
        return Ok(None);
    }
    queue_in(tx, &message)?;
    Ok(Some(message.id))
}

/// Queues a read receipt for a message just marked read (a received one only).
pub(super) fn queue_read_receipt(
    tx: &Transaction<'_>,
    me: &Address,
    (id, direction, sender, thread): ReadRow,
) -> Result<(), StoreError> {
    if direction != "in" {
        return Ok(());
    }
    let corrupt = |detail: String| StoreError::Corrupt {
        what: "message",
        detail,
    };
    let receipt = Receipt {
        of: MessageId::parse(&id).map_err(|e| corrupt(e.to_string()))?,
        kind: ReceiptKind::Read,
        answer: None,
    };
    let to = Address::parse(&sender).map_err(|e| corrupt(e.to_string()))?;
    let thread = ThreadId::parse(&thread).map_err(|e| corrupt(e.to_string()))?;
    queue_receipt_in(tx, me, to, thread, receipt)?;
    Ok(())
}

/// A message marked read just now: id, direction, sender, thread.
pub(super) type ReadRow = (String, String, String, String);

fn read_row(r: &Row<'_>) -> rusqlite::Result<ReadRow> {
    Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
}

/// Queues the read receipts of `newly` (when `receipts` is on) and commits; how many were
/// marked read.
fn commit_read(
    tx: Transaction<'_>,
    me: &Address,
    receipts: bool,
    newly: Vec<ReadRow>,
) -> Result<usize, StoreError> {
    let changed = newly.len();
    if receipts {
        for row in newly {
            queue_read_receipt(&tx, me, row)?;
        }
    }
    tx.commit()?;
    Ok(changed)
}

impl Store {
    /// Marks messages read as `me`; returns how many were unread before. When the owner
    /// turned read receipts on, each received message read now queues a read receipt to its
    /// sender, in the same transaction.
    pub fn mark_read(&mut self, me: &Address, ids: &[MessageId]) -> Result<usize, StoreError> {
        let tx = self.write_tx()?;
        let receipts = read_receipts_on(&tx)?;
        let now = to_ms(now_millis());
        let mut newly = Vec::new();
        {
            let mut stmt = tx.prepare_cached(
                "UPDATE messages SET read_at = ?2 WHERE id = ?1 AND read_at IS NULL
                 RETURNING id, direction, sender, thread_id",
            )?;
            for id in ids {
                if let Some(row) = stmt
                    .query_row(params![id.to_string(), now], read_row)
                    .optional()?
                {
                    newly.push(row);
                }
            }
        }
        commit_read(tx, me, receipts, newly)
    }

    /// Marks every received message read as `me` (read receipts as in [`Store::mark_read`]);
    /// returns how many were unread.
    pub fn mark_all_read(&mut self, me: &Address) -> Result<usize, StoreError> {
        let tx = self.write_tx()?;
        let receipts = read_receipts_on(&tx)?;
        let newly = {
            let mut stmt = tx.prepare_cached(
                "UPDATE messages SET read_at = ?1 WHERE direction = 'in' AND read_at IS NULL
                 RETURNING id, direction, sender, thread_id",
            )?;
            stmt.query_map([to_ms(now_millis())], read_row)?
                .collect::<Result<Vec<_>, _>>()?
        };
        commit_read(tx, me, receipts, newly)
    }

    /// Whether read receipts are on (the owner's setting; off unless turned on).
    pub fn read_receipts(&self) -> Result<bool, StoreError> {
        read_receipts_on(&self.conn)
    }

    /// Turns read receipts on or off. Off removes the setting: nothing is ever sent.
    pub fn set_read_receipts(&mut self, on: bool) -> Result<(), StoreError> {
        if on {
            self.conn.execute(
                "INSERT INTO meta (key, value) VALUES (?1, 'on') ON CONFLICT (key) DO UPDATE SET value = 'on'",
                [READ_RECEIPTS],
            )?;
        } else {
            self.conn
                .execute("DELETE FROM meta WHERE key = ?1", [READ_RECEIPTS])?;
        }
        Ok(())
    }

    /// `me` acknowledges the received message `of`, with an optional short answer: records it
    /// and queues the receipt to its sender in one transaction. Returns the receipt message
    /// queued now, or the acknowledgement given before (nothing is queued again).
    pub fn acknowledge(
        &mut self,
        me: &Address,
        of: &MessageId,
        answer: Option<String>,
    ) -> Result<Acknowledged, StoreError> {
        let tx = self.write_tx()?;
        let found: Option<(String, String, String)> = tx
            .query_row(
                "SELECT direction, sender, thread_id FROM messages WHERE id = ?1 AND is_receipt = 0",
                [of.to_string()],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )
            .optional()?;
        let Some((direction, sender, thread)) = found else {
            return Err(StoreError::NoSuchMessage {
                part: of.to_string(),
            });
        };
        if direction != "in" {
            return Ok(Acknowledged::OwnMessage);
        }
        let corrupt = |detail: String| StoreError::Corrupt {
            what: "message",
            detail,
        };
        let to = Address::parse(&sender).map_err(|e| corrupt(e.to_string()))?;
        let thread = ThreadId::parse(&thread).map_err(|e| corrupt(e.to_string()))?;
        let receipt = Receipt {
            of: *of,
            kind: ReceiptKind::Acknowledged,
            answer,
        };
        receipt.validate()?;
        let Some(id) = queue_receipt_in(&tx, me, to, thread, receipt)? else {
            let at: i64 = tx.query_row(
                "SELECT at FROM receipts WHERE message_id = ?1 AND recipient = ?2 AND kind = 'acknowledged'",
                params![of.to_string(), me.to_string()],
                |r| r.get(0),
            )?;
            return Ok(Acknowledged::Before(from_ms(at)?));
        };
        tx.commit()?;
        Ok(Acknowledged::Now(id))
    }

    /// The recipients of a message this agent sent, as addressed; `None` when it sent no
    /// message with that id. A receipt's giver is matched against these before
    /// [`Store::record_receipt`]: only the caller can tell which spellings are this relay's.
    pub fn sent_recipients(&self, of: &MessageId) -> Result<Option<Vec<Address>>, StoreError> {
        let Some(sent) = sent_message(&self.conn, of)? else {
            return Ok(None);
        };
        Ok(Some(recipients_of(&self.conn, &sent)?))
    }

    /// Records a receipt that the recipient `recipient` of this agent's sent message gave, at
    /// `at` (the receipt's sent time). `recipient` is the exact address the message went to
    /// (see [`Store::sent_recipients`]): a namesake on another relay is a different recipient.
    /// Each (recipient, kind) counts once.
    pub fn record_receipt(
        &mut self,
        recipient: &Address,
        receipt: &Receipt,
        at: Timestamp,
    ) -> Result<ReceiptOutcome, StoreError> {
        let tx = self.write_tx()?;
        // Read again inside the write: what the caller matched against may be gone by now.
        let Some(sent) = sent_message(&tx, &receipt.of)? else {
            return Ok(ReceiptOutcome::NotSent);
        };
        if !recipients_of(&tx, &sent)?.contains(recipient) {
            return Ok(ReceiptOutcome::NotRecipient);
        }
        let new = tx.execute(
            "INSERT INTO receipts (message_id, recipient, kind, at, answer) VALUES (?1, ?2, ?3, ?4, ?5)
             ON CONFLICT DO NOTHING",
            params![
                receipt.of.to_string(),
                recipient.to_string(),
                receipt.kind.as_str(),
                to_ms(at),
                receipt.answer
            ],
        )?;
        if new == 1 {
            super::deliveries::close_in(&tx, &receipt.of, recipient)?;
        }
        tx.commit()?;
        Ok(if new == 1 {
            ReceiptOutcome::Recorded(ReceiptRecord {
                recipient: recipient.clone(),
                kind: receipt.kind,
                at,
                answer: receipt.answer.clone(),
            })
        } else {
            ReceiptOutcome::Duplicate
        })
    }
}

/// What `acknowledge` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Acknowledged {
    /// The receipt is queued now; its message id.
    Now(MessageId),
    /// Acknowledged before, at this time; nothing was queued again.
    Before(Timestamp),
    /// The message is one this agent sent: there is nobody to acknowledge it to.
    OwnMessage,
}
