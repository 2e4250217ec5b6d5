//! New mail, live: each open page subscribes to every agent's mailbox, which announces each
//! message once it is committed to the store (read once, whole, by the mailbox), and gets a
//! [`LiveMail`] summary of it as a Server-Sent Event (`event: mail`, JSON data). The page's
//! script puts the sender's words into the page with `textContent`, never as HTML.

use std::convert::Infallible;
use std::time::Duration;

use axum::response::sse::{Event, KeepAlive, Sse};
use futures_util::{Stream, StreamExt};
use serde::Serialize;

use tokio_util::sync::CancellationToken;

use super::pages::{Mark, marks, when};
use crate::doorbell::frame;
use crate::mailbox::{Arrived, Feed, Heard, Mailbox, MailboxEvent};
use crate::protocol::{AgentName, MessageId};
use crate::store::Trust;

/// The longest subject sent to a page (characters).
const SUBJECT_CHARS: usize = 200;

/// A received message, as a page's inbox shows it.
#[derive(Debug, Clone, Serialize)]
pub struct LiveMail {
    /// The receiving agent.
    pub agent: AgentName,
    /// The message.
    pub id: MessageId,
    /// Its verified sender, or "you, the owner" for the owner's verified message.
    pub from: String,
    /// The sender's subject, on one line (text: the page never parses it as HTML).
    pub subject: String,
    /// When the sender says it was sent, as the server-rendered rows show it.
    pub sent_at: String,
    /// Its marks in words (a changed key, urgency, an acknowledgement request), as the
    /// server-rendered rows show them.
    pub marks: Vec<Mark>,
}

impl LiveMail {
    fn new(agent: &AgentName, arrived: &Arrived) -> Self {
        let m = &arrived.stored.message;
        Self {
            agent: agent.clone(),
            id: m.id,
            from: if arrived.stored.trust == Trust::Owner {
                "you, the owner".to_owned()
            } else {
                m.from.to_string()
            },
            subject: frame::one_line(&m.subject, SUBJECT_CHARS),
            sent_at: when(m.sent_at),
            marks: marks(m, arrived.stored.trust),
        }
    }
}

/// One agent's new mail as events for a page; a page that fell behind is told to reload
/// (it then reads the store).
fn agent_events(agent: AgentName, feed: Feed<MailboxEvent>) -> impl Stream<Item = Event> {
    futures_util::stream::unfold((agent, feed), |(agent, mut feed)| async move {
        loop {
            let event = match feed.next().await? {
                Heard::Event(MailboxEvent::Mail(arrived)) => Event::default()
                    .event("mail")
                    .json_data(LiveMail::new(&agent, &arrived))
                    .expect("a summary always serializes"),
                Heard::Event(MailboxEvent::Relay(_)) => continue,
                Heard::Missed(_) => Event::default().event("reload").data("lagged"),
            };
            return Some((event, (agent, feed)));
        }
    })
}

/// The live stream of `agents`' new mail, until `stop` fires.
pub fn events(
    agents: &[(AgentName, Mailbox)],
    stop: CancellationToken,
) -> Sse<impl Stream<Item = Result<Event, Infallible>> + use<>> {
    let every_agent = futures_util::stream::select_all(agents.iter().map(|(name, mailbox)| {
        Box::pin(agent_events(
            name.clone(),
            mailbox.subscribe("dashboard page"),
        ))
    }));
    // Ends with the dashboard, so that its graceful shutdown does not wait for open pages.
    let stream = every_agent
        .take_until(async move { stop.cancelled().await })
        .map(Ok);
    Sse::new(stream).keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
}
