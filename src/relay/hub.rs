//! Who is online: one live session per agent. A new connection for an agent replaces the old
//! one, and the old one's cleanup can never remove the new one (cleanup is by connection id).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::{Notify, mpsc, oneshot};

use crate::protocol::{AgentName, ConsentEvent};

struct Entry {
    conn: u64,
    wake: Arc<Notify>,
    kick: oneshot::Sender<()>,
    events: mpsc::Sender<ConsentEvent>,
}

/// Consent events queued for one session at most; more are dropped (the state stays
/// queryable with `consent`).
const EVENT_BACKLOG: usize = 64;

/// The live sessions, by agent.
#[derive(Default)]
pub struct Hub {
    sessions: Mutex<HashMap<AgentName, Entry>>,
    next_conn: AtomicU64,
}

/// What a session gets when it attaches.
pub struct Attached {
    /// This connection's id, for [`Hub::detach`].
    pub conn: u64,
    /// Notified when new mail is stored for the agent.
    pub wake: Arc<Notify>,
    /// Fires when a newer connection for the same agent takes over.
    pub kicked: oneshot::Receiver<()>,
    /// Consent events for the agent.
    pub events: mpsc::Receiver<ConsentEvent>,
}

impl Hub {
    /// Makes this connection the agent's live session, kicking any older one.
    pub fn attach(&self, agent: &AgentName) -> Attached {
        let conn = self.next_conn.fetch_add(1, Ordering::Relaxed);
        let wake = Arc::new(Notify::new());
        let (kick, kicked) = oneshot::channel();
        let (events_tx, events_rx) = mpsc::channel(EVENT_BACKLOG);
        let old = self.lock().insert(
            agent.clone(),
            Entry {
                conn,
                wake: wake.clone(),
                kick,
                events: events_tx,
            },
        );
        if let Some(old) = old {
            let _ = old.kick.send(());
        }
        // Mail may have arrived between the old session's last fetch and now.
        wake.notify_one();
        Attached {
            conn,
            wake,
            kicked,
            events: events_rx,
        }
    }

    /// Removes the agent's session if it is still this connection.
    pub fn detach(&self, agent: &AgentName, conn: u64) {
        let mut sessions = self.lock();
        if sessions.get(agent).is_some_and(|e| e.conn == conn) {
            sessions.remove(agent);
        }
    }

    /// Tells the agent's live session, if any, that new mail is stored.
    pub fn wake(&self, agent: &AgentName) {
        if let Some(e) = self.lock().get(agent) {
            e.wake.notify_one();
        }
    }

    /// Pushes a consent event to the agent's live session, if any.
    pub fn tell(&self, agent: &AgentName, event: ConsentEvent) {
        if let Some(e) = self.lock().get(agent)
            && e.events.try_send(event).is_err()
        {
            tracing::warn!(%agent, "consent event dropped: the session is not reading");
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<AgentName, Entry>> {
        self.sessions.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_replaced_session_cannot_detach_its_successor() {
        let hub = Hub::default();
        let alice = AgentName::new("alice").unwrap();
        let mut first = hub.attach(&alice);
        let second = hub.attach(&alice);
        assert!(
            first.kicked.try_recv().is_ok(),
            "the first session is told to go"
        );
        hub.detach(&alice, first.conn);
        assert!(
            hub.lock()
                .get(&alice)
                .is_some_and(|e| e.conn == second.conn)
        );
        hub.detach(&alice, second.conn);
        assert!(hub.lock().is_empty());
    }
}
