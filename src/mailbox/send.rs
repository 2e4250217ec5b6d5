//! Sending: a message is stored and queued first (so nothing is lost when the relay is
//! away), then handed to the relay; the caller learns whether the relay accepted it.

use serde::Serialize;

use super::{Mailbox, MailboxError, RelayStatus, SEND_WAIT};
use crate::client::SendAnswer;
use crate::protocol::{Limits, Message, MessageId};
use crate::store::{Store, StoreError};

/// What became of a message handed to [`Mailbox::send`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum SendOutcome {
    /// The relay stored it for its recipients.
    Sent,
    /// It waits in the outbox and goes out when the relay takes it.
    Queued {
        /// Why it is not sent yet.
        reason: String,
    },
}

impl Mailbox {
    /// Validates, stores and queues `message`, then waits (up to [`SEND_WAIT`]) for the relay's
    /// answer. A permanent refusal (unknown recipient, no consent, too big) is an error; the
    /// message then stays in the sent mail, marked failed.
    #[tracing::instrument(name = "send", level = "debug", skip_all, fields(id = %message.id))]
    pub async fn send(&self, message: Message) -> Result<SendOutcome, MailboxError> {
        message.validate(&Limits::default())?;
        let id = message.id;
        let ((), outcome) = self
            .queue_then_send(move |s| {
                s.queue_outgoing(&message)?;
                Ok(((), Some(id)))
            })
            .await?;
        Ok(outcome.expect("a queued message is handed over"))
    }

    /// Runs `queue` on the store (which returns a value and the id of the message it queued,
    /// if any), then hands that message to the relay and waits (up to [`SEND_WAIT`]) for the
    /// answer, like [`Mailbox::send`].
    pub(super) async fn queue_then_send<T, F>(
        &self,
        queue: F,
    ) -> Result<(T, Option<SendOutcome>), MailboxError>
    where
        T: Send + 'static,
        F: FnOnce(&mut Store) -> Result<(T, Option<MessageId>), StoreError> + Send + 'static,
    {
        let session = self.session().await;
        let expecting = session.clone();
        // The wait starts on the store's thread, in the call that queued the message: the
        // session reads the outbox through that thread too, so the answer cannot come first.
        let (value, queued, waiting) = self
            .0
            .store
            .call(move |s| {
                let (value, queued) = queue(s)?;
                let waiting = queued.zip(expecting).map(|(id, s)| s.expect(id));
                Ok((value, queued, waiting))
            })
            .await?;
        let Some(id) = queued else {
            return Ok((value, None));
        };
        let Some(session) = session else {
            return Ok((value, Some(self.wait_for_holder(id).await?)));
        };
        if let status @ RelayStatus::Offline { .. } = self.status() {
            return Ok((
                value,
                Some(SendOutcome::Queued {
                    reason: status.describe(self.relay()),
                }),
            ));
        }
        let mut waiting = waiting.expect("expected while holding the session");
        session.flush();
        let answer = tokio::time::timeout(SEND_WAIT, async {
            match waiting.answer().await {
                Some(SendAnswer::Sent) => Ok(SendOutcome::Sent),
                Some(SendAnswer::NotSent {
                    reason,
                    will_retry: true,
                }) => Ok(SendOutcome::Queued { reason }),
                Some(SendAnswer::NotSent { reason, .. }) => Err(MailboxError::NotSent(reason)),
                Some(SendAnswer::Offline { reason }) => Ok(SendOutcome::Queued {
                    reason: RelayStatus::Offline { reason }.describe(self.relay()),
                }),
                None => Ok(SendOutcome::Queued {
                    reason: "the relay connection stopped".into(),
                }),
            }
        })
        .await;
        let outcome = answer.unwrap_or_else(|_| {
            Ok(SendOutcome::Queued {
                reason: format!(
                    "the relay has not answered within {} s; the message stays queued",
                    SEND_WAIT.as_secs()
                ),
            })
        })?;
        Ok((value, Some(outcome)))
    }

    /// Another process holds the connection: it sends what this one queued. Wait until the
    /// message leaves the outbox, fails, or [`SEND_WAIT`] passes.
    async fn wait_for_holder(&self, id: MessageId) -> Result<SendOutcome, MailboxError> {
        let mut rounds = self.0.rounds.subscribe();
        let waiting = async {
            loop {
                match self.0.store.call(move |s| s.outbox_entry(&id)).await? {
                    None => return Ok(SendOutcome::Sent),
                    Some((true, error)) => {
                        return Err(MailboxError::NotSent(error.unwrap_or_default()));
                    }
                    Some((false, _)) => {}
                }
                if rounds.changed().await.is_err() {
                    return Ok(SendOutcome::Queued {
                        reason: "the mailbox is closing".into(),
                    });
                }
            }
        };
        tokio::time::timeout(SEND_WAIT, waiting)
            .await
            .unwrap_or_else(|_| {
                Ok(SendOutcome::Queued {
                    reason: format!(
                        "{}; it has not sent this yet",
                        self.status().describe(self.relay())
                    ),
                })
            })
    }
}
