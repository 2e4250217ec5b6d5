//! Receipts and the sent view: acknowledging received mail (a sealed receipt to its sender,
//! through the outbox) and where each sent message stands.

use jiff::Timestamp;

use super::{Mailbox, MailboxError, SendOutcome};
use crate::protocol::{MessageId, ValidationError, validate_answer};
use crate::store::{Acknowledged, SentItem, SentState};

/// What [`Mailbox::acknowledge`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AckOutcome {
    /// The receipt was handed to the relay (or waits in the outbox).
    Sent(SendOutcome),
    /// The message was acknowledged before, at this time; nothing was sent again.
    Already(Timestamp),
}

impl Mailbox {
    /// Acknowledges the received message `id` to its sender, with an optional short answer
    /// (at most [`crate::protocol::MAX_ANSWER_CHARS`] characters; empty is none). Once per
    /// message: a second call sends nothing.
    pub async fn acknowledge(
        &self,
        id: MessageId,
        answer: Option<String>,
    ) -> Result<AckOutcome, MailboxError> {
        let answer = answer.filter(|a| !a.trim().is_empty());
        if let Some(a) = &answer {
            validate_answer(a)?;
        }
        let me = self.0.address.clone();
        let (done, outcome) = self
            .queue_then_send(move |s| {
                let done = s.acknowledge(&me, &id, answer)?;
                let queued = match &done {
                    Acknowledged::Now(receipt) => Some(*receipt),
                    Acknowledged::Before(_) | Acknowledged::OwnMessage => None,
                };
                Ok((done, queued))
            })
            .await?;
        match (done, outcome) {
            (Acknowledged::Now(_), Some(outcome)) => Ok(AckOutcome::Sent(outcome)),
            (Acknowledged::Before(at), _) => Ok(AckOutcome::Already(at)),
            _ => Err(ValidationError::new(
                "message_id",
                format!("{id} is a message you sent; only its recipients can acknowledge it"),
            )
            .into()),
        }
    }

    /// Sent messages with where each stands (per recipient too), newest first, at most
    /// `limit`; only those in `state` when given.
    pub async fn sent(
        &self,
        state: Option<SentState>,
        limit: usize,
    ) -> Result<Vec<SentItem>, MailboxError> {
        Ok(self.0.store.call(move |s| s.sent(state, limit)).await?)
    }
}
