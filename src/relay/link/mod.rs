//! Links to other relays: mail for their agents waits here in their relay's mailbox (`@host`)
//! and a link delivers it, in order, with the guarantees of the client protocol. `dial` is
//! the side that holds mail and connects; `answer` is the `/v1/relay` endpoint that takes it;
//! `peer` finds and pins another relay's key.

mod answer;
mod bounces;
mod consent;
mod dial;
mod peer;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::{Notify, mpsc};

pub use answer::run as answer;
pub(super) use dial::{ask, supervise};

use super::storage::Committed;
use crate::protocol::RelayName;

/// Resolves when the relay shuts down.
async fn stopped(shutdown: &mut tokio::sync::watch::Receiver<bool>) {
    let _ = shutdown.wait_for(|s| *s).await;
}

/// A link to start: the relay, and what wakes it.
type Start = (RelayName, Arc<Notify>);

/// The running links, by the relay they deliver to. A copy committed for a relay's mailbox
/// wakes its link, started on first need.
#[derive(Default)]
pub struct Links {
    woken: Mutex<HashMap<RelayName, Arc<Notify>>>,
    start: Mutex<Option<mpsc::UnboundedSender<Start>>>,
}

impl Links {
    /// Wakes the link to `relay`, or has one started.
    pub fn wake(&self, relay: &RelayName) {
        let mut woken = self.woken.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(notify) = woken.get(relay) {
            notify.notify_one();
            return;
        }
        let notify = Arc::new(Notify::new());
        notify.notify_one();
        let start = self.start.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(start) = start.as_ref()
            && start.send((relay.clone(), notify.clone())).is_ok()
        {
            woken.insert(relay.clone(), notify);
        }
    }

    /// Wakes the links of the relays among these copies' recipients.
    pub fn announce(&self, committed: &[Committed]) {
        let mut last: Option<&crate::protocol::AgentName> = None;
        for copy in committed {
            if last == Some(&copy.recipient) {
                continue;
            }
            last = Some(&copy.recipient);
            if let Some(relay) = copy.recipient.mailbox_relay() {
                self.wake(&relay);
            }
        }
    }

    /// Where new links are asked for (the supervisor, once it runs).
    fn serve(&self) -> mpsc::UnboundedReceiver<Start> {
        let (tx, rx) = mpsc::unbounded_channel();
        *self.start.lock().unwrap_or_else(|e| e.into_inner()) = Some(tx);
        rx
    }

    /// Forgets a link that ended, so the next copy starts a new one.
    fn ended(&self, relay: &RelayName, notify: &Arc<Notify>) {
        let mut woken = self.woken.lock().unwrap_or_else(|e| e.into_inner());
        if woken.get(relay).is_some_and(|n| Arc::ptr_eq(n, notify)) {
            woken.remove(relay);
        }
    }
}
