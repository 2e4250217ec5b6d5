//! What a mailbox announces, and the one rule for a subscriber that falls behind.
//!
//! Events travel one way: the client session tells the mailbox's [`Signals`] what happened
//! (mail committed, consent and sent-mail news, the connection's state); the watcher reads
//! each committed message once, whole and with its sender, and broadcasts it as an
//! [`Arrived`]; subscribers (the doorbell, the dashboard, MCP pushes, waits) render from the
//! event without reading the store again.

use std::sync::{Arc, Mutex};

use tokio::sync::{Notify, broadcast, watch};

use super::RelayStatus;
use crate::client::{ClientEvent, Listener, RelayNews};
use crate::store::{Contact, StoredMessage};

/// Events kept for a subscriber that falls behind before it misses the oldest.
const EVENT_BACKLOG: usize = 1024;

/// A received message, read once from the store after its commit.
#[derive(Debug)]
pub struct Arrived {
    /// The message as stored (trust, time received, attachments' names and sizes).
    pub stored: StoredMessage,
    /// Its sender's pinned contact, if any.
    pub sender: Option<Contact>,
}

/// What the mailbox announces.
#[derive(Debug, Clone)]
pub enum MailboxEvent {
    /// A received message was committed to the store.
    Mail(Arc<Arrived>),
    /// News from the relay, recorded in the store before it is told (only the process holding
    /// the connection hears it).
    Relay(RelayNews),
}

impl MailboxEvent {
    /// Whether the sent view changed: a copy was delivered or bounced, or a receipt came.
    pub fn changes_sent_view(&self) -> bool {
        matches!(self, MailboxEvent::Relay(news) if news.changes_sent_view())
    }
}

/// What a subscriber hears next.
#[derive(Debug)]
pub enum Heard<T> {
    /// The next event.
    Event(T),
    /// The subscriber fell behind and missed this many events.
    Missed(u64),
}

/// A subscription to a broadcast of events: the mailbox's, or the doorbell's rings.
///
/// The one policy for a subscriber that falls behind: the oldest events are dropped for it
/// (the broadcast never waits for it, so a stuck page or client cannot hold up the mailbox),
/// it is told how many with [`Heard::Missed`] (logged here, once), and it goes on from the
/// oldest event still kept. Everything it missed is in the store: a subscriber that shows
/// state re-reads it; one that rings a model does not ring the missed ones (the unread notice
/// on every tool result and the inbox still show them).
pub struct Feed<T> {
    receiver: broadcast::Receiver<T>,
    name: &'static str,
}

impl<T: Clone> Feed<T> {
    /// A subscription to `sender`; `name` says who subscribes, in the log.
    pub fn new(sender: &broadcast::Sender<T>, name: &'static str) -> Self {
        Self::from_receiver(sender.subscribe(), name)
    }

    fn from_receiver(receiver: broadcast::Receiver<T>, name: &'static str) -> Self {
        Self { receiver, name }
    }

    /// The next event, or what was missed; `None` once the broadcast has ended.
    pub async fn next(&mut self) -> Option<Heard<T>> {
        match self.receiver.recv().await {
            Ok(event) => Some(Heard::Event(event)),
            Err(broadcast::error::RecvError::Lagged(missed)) => {
                tracing::warn!(
                    subscriber = self.name,
                    missed,
                    "fell behind; what it missed is in the store"
                );
                Some(Heard::Missed(missed))
            }
            Err(broadcast::error::RecvError::Closed) => None,
        }
    }
}

/// Where the client session's events land: the mailbox's status, the watcher's wake-up and
/// the broadcast of events. Told directly by the session, on its task.
pub(super) struct Signals {
    /// Wakes the watcher (the session committed mail).
    pub wake: Notify,
    pub status: watch::Sender<RelayStatus>,
    pub events: broadcast::Sender<MailboxEvent>,
    /// A subscription made before the session started, for the doorbell: news the relay tells
    /// at login (a denial kept for an agent that was away) comes before any sink of the
    /// process could subscribe, and would otherwise ring nobody.
    since_open: Mutex<Option<broadcast::Receiver<MailboxEvent>>>,
}

impl Signals {
    pub fn new() -> Self {
        let (events, since_open) = broadcast::channel(EVENT_BACKLOG);
        Self {
            wake: Notify::new(),
            status: watch::channel(RelayStatus::Connecting).0,
            events,
            since_open: Mutex::new(Some(since_open)),
        }
    }

    /// Every event since the mailbox opened, for the first caller; later ones hear what comes
    /// from now on, like [`Feed::new`].
    pub fn since_open(&self, name: &'static str) -> Feed<MailboxEvent> {
        match self.since_open.lock().expect("not poisoned").take() {
            Some(receiver) => Feed::from_receiver(receiver, name),
            None => Feed::new(&self.events, name),
        }
    }
}

impl Listener for Signals {
    fn heard(&self, event: ClientEvent) {
        match event {
            ClientEvent::Connected { .. } => {
                self.status.send_replace(RelayStatus::Online);
            }
            ClientEvent::Disconnected { reason, retry_in } => {
                let retry_in_ms = retry_in.as_millis() as u64;
                // Once per outage, not once per retry.
                if matches!(*self.status.borrow(), RelayStatus::Offline { .. }) {
                    tracing::debug!(%reason, retry_in_ms, "relay still unreachable");
                } else {
                    tracing::warn!(%reason, retry_in_ms, "relay unreachable; mail is queued meanwhile");
                }
                self.status.send_replace(RelayStatus::Offline { reason });
            }
            // Announced from the store by the watcher, which reads it once, whole.
            ClientEvent::NewMail { .. } => self.wake.notify_one(),
            ClientEvent::Relay(news) => {
                let _ = self.events.send(MailboxEvent::Relay(news));
            }
        }
    }
}
