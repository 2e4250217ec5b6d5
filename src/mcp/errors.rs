//! The one mapping from the domain's errors ([`MailboxError`]) to what a tool tells the
//! model: the domain's sentence, and what it means for the call (nothing was sent; try again
//! later), with what the model can do about a refused recipient or an unknown message.

use super::server::MailslotServer;
use crate::mailbox::MailboxError;
use crate::store::StoreError;

/// What the failed call was doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Doing {
    /// Reading or changing the agent's own store.
    Local,
    /// Asking the relay (consent, directory, presence, whois).
    Asking,
    /// Sending a message or a receipt.
    Sending,
}

impl MailslotServer {
    /// The tool error for `error`, raised while `doing`.
    pub(super) async fn tool_error(&self, error: MailboxError, doing: Doing) -> String {
        match error {
            MailboxError::NotSent(reason) => self.not_sent(&reason).await,
            MailboxError::Store(StoreError::NoSuchMessage { part }) => no_message(&part),
            // A refused value names the field and the limit; waiting would not change it.
            MailboxError::Invalid(e) if doing != Doing::Sending => e.to_string(),
            e => match doing {
                Doing::Local => e.to_string(),
                Doing::Asking => format!("{e}. Try again later."),
                Doing::Sending => format!("{e}. Nothing was sent."),
            },
        }
    }

    /// A permanent refusal, with what the model can do about it.
    async fn not_sent(&self, reason: &str) -> String {
        let known = self
            .mailbox
            .pinned_contacts()
            .await
            .map(|c| {
                c.iter()
                    .map(|c| c.address.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            })
            .unwrap_or_default();
        let known = if known.is_empty() {
            "none yet".to_owned()
        } else {
            known
        };
        format!(
            "not sent: {reason} (relay {}). Known contacts: {known}. Check the address with the user; a stranger may first need request_contact. The message is kept in your sent mail, marked failed.",
            self.mailbox.relay().authority()
        )
    }
}

/// No message with the id (or id part) `id`.
pub(super) fn no_message(id: &impl std::fmt::Display) -> String {
    format!("no message with id {id}; list messages with the inbox or search tool")
}
