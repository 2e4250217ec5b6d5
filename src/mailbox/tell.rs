//! The owner writing to this agent from a process that runs its mailbox (the dashboard):
//! signed with the owner key the caller unlocked, stored as received mail, announced by the
//! watcher like any other.

use super::{Mailbox, MailboxError};
use crate::agent::voice;
use crate::crypto::Owner;
use crate::protocol::MessageId;

impl Mailbox {
    /// Stores the owner's message to this agent, signed by `signer`, and wakes the watcher.
    pub async fn tell(
        &self,
        signer: &Owner,
        subject: Option<&str>,
        body: &str,
    ) -> Result<MessageId, MailboxError> {
        let (message, signature) = voice::compose(signer, self.name(), subject, body)?;
        let id = message.id;
        self.0
            .store
            .call(move |s| s.insert_owner_message(&message, &signature))
            .await?;
        self.0.signals.wake.notify_one();
        Ok(id)
    }
}
