//! Memories: notes an agent keeps across context resets, recalled by relevance and recency.

use jiff::Timestamp;
use rusqlite::{OptionalExtension, Row, params};
use serde::Serialize;

use super::search::{FtsIndex, fts_terms, ranked};
use super::time::{from_ms, to_ms};
use super::{Page, Store, StoreError};
use crate::protocol::{MemoryId, ValidationError, now_millis};

/// The longest memory text.
pub const MAX_MEMORY_BYTES: usize = 64 * 1024;
/// The longest title, in characters.
pub const MAX_TITLE_CHARS: usize = 200;
/// The most tags on one memory.
pub const MAX_TAGS: usize = 16;
const MAX_TAG_CHARS: usize = 32;
/// An untitled memory takes this many characters of its first line as title.
const AUTO_TITLE_CHARS: usize = 80;

/// A stored memory.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Memory {
    /// Its id.
    pub id: MemoryId,
    /// A short title.
    pub title: String,
    /// The text.
    pub body: String,
    /// Lowercase tags.
    pub tags: Vec<String>,
    /// When it was written.
    pub created_at: Timestamp,
    /// When it last changed.
    pub updated_at: Timestamp,
}

/// A memory to store.
#[derive(Debug, Clone, PartialEq)]
pub struct MemoryDraft {
    /// The text.
    pub text: String,
    /// A title; the text's first line when absent.
    pub title: Option<String>,
    /// Tags, lowercased on storing.
    pub tags: Vec<String>,
    /// When it was written.
    pub at: Timestamp,
}

/// A memory found by [`Store::recall`], with its score (higher is better; 0 without a query).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Recalled {
    /// The memory.
    pub memory: Memory,
    /// Relevance blended with recency.
    pub score: f64,
}

fn validate(
    text: &str,
    title: Option<&str>,
    tags: &[String],
) -> Result<(String, Vec<String>), ValidationError> {
    if text.trim().is_empty() {
        return Err(ValidationError::new(
            "text",
            "is empty; write what to remember",
        ));
    }
    if text.len() > MAX_MEMORY_BYTES {
        return Err(ValidationError::too_long(
            "text",
            text.len(),
            MAX_MEMORY_BYTES,
            "bytes",
        ));
    }
    let title = match title {
        Some(t) => {
            let len = t.chars().count();
            if len > MAX_TITLE_CHARS {
                return Err(ValidationError::too_long(
                    "title",
                    len,
                    MAX_TITLE_CHARS,
                    "characters",
                ));
            }
            if t.chars().any(char::is_control) {
                return Err(ValidationError::new(
                    "title",
                    "has a control character; keep it to one line",
                ));
            }
            t.trim().to_owned()
        }
        None => text
            .trim()
            .lines()
            .next()
            .unwrap_or("")
            .chars()
            .take(AUTO_TITLE_CHARS)
            .collect(),
    };
    if tags.len() > MAX_TAGS {
        return Err(ValidationError::new(
            "tags",
            format!("has {} tags, over the limit of {MAX_TAGS}", tags.len()),
        ));
    }
    let mut clean = Vec::with_capacity(tags.len());
    for (i, tag) in tags.iter().enumerate() {
        let t = tag.trim().to_lowercase();
        let ok = !t.is_empty()
            && t.chars().count() <= MAX_TAG_CHARS
            && t.chars()
                .all(|c| c.is_alphanumeric() || c == '-' || c == '_');
        if !ok {
            return Err(ValidationError::new(
                format!("tags[{i}]"),
                format!(
                    "{tag:?} is not a tag: use 1 to {MAX_TAG_CHARS} letters, digits, '-' or '_'"
                ),
            ));
        }
        if !clean.contains(&t) {
            clean.push(t);
        }
    }
    Ok((title, clean))
}

/// Reads back every memory; how many there are.
pub(super) fn check_rows(conn: &rusqlite::Connection) -> Result<u64, StoreError> {
    let mut stmt = conn.prepare(&format!("SELECT {COLUMNS} FROM memories m"))?;
    let mut rows = stmt.query([])?;
    let mut n = 0;
    while let Some(row) = rows.next()? {
        decode(from_row(row)?)?;
        n += 1;
    }
    Ok(n)
}

fn from_row(row: &Row<'_>) -> rusqlite::Result<(String, String, String, String, i64, i64)> {
    Ok((
        row.get(0)?,
        row.get(1)?,
        row.get(2)?,
        row.get(3)?,
        row.get(4)?,
        row.get(5)?,
    ))
}

fn decode(raw: (String, String, String, String, i64, i64)) -> Result<Memory, StoreError> {
    let (id, title, body, tags, created_at, updated_at) = raw;
    Ok(Memory {
        id: MemoryId::parse(&id).map_err(|e| StoreError::Corrupt {
            what: "memory",
            detail: e.to_string(),
        })?,
        title,
        body,
        tags: tags.split_whitespace().map(str::to_owned).collect(),
        created_at: from_ms(created_at)?,
        updated_at: from_ms(updated_at)?,
    })
}

const COLUMNS: &str = "m.id, m.title, m.body, m.tags, m.created_at, m.updated_at";
/// Title counts three times the body, tags twice (as the index's `rank` in migration 1).
const MEMORIES_FTS: FtsIndex = FtsIndex {
    name: "memories_fts",
    weights: "3.0, 1.0, 2.0",
    table: "memories",
    time: "updated_at",
    findable: "1",
    times_index: None,
};

impl Store {
    /// Stores a memory now. Without a title, the first line of the text is used.
    pub fn remember(
        &mut self,
        text: &str,
        title: Option<&str>,
        tags: &[String],
    ) -> Result<Memory, StoreError> {
        let draft = MemoryDraft {
            text: text.to_owned(),
            title: title.map(str::to_owned),
            tags: tags.to_vec(),
            at: now_millis(),
        };
        Ok(self.remember_all(std::slice::from_ref(&draft))?.remove(0))
    }

    /// Stores many memories in one transaction (imports); all or none.
    pub fn remember_all(&mut self, drafts: &[MemoryDraft]) -> Result<Vec<Memory>, StoreError> {
        let tx = self.write_tx()?;
        let mut stored = Vec::with_capacity(drafts.len());
        {
            let mut insert = tx.prepare_cached(
                "INSERT INTO memories (id, title, body, tags, created_at, updated_at) VALUES (?1, ?2, ?3, ?4, ?5, ?5)",
            )?;
            for draft in drafts {
                let (title, tags) = validate(&draft.text, draft.title.as_deref(), &draft.tags)?;
                let memory = Memory {
                    id: MemoryId::new(),
                    title,
                    body: draft.text.clone(),
                    tags,
                    created_at: draft.at,
                    updated_at: draft.at,
                };
                insert.execute(params![
                    memory.id.to_string(),
                    memory.title,
                    memory.body,
                    memory.tags.join(" "),
                    to_ms(draft.at)
                ])?;
                stored.push(memory);
            }
        }
        tx.commit()?;
        Ok(stored)
    }

    /// With a query: the best matches by BM25 blended with recency. Without: the most recent.
    pub fn recall(&self, query: Option<&str>, limit: usize) -> Result<Vec<Recalled>, StoreError> {
        let Some(query) = query else {
            let mut stmt = self.conn.prepare_cached(&format!(
                "SELECT {COLUMNS} FROM memories m ORDER BY m.updated_at DESC, m.seq DESC LIMIT ?1"
            ))?;
            let rows = stmt.query_map([limit as i64], from_row)?;
            return rows
                .map(|r| {
                    Ok(Recalled {
                        memory: decode(r?)?,
                        score: 0.0,
                    })
                })
                .collect();
        };
        let terms = fts_terms(query)?;
        if terms.is_empty() {
            return Ok(Vec::new());
        }
        self.reading(|s| {
            let mut by_seq = s.conn.prepare_cached(&format!(
                "SELECT {COLUMNS} FROM memories m WHERE m.seq = ?1"
            ))?;
            ranked(&s.conn, MEMORIES_FTS, &terms, limit)?
                .into_iter()
                .map(|(seq, score)| {
                    Ok(Recalled {
                        memory: decode(by_seq.query_row([seq], from_row)?)?,
                        score,
                    })
                })
                .collect()
        })
    }

    /// A page of the most recent memories (as [`Store::recall`] without a query): those after
    /// `before` (the last memory of the page before; the first page without it), and how
    /// many follow them. Memories updated in the same millisecond keep their order (`seq`).
    pub fn recent_memories(
        &self,
        limit: usize,
        before: Option<&MemoryId>,
    ) -> Result<Page<Memory>, StoreError> {
        let after: Option<(i64, i64)> = before
            .map(|id| {
                self.conn
                    .query_row(
                        "SELECT updated_at, seq FROM memories WHERE id = ?1",
                        [id.to_string()],
                        |r| Ok((r.get(0)?, r.get(1)?)),
                    )
                    .optional()?
                    .ok_or_else(|| {
                        StoreError::from(ValidationError::new(
                            "--before",
                            format!(
                                "{id} is not a memory; give the last id a page of recall listed"
                            ),
                        ))
                    })
            })
            .transpose()?;
        const AFTER: &str =
            "(?2 IS NULL OR m.updated_at < ?2 OR (m.updated_at = ?2 AND m.seq < ?3))";
        let (at, seq) = (after.map(|a| a.0), after.map(|a| a.1));
        let items = self
            .conn
            .prepare_cached(&format!(
                "SELECT {COLUMNS} FROM memories m WHERE {AFTER}
                 ORDER BY m.updated_at DESC, m.seq DESC LIMIT ?1"
            ))?
            .query_map(params![limit as i64, at, seq], from_row)?
            .map(|r| decode(r?))
            .collect::<Result<Vec<_>, _>>()?;
        let listed: i64 = self
            .conn
            .prepare_cached(&format!("SELECT count(*) FROM memories m WHERE {AFTER}"))?
            // ?1 (the limit) is not counted by; bound all the same, as both share AFTER.
            .query_row(params![None::<i64>, at, seq], |r| r.get(0))?;
        Ok(Page {
            more: (listed as u64).saturating_sub(items.len() as u64),
            items,
        })
    }

    /// Deletes a memory; `false` if there was none with that id.
    pub fn forget(&mut self, id: &MemoryId) -> Result<bool, StoreError> {
        Ok(self
            .conn
            .execute("DELETE FROM memories WHERE id = ?1", [id.to_string()])?
            == 1)
    }

    /// How many memories the store holds.
    pub fn memory_count(&self) -> Result<u64, StoreError> {
        Ok(self
            .conn
            .query_row("SELECT count(*) FROM memories", [], |r| r.get::<_, i64>(0))?
            as u64)
    }
}
