//! Ids and names that start with what a person typed, for an MCP client's completions: read
//! from the agent's own store, bounded, never from the relay.

use super::{Mailbox, MailboxError};
use crate::protocol::{Address, MessageId, ThreadId};

impl Mailbox {
    /// Ids of stored mail that start with `prefix`, newest first, at most `limit`.
    pub async fn message_ids_starting(
        &self,
        prefix: String,
        limit: usize,
    ) -> Result<Vec<MessageId>, MailboxError> {
        Ok(self
            .0
            .store
            .call(move |s| s.message_ids_starting(&prefix, limit))
            .await?)
    }

    /// Ids of threads that start with `prefix`, newest first, at most `limit`.
    pub async fn thread_ids_starting(
        &self,
        prefix: String,
        limit: usize,
    ) -> Result<Vec<ThreadId>, MailboxError> {
        Ok(self
            .0
            .store
            .call(move |s| s.thread_ids_starting(&prefix, limit))
            .await?)
    }

    /// The agents this one knows (their keys are pinned here) whose address starts with
    /// `prefix`, ignoring case, sorted, at most `limit`.
    pub async fn known_agents_starting(
        &self,
        prefix: &str,
        limit: usize,
    ) -> Result<Vec<Address>, MailboxError> {
        let prefix = prefix.trim().to_lowercase();
        let mut found: Vec<Address> = self
            .pinned_contacts()
            .await?
            .into_iter()
            .map(|c| c.address)
            .filter(|a| a.to_string().to_lowercase().starts_with(&prefix))
            .collect();
        found.sort_by_key(|a| a.to_string());
        found.dedup();
        found.truncate(limit);
        Ok(found)
    }
}
