//! New mail, live: each agent's mailbox announces mail once it is committed to the store; a
//! task per agent turns that into a [`LiveMail`] summary on one broadcast channel, and each
//! open page gets it as a Server-Sent Event (`event: mail`, JSON data). The page's script puts
//! the sender's words into the page with `textContent`, never as HTML.

use std::convert::Infallible;
use std::time::Duration;

use axum::extract::State;
use axum::response::sse::{Event, KeepAlive, Sse};
use futures_util::Stream;
use jiff::Timestamp;
use serde::Serialize;
use tokio::sync::broadcast;

use super::routes::AppState;
use crate::doorbell::frame;
use crate::mailbox::{Mailbox, MailboxEvent};
use crate::protocol::{Address, AgentName, MessageId};
use crate::store::Trust;

/// Summaries kept for a slow page before the oldest are dropped.
const BACKLOG: usize = 256;
/// The longest subject sent to a page (characters).
const SUBJECT_CHARS: usize = 200;

/// A received message, as a page's inbox shows it.
#[derive(Debug, Clone, Serialize)]
pub struct LiveMail {
    /// The receiving agent.
    pub agent: AgentName,
    /// The message.
    pub id: MessageId,
    /// Its verified sender.
    pub from: Address,
    /// The sender's subject, on one line (text: the page never parses it as HTML).
    pub subject: String,
    /// When the sender says it was sent.
    pub sent_at: Timestamp,
    /// How far the sender is vouched for.
    pub trust: Trust,
}

/// The channel every page listens on.
pub fn channel() -> broadcast::Sender<LiveMail> {
    broadcast::channel(BACKLOG).0
}

/// Forwards `mailbox`'s new mail to `live` until the mailbox closes.
pub async fn forward(mailbox: Mailbox, live: broadcast::Sender<LiveMail>) {
    let mut events = mailbox.subscribe();
    loop {
        let id = match events.recv().await {
            Ok(MailboxEvent::Mail { id, .. }) => id,
            Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => continue,
            Err(broadcast::error::RecvError::Closed) => return,
        };
        let stored = match mailbox.message(id).await {
            Ok(Some(stored)) => stored,
            Ok(None) => continue,
            Err(e) => {
                tracing::warn!(error = %e, "dashboard: cannot read new mail");
                continue;
            }
        };
        let _ = live.send(LiveMail {
            agent: mailbox.name().clone(),
            id,
            from: stored.message.from.clone(),
            subject: frame::one_line(&stored.message.subject, SUBJECT_CHARS),
            sent_at: stored.message.sent_at,
            trust: stored.trust,
        });
    }
}

/// `GET /events`: the live stream.
pub async fn events(
    State(app): State<AppState>,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let receiver = app.live.subscribe();
    let stop = app.stop.clone();
    // Ends with the dashboard, so that its graceful shutdown does not wait for open pages.
    let stream = futures_util::stream::unfold(receiver, move |mut receiver| {
        let stop = stop.clone();
        async move {
            let received = tokio::select! {
                () = stop.cancelled() => return None,
                r = receiver.recv() => r,
            };
            let event = match received {
                Ok(mail) => Event::default()
                    .event("mail")
                    .json_data(&mail)
                    .expect("a summary always serializes"),
                // The page missed some: it reloads and reads the store.
                Err(broadcast::error::RecvError::Lagged(_)) => {
                    Event::default().event("reload").data("lagged")
                }
                Err(broadcast::error::RecvError::Closed) => return None,
            };
            Some((Ok(event), receiver))
        }
    });
    Sse::new(stream).keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
}
