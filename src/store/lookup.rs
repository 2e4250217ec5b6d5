//! Finding a message by part of its id, as git finds a commit: the start of the id, or its
//! end (ids are UUIDv7, whose first characters are a timestamp that messages of the same
//! minute share, and whose last characters are random).

use std::str::FromStr;

use super::{Store, StoreError};
use crate::protocol::{MessageId, ValidationError};

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

impl Store {
    /// The one message whose id starts or ends with `part`.
    pub fn resolve_message(&self, part: &IdPart) -> Result<MessageId, StoreError> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT id FROM messages WHERE is_receipt = 0 AND (id = ?1 OR substr(id, 1, length(?1)) = ?1
                 OR substr(id, -length(?1)) = ?1)
             ORDER BY id = ?1 DESC, seq DESC LIMIT 4",
        )?;
        let found: Vec<String> = stmt
            .query_map([&part.0], |r| r.get(0))?
            .collect::<Result<_, _>>()?;
        let exact = found.first().is_some_and(|id| *id == part.0);
        match found.as_slice() {
            [] => Err(StoreError::NoSuchMessage {
                part: part.0.clone(),
            }),
            [one, ..] if exact || found.len() == 1 => {
                one.parse().map_err(|e| StoreError::Corrupt {
                    what: "message id",
                    detail: format!("{e}"),
                })
            }
            many => Err(StoreError::AmbiguousId {
                part: part.0.clone(),
                some: many.iter().take(3).cloned().collect(),
            }),
        }
    }
}
