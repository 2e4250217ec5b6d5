//! Sent mail and where each message stands, as far as this store knows: waiting in the
//! outbox, taken by the relay, read or acknowledged by its recipients (their receipts),
//! failed for good, or bounced (a copy expired undelivered).

use jiff::Timestamp;
use rusqlite::{OptionalExtension, params};
use serde::Serialize;

use super::messages::{COLUMN_COUNT, COLUMNS, StoredMessage, decode, from_row};
use super::{Page, Store, StoreError};
use crate::protocol::{Address, MessageId, ReceiptKind, ValidationError};

/// Where a sent message stands (or one recipient's copy of it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SentState {
    /// In the outbox: the relay has not taken it yet (it is retried with backoff).
    Queued,
    /// The relay took it (stored durably for its recipients).
    Sent,
    /// The recipient's client took its copy from the relay (reported by the relay).
    Delivered,
    /// The recipient read it (a read receipt: only recipients whose owner turned them on).
    Read,
    /// The recipient acknowledged it.
    Acknowledged,
    /// Refused for good (an unknown recipient, consent); `retry` queues it again.
    Failed,
    /// The relay took it, and a recipient's copy expired before it was fetched.
    Bounced,
}

impl SentState {
    /// Every state, in the order `sent` documents them.
    pub const ALL: [SentState; 7] = [
        Self::Queued,
        Self::Sent,
        Self::Delivered,
        Self::Read,
        Self::Acknowledged,
        Self::Failed,
        Self::Bounced,
    ];

    /// The snake_case name, as in JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Queued => "queued",
            Self::Sent => "sent",
            Self::Delivered => "delivered",
            Self::Read => "read",
            Self::Acknowledged => "acknowledged",
            Self::Failed => "failed",
            Self::Bounced => "bounced",
        }
    }

    /// How far a copy got once the relay took it; a message stands where its least
    /// advanced copy does.
    fn progress(self) -> u8 {
        match self {
            Self::Sent => 0,
            Self::Delivered => 1,
            Self::Read => 2,
            Self::Acknowledged => 3,
            Self::Queued | Self::Failed | Self::Bounced => 0,
        }
    }
}

impl std::fmt::Display for SentState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for SentState {
    type Err = crate::protocol::ValidationError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|state| state.as_str() == s)
            .ok_or_else(|| {
                crate::protocol::ValidationError::new(
                    "state",
                    format!(
                        "{s:?} is not a state: use queued, sent, delivered, read, acknowledged, failed or bounced"
                    ),
                )
            })
    }
}

/// Where one recipient's copy stands.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RecipientState {
    /// The recipient, as addressed.
    pub to: Address,
    /// How far its copy got.
    pub state: SentState,
    /// When it got there, when a receipt or the relay says (delivered: the relay no longer
    /// held the copy at this time, so it was taken no later).
    pub at: Option<Timestamp>,
    /// Its acknowledgement's answer: the recipient's words, untrusted.
    pub answer: Option<String>,
}

/// Each recipient's state for a message the relay took: bounced, else acknowledged or read,
/// as its receipts say, else delivered when the relay said its copy was taken, else sent.
fn recipient_states(stored: &StoredMessage) -> Vec<RecipientState> {
    stored
        .copy_recipients()
        .iter()
        .map(|to| {
            if stored.bounced.contains(to) {
                return RecipientState {
                    to: to.clone(),
                    state: SentState::Bounced,
                    at: None,
                    answer: None,
                };
            }
            let delivered = stored
                .delivered
                .iter()
                .find(|(recipient, _)| recipient == to)
                .map(|(_, at)| *at);
            let mut best = RecipientState {
                to: to.clone(),
                state: if delivered.is_some() {
                    SentState::Delivered
                } else {
                    SentState::Sent
                },
                at: delivered,
                answer: None,
            };
            for r in stored.receipts.iter().filter(|r| r.recipient == *to) {
                let state = match r.kind {
                    ReceiptKind::Read => SentState::Read,
                    ReceiptKind::Acknowledged => SentState::Acknowledged,
                };
                if state.progress() > best.state.progress() {
                    best.state = state;
                    best.at = Some(r.at);
                    best.answer = r.answer.clone();
                }
            }
            best
        })
        .collect()
}

/// The number of recipients of a stored message, from its JSON.
const RECIPIENTS: &str = "(coalesce(json_array_length(messages.json, '$.to'), 0)
    + coalesce(json_array_length(messages.json, '$.cc'), 0)
    + coalesce(json_array_length(messages.json, '$.bcc'), 0))";

/// A sent message with its state.
#[derive(Debug, Clone)]
pub struct SentItem {
    /// The message as stored (its bounced recipients and receipts among it).
    pub stored: StoredMessage,
    /// Where it stands: the outbox's word while it is there; after, bounced when a copy
    /// bounced, else where its least advanced copy stands.
    pub state: SentState,
    /// Each recipient's copy, once the relay took the message.
    pub recipients: Vec<RecipientState>,
    /// Sends tried while it was in the outbox.
    pub attempts: u32,
    /// The last failure, while it is queued or failed.
    pub last_error: Option<String>,
}

/// Which sent messages a listing holds: ?1 only this state (the same rule as
/// `SentItem::state`, in SQL, so the filter comes before the limit), ?3 only those after
/// this `seq` (a page's start).
fn sent_listed() -> String {
    format!(
        "direction = 'out' AND is_receipt = 0
               AND (?1 IS NULL OR ?1 = CASE
                     WHEN o.failed = 1 THEN 'failed'
                     WHEN o.failed = 0 THEN 'queued'
                     WHEN EXISTS (SELECT 1 FROM bounces b WHERE b.message_id = messages.id) THEN 'bounced'
                     WHEN (SELECT count(*) FROM receipts r WHERE r.message_id = messages.id
                             AND r.kind = 'acknowledged') >= {RECIPIENTS} THEN 'acknowledged'
                     WHEN (SELECT count(DISTINCT r.recipient) FROM receipts r
                             WHERE r.message_id = messages.id) >= {RECIPIENTS} THEN 'read'
                     WHEN (SELECT count(*) FROM deliveries d WHERE d.message_id = messages.id
                             AND (d.delivered_at IS NOT NULL OR EXISTS (SELECT 1 FROM receipts r
                                   WHERE r.message_id = d.message_id AND r.recipient = d.recipient)))
                          >= {RECIPIENTS} THEN 'delivered'
                     ELSE 'sent' END) AND (?3 IS NULL OR seq < ?3)"
    )
}

impl Store {
    /// Sent messages (never receipts), newest first, at most `limit`; only those in `state`
    /// when given.
    pub fn sent(
        &self,
        state: Option<SentState>,
        limit: usize,
    ) -> Result<Vec<SentItem>, StoreError> {
        self.sent_rows(state, limit, None)
    }

    /// A page of [`Store::sent`]: the messages after `before` (the last message of the page
    /// before; the first page without it), and how many follow them.
    pub fn sent_page(
        &self,
        state: Option<SentState>,
        limit: usize,
        before: Option<&MessageId>,
    ) -> Result<Page<SentItem>, StoreError> {
        let after = before
            .map(|id| {
                self.conn
                    .query_row(
                        "SELECT seq FROM messages WHERE id = ?1 AND direction = 'out' AND is_receipt = 0",
                        [id.to_string()],
                        |r| r.get::<_, i64>(0),
                    )
                    .optional()?
                    .ok_or_else(|| {
                        StoreError::from(ValidationError::new(
                            "--before",
                            format!("{id} is not a sent message; give the last id a page of sent mail listed"),
                        ))
                    })
            })
            .transpose()?;
        let items = self.sent_rows(state, limit, after)?;
        let listed: i64 = self
            .conn
            .prepare_cached(&format!(
                "SELECT count(*) FROM messages LEFT JOIN outbox o ON o.message_id = messages.id
             WHERE {}",
                sent_listed()
            ))?
            .query_row(
                params![state.map(SentState::as_str), None::<i64>, after],
                |r| r.get(0),
            )?;
        Ok(Page {
            more: (listed as u64).saturating_sub(items.len() as u64),
            items,
        })
    }

    fn sent_rows(
        &self,
        state: Option<SentState>,
        limit: usize,
        after: Option<i64>,
    ) -> Result<Vec<SentItem>, StoreError> {
        let mut stmt = self.conn.prepare_cached(&format!(
            "SELECT {COLUMNS}, o.failed, o.attempts, o.last_error FROM messages
             LEFT JOIN outbox o ON o.message_id = messages.id
             WHERE {}
             ORDER BY seq DESC LIMIT ?2",
            sent_listed()
        ))?;
        let rows = stmt.query_map(
            params![state.map(SentState::as_str), limit as i64, after],
            |r| {
                Ok((
                    from_row(r)?,
                    r.get::<_, Option<bool>>(COLUMN_COUNT)?,
                    r.get::<_, Option<u32>>(COLUMN_COUNT + 1)?,
                    r.get::<_, Option<String>>(COLUMN_COUNT + 2)?,
                ))
            },
        )?;
        rows.map(|row| {
            let (raw, failed, attempts, last_error) = row?;
            let stored = decode(raw, self.owner_check.as_ref())?;
            let (state, recipients) = match failed {
                Some(true) => (SentState::Failed, Vec::new()),
                Some(false) => (SentState::Queued, Vec::new()),
                None => {
                    let recipients = recipient_states(&stored);
                    let state = if !stored.bounced.is_empty() {
                        SentState::Bounced
                    } else {
                        recipients
                            .iter()
                            .map(|r| r.state)
                            .min_by_key(|s| s.progress())
                            .unwrap_or(SentState::Sent)
                    };
                    (state, recipients)
                }
            };
            Ok(SentItem {
                stored,
                state,
                recipients,
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
