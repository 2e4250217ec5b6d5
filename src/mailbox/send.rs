//! Sending: a message is stored and queued first (so nothing is lost when the relay is
//! away), then handed to the relay; the caller learns whether the relay accepted it.

use serde::Serialize;
use tokio::sync::broadcast;

use super::{Mailbox, MailboxError, RelayStatus, SEND_WAIT};
use crate::client::ClientEvent;
use crate::protocol::{Limits, Message};

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
    pub async fn send(&self, message: Message) -> Result<SendOutcome, MailboxError> {
        message.validate(&Limits::default())?;
        let id = message.id;
        let session = self.session().await;
        let mut events = session.as_ref().map(|s| s.subscribe());
        self.0
            .store
            .call(move |s| s.queue_outgoing(&message))
            .await?;
        let Some(session) = session else {
            return self.wait_for_holder(id).await;
        };
        if let status @ RelayStatus::Offline { .. } = self.status() {
            return Ok(SendOutcome::Queued {
                reason: status.describe(self.relay()),
            });
        }
        session.flush();
        let events = events
            .as_mut()
            .expect("subscribed while holding the session");
        let answer = tokio::time::timeout(SEND_WAIT, async {
            loop {
                match events.recv().await {
                    Ok(ClientEvent::Sent(ids)) if ids.contains(&id) => {
                        return Ok(SendOutcome::Sent);
                    }
                    Ok(ClientEvent::NotSent {
                        id: failed,
                        reason,
                        will_retry,
                    }) if failed == id => {
                        return if will_retry {
                            Ok(SendOutcome::Queued { reason })
                        } else {
                            Err(MailboxError::NotSent(reason))
                        };
                    }
                    Ok(ClientEvent::Disconnected { reason, .. }) => {
                        return Ok(SendOutcome::Queued {
                            reason: RelayStatus::Offline { reason }.describe(self.relay()),
                        });
                    }
                    Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => {}
                    Err(broadcast::error::RecvError::Closed) => {
                        return Ok(SendOutcome::Queued {
                            reason: "the relay connection stopped".into(),
                        });
                    }
                }
            }
        })
        .await;
        answer.unwrap_or_else(|_| {
            Ok(SendOutcome::Queued {
                reason: format!(
                    "the relay has not answered within {} s; the message stays queued",
                    SEND_WAIT.as_secs()
                ),
            })
        })
    }

    /// Another process holds the connection: it sends what this one queued. Wait until the
    /// message leaves the outbox, fails, or [`SEND_WAIT`] passes.
    async fn wait_for_holder(
        &self,
        id: crate::protocol::MessageId,
    ) -> Result<SendOutcome, MailboxError> {
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
