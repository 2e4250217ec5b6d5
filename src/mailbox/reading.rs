//! Reading mail: listing, searching, threads, reading and marking read, and what each client
//! session was shown. Marking read is where read receipts start (when the owner turned them
//! on, the store queues one per message read in the same transaction), so every path that
//! marks mail read goes through here.

use super::{Mailbox, MailboxError};
use crate::protocol::{MessageId, ThreadId};
use crate::store::{
    Contact, IdlePath, InboxQuery, Page, SessionKey, Store, StoreError, StoredMessage,
    UnreadSummary, Via,
};

/// A list of mail and the unread summary, read in one store call and one read transaction: the
/// list and its unread count agree, and a list tool pays one trip to the store thread.
#[derive(Debug)]
pub struct Listed {
    /// The messages listed, in the list's order.
    pub messages: Vec<StoredMessage>,
    /// How much received mail is unread, and from whom the newest is.
    pub unread: UnreadSummary,
}

impl Mailbox {
    /// Received messages matching `query`: unread first, newest first.
    pub async fn inbox(&self, query: InboxQuery) -> Result<Listed, MailboxError> {
        self.listed(move |s| s.inbox(&query)).await
    }

    /// `list`'s messages and the unread summary, in one store call.
    async fn listed(
        &self,
        list: impl FnOnce(&Store) -> Result<Vec<StoredMessage>, StoreError> + Send + 'static,
    ) -> Result<Listed, MailboxError> {
        Ok(self
            .0
            .store
            .call(move |s| {
                s.reading(|s| {
                    Ok(Listed {
                        messages: list(s)?,
                        unread: s.unread_summary()?,
                    })
                })
            })
            .await?)
    }

    /// Received messages, read or not, newest first, older than the received message `before`
    /// if given; at most `limit`, and how many older ones follow (the dashboard's pages; the
    /// CLI's `inbox --all` pages the same way).
    pub async fn received_page(
        &self,
        before: Option<MessageId>,
        limit: usize,
    ) -> Result<Page<StoredMessage>, MailboxError> {
        let query = InboxQuery {
            unread_only: false,
            limit,
            ..InboxQuery::default()
        };
        Ok(self
            .0
            .store
            .call(move |s| s.inbox_page(&query, before.as_ref()))
            .await?)
    }

    /// How many messages were received, and how many of them are unread.
    pub async fn received_counts(&self) -> Result<(u64, u64), MailboxError> {
        Ok(self
            .0
            .store
            .call(|s| Ok((s.received_count(false)?, s.received_count(true)?)))
            .await?)
    }

    /// How much received mail is unread, and from whom the newest is.
    pub async fn unread_summary(&self) -> Result<UnreadSummary, MailboxError> {
        Ok(self.0.store.call(|s| s.unread_summary()).await?)
    }

    /// Mail, received and sent, matching the words of `query`; best first, at most `limit`.
    pub async fn search(&self, query: String, limit: usize) -> Result<Listed, MailboxError> {
        self.listed(move |s| s.search_messages(&query, limit)).await
    }

    /// One message, as stored, without marking it read; `None` when there is no such message.
    pub async fn message(&self, id: MessageId) -> Result<Option<StoredMessage>, MailboxError> {
        Ok(self.0.store.call(move |s| s.message(&id)).await?)
    }

    /// A stored message and its sender's pinned contact, if both are known; not marked read.
    pub async fn message_and_sender(
        &self,
        id: MessageId,
    ) -> Result<Option<(StoredMessage, Option<Contact>)>, MailboxError> {
        Ok(self
            .0
            .store
            .call(move |s| {
                let Some(stored) = s.message(&id)? else {
                    return Ok(None);
                };
                let contact = s.contact(&stored.message.from)?;
                Ok(Some((stored, contact)))
            })
            .await?)
    }

    /// Every message of a thread, in and out, oldest first, each with its sender's pinned
    /// contact; empty when there is no such thread. Nothing is marked read.
    pub async fn thread(
        &self,
        id: ThreadId,
    ) -> Result<Vec<(StoredMessage, Option<Contact>)>, MailboxError> {
        Ok(self
            .0
            .store
            .call(move |s| {
                let messages = s.thread(&id)?;
                let mut with_contacts = Vec::with_capacity(messages.len());
                for m in messages {
                    let contact = s.contact(&m.message.from)?;
                    with_contacts.push((m, contact));
                }
                Ok(with_contacts)
            })
            .await?)
    }

    /// Records that `ids` were put in front of the client session `session`'s model (so its
    /// hooks do not show them again).
    pub async fn mark_shown(
        &self,
        session: SessionKey,
        ids: Vec<MessageId>,
        via: Via,
    ) -> Result<(), MailboxError> {
        Ok(self
            .0
            .store
            .call(move |s| s.mark_shown(&session, &ids, via))
            .await?)
    }

    /// How `session`'s model was first shown message `id`, if it was.
    pub async fn shown_via(
        &self,
        session: SessionKey,
        id: MessageId,
    ) -> Result<Option<Via>, MailboxError> {
        Ok(self
            .0
            .store
            .call(move |s| s.shown_via(&session, &id))
            .await?)
    }

    /// Takes, for a doorbell about to ring `session`, those of `ids` that are unread and not
    /// yet shown to it (see `Store::take_for_ring`).
    pub async fn take_for_ring(
        &self,
        session: SessionKey,
        ids: Vec<MessageId>,
        via: Via,
    ) -> Result<Vec<MessageId>, MailboxError> {
        Ok(self
            .0
            .store
            .call(move |s| s.take_for_ring(&session, &ids, via))
            .await?)
    }

    /// Undoes a take whose ring failed, so the hooks show the messages after all.
    pub async fn give_back(
        &self,
        session: SessionKey,
        ids: Vec<MessageId>,
        via: Via,
    ) -> Result<(), MailboxError> {
        Ok(self
            .0
            .store
            .call(move |s| s.give_back(&session, &ids, via))
            .await?)
    }

    /// Claims (`Some`) or releases (`None`) the path by which this process wakes `session`.
    pub async fn claim_idle_path(
        &self,
        session: SessionKey,
        path: Option<IdlePath>,
    ) -> Result<(), MailboxError> {
        let pid = std::process::id();
        Ok(self
            .0
            .store
            .call(move |s| match path {
                Some(path) => s.claim_idle_path(&session, path, pid),
                None => s.release_idle_path(&session, pid),
            })
            .await?)
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
