//! The outbox: sealed envelopes waiting for a relay to accept them.

use rusqlite::params;

use super::messages::{Direction, Trust, insert_batch};
use super::time::to_ms;
use super::{Store, StoreError};
use crate::protocol::{Message, MessageId, SealedEnvelope, now_millis};

/// One envelope waiting to go out.
#[derive(Debug, Clone, PartialEq)]
pub struct OutboxItem {
    /// The outbox row, for [`Store::outbox_done`] and [`Store::outbox_failed`].
    pub seq: i64,
    /// The message it carries.
    pub message_id: MessageId,
    /// The envelope to send.
    pub envelope: SealedEnvelope,
    /// How many sends were tried.
    pub attempts: u32,
    /// The last failure, if any.
    pub last_error: Option<String>,
}

impl Store {
    /// Stores a sent message and queues its envelopes, in one transaction: either the message
    /// is in the sent folder and queued, or neither.
    pub fn queue_outgoing(
        &mut self,
        message: &Message,
        envelopes: &[SealedEnvelope],
    ) -> Result<(), StoreError> {
        let tx = self.write_tx()?;
        let now = to_ms(now_millis());
        {
            let mut stmt = tx.prepare_cached(
                "INSERT INTO outbox (message_id, copy, envelope, queued_at) VALUES (?1, ?2, ?3, ?4)
                 ON CONFLICT (message_id, copy) DO NOTHING",
            )?;
            for (copy, env) in envelopes.iter().enumerate() {
                stmt.execute(params![
                    message.id.to_string(),
                    copy as i64,
                    env.to_bytes(),
                    now
                ])?;
            }
        }
        insert_batch(&tx, &[(message, Direction::Out, Trust::Own)])?;
        tx.commit()?;
        Ok(())
    }

    /// The oldest waiting envelopes, at most `limit`.
    pub fn outbox(&self, limit: usize) -> Result<Vec<OutboxItem>, StoreError> {
        let mut stmt = self
            .conn
            .prepare_cached("SELECT seq, message_id, envelope, attempts, last_error FROM outbox ORDER BY seq LIMIT ?1")?;
        let rows = stmt.query_map([limit as i64], |r| {
            Ok((
                r.get::<_, i64>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, Vec<u8>>(2)?,
                r.get::<_, u32>(3)?,
                r.get(4)?,
            ))
        })?;
        rows.map(|row| {
            let (seq, id, env, attempts, last_error) = row?;
            let corrupt = |detail: String| StoreError::Corrupt {
                what: "outbox entry",
                detail,
            };
            Ok(OutboxItem {
                seq,
                message_id: MessageId::parse(&id).map_err(|e| corrupt(e.to_string()))?,
                envelope: serde_json::from_slice(&env).map_err(|e| corrupt(e.to_string()))?,
                attempts,
                last_error,
            })
        })
        .collect()
    }

    /// Removes an envelope the relay accepted.
    pub fn outbox_done(&mut self, seq: i64) -> Result<(), StoreError> {
        self.conn
            .execute("DELETE FROM outbox WHERE seq = ?1", [seq])?;
        Ok(())
    }

    /// Records a failed send attempt; the envelope stays queued.
    pub fn outbox_failed(&mut self, seq: i64, error: &str) -> Result<(), StoreError> {
        self.conn.execute(
            "UPDATE outbox SET attempts = attempts + 1, last_error = ?2 WHERE seq = ?1",
            params![seq, error],
        )?;
        Ok(())
    }

    /// How many envelopes wait.
    pub fn outbox_len(&self) -> Result<u64, StoreError> {
        Ok(self
            .conn
            .query_row("SELECT count(*) FROM outbox", [], |r| r.get::<_, i64>(0))?
            as u64)
    }
}
