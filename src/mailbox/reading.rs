//! Reading received mail: listing, reading and marking read. Marking read is where read
//! receipts start (when the owner turned them on, the store queues one per message read in
//! the same transaction), so every path that marks mail read goes through here.

use super::{Mailbox, MailboxError};
use crate::protocol::MessageId;
use crate::store::{Contact, InboxQuery, StoredMessage};

impl Mailbox {
    /// Received messages matching `query`: unread first, newest first.
    pub async fn inbox(&self, query: InboxQuery) -> Result<Vec<StoredMessage>, MailboxError> {
        Ok(self.0.store.call(move |s| s.inbox(&query)).await?)
    }

    /// One message with its sender's pinned contact, marked read (as it was before marking
    /// is what comes back); `None` when there is no such message.
    pub async fn read(
        &self,
        id: MessageId,
    ) -> Result<Option<(StoredMessage, Option<Contact>)>, MailboxError> {
        let Some(found) = self.message_and_sender(id).await? else {
            return Ok(None);
        };
        self.mark_read(vec![id]).await?;
        Ok(Some(found))
    }

    /// Marks messages read; returns how many were unread. Read receipts it queued go out now
    /// when this process holds the relay connection (else the holder notices them).
    pub async fn mark_read(&self, ids: Vec<MessageId>) -> Result<usize, MailboxError> {
        let me = self.0.address.clone();
        let changed = self.0.store.call(move |s| s.mark_read(&me, &ids)).await?;
        if changed > 0 {
            self.flush_outbox().await;
        }
        Ok(changed)
    }

    /// Asks the relay session, if this process holds it, to send the outbox now.
    pub(super) async fn flush_outbox(&self) {
        if let Some(session) = self.session().await {
            session.flush();
        }
    }
}
