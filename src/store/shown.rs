//! The shown ledger: which received messages were already put in front of a client
//! session's model, and by which path (a hook's digest, a channel event, a tool result). The
//! doorbells that can repeat themselves (Claude Code's hooks) consult it, so one message
//! interrupts a session once.

use std::fmt;

use rusqlite::{OptionalExtension, params};

use super::messages::{COLUMNS, decode, from_row};
use super::time::to_ms;
use super::{Store, StoreError, StoredMessage};
use crate::protocol::{MessageId, ValidationError, now_millis};

/// The longest session key accepted.
pub const MAX_SESSION_CHARS: usize = 128;
/// Ledger rows older than this are dropped: a session that old is long over.
const KEEP_MS: i64 = 30 * 24 * 3600 * 1000;

/// A client session, as the client names it (Claude Code's `session_id`, a UUID).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SessionKey(String);

impl SessionKey {
    /// Validates `raw`: 1 to 128 characters of ASCII letters, digits, `.`, `_`, `:` and `-`.
    pub fn new(raw: &str) -> Result<Self, ValidationError> {
        let field = "session_id";
        if raw.is_empty() {
            return Err(ValidationError::new(
                field,
                "is empty; pass the client's session id",
            ));
        }
        if raw.len() > MAX_SESSION_CHARS {
            return Err(ValidationError::too_long(
                field,
                raw.len(),
                MAX_SESSION_CHARS,
                "characters",
            ));
        }
        if let Some(c) = raw
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | ':' | '-')))
        {
            return Err(ValidationError::new(
                field,
                format!("contains {c:?}; a session id is letters, digits, '.', '_', ':' and '-'"),
            ));
        }
        Ok(Self(raw.to_owned()))
    }

    /// The key as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for SessionKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The path that put a message in front of the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Via {
    /// A hook's digest (session start, prompt, after a tool, stop).
    Hook,
    /// A Claude Code channel event that started a turn.
    Channel,
    /// A tool result that listed or showed it.
    Tool,
    /// A notice written to Claude Code's session inbox socket.
    Socket,
    /// The rewake hook's digest (an `asyncRewake` hook that exited 2).
    Rewake,
}

impl Via {
    /// The name stored in the ledger.
    pub fn as_str(self) -> &'static str {
        match self {
            Via::Hook => "hook",
            Via::Channel => "channel",
            Via::Tool => "tool",
            Via::Socket => "socket",
            Via::Rewake => "rewake",
        }
    }

    fn parse(raw: &str) -> Option<Self> {
        [Via::Hook, Via::Channel, Via::Tool, Via::Socket, Via::Rewake]
            .into_iter()
            .find(|v| v.as_str() == raw)
    }
}

/// Received messages that are unread and not yet shown to the session (`?1`).
const UNSEEN: &str = "direction = 'in' AND read_at IS NULL
     AND NOT EXISTS (SELECT 1 FROM shown WHERE shown.session = ?1 AND shown.message_id = messages.id)";

impl Store {
    /// Records that `ids` were put in front of `session`'s model (once per message: the
    /// first path is kept; ids of messages not in the store are ignored). Also forgets rows
    /// older than 30 days.
    pub fn mark_shown(
        &mut self,
        session: &SessionKey,
        ids: &[MessageId],
        via: Via,
    ) -> Result<(), StoreError> {
        if ids.is_empty() {
            return Ok(());
        }
        let now = to_ms(now_millis());
        let tx = self.write_tx()?;
        {
            let mut insert = tx.prepare_cached(
                "INSERT INTO shown (session, message_id, via, shown_at)
                 SELECT ?1, ?2, ?3, ?4 WHERE EXISTS (SELECT 1 FROM messages WHERE id = ?2)
                 ON CONFLICT (session, message_id) DO NOTHING",
            )?;
            for id in ids {
                insert.execute(params![session.as_str(), id.to_string(), via.as_str(), now])?;
            }
            tx.execute("DELETE FROM shown WHERE shown_at < ?1", [now - KEEP_MS])?;
        }
        tx.commit()?;
        Ok(())
    }

    /// Takes what `session`'s model has not been shown: the unread received messages it
    /// has not seen, newest first, at most `limit` of them, and how many there are in all;
    /// and records all of them (not only the listed ones: the digest gives the count and how
    /// to read the rest) as shown `via`, in the same transaction, so mail stored meanwhile is
    /// neither lost nor marked.
    pub fn take_unseen(
        &mut self,
        session: &SessionKey,
        limit: usize,
        via: Via,
    ) -> Result<(Vec<StoredMessage>, u32), StoreError> {
        // Read-only first: the common answer, nothing new, takes no write lock.
        let any: bool = self.conn.query_row(
            &format!("SELECT EXISTS (SELECT 1 FROM messages WHERE {UNSEEN})"),
            [session.as_str()],
            |r| r.get(0),
        )?;
        if !any {
            return Ok((Vec::new(), 0));
        }
        let now = to_ms(now_millis());
        let check = self.owner_check.clone();
        let tx = self.write_tx()?;
        let found = {
            let mut stmt = tx.prepare_cached(&format!(
                "SELECT {COLUMNS} FROM messages WHERE {UNSEEN} ORDER BY seq DESC LIMIT ?2"
            ))?;
            let rows = stmt.query_map(params![session.as_str(), limit as i64], from_row)?;
            rows.map(|r| decode(r?, check.as_ref()))
                .collect::<Result<Vec<_>, _>>()?
        };
        let marked = tx.execute(
            &format!(
                "INSERT INTO shown (session, message_id, via, shown_at)
                 SELECT ?1, id, ?2, ?3 FROM messages WHERE {UNSEEN}"
            ),
            params![session.as_str(), via.as_str(), now],
        )?;
        tx.commit()?;
        Ok((found, marked as u32))
    }

    /// Takes those of `ids` that `session`'s model has not been shown and that are still
    /// unread, recording them as shown `via` in one transaction, and returns them (in the
    /// order given). A doorbell takes a message before it rings, so no hook or other
    /// doorbell shows it too; [`Store::give_back`] undoes a take whose ring failed.
    pub fn take_for_ring(
        &mut self,
        session: &SessionKey,
        ids: &[MessageId],
        via: Via,
    ) -> Result<Vec<MessageId>, StoreError> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let now = to_ms(now_millis());
        let tx = self.write_tx()?;
        let mut taken = Vec::new();
        {
            let mut take = tx.prepare_cached(&format!(
                "INSERT INTO shown (session, message_id, via, shown_at)
                 SELECT ?1, id, ?3, ?4 FROM messages WHERE id = ?2 AND {UNSEEN}"
            ))?;
            for id in ids {
                if take.execute(params![session.as_str(), id.to_string(), via.as_str(), now])? > 0 {
                    taken.push(*id);
                }
            }
        }
        tx.commit()?;
        Ok(taken)
    }

    /// Forgets that `ids` were shown to `session` `via` (a ring that could not be written), so
    /// the hooks show them after all.
    pub fn give_back(
        &mut self,
        session: &SessionKey,
        ids: &[MessageId],
        via: Via,
    ) -> Result<(), StoreError> {
        let tx = self.write_tx()?;
        {
            let mut forget = tx.prepare_cached(
                "DELETE FROM shown WHERE session = ?1 AND message_id = ?2 AND via = ?3",
            )?;
            for id in ids {
                forget.execute(params![session.as_str(), id.to_string(), via.as_str()])?;
            }
        }
        tx.commit()?;
        Ok(())
    }

    /// How `session`'s model was first shown message `id`, if it was.
    pub fn shown_via(
        &self,
        session: &SessionKey,
        id: &MessageId,
    ) -> Result<Option<Via>, StoreError> {
        let via: Option<String> = self
            .conn
            .query_row(
                "SELECT via FROM shown WHERE session = ?1 AND message_id = ?2",
                params![session.as_str(), id.to_string()],
                |r| r.get(0),
            )
            .optional()?;
        Ok(via.as_deref().and_then(Via::parse))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn session_keys_are_bounded_and_plain() {
        assert!(SessionKey::new("c26a70b4-07bd-4ec2-9708-adeaeb9b6867").is_ok());
        assert!(SessionKey::new("").is_err());
        assert!(SessionKey::new(&"a".repeat(129)).is_err());
        let e = SessionKey::new("a b").unwrap_err();
        assert_eq!(e.field, "session_id");
        assert!(e.problem.contains("' '"), "{}", e.problem);
    }
}
