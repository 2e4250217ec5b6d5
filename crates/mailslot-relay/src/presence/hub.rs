//! Who is online on this node: one live session per agent. A new connection for an agent replaces the old
//! one, and the old one's cleanup can never remove the new one (cleanup is by connection id).
//!
//! Stored copies are pushed to online recipients straight from the commit, in commit order
//! ([`crate::pushes`]), so a session delivers new mail without reading it back from
//! the database; one that falls behind reads the database instead.
//!
//! Sessions of one agent never overlap: each takes the agent's *turn* before it reads the
//! queue, and a replaced session holds it until it has ended, so every ack it received is
//! committed before its successor reads the queue. Without this, an ack still being committed
//! when the client reconnects lets the new session read the acked mail and deliver it again.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::{Mutex as AsyncMutex, OwnedMutexGuard, mpsc, oneshot};

use jiff::Timestamp;

use super::Presence;
use crate::protocol::{AgentName, ConsentEvent, Online, Shown};
use crate::pushes::{self, PushSender, Pushes};
use crate::storage::{Committed, Epoch, StorageError};

/// Consent events queued for one session at most; more are dropped (the state stays
/// queryable with `consent`).
const EVENT_BACKLOG: usize = 64;
/// Pushed copies queued for one session at most; beyond that it reads from the database.
const PUSH_BACKLOG: usize = 1024;
/// Bytes of pushed copies queued for one session at most, likewise: a session that is not
/// taking its pushes (its client does not read) must not hold a copy of all its new mail.
const PUSH_BYTES: usize = 4 * 1024 * 1024;

struct Entry {
    conn: u64,
    /// The lease its session claimed, once it has, and when: from then on it is online,
    /// unless it asked to be hidden.
    epoch: Option<(Epoch, Timestamp)>,
    shown: Shown,
    turn: Turn,
    kick: oneshot::Sender<Kick>,
    events: mpsc::Sender<ConsentEvent>,
    pushes: PushSender,
}

/// The right to serve an agent, shared by the sessions that replace one another. Held by at
/// most one of them at a time, handed over in attach order (tokio's mutex is fair).
#[derive(Clone, Default)]
pub struct Turn(Arc<AsyncMutex<()>>);

impl Turn {
    /// Waits until every earlier session of the agent has ended, then holds the turn until
    /// the guard is dropped.
    pub async fn take(self) -> OwnedMutexGuard<()> {
        self.0.lock_owned().await
    }
}

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
    /// Fires when a newer connection for the same agent takes over, or the agent retired.
    pub kicked: oneshot::Receiver<Kick>,
    /// Consent events for the agent.
    pub events: mpsc::Receiver<ConsentEvent>,
    /// Copies stored for the agent, in commit order, or word to read the database.
    pub pushes: Pushes,
    /// The agent's turn: take it before reading the queue, hold it until detached.
    pub turn: Turn,
}

/// Why a live session must end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kick {
    /// A newer connection of the same agent took over.
    Replaced,
    /// The agent retired its name.
    Retired,
}

/// What keeps a control connection's [`Attached`] quiet: senders nobody uses.
pub struct Quiet {
    _kick: oneshot::Sender<Kick>,
    _events: mpsc::Sender<ConsentEvent>,
    _pushes: PushSender,
}

impl Presence for Hub {
    /// An attachment for a control connection: never registered, so it receives no pushes or
    /// events, is never kicked, and kicks nobody. Keep the [`Quiet`] for as long as it lives.
    fn control(&self) -> (Attached, Quiet) {
        let conn = self.next_conn.fetch_add(1, Ordering::Relaxed);
        let (kick, kicked) = oneshot::channel();
        let (events_tx, events) = mpsc::channel(1);
        let (pushes_tx, pushes) = pushes::channel(1, PUSH_BYTES);
        let attached = Attached {
            conn,
            kicked,
            events,
            pushes,
            turn: Turn::default(),
        };
        let quiet = Quiet {
            _kick: kick,
            _events: events_tx,
            _pushes: pushes_tx,
        };
        (attached, quiet)
    }

    /// Makes this connection the agent's live session, kicking any older one. The new session
    /// shares the older one's [`Turn`], so it can wait for it to end.
    fn attach(&self, agent: &AgentName) -> Attached {
        let conn = self.next_conn.fetch_add(1, Ordering::Relaxed);
        let (kick, kicked) = oneshot::channel();
        let (events_tx, events) = mpsc::channel(EVENT_BACKLOG);
        let (pushes_tx, pushes) = pushes::channel(PUSH_BACKLOG, PUSH_BYTES);
        let mut sessions = self.lock();
        let turn = sessions
            .get(agent)
            .map(|old| old.turn.clone())
            .unwrap_or_default();
        let entry = Entry {
            conn,
            epoch: None,
            shown: Shown::Online,
            turn: turn.clone(),
            kick,
            events: events_tx,
            pushes: pushes_tx,
        };
        if let Some(old) = sessions.insert(agent.clone(), entry) {
            let _ = old.kick.send(Kick::Replaced);
        }
        Attached {
            conn,
            kicked,
            events,
            pushes,
            turn,
        }
    }

    /// Removes the agent's session if it is still this connection.
    fn detach(&self, agent: &AgentName, conn: u64) {
        let mut sessions = self.lock();
        if sessions.get(agent).is_some_and(|e| e.conn == conn) {
            sessions.remove(agent);
        }
    }

    /// Ends the agent's live session, if any, because it retired its name.
    fn retire(&self, agent: &AgentName) {
        if let Some(entry) = self.lock().remove(agent) {
            let _ = entry.kick.send(Kick::Retired);
        }
    }

    /// Hands freshly committed copies to their recipients' sessions, in commit order.
    fn announce(&self, committed: Vec<Committed>) {
        let sessions = self.lock();
        for copy in committed {
            if let Some(e) = sessions.get(&copy.recipient) {
                e.pushes.push(copy);
            }
        }
    }

    /// Pushes a consent event to the agent's live session, if any.
    fn tell(&self, agent: &AgentName, event: ConsentEvent) {
        if let Some(e) = self.lock().get(agent)
            && e.events.try_send(event).is_err()
        {
            tracing::warn!(%agent, "consent event dropped: the session is not reading");
        }
    }

    fn take_over<'a>(
        &'a self,
        _agent: &'a AgentName,
    ) -> Pin<Box<dyn Future<Output = ()> + Send + 'a>> {
        Box::pin(std::future::ready(()))
    }

    fn claimed(&self, agent: &AgentName, conn: u64, (epoch, shown): (Epoch, Shown)) {
        if let Some(e) = self.lock().get_mut(agent)
            && e.conn == conn
        {
            e.epoch = Some((epoch, Timestamp::now()));
            e.shown = shown;
        }
    }

    fn online<'a>(
        &'a self,
        agents: &'a [AgentName],
    ) -> Pin<Box<dyn Future<Output = Result<Vec<Online>, StorageError>> + Send + 'a>> {
        let sessions = self.lock();
        let mut online: Vec<Online> = agents
            .iter()
            .filter_map(|agent| {
                let entry = sessions.get(agent).filter(|e| e.shown == Shown::Online)?;
                let (_, since) = entry.epoch?;
                Some(Online {
                    agent: agent.clone(),
                    since,
                })
            })
            .collect();
        drop(sessions);
        online.sort_by(|a, b| a.agent.cmp(&b.agent));
        online.dedup_by(|a, b| a.agent == b.agent);
        Box::pin(std::future::ready(Ok(online)))
    }
}

impl Hub {
    /// Has the agent's session read the queue: another node committed mail for it.
    pub fn wake(&self, agent: &AgentName) {
        if let Some(e) = self.lock().get(agent) {
            e.pushes.miss();
        }
    }

    /// Whether the agent has a session here.
    pub fn serves(&self, agent: &AgentName) -> bool {
        self.lock().contains_key(agent)
    }

    /// Has every session read the queue: news from other nodes may have been missed.
    pub fn wake_all(&self) {
        for e in self.lock().values() {
            e.pushes.miss();
        }
    }

    /// Ends the agent's session here, if it is serving (has claimed its lease): a node where
    /// the agent connected since asks for it.
    pub fn hand_over(&self, agent: &AgentName) {
        let mut sessions = self.lock();
        if sessions.get(agent).is_some_and(|e| e.epoch.is_some())
            && let Some(old) = sessions.remove(agent)
        {
            let _ = old.kick.send(Kick::Replaced);
        }
    }

    /// Ends the agent's session here if it holds a lease older than `epoch`, which another
    /// node claimed. A session that has not claimed yet will claim after it (or find its
    /// acks fenced), so it stays.
    pub fn replaced_elsewhere(&self, agent: &AgentName, epoch: Epoch) {
        let mut sessions = self.lock();
        if sessions
            .get(agent)
            .is_some_and(|e| e.epoch.is_some_and(|(held, _)| held < epoch))
            && let Some(old) = sessions.remove(agent)
        {
            let _ = old.kick.send(Kick::Replaced);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<AgentName, Entry>> {
        self.sessions.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn copy(to: &AgentName, seq: u64) -> Committed {
        crate::pushes::test_copy(to, seq, 2)
    }

    #[test]
    fn a_hidden_session_is_served_but_not_online() {
        let hub = Hub::default();
        let (alice, bob) = (
            AgentName::new("alice").unwrap(),
            AgentName::new("bob").unwrap(),
        );
        let a = hub.attach(&alice);
        let b = hub.attach(&bob);
        hub.claimed(&alice, a.conn, (Epoch::new(1), Shown::Online));
        hub.claimed(&bob, b.conn, (Epoch::new(1), Shown::Hidden));
        let online =
            futures_util::FutureExt::now_or_never(hub.online(&[alice.clone(), bob.clone()]))
                .unwrap()
                .unwrap();
        assert_eq!(
            online.iter().map(|o| &o.agent).collect::<Vec<_>>(),
            [&alice]
        );
        assert!(hub.serves(&bob), "a hidden session is still served");
    }

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

    #[tokio::test]
    async fn a_session_gets_its_turn_only_after_the_sessions_it_replaced_ended() {
        use futures_util::FutureExt;
        let hub = Hub::default();
        let alice = AgentName::new("alice").unwrap();
        let first = hub.attach(&alice);
        let serving = first.turn.clone().take().await;
        let second = hub.attach(&alice);
        let mut waiting = Box::pin(second.turn.clone().take());
        assert!(
            (&mut waiting).now_or_never().is_none(),
            "the first session still serves"
        );
        // A third connection replaces the second before its turn came; the second gives up.
        let third = hub.attach(&alice);
        drop(waiting);
        let mut next = Box::pin(third.turn.clone().take());
        assert!((&mut next).now_or_never().is_none());
        hub.detach(&alice, first.conn);
        drop(serving);
        let serving = next
            .now_or_never()
            .expect("the first ended: the third's turn");
        hub.detach(&alice, third.conn);
        drop(serving);
        let fresh = hub.attach(&alice);
        assert!(
            fresh.turn.take().now_or_never().is_some(),
            "nobody else serves"
        );
    }

    #[test]
    fn pushes_reach_the_recipients_session_only() {
        use futures_util::FutureExt;
        let hub = Hub::default();
        let (bob, carol) = (
            AgentName::new("bob").unwrap(),
            AgentName::new("carol").unwrap(),
        );
        let mut attached = hub.attach(&bob);
        hub.announce(vec![copy(&carol, 1), copy(&bob, 2)]);
        let Some(Some(pushes::Pushed::Copy(c))) = attached.pushes.recv().now_or_never() else {
            panic!("bob's copy is pushed");
        };
        assert_eq!(c.seq, 2);
        hub.wake(&bob);
        assert!(matches!(
            attached.pushes.recv().now_or_never(),
            Some(Some(pushes::Pushed::Missed))
        ));
    }
}
