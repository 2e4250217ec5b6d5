//! Small named values: who this agent is, and what it is doing now.

use rusqlite::{OptionalExtension, params};

use super::{Store, StoreError};
use crate::protocol::ValidationError;

/// The longest identity or current-task text.
pub const MAX_STATUS_BYTES: usize = 8 * 1024;

const IDENTITY: &str = "identity";
const CURRENT_TASK: &str = "current_task";

impl Store {
    fn meta(&self, key: &str) -> Result<Option<String>, StoreError> {
        Ok(self
            .conn
            .query_row("SELECT value FROM meta WHERE key = ?1", [key], |r| r.get(0))
            .optional()?)
    }

    fn set_meta(&mut self, key: &str, field: &str, value: &str) -> Result<(), StoreError> {
        if value.len() > MAX_STATUS_BYTES {
            return Err(
                ValidationError::too_long(field, value.len(), MAX_STATUS_BYTES, "bytes").into(),
            );
        }
        if value.trim().is_empty() {
            self.conn
                .execute("DELETE FROM meta WHERE key = ?1", [key])?;
        } else {
            self.conn.execute(
                "INSERT INTO meta (key, value) VALUES (?1, ?2) ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                params![key, value.trim()],
            )?;
        }
        Ok(())
    }

    /// "Who am I": the agent's identity text.
    pub fn identity_text(&self) -> Result<Option<String>, StoreError> {
        self.meta(IDENTITY)
    }

    /// Sets the identity text; empty clears it.
    pub fn set_identity_text(&mut self, text: &str) -> Result<(), StoreError> {
        self.set_meta(IDENTITY, "identity", text)
    }

    /// "What am I doing": the current task.
    pub fn current_task(&self) -> Result<Option<String>, StoreError> {
        self.meta(CURRENT_TASK)
    }

    /// Sets the current task; empty clears it.
    pub fn set_current_task(&mut self, text: &str) -> Result<(), StoreError> {
        self.set_meta(CURRENT_TASK, "current task", text)
    }
}
