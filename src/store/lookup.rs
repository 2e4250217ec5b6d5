//! Finding a message or a memory by part of its id, as git finds a commit: the start of the id, or its
//! end (ids are UUIDv7, whose first characters are a timestamp that messages of the same
//! minute share, and whose last characters are random).

use std::str::FromStr;

use super::{Store, StoreError};
use crate::protocol::{MemoryId, MessageId, ValidationError};

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
