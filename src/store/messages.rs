//! Messages in and out, their threads, the receipts recorded against them, and full-text search.

use std::sync::Arc;

use jiff::Timestamp;
use rusqlite::{OptionalExtension, Row, Transaction, params};
use serde::{Deserialize, Serialize};

use super::attachments::{self, AttachmentInfo};
use super::deliveries::decode_delivered;
use super::search::{FtsIndex, fts_terms, ranked};
use super::time::{from_ms, to_ms};
use super::{Contact, Page, Store, StoreError};
use crate::protocol::{
    Address, Fingerprint, Importance, Message, MessageId, ReceiptKind, ThreadId, ValidationError,
    now_millis,
};

/// Whether this agent received or sent a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Direction {
    /// Received from another agent.
    In,
    /// Sent by this agent.
    Out,
}

/// How far a message's sender is vouched for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Trust {
    /// This agent wrote it.
    Own,
    /// Signed by the sender's pinned key.
    Verified,
    /// Signed by a key that differs from the one pinned for the sender: do not trust it.
    KeyChanged,
    /// Not verified.
    Unverified,
    /// Written by the agent's owner and signed by this home's confirmed owner key, checked
    /// as it was read (never stored: the row says `unverified`, and carries the signature).
    Owner,
}

/// Whether a message claims to be the owner's own words (`mailslot tell`), and whether the
/// claim holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OwnerVoice {
    /// Signed by this home's confirmed owner key, whose fingerprint this is.
    Verified(Fingerprint),
    /// It carries an owner signature, but not one by this home's confirmed owner key over
    /// exactly what is shown: never the owner's words.
    Unverified,
}

/// The agent layer's check of an owner signature: the fingerprint of the home's confirmed
/// owner key when `signature` is its over `message`, else `None`. The store holds it and
/// asks it about each owner message it reads; it never verifies anything itself.
pub type OwnerCheck = Arc<dyn Fn(&Message, &[u8]) -> Option<Fingerprint> + Send + Sync>;

impl Direction {
    fn as_str(self) -> &'static str {
        match self {
            Direction::In => "in",
            Direction::Out => "out",
        }
    }
}

impl Trust {
    /// Its name in JSON, tool results and doorbell meta.
    pub fn as_str(self) -> &'static str {
        match self {
            Trust::Own => "own",
            Trust::Verified => "verified",
            Trust::KeyChanged => "key_changed",
            Trust::Unverified => "unverified",
            Trust::Owner => "owner",
        }
    }

    fn parse(s: &str) -> Result<Self, StoreError> {
        Ok(match s {
            "own" => Trust::Own,
            "verified" => Trust::Verified,
            "key_changed" => Trust::KeyChanged,
            "unverified" => Trust::Unverified,
            other => {
                return Err(StoreError::Corrupt {
                    what: "message",
                    detail: format!("unknown trust {other:?}"),
                });
            }
        })
    }
}

/// A message as the store holds it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StoredMessage {
    /// The message itself.
    pub message: Message,
    /// Received or sent.
    pub direction: Direction,
    /// How far the sender is vouched for.
    pub trust: Trust,
    /// When it reached this store.
    pub stored_at: Timestamp,
    /// When it was read, if it was.
    pub read_at: Option<Timestamp>,
    /// Recipients whose copy of this sent message expired on the relay undelivered.
    pub bounced: Vec<Address>,
    /// Receipts, oldest first: for sent mail, what its recipients said (read,
    /// acknowledged); for received mail, what this agent said.
    pub receipts: Vec<ReceiptRecord>,
    /// Recipients of this sent message whose copy the relay said they took, and when it
    /// said so (they took it no later).
    pub delivered: Vec<(Address, Timestamp)>,
    /// The recipient of each copy of this sent message the relay took: for a group send, the
    /// group's members that got one (the letter names only the group).
    pub copies: Vec<Address>,
    /// The message's attachments without their bytes (`message.attachments` is empty:
    /// read one with [`Store::attachment`]).
    pub attachments: Vec<AttachmentInfo>,
    /// Set when the message is the owner's (written by `mailslot tell` or the dashboard), as
    /// checked when it was read; `None` for every other message.
    pub owner: Option<OwnerVoice>,
}

/// Which received messages to list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InboxQuery {
    /// Only unread ones.
    pub unread_only: bool,
    /// Only from this sender.
    pub from: Option<Address>,
    /// Only in this thread.
    pub thread: Option<ThreadId>,
    /// Only this importance or higher ("high" lists high and urgent mail).
    pub importance: Option<Importance>,
    /// At most this many.
    pub limit: usize,
}

impl Default for InboxQuery {
    fn default() -> Self {
        Self {
            unread_only: true,
            from: None,
            thread: None,
            importance: None,
            limit: 50,
        }
    }
}

/// What the unread-mail notice shows: facts mailslot verified, never a sender's words.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct UnreadSummary {
    /// Unread received messages.
    pub count: u32,
    /// The newest unread message's sender.
    pub newest_from: Option<Address>,
    /// Whether the newest unread message is the owner's, its signature verified.
    pub newest_from_owner: bool,
}

/// The watcher's read of mail received after a position, in order. `NOT INDEXED`: it reads
/// on the primary key from that position. On `messages_inbox` (`direction = ?`) SQLite read
/// and sorted every received message, in each of the watcher's rounds (every 100 ms): at
/// 100,000 messages a stall of the store of several milliseconds, ten times a second.
pub(super) fn arrived_since_sql() -> String {
    format!(
        "SELECT {COLUMNS}, seq FROM messages NOT INDEXED WHERE direction = 'in' AND seq > ?1 ORDER BY seq LIMIT ?2"
    )
}

pub(super) const COLUMNS: &str = "json, direction, trust, stored_at, read_at,
    (SELECT group_concat(recipient, ' ') FROM bounces WHERE bounces.message_id = id),
    (SELECT json_group_array(json_object('recipient', recipient, 'kind', kind, 'at', at, 'answer', answer))
     FROM receipts WHERE receipts.message_id = id),
    (SELECT json_group_array(json_array(agent, delivered_at))
     FROM deliveries WHERE deliveries.message_id = id AND delivered_at IS NOT NULL),
    (SELECT group_concat(recipient, ' ') FROM deliveries WHERE deliveries.message_id = id),
    (SELECT json_group_array(json_object('name', name, 'media_type', media_type, 'size', size, 'sha256', sha256))
     FROM (SELECT name, media_type, size, sha256 FROM attachments WHERE attachments.message_id = id ORDER BY idx)),
    owner_signature";

/// Subject counts three times the body, the sender twice (as the index's `rank` in migration 1).
pub(super) const MESSAGES_FTS: FtsIndex = FtsIndex {
    name: "messages_fts",
    weights: "3.0, 1.0, 2.0",
    table: "messages",
    time: "sent_at",
    findable: "t.is_receipt = 0",
    times_index: Some("messages_recency"),
};

/// The number of columns in [`COLUMNS`]; a query's own columns follow them.
pub(super) const COLUMN_COUNT: usize = 11;

/// A message row: json, direction, trust, stored_at, read_at, bounced recipients, receipts,
/// deliveries, the recipients of its copies, attachments (without bytes), the owner's signature.
pub(super) type RawRow = (
    String,
    String,
    String,
    i64,
    Option<i64>,
    Option<String>,
    Option<String>,
    Option<String>,
    Option<String>,
    Option<String>,
    Option<Vec<u8>>,
);

pub(super) fn from_row(row: &Row<'_>) -> rusqlite::Result<RawRow> {
    Ok((
        row.get(0)?,
        row.get(1)?,
        row.get(2)?,
        row.get(3)?,
        row.get(4)?,
        row.get(5)?,
        row.get(6)?,
        row.get(7)?,
        row.get(8)?,
        row.get(9)?,
        row.get(10)?,
    ))
}

/// Builds a message from its row; an owner message is checked with `check` (with none, it
/// is shown as an unverified claim).
pub(super) fn decode(raw: RawRow, check: Option<&OwnerCheck>) -> Result<StoredMessage, StoreError> {
    let (
        json,
        direction,
        trust,
        stored_at,
        read_at,
        bounced,
        receipts,
        delivered,
        copies,
        attached,
        signature,
    ) = raw;
    let mut message: Message = serde_json::from_str(&json).map_err(|e| StoreError::Corrupt {
        what: "message",
        detail: e.to_string(),
    })?;
    // A message stored before migration 8 carries its attachments in its JSON.
    let mut attachments = attachments::infos(attached.as_deref())?;
    if attachments.is_empty() {
        attachments = message.attachments.iter().map(AttachmentInfo::of).collect();
    }
    message.attachments.clear();
    let direction = if direction == "out" {
        Direction::Out
    } else {
        Direction::In
    };
    // Only received mail with nothing beside its signed words can be the owner's.
    let owner = signature.map(|signature| {
        let signed = (direction == Direction::In && attachments.is_empty())
            .then(|| check.and_then(|check| check(&message, &signature)))
            .flatten();
        signed.map_or(OwnerVoice::Unverified, OwnerVoice::Verified)
    });
    let trust = match owner {
        Some(OwnerVoice::Verified(_)) => Trust::Owner,
        Some(OwnerVoice::Unverified) => Trust::Unverified,
        None => Trust::parse(&trust)?,
    };
    Ok(StoredMessage {
        attachments,
        message,
        owner,
        direction,
        trust,
        stored_at: from_ms(stored_at)?,
        read_at: read_at.map(from_ms).transpose()?,
        bounced: addresses(bounced.as_deref(), "bounce")?,
        copies: addresses(copies.as_deref(), "delivery")?,
        receipts: decode_receipts(receipts.as_deref())?,
        delivered: decode_delivered(delivered.as_deref())?,
    })
}

/// A column of addresses joined by spaces.
fn addresses(column: Option<&str>, what: &'static str) -> Result<Vec<Address>, StoreError> {
    column
        .unwrap_or_default()
        .split_whitespace()
        .map(|to| {
            Address::parse(to).map_err(|e| StoreError::Corrupt {
                what,
                detail: e.to_string(),
            })
        })
        .collect()
}

impl StoredMessage {
    /// Whom this sent message's copies went to: the members that got one, for a group send;
    /// its recipients otherwise.
    pub fn copy_recipients(&self) -> Vec<Address> {
        let m = &self.message;
        match m.to.as_slice() {
            [group]
                if m.cc.is_empty() && m.bcc.is_empty() && is_group_send(group, &self.copies) =>
            {
                self.copies.clone()
            }
            _ => m.recipients().cloned().collect(),
        }
    }
}

/// Whether a message to `to` alone whose copies went to `copies` was a group send: copies
/// were taken for others than `to`.
pub(super) fn is_group_send(to: &Address, copies: &[Address]) -> bool {
    !copies.is_empty() && !copies.contains(to)
}

/// A receipt recorded against a message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ReceiptRecord {
    /// The recipient who gave it (for received mail: this agent).
    pub recipient: Address,
    /// Read or acknowledged.
    pub kind: ReceiptKind,
    /// When the recipient gave it (its clock).
    pub at: Timestamp,
    /// The acknowledgement's answer: the recipient's words, untrusted.
    pub answer: Option<String>,
}

#[derive(Deserialize)]
struct ReceiptRow {
    recipient: String,
    kind: String,
    at: i64,
    answer: Option<String>,
}

/// Reads the receipts column of a message row (a JSON array), oldest first.
pub(super) fn decode_receipts(json: Option<&str>) -> Result<Vec<ReceiptRecord>, StoreError> {
    let corrupt = |detail: String| StoreError::Corrupt {
        what: "receipt",
        detail,
    };
    let rows: Vec<ReceiptRow> =
        serde_json::from_str(json.unwrap_or("[]")).map_err(|e| corrupt(e.to_string()))?;
    let mut out = rows
        .into_iter()
        .map(|r| {
            Ok(ReceiptRecord {
                recipient: Address::parse(&r.recipient).map_err(|e| corrupt(e.to_string()))?,
                kind: ReceiptKind::parse(&r.kind)
                    .ok_or_else(|| corrupt(format!("unknown kind {:?}", r.kind)))?,
                at: from_ms(r.at)?,
                answer: r.answer,
            })
        })
        .collect::<Result<Vec<_>, StoreError>>()?;
    out.sort_by_key(|r| (r.at, r.kind));
    Ok(out)
}

/// Inserts messages inside the caller's transaction; per message, whether it was new.
pub(super) fn insert_batch(
    tx: &Transaction<'_>,
    batch: &[(&Message, Direction, Trust)],
) -> Result<Vec<bool>, StoreError> {
    let now = to_ms(now_millis());
    let mut inserted = Vec::with_capacity(batch.len());
    let mut insert = tx.prepare_cached(
        "INSERT INTO messages (id, direction, sender, thread_id, subject, body, sent_at, stored_at, read_at, trust, json, importance, is_receipt)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)
         ON CONFLICT (id) DO NOTHING",
    )?;
    let mut thread = tx.prepare_cached(
        "INSERT INTO threads (id, subject, first_at, last_at, message_count) VALUES (?1, ?2, ?3, ?3, 1)
         ON CONFLICT (id) DO UPDATE SET
            first_at = min(first_at, excluded.first_at),
            last_at = max(last_at, excluded.last_at),
            message_count = message_count + 1",
    )?;
    for (m, direction, trust) in batch {
        let sent_at = to_ms(m.sent_at);
        let json = attachments::bare_json(m);
        // Own mail is born read.
        let read_at = (*direction == Direction::Out).then_some(now);
        let n = insert.execute(params![
            m.id.to_string(),
            direction.as_str(),
            m.from.to_string(),
            m.thread.to_string(),
            m.subject,
            m.body,
            sent_at,
            now,
            read_at,
            trust.as_str(),
            json,
            m.importance.rank(),
            m.is_notice(),
        ])?;
        // The thread row may follow its first message: the foreign key is deferred.
        if n == 1 {
            thread.execute(params![m.thread.to_string(), m.subject, sent_at])?;
            attachments::insert(tx, m)?;
        }
        inserted.push(n == 1);
    }
    Ok(inserted)
}

impl Store {
    /// Stores one message; `false` if its id was already stored (nothing changes then).
    pub fn insert_message(
        &mut self,
        message: &Message,
        direction: Direction,
        trust: Trust,
    ) -> Result<bool, StoreError> {
        Ok(self.insert_messages(&[(message, direction, trust)])?[0])
    }

    /// Stores the owner's `message` to this agent with the owner key's `signature` over it,
    /// as received mail; `false` if its id was already stored (nothing changes then). Only
    /// the owner's commands call this: nothing from a relay is stored with a signature.
    pub fn insert_owner_message(
        &mut self,
        message: &Message,
        signature: &[u8; 64],
    ) -> Result<bool, StoreError> {
        let tx = self.write_tx()?;
        // `unverified` until shown: each read checks the signature against the owner key.
        let inserted = insert_batch(&tx, &[(message, Direction::In, Trust::Unverified)])?[0];
        if inserted {
            tx.execute(
                "UPDATE messages SET owner_signature = ?2 WHERE id = ?1",
                params![message.id.to_string(), &signature[..]],
            )?;
        }
        tx.commit()?;
        Ok(inserted)
    }

    /// Stores a batch in one transaction (one fsync); per message, whether it was new.
    pub fn insert_messages(
        &mut self,
        batch: &[(&Message, Direction, Trust)],
    ) -> Result<Vec<bool>, StoreError> {
        let tx = self.write_tx()?;
        let inserted = insert_batch(&tx, batch)?;
        tx.commit()?;
        Ok(inserted)
    }

    /// One message by id.
    pub fn message(&self, id: &MessageId) -> Result<Option<StoredMessage>, StoreError> {
        self.conn
            .query_row(
                &format!("SELECT {COLUMNS} FROM messages WHERE id = ?1"),
                [id.to_string()],
                from_row,
            )
            .optional()?
            .map(|raw| decode(raw, self.owner_check.as_ref()))
            .transpose()
    }

    /// Received messages: unread first, newest first within each group.
    pub fn inbox(&self, q: &InboxQuery) -> Result<Vec<StoredMessage>, StoreError> {
        // Each group is read in index order and cut at the limit before any row is built: the
        // columns (the JSON, the bounce and receipt subqueries) are computed for the listed
        // messages only, not for every received one. `messages_read` must be named: the
        // planner otherwise takes `messages_inbox` and sorts every read message.
        const FILTERS: &str = "(?2 IS NULL OR sender = ?2)
               AND (?3 IS NULL OR thread_id = ?3)
               AND (?5 IS NULL OR importance >= ?5)";
        let mut stmt = self.conn.prepare_cached(&format!(
            "SELECT {COLUMNS} FROM messages WHERE seq IN (
                 SELECT seq FROM (SELECT seq FROM messages
                     WHERE direction = 'in' AND read_at IS NULL AND {FILTERS}
                     ORDER BY seq DESC LIMIT ?4)
                 UNION ALL
                 SELECT seq FROM (SELECT seq FROM messages INDEXED BY messages_read
                     WHERE ?1 = 0 AND direction = 'in' AND read_at IS NOT NULL AND {FILTERS}
                     ORDER BY seq DESC LIMIT ?4))
             ORDER BY read_at IS NOT NULL, seq DESC
             LIMIT ?4"
        ))?;
        let rows = stmt.query_map(
            params![
                q.unread_only,
                q.from.as_ref().map(ToString::to_string),
                q.thread.map(|t| t.to_string()),
                q.limit as i64,
                q.importance.map(Importance::rank),
            ],
            from_row,
        )?;
        rows.map(|r| decode(r?, self.owner_check.as_ref()))
            .collect()
    }

    /// A page of received messages, newest first by arrival (`seq`): the unread ones, or all
    /// of them (`q.unread_only`), after `before` (the last message of the page before; the
    /// first page without it), and how many follow them. All of them are not unread first, as
    /// [`Store::inbox`] lists them: reading a message must not move it between pages, or the
    /// next page would skip or repeat some.
    pub fn inbox_page(
        &self,
        q: &InboxQuery,
        before: Option<&MessageId>,
    ) -> Result<Page<StoredMessage>, StoreError> {
        self.reading(|s| {
            let after: Option<i64> = before
                .map(|id| {
                    s.conn
                        .query_row(
                            "SELECT seq FROM messages WHERE id = ?1 AND direction = 'in'",
                            [id.to_string()],
                            |r| r.get(0),
                        )
                        .optional()?
                        .ok_or_else(|| {
                            StoreError::from(ValidationError::new(
                                "--before",
                                format!("{id} is not a received message; give the last id a page of the inbox listed"),
                            ))
                        })
                })
                .transpose()?;
            // Two statements, so the unread are found on their index (`messages_inbox`).
            let listed = format!(
                "direction = 'in' {}
                   AND (?1 IS NULL OR sender = ?1)
                   AND (?2 IS NULL OR thread_id = ?2)
                   AND (?3 IS NULL OR importance >= ?3)
                   AND (?4 IS NULL OR seq < ?4)",
                if q.unread_only {
                    "AND read_at IS NULL"
                } else {
                    ""
                }
            );
            let params = params![
                q.from.as_ref().map(ToString::to_string),
                q.thread.map(|t| t.to_string()),
                q.importance.map(Importance::rank),
                after,
                q.limit as i64,
            ];
            // Only the listed messages are read whole.
            let items = s
                .conn
                .prepare_cached(&format!(
                    "SELECT {COLUMNS} FROM messages WHERE seq IN (
                         SELECT seq FROM messages WHERE {listed} ORDER BY seq DESC LIMIT ?5)
                     ORDER BY seq DESC"
                ))?
                .query_map(params, from_row)?
                .map(|r| decode(r?, s.owner_check.as_ref()))
                .collect::<Result<Vec<_>, _>>()?;
            let count: i64 = s
                .conn
                .prepare_cached(&format!("SELECT count(*) FROM messages WHERE {listed}"))?
                .query_row(&params[..4], |r| r.get(0))?;
            Ok(Page {
                more: (count as u64).saturating_sub(items.len() as u64),
                items,
            })
        })
    }

    /// Every message of a thread, in and out, oldest first.
    pub fn thread(&self, id: &ThreadId) -> Result<Vec<StoredMessage>, StoreError> {
        let mut stmt = self.conn.prepare_cached(&format!(
            "SELECT {COLUMNS} FROM messages WHERE thread_id = ?1 AND is_receipt = 0 ORDER BY sent_at, seq"
        ))?;
        let rows = stmt.query_map([id.to_string()], from_row)?;
        rows.map(|r| decode(r?, self.owner_check.as_ref()))
            .collect()
    }

    /// How many messages were received: all of them, or only the unread ones.
    pub fn received_count(&self, unread_only: bool) -> Result<u64, StoreError> {
        Ok(self.conn.query_row(
            "SELECT count(*) FROM messages WHERE direction = 'in' AND (?1 = 0 OR read_at IS NULL)",
            [unread_only],
            |r| r.get::<_, i64>(0),
        )? as u64)
    }

    /// Full-text search over subject, body and sender, best first (relevance and recency).
    pub fn search_messages(
        &self,
        query: &str,
        limit: usize,
    ) -> Result<Vec<StoredMessage>, StoreError> {
        let terms = fts_terms(query)?;
        if terms.is_empty() {
            return Ok(Vec::new());
        }
        self.reading(|s| {
            // Only the messages returned are read whole (their JSON, bounces and receipts).
            let mut by_seq = s
                .conn
                .prepare_cached(&format!("SELECT {COLUMNS} FROM messages WHERE seq = ?1"))?;
            ranked(&s.conn, MESSAGES_FTS, &terms, limit)?
                .into_iter()
                .map(|(seq, _)| decode(by_seq.query_row([seq], from_row)?, s.owner_check.as_ref()))
                .collect()
        })
    }

    /// The unread count and the newest unread message's sender.
    pub fn unread_summary(&self) -> Result<UnreadSummary, StoreError> {
        self.reading(|s| {
            // Kept by triggers (migration 6): counting the unread rows grows with them. Both
            // statements are cached: this runs for the notice on every tool result.
            let count: u32 = s
                .conn
                .prepare_cached("SELECT count FROM unread")?
                .query_row([], |r| r.get(0))?;
            let newest = s
                .conn
                .prepare_cached(
                    "SELECT sender, owner_signature IS NOT NULL, id FROM messages
                     WHERE direction = 'in' AND read_at IS NULL ORDER BY seq DESC LIMIT 1",
                )?
                .query_row([], |r| {
                    Ok((
                        r.get::<_, String>(0)?,
                        r.get::<_, bool>(1)?,
                        r.get::<_, String>(2)?,
                    ))
                })
                .optional()?;
            let corrupt = |e: ValidationError| StoreError::Corrupt {
                what: "message",
                detail: e.to_string(),
            };
            let Some((sender, claims_owner, id)) = newest else {
                return Ok(UnreadSummary {
                    count,
                    newest_from: None,
                    newest_from_owner: false,
                });
            };
            let newest_from = Some(Address::parse(&sender).map_err(corrupt)?);
            // Only a claim is read whole, to check its signature.
            let newest_from_owner = claims_owner
                && s.message(&MessageId::parse(&id).map_err(corrupt)?)?
                    .is_some_and(|m| m.trust == Trust::Owner);
            Ok(UnreadSummary {
                count,
                newest_from,
                newest_from_owner,
            })
        })
    }

    /// Received messages stored after position `after` (in store order), at most `limit`,
    /// each whole with its sender's contact and its position: what the mailbox has not
    /// announced yet. Positions only grow.
    pub fn arrived_since(
        &self,
        after: i64,
        limit: usize,
    ) -> Result<Vec<(i64, StoredMessage, Option<Contact>)>, StoreError> {
        let mut stmt = self.conn.prepare_cached(&arrived_since_sql())?;
        let rows = stmt
            .query_map(params![after, limit as i64], |r| {
                Ok((r.get::<_, i64>(COLUMN_COUNT)?, from_row(r)?))
            })?
            .collect::<Result<Vec<_>, _>>()?;
        rows.into_iter()
            .map(|(seq, raw)| {
                let stored = decode(raw, self.owner_check.as_ref())?;
                let sender = self.contact(&stored.message.from)?;
                Ok((seq, stored, sender))
            })
            .collect()
    }

    /// The plan SQLite chose for `sql`, one line per step (for tests of the plans that matter).
    #[cfg(test)]
    pub(super) fn plan(&self, sql: &str) -> Vec<String> {
        let mut stmt = self
            .conn
            .prepare(&format!("EXPLAIN QUERY PLAN {sql}"))
            .expect("the statement prepares");
        let count = stmt.parameter_count();
        let nulls = vec![rusqlite::types::Null; count];
        stmt.query_map(rusqlite::params_from_iter(nulls), |r| r.get::<_, String>(3))
            .expect("the plan runs")
            .map(|r| r.expect("a plan line"))
            .collect()
    }

    /// The position of the newest stored message (0 when there is none).
    pub fn latest_position(&self) -> Result<i64, StoreError> {
        Ok(self
            .conn
            .query_row("SELECT coalesce(max(seq), 0) FROM messages", [], |r| {
                r.get(0)
            })?)
    }

    /// A number that changes whenever another connection (another process) commits to the
    /// store: a cheap way to notice their writes.
    pub fn data_version(&self) -> Result<i64, StoreError> {
        Ok(self
            .conn
            .query_row("PRAGMA data_version", [], |r| r.get(0))?)
    }

    /// How many messages the store holds.
    pub fn message_count(&self) -> Result<u64, StoreError> {
        Ok(self
            .conn
            .query_row("SELECT count(*) FROM messages", [], |r| r.get::<_, i64>(0))?
            as u64)
    }
}
