//! What the agent keeps for itself: memories that survive context resets, and its status
//! (who it is, what it is doing).

use super::{Mailbox, MailboxError};
use crate::protocol::MemoryId;
use crate::store::{Memory, Recalled};

/// Who the agent is and what it is doing, as it said.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AgentStatus {
    /// Who this agent is (role, owner, purpose).
    pub identity: Option<String>,
    /// What it is doing now.
    pub current_task: Option<String>,
}

impl Mailbox {
    /// Stores a memory; `title` defaults to the text's first line.
    pub async fn remember(
        &self,
        text: String,
        title: Option<String>,
        tags: Vec<String>,
    ) -> Result<Memory, MailboxError> {
        Ok(self
            .0
            .store
            .call(move |s| s.remember(&text, title.as_deref(), &tags))
            .await?)
    }

    /// Memories by relevance and recency for `query`, else the most recent; at most `limit`.
    pub async fn recall(
        &self,
        query: Option<String>,
        limit: usize,
    ) -> Result<Vec<Recalled>, MailboxError> {
        Ok(self
            .0
            .store
            .call(move |s| s.recall(query.as_deref(), limit))
            .await?)
    }

    /// Deletes a memory; whether it existed.
    pub async fn forget(&self, id: MemoryId) -> Result<bool, MailboxError> {
        Ok(self.0.store.call(move |s| s.forget(&id)).await?)
    }

    /// The agent's status.
    pub async fn agent_status(&self) -> Result<AgentStatus, MailboxError> {
        Ok(self
            .0
            .store
            .call(|s| {
                Ok(AgentStatus {
                    identity: s.identity_text()?,
                    current_task: s.current_task()?,
                })
            })
            .await?)
    }

    /// Sets the parts of the status given ("" clears one); the whole status after.
    pub async fn set_agent_status(
        &self,
        identity: Option<String>,
        current_task: Option<String>,
    ) -> Result<AgentStatus, MailboxError> {
        Ok(self
            .0
            .store
            .call(move |s| {
                if let Some(v) = &identity {
                    s.set_identity_text(v)?;
                }
                if let Some(v) = &current_task {
                    s.set_current_task(v)?;
                }
                Ok(AgentStatus {
                    identity: s.identity_text()?,
                    current_task: s.current_task()?,
                })
            })
            .await?)
    }

    /// The status with up to `limit` memories to restore after a context reset: those that
    /// match the current task first, then the most recent.
    pub async fn startup(
        &self,
        limit: usize,
    ) -> Result<(AgentStatus, Vec<Recalled>), MailboxError> {
        Ok(self
            .0
            .store
            .call(move |s| {
                let task = s.current_task()?;
                let mut found = match &task {
                    Some(t) => s.recall(Some(t), limit).unwrap_or_default(),
                    None => Vec::new(),
                };
                for r in s.recall(None, limit)? {
                    if found.len() < limit && !found.iter().any(|f| f.memory.id == r.memory.id) {
                        found.push(r);
                    }
                }
                let status = AgentStatus {
                    identity: s.identity_text()?,
                    current_task: task,
                };
                Ok((status, found))
            })
            .await?)
    }
}
