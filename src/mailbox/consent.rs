//! Contacts: asking another agent's owner for contact, the consent state the relay holds
//! (over the held session, through `client::consent`), and the peers whose keys are pinned.
//! Approving and the other owner's decisions are not here: only the owner key signs them.

use super::{Mailbox, MailboxError};
use crate::client::consent::{self, ConsentState, ContactRequest};
use crate::protocol::{Address, validate_note};
use crate::store::Contact;

impl Mailbox {
    /// Asks `to`'s owner to accept mail from this agent; `note` is for that owner. A pending
    /// request's code is for this agent's owner only: never show it to a model.
    pub async fn request_contact(
        &self,
        to: Address,
        note: String,
    ) -> Result<ContactRequest, MailboxError> {
        validate_note(&note)?;
        let asked = to.clone();
        let answer = consent::request(&mut self.asking().await?, to, note).await?;
        // A denial of the request before is old news once this one is open.
        self.0.store.call(move |s| s.forget_denial(&asked)).await?;
        Ok(answer)
    }

    /// The agent's consent state on the relay: policy, contacts, blocks, open requests.
    pub async fn consent_state(&self) -> Result<ConsentState, MailboxError> {
        Ok(consent::state(&mut self.asking().await?).await?)
    }

    /// The peers whose keys this agent has pinned.
    pub async fn pinned_contacts(&self) -> Result<Vec<Contact>, MailboxError> {
        Ok(self.0.store.call(|s| s.contacts()).await?)
    }
}
