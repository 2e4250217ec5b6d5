//! Finding a message or a memory by part of its id, as git finds a commit: the start of the id, or its
//! end (ids are UUIDv7, whose first characters are a timestamp that messages of the same
//! minute share, and whose last characters are random).

use std::str::FromStr;

use super::{Store, StoreError};
use crate::protocol::{MemoryId, MessageId, ThreadId, ValidationError};

/// Fewest characters of an id accepted.
pub const MIN_ID_PART: usize = 4;

/// The start or end of a message id: 4 to 36 of its characters (hex digits and dashes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdPart(String);

impl FromStr for IdPart {
    type Err = ValidationError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let part = s.trim().to_ascii_lowercase();
        let fits = (MIN_ID_PART..=36).contains(&part.len())
            && part.chars().all(|c| c.is_ascii_hexdigit() || c == '-');
        if fits {
            Ok(Self(part))
        } else {
            Err(ValidationError::new(
                "id",
                format!(
                    "{s:?} is not part of a message id: give its first or last {MIN_ID_PART} to 36 characters (hex digits and dashes), as `inbox` or `sent` print it"
                ),
            ))
        }
    }
}

impl std::fmt::Display for IdPart {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// The bounds of the ids that start with `prefix` (any case), for a range on an id's index:
/// ids are lowercase hex digits and dashes, all below `g`. `None` when no id can start so.
fn id_range(prefix: &str) -> Option<(String, String)> {
    let low = prefix.trim().to_ascii_lowercase();
    let fits = low.len() <= 36 && low.chars().all(|c| c.is_ascii_hexdigit() || c == '-');
    fits.then(|| (low.clone(), format!("{low}g")))
}

/// A table whose rows are named by UUIDv7 ids, for [`Store::resolve`].
struct Named {
    /// The table, and which of its rows may be named.
    rows: &'static str,
    /// What a row is, in the plural (for "matches several …").
    plural: &'static str,
}

const MESSAGES: Named = Named {
    rows: "messages WHERE is_receipt = 0 AND",
    plural: "messages",
};
const MEMORIES: Named = Named {
    rows: "memories WHERE",
    plural: "memories",
};

impl Store {
    /// The ids of mail (not receipts) that start with `prefix`, newest first, at most
    /// `limit`: read in the id index's order, so no more rows than returned.
    pub fn message_ids_starting(
        &self,
        prefix: &str,
        limit: usize,
    ) -> Result<Vec<MessageId>, StoreError> {
        self.ids_starting(
            "SELECT id FROM messages WHERE id >= ?1 AND id < ?2 AND is_receipt = 0
             ORDER BY id DESC LIMIT ?3",
            prefix,
            limit,
        )
    }

    /// The ids of threads that start with `prefix`, newest first, at most `limit`.
    pub fn thread_ids_starting(
        &self,
        prefix: &str,
        limit: usize,
    ) -> Result<Vec<ThreadId>, StoreError> {
        self.ids_starting(
            "SELECT id FROM threads WHERE id >= ?1 AND id < ?2 ORDER BY id DESC LIMIT ?3",
            prefix,
            limit,
        )
    }

    fn ids_starting<T: FromStr<Err: std::fmt::Display>>(
        &self,
        sql: &str,
        prefix: &str,
        limit: usize,
    ) -> Result<Vec<T>, StoreError> {
        let Some((low, high)) = id_range(prefix) else {
            return Ok(Vec::new());
        };
        let mut stmt = self.conn.prepare_cached(sql)?;
        let rows = stmt.query_map(rusqlite::params![low, high, limit as i64], |r| {
            r.get::<_, String>(0)
        })?;
        rows.map(|id| {
            id?.parse().map_err(|e: T::Err| StoreError::Corrupt {
                what: "id",
                detail: e.to_string(),
            })
        })
        .collect()
    }

    /// The one message whose id starts or ends with `part`.
    pub fn resolve_message(&self, part: &IdPart) -> Result<MessageId, StoreError> {
        match self.resolve(&MESSAGES, part)? {
            Some(id) => parse_id(&id, "message id"),
            None => Err(StoreError::NoSuchMessage {
                part: part.0.clone(),
            }),
        }
    }

    /// The one memory whose id starts or ends with `part`, found as messages are.
    pub fn resolve_memory(&self, part: &IdPart) -> Result<MemoryId, StoreError> {
        match self.resolve(&MEMORIES, part)? {
            Some(id) => parse_id(&id, "memory id"),
            None => Err(StoreError::NoSuchMemory {
                part: part.0.clone(),
            }),
        }
    }

    /// The one id of `table` that is `part` or starts or ends with it; `None` when none does.
    fn resolve(&self, table: &Named, part: &IdPart) -> Result<Option<String>, StoreError> {
        let mut stmt = self.conn.prepare_cached(&format!(
            "SELECT id FROM {} (id = ?1 OR substr(id, 1, length(?1)) = ?1
                 OR substr(id, -length(?1)) = ?1)
             ORDER BY id = ?1 DESC, seq DESC LIMIT 4",
            table.rows
        ))?;
        let found: Vec<String> = stmt
            .query_map([&part.0], |r| r.get(0))?
            .collect::<Result<_, _>>()?;
        let exact = found.first().is_some_and(|id| *id == part.0);
        match found.as_slice() {
            [] => Ok(None),
            [one, ..] if exact || found.len() == 1 => Ok(Some(one.clone())),
            many => Err(StoreError::AmbiguousId {
                part: part.0.clone(),
                what: table.plural,
                some: many.iter().take(3).cloned().collect(),
            }),
        }
    }
}

fn parse_id<T: FromStr>(id: &str, what: &'static str) -> Result<T, StoreError>
where
    T::Err: std::fmt::Display,
{
    id.parse().map_err(|e| StoreError::Corrupt {
        what,
        detail: format!("{e}"),
    })
}
