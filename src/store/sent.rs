//! Sent mail and where each message stands, as far as this store knows: waiting in the
//! outbox, taken by the relay, failed for good, or bounced (a copy expired undelivered).

use rusqlite::params;
use serde::Serialize;

use super::messages::{COLUMNS, StoredMessage, decode, from_row};
use super::{Store, StoreError};
use crate::protocol::MessageId;

/// Where a sent message stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SentState {
    /// In the outbox: the relay has not taken it yet (it is retried with backoff).
    Queued,
    /// The relay took it (stored durably for its recipients).
    Sent,
    /// Refused for good (an unknown recipient, consent); `retry` queues it again.
    Failed,
    /// The relay took it, and a recipient's copy expired before it was fetched.
    Bounced,
}

impl SentState {
    /// The snake_case name, as in JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Queued => "queued",
            Self::Sent => "sent",
            Self::Failed => "failed",
            Self::Bounced => "bounced",
        }
    }
}

impl std::str::FromStr for SentState {
    type Err = crate::protocol::ValidationError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "queued" => Ok(Self::Queued),
            "sent" => Ok(Self::Sent),
            "failed" => Ok(Self::Failed),
            "bounced" => Ok(Self::Bounced),
            other => Err(crate::protocol::ValidationError::new(
                "state",
                format!("{other:?} is not a state: use queued, sent, failed or bounced"),
            )),
        }
    }
}

/// A sent message with its state.
#[derive(Debug, Clone)]
pub struct SentItem {
    /// The message as stored (its bounced recipients among it).
    pub stored: StoredMessage,
    /// Where it stands.
    pub state: SentState,
    /// Sends tried while it was in the outbox.
    pub attempts: u32,
    /// The last failure, while it is queued or failed.
    pub last_error: Option<String>,
}

impl Store {
    /// Sent messages, newest first, at most `limit`; only those in `state` when given.
    pub fn sent(
        &self,
        state: Option<SentState>,
        limit: usize,
    ) -> Result<Vec<SentItem>, StoreError> {
        let mut stmt = self.conn.prepare_cached(&format!(
            "SELECT {COLUMNS}, o.failed, o.attempts, o.last_error FROM messages
             LEFT JOIN outbox o ON o.message_id = messages.id
             WHERE direction = 'out'
               AND (?1 IS NULL OR ?1 = CASE
                     WHEN o.failed = 1 THEN 'failed'
                     WHEN o.failed = 0 THEN 'queued'
                     WHEN EXISTS (SELECT 1 FROM bounces b WHERE b.message_id = messages.id) THEN 'bounced'
                     ELSE 'sent' END)
             ORDER BY seq DESC LIMIT ?2"
        ))?;
        let rows = stmt.query_map(params![state.map(SentState::as_str), limit as i64], |r| {
            Ok((
                from_row(r)?,
                r.get::<_, Option<bool>>(6)?,
                r.get::<_, Option<u32>>(7)?,
                r.get::<_, Option<String>>(8)?,
            ))
        })?;
        rows.map(|row| {
            let (raw, failed, attempts, last_error) = row?;
            let stored = decode(raw)?;
            let state = match failed {
                Some(true) => SentState::Failed,
                Some(false) => SentState::Queued,
                None if !stored.bounced.is_empty() => SentState::Bounced,
                None => SentState::Sent,
            };
            Ok(SentItem {
                stored,
                state,
                attempts: attempts.unwrap_or(0),
                last_error,
            })
        })
        .collect()
    }

    /// Queues failed messages again: those of `ids`, or every failed one when `ids` is
    /// `None`. Returns the ids queued again (a message that had not failed is left alone).
    pub fn retry_failed(
        &mut self,
        ids: Option<&[MessageId]>,
    ) -> Result<Vec<MessageId>, StoreError> {
        let tx = self.write_tx()?;
        let mut queued = Vec::new();
        {
            let mut stmt = tx.prepare_cached(
                "UPDATE outbox SET failed = 0, attempts = 0, last_error = NULL
                 WHERE failed = 1 AND (?1 IS NULL OR message_id = ?1) RETURNING message_id",
            )?;
            let targets: Vec<Option<String>> = match ids {
                Some(ids) => ids.iter().map(|id| Some(id.to_string())).collect(),
                None => vec![None],
            };
            for target in targets {
                let mut rows = stmt.query([target])?;
                while let Some(row) = rows.next()? {
                    let id: String = row.get(0)?;
                    queued.push(id.parse().map_err(|e| StoreError::Corrupt {
                        what: "outbox entry",
                        detail: format!("{e}"),
                    })?);
                }
            }
        }
        tx.commit()?;
        Ok(queued)
    }
}
