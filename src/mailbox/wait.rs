//! Waiting for mail: the doorbell for clients with no push (Codex, Cursor, scripts). A wait
//! returns as soon as unread mail is in the store, whoever stored it (this process's relay
//! session or another process's), and hands it over read, like the read tool.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::{Heard, Mailbox, MailboxError, MailboxEvent};
use crate::store::{Contact, InboxQuery, StoredMessage};

/// Unread messages with their senders' pinned contacts.
pub type Delivered = Vec<(StoredMessage, Option<Contact>)>;

impl Mailbox {
    /// Waits up to `timeout` (or until `stop` fires) for unread mail. Returns at most
    /// `limit` unread messages, newest first, each with its sender's contact, and marks them
    /// read; empty when the time ran out.
    pub async fn wait_for_unread(
        &self,
        timeout: Duration,
        limit: usize,
        stop: &CancellationToken,
    ) -> Result<Delivered, MailboxError> {
        // Subscribed before the first look, so mail committed in between is not missed.
        let mut events = self.subscribe("wait_for_mail");
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let found = self.take_unread(limit).await?;
            if !found.is_empty() {
                return Ok(found);
            }
            loop {
                tokio::select! {
                    _ = stop.cancelled() => return Ok(Vec::new()),
                    _ = tokio::time::sleep_until(deadline) => return Ok(Vec::new()),
                    heard = events.next() => match heard {
                        Some(Heard::Event(MailboxEvent::Mail(_)) | Heard::Missed(_)) => break,
                        Some(Heard::Event(MailboxEvent::Relay(_))) => {}
                        None => return Ok(Vec::new()),
                    },
                }
            }
        }
    }

    async fn take_unread(&self, limit: usize) -> Result<Delivered, MailboxError> {
        let query = InboxQuery {
            limit,
            ..InboxQuery::default()
        };
        let me = self.0.address.clone();
        let delivered: Delivered = self
            .0
            .store
            .call(move |s| {
                let unread = s.inbox(&query)?;
                let ids: Vec<_> = unread.iter().map(|m| m.message.id).collect();
                s.mark_read(&me, &ids)?;
                unread
                    .into_iter()
                    .map(|m| {
                        let contact = s.contact(&m.message.from)?;
                        Ok((m, contact))
                    })
                    .collect()
            })
            .await?;
        if !delivered.is_empty() {
            // Read receipts the marking queued.
            self.flush_outbox().await;
        }
        Ok(delivered)
    }
}
