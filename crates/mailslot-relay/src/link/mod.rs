//! Links to other relays: mail for their agents waits here in their relay's mailbox (`@host`)
//! and a link delivers it, in order, with the guarantees of the client protocol. `dial` is
//! the side that holds mail and connects; `answer` is the `/v1/relay` endpoint that takes it;
//! `peer` finds and pins another relay's key; `reach` decides which addresses a named relay
//! may be reached at.

mod answer;
mod bounces;
mod consent;
mod dial;
mod peer;
mod reach;

use std::collections::HashMap;
use std::sync::Mutex;

use tokio::sync::mpsc;

pub use answer::run as answer;
pub(super) use dial::{ask, supervise};
pub use peer::DeniedLookups;
pub(super) use reach::{names_private, private_refusal};

use super::pushes::{self, PushSender, Pushes};
use super::storage::Committed;
use crate::protocol::{LINK_WINDOW, RelayName};

/// Resolves when the relay shuts down.
async fn stopped(shutdown: &mut tokio::sync::watch::Receiver<bool>) {
    let _ = shutdown.wait_for(|s| *s).await;
}

/// A link to start: the relay, and the copies committed for it.
type Start = (RelayName, Pushes);

/// Copies queued for one link at most; beyond that it reads its relay's mailbox.
const PUSH_BACKLOG: usize = 4 * LINK_WINDOW;
/// Bytes of copies queued for one link at most, likewise.
const PUSH_BYTES: usize = 8 * 1024 * 1024;

/// The running links, by the relay they deliver to. Copies committed for a relay's mailbox
/// are pushed to its link ([`crate::pushes`]), which is started on first need.
#[derive(Default)]
pub struct Links {
    running: Mutex<HashMap<RelayName, PushSender>>,
    start: Mutex<Option<mpsc::UnboundedSender<Start>>>,
}

impl Links {
    /// Has the link to `relay` read its mailbox, or has one started (which reads it first).
    pub fn wake(&self, relay: &RelayName) {
        let mut running = self.lock();
        match running.get(relay) {
            Some(link) => link.miss(),
            None => self.start(&mut running, relay),
        }
    }

    /// Hands the copies for other relays' mailboxes to their links, in commit order, and
    /// returns the rest (the copies for agents here).
    pub fn announce(&self, mut committed: Vec<Committed>) -> Vec<Committed> {
        let mut running = None;
        // The relay of the copy before, which is mostly this copy's.
        let mut last: Option<(crate::protocol::AgentName, RelayName)> = None;
        // A relay's mailbox is the one kind of name that starts with `@`.
        for copy in committed.extract_if(.., |c| c.recipient.as_str().starts_with('@')) {
            if last
                .as_ref()
                .is_none_or(|(mailbox, _)| *mailbox != copy.recipient)
            {
                last = copy
                    .recipient
                    .mailbox_relay()
                    .map(|r| (copy.recipient.clone(), r));
            }
            let Some((_, relay)) = &last else { continue };
            let running = running.get_or_insert_with(|| self.lock());
            match running.get(relay) {
                Some(link) => link.push(copy),
                None => self.start(running, relay),
            }
        }
        committed
    }

    /// Starts a link to `relay`; it reads the mailbox first, so what was committed before it
    /// listened is not missed.
    fn start(&self, running: &mut HashMap<RelayName, PushSender>, relay: &RelayName) {
        let (link, pushes) = pushes::channel(PUSH_BACKLOG, PUSH_BYTES);
        let start = self.start.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(start) = start.as_ref()
            && start.send((relay.clone(), pushes)).is_ok()
        {
            running.insert(relay.clone(), link);
        }
    }

    /// Where new links are asked for (the supervisor, once it runs).
    fn serve(&self) -> mpsc::UnboundedReceiver<Start> {
        let (tx, rx) = mpsc::unbounded_channel();
        *self.start.lock().unwrap_or_else(|e| e.into_inner()) = Some(tx);
        rx
    }

    /// Forgets a link that ended, so the next copy starts a new one.
    fn ended(&self, relay: &RelayName, pushes: &Pushes) {
        let mut running = self.lock();
        if running.get(relay).is_some_and(|link| link.feeds(pushes)) {
            running.remove(relay);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<RelayName, PushSender>> {
        self.running.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::AgentName;
    use crate::pushes::Pushed;

    fn copy(to: &AgentName, seq: u64) -> Committed {
        crate::pushes::test_copy(to, seq, 2)
    }

    #[test]
    fn a_relays_copies_go_to_its_link_and_an_overflow_makes_it_read() {
        let links = Links::default();
        let mut starts = links.serve();
        let relay = RelayName::new("relay-b.example").unwrap();
        let mailbox = AgentName::relay_mailbox(&relay).unwrap();
        let bob = AgentName::new("bob").unwrap();
        let rest = links.announce(vec![copy(&mailbox, 1), copy(&bob, 2)]);
        assert_eq!(rest, [copy(&bob, 2)], "an agent's copy is the sessions'");
        let (started, mut pushes) = starts.try_recv().expect("the first copy starts a link");
        assert_eq!(started, relay);
        assert!(
            pushes.try_recv().is_none(),
            "the new link reads the mailbox first"
        );
        links.announce(vec![copy(&mailbox, 3)]);
        assert!(matches!(pushes.try_recv(), Some(Pushed::Copy(c)) if c.seq == 3));
        links.announce(
            (4..5 + PUSH_BACKLOG as u64)
                .map(|s| copy(&mailbox, s))
                .collect(),
        );
        assert!(
            matches!(pushes.try_recv(), Some(Pushed::Missed)),
            "too many: read instead"
        );
        assert!(starts.try_recv().is_err(), "one link per relay");
        links.ended(&relay, &pushes);
        links.announce(vec![copy(&mailbox, 9999)]);
        assert!(
            starts.try_recv().is_ok(),
            "after it ended, the next copy starts another"
        );
    }
}
