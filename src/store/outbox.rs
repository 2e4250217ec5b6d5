//! The outbox: sent messages the relay has not accepted yet. They are stored unsealed (the
//! store holds plaintext anyway) and sealed at sending time, with the keys known then.

use rusqlite::{OptionalExtension, Transaction, params};

use jiff::Timestamp;

use super::attachments;
use super::deliveries;
use super::messages::{Direction, Trust, insert_batch};
use super::time::to_ms;
use super::{Store, StoreError};
use crate::protocol::{Address, Bounce, Message, MessageId, now_millis};

/// A message waiting to go out, or one that failed for good.
#[derive(Debug, Clone, PartialEq)]
pub struct OutboxItem {
    /// The message, as sent (with its full BCC list).
    pub message: Message,
    /// How many sends were tried.
    pub attempts: u32,
    /// The last failure, if any.
    pub last_error: Option<String>,
    /// Whether it failed for good (unknown recipient, refused): no retries.
    pub failed: bool,
}

fn decode(
    json: String,
    attempts: u32,
    last_error: Option<String>,
    failed: bool,
) -> Result<OutboxItem, StoreError> {
    let message = serde_json::from_str(&json).map_err(|e| StoreError::Corrupt {
        what: "outbox entry",
        detail: e.to_string(),
    })?;
    Ok(OutboxItem {
        message,
        attempts,
        last_error,
        failed,
    })
}

/// Stores `message` as sent and queues it, inside the caller's transaction.
pub(super) fn queue_in(tx: &Transaction<'_>, message: &Message) -> Result<(), StoreError> {
    insert_batch(tx, &[(message, Direction::Out, Trust::Own)])?;
    tx.execute(
        "INSERT INTO outbox (message_id, queued_at) VALUES (?1, ?2) ON CONFLICT (message_id) DO NOTHING",
        params![message.id.to_string(), to_ms(now_millis())],
    )?;
    Ok(())
}

impl Store {
    /// Stores a message in the sent folder and queues it, in one transaction. Queueing the
    /// same id again changes nothing.
    pub fn queue_outgoing(&mut self, message: &Message) -> Result<(), StoreError> {
        let tx = self.write_tx()?;
        queue_in(&tx, message)?;
        tx.commit()?;
        Ok(())
    }

    /// The oldest messages still to send (failed ones excluded), at most `limit`.
    pub fn outbox(&self, limit: usize) -> Result<Vec<OutboxItem>, StoreError> {
        self.outbox_where("o.failed = 0", limit)
    }

    /// Messages that failed for good, oldest first.
    pub fn outbox_failed_items(&self, limit: usize) -> Result<Vec<OutboxItem>, StoreError> {
        self.outbox_where("o.failed = 1", limit)
    }

    fn outbox_where(&self, filter: &str, limit: usize) -> Result<Vec<OutboxItem>, StoreError> {
        let mut stmt = self.conn.prepare_cached(&format!(
            "SELECT m.json, o.attempts, o.last_error, o.failed FROM outbox o JOIN messages m ON m.id = o.message_id
             WHERE {filter} ORDER BY o.queued_at, m.seq LIMIT ?1"
        ))?;
        let rows = stmt.query_map([limit as i64], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
        })?;
        rows.map(|row| {
            let (json, attempts, last_error, failed) = row?;
            let mut item = decode(json, attempts, last_error, failed)?;
            // The row holds the message without its attachments (store/attachments.rs).
            if item.message.attachments.is_empty() {
                item.message.attachments = attachments::all_of(&self.conn, &item.message.id)?;
            }
            Ok(item)
        })
        .collect()
    }

    /// Removes a message the relay `relay` (its id) accepted from the outbox, and records
    /// each recipient's copy as open, to be asked about at that relay (see `deliveries`): for
    /// a group send, each member's that got one (`members`), not the group's.
    pub fn outbox_done(
        &mut self,
        id: &MessageId,
        relay: &str,
        members: Option<&[Address]>,
    ) -> Result<(), StoreError> {
        let tx = self.write_tx()?;
        let json: Option<String> = tx
            .query_row(
                "DELETE FROM outbox WHERE message_id = ?1
                 RETURNING (SELECT json FROM messages WHERE messages.id = outbox.message_id)",
                [id.to_string()],
                |r| r.get(0),
            )
            .optional()?;
        if let Some(json) = json {
            let message: Message =
                serde_json::from_str(&json).map_err(|e| StoreError::Corrupt {
                    what: "message",
                    detail: e.to_string(),
                })?;
            deliveries::open_in(&tx, (&message, members), relay, Timestamp::now())?;
        }
        tx.commit()?;
        Ok(())
    }

    /// Records a failed attempt; `permanent` stops retries (the owner sees it in `status`).
    pub fn outbox_failed(
        &mut self,
        id: &MessageId,
        error: &str,
        permanent: bool,
    ) -> Result<(), StoreError> {
        self.conn.execute(
            "UPDATE outbox SET attempts = attempts + 1, last_error = ?2, failed = ?3 WHERE message_id = ?1",
            params![id.to_string(), error, permanent],
        )?;
        Ok(())
    }

    /// Where one message stands in the outbox: `None` once the relay accepted it (or if it
    /// was never queued), else whether it failed for good and the last error.
    pub fn outbox_entry(
        &self,
        id: &MessageId,
    ) -> Result<Option<(bool, Option<String>)>, StoreError> {
        Ok(self
            .conn
            .query_row(
                "SELECT failed, last_error FROM outbox WHERE message_id = ?1",
                [id.to_string()],
                |r| Ok((r.get::<_, bool>(0)?, r.get::<_, Option<String>>(1)?)),
            )
            .optional()?)
    }

    /// Records bounces the relay reported: a copy of a message this agent sent expired before
    /// its recipient took it. Returns those recorded now; one already recorded, or about a
    /// message this agent did not send, changes nothing.
    pub fn record_bounces(&mut self, bounces: &[Bounce]) -> Result<Vec<Bounce>, StoreError> {
        let tx = self.write_tx()?;
        let mut recorded = Vec::new();
        {
            let mut insert = tx.prepare_cached(
                "INSERT INTO bounces (message_id, recipient, expired_at)
                 SELECT id, ?2, ?3 FROM messages WHERE id = ?1 AND direction = 'out'
                 ON CONFLICT DO NOTHING",
            )?;
            for b in bounces {
                let at = to_ms(b.expired_at);
                if insert.execute(params![b.id.to_string(), b.to.to_string(), at])? == 1 {
                    deliveries::close_in(&tx, &b.id, &b.to)?;
                    recorded.push(b.clone());
                }
            }
        }
        tx.commit()?;
        Ok(recorded)
    }

    /// How many messages wait to be sent (failed ones excluded).
    pub fn outbox_len(&self) -> Result<u64, StoreError> {
        Ok(self
            .conn
            .query_row("SELECT count(*) FROM outbox WHERE failed = 0", [], |r| {
                r.get::<_, i64>(0)
            })? as u64)
    }
}
