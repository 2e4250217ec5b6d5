//! Presence across relay nodes that share one PostgreSQL database.
//!
//! Each node keeps its own sessions in a [`Hub`] and hears the others through `LISTEN`:
//!
//! | channel           | sent by                                   | this node then           |
//! |-------------------|-------------------------------------------|--------------------------|
//! | `mailslot_wake`   | the storage, in the commit of new mail    | reads the new copies, pushes them |
//! | `mailslot_lease`  | the storage, in the commit of a claim     | ends an older session of the agent |
//! | `mailslot_event`  | [`Cluster::tell`]                         | tells its session        |
//! | `mailslot_retire` | [`Cluster::retire`]                       | ends its session         |
//! | `mailslot_handover` | [`Cluster::take_over`]                  | ends its session         |
//! | `mailslot_release` | the storage, when a session ended        | the node taking over goes on |
//!
//! Notifications from this node itself are ignored: it has already acted on them. A wake names
//! the recipient's new sequence numbers; one task reads the copies of every wake heard so far
//! in one query and pushes them to the sessions here, as this node's own commits are pushed
//! (one read per node and burst instead of one per session and wake). Each copy says which
//! copy comes before it, so a session that has not delivered that one (its wake was slower
//! than a later push) reads its queue instead; a late or repeated wake costs a read, never a
//! duplicate or a skipped copy. When the listening connection drops, notifications sent
//! meanwhile are lost: after reconnecting, every session here reads its queue once, which
//! covers any wake it missed; a missed lease notice is covered by fencing (the replaced
//! session's next ack is refused, which ends it).
//!
//! Sessions of one agent take turns across nodes as they do on one: a node taking over asks
//! the holder to end its session (`mailslot_handover`) and waits for its release, which comes
//! after every ack that session received is committed — so mail acknowledged just before a
//! move is not delivered again. The wait is bounded ([`HANDOVER_BOUND`]) for a node that died.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::{Notify, mpsc, watch};

use super::{Attached, Hub, Presence, Quiet};
use crate::protocol::{AgentName, ConsentEvent, Online, Seq, Shown};
use crate::storage::postgres::{Notifier, Target};
use crate::storage::{Committed, Epoch, StorageError};

/// The channels a node listens on.
const CHANNELS: [&str; 6] = [
    "mailslot_wake",
    "mailslot_lease",
    "mailslot_event",
    "mailslot_retire",
    "mailslot_handover",
    "mailslot_release",
];
/// How long a node taking over an agent waits for the node holding it to let go.
const HANDOVER_BOUND: Duration = Duration::from_secs(2);
/// The longest wait between attempts to reconnect the listening connection.
const MAX_BACKOFF: Duration = Duration::from_secs(5);
/// Wakes waiting to be read at most; beyond that a wake makes its session read the queue.
const WAKE_BACKLOG: usize = 65_536;
/// Copies one read takes at most; the wakes after them wait for the next read.
const FETCH_COPIES: u64 = 4_096;
/// A wake for more copies than this is left to the session, which reads them in pages.
const FETCH_RANGE: u64 = 256;

/// New mail for `recipient`, numbered `from` to `seq`, committed by `node` (a node before
/// this version sends no `from`: its wakes make the session read the queue).
#[derive(Deserialize)]
struct Wake {
    /// An agent, or a relay mailbox (`@host`, whose link the committing node woke itself).
    #[serde(deserialize_with = "stored_name")]
    recipient: AgentName,
    node: String,
    #[serde(default)]
    from: Option<Seq>,
    #[serde(default)]
    seq: Option<Seq>,
}

/// A queue name as the storage writes it: an agent's, or a relay mailbox.
fn stored_name<'de, D: serde::Deserializer<'de>>(d: D) -> Result<AgentName, D::Error> {
    let name = String::deserialize(d)?;
    AgentName::from_stored(&name).map_err(serde::de::Error::custom)
}

/// `node` claimed `agent`'s delivery session with `epoch`.
#[derive(Deserialize)]
struct Lease {
    /// An agent, or a relay mailbox claimed by a node's link.
    #[serde(deserialize_with = "stored_name")]
    agent: AgentName,
    epoch: u64,
    node: String,
}

/// A consent event for `agent`, from `node`.
#[derive(Serialize, Deserialize)]
struct Event {
    agent: AgentName,
    event: ConsentEvent,
    node: String,
}

/// `node` takes over `agent`'s delivery session, or (`mailslot_release`) `node`'s session of
/// `agent` ended.
#[derive(Serialize, Deserialize)]
struct Handover {
    agent: AgentName,
    node: String,
}

/// `agent` retired its name on `node`.
#[derive(Serialize, Deserialize)]
struct Retire {
    agent: AgentName,
    node: String,
}

/// Presence for one node of several: its own sessions, and the others' news by `LISTEN`.
pub struct Cluster {
    hub: Hub,
    node: String,
    notifier: Notifier,
    /// Sessions here waiting for another node to release an agent.
    releases: Mutex<HashMap<AgentName, Arc<Notify>>>,
    /// Wakes for sessions here, to the task that reads their copies.
    wakes: mpsc::Sender<Wake>,
}

impl Cluster {
    /// Presence for the node `node`, told the others' news by listening on `target`
    /// (reconnected with backoff until `shutdown`), telling them its own through `notifier`.
    pub fn start(
        node: String,
        target: Target,
        notifier: Notifier,
        shutdown: watch::Receiver<bool>,
    ) -> Arc<Self> {
        let (wakes, woken) = mpsc::channel(WAKE_BACKLOG);
        let cluster = Arc::new(Self {
            hub: Hub::default(),
            node,
            notifier,
            releases: Mutex::default(),
            wakes,
        });
        tokio::spawn(listen(cluster.clone(), target, shutdown));
        tokio::spawn(fetch(Arc::downgrade(&cluster), woken));
        cluster
    }

    /// Acts on one notification from the database.
    fn heard(&self, channel: &str, payload: &str) {
        let ours = |node: &str| node == self.node;
        let parsed = match channel {
            "mailslot_wake" => serde_json::from_str::<Wake>(payload).map(|w| {
                if !ours(&w.node)
                    && self.hub.serves(&w.recipient)
                    && let Err(full) = self.wakes.try_send(w)
                {
                    self.hub.wake(&full.into_inner().recipient);
                }
            }),
            "mailslot_lease" => serde_json::from_str::<Lease>(payload).map(|l| {
                if !ours(&l.node) {
                    self.hub.replaced_elsewhere(&l.agent, Epoch::new(l.epoch));
                }
            }),
            "mailslot_event" => serde_json::from_str::<Event>(payload).map(|e| {
                if !ours(&e.node) {
                    self.hub.tell(&e.agent, e.event);
                }
            }),
            "mailslot_retire" => serde_json::from_str::<Retire>(payload).map(|r| {
                if !ours(&r.node) {
                    self.hub.retire(&r.agent);
                }
            }),
            "mailslot_handover" => serde_json::from_str::<Handover>(payload).map(|h| {
                if !ours(&h.node) {
                    self.hub.hand_over(&h.agent);
                }
            }),
            "mailslot_release" => serde_json::from_str::<Handover>(payload).map(|r| {
                if let Some(waiting) = self.waiters().get(&r.agent) {
                    waiting.notify_waiters();
                }
            }),
            _ => return,
        };
        if let Err(e) = parsed {
            tracing::warn!(channel, error = %e, "ignored a notification this node cannot read");
        }
    }

    fn waiters(&self) -> std::sync::MutexGuard<'_, HashMap<AgentName, Arc<Notify>>> {
        self.releases.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Asks the node holding `agent` to let go, and waits for it (bounded).
    async fn hand_over_to_me(&self, agent: &AgentName) {
        let released = self.waiters().entry(agent.clone()).or_default().clone();
        // Listening before the holder is looked up: a release right after is not missed.
        let notified = released.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        match self.notifier.lease_holder(agent.as_str()).await {
            Ok(Some(holder)) if holder != self.node => {
                self.broadcast(
                    "mailslot_handover",
                    Handover {
                        agent: agent.clone(),
                        node: self.node.clone(),
                    },
                );
                if tokio::time::timeout(HANDOVER_BOUND, notified)
                    .await
                    .is_err()
                {
                    tracing::info!(%agent, %holder, "the node holding the agent did not let go in time; taking over (its acks are refused from now on)");
                }
            }
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(%agent, error = %e, "could not look up who holds the agent; taking over")
            }
        }
        self.waiters().remove(agent);
    }

    /// Sends `payload` on `channel` to the other nodes, without waiting.
    fn broadcast(&self, channel: &'static str, payload: impl Serialize) {
        let payload = match serde_json::to_string(&payload) {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!(channel, error = %e, "could not encode a notification");
                return;
            }
        };
        let notifier = self.notifier.clone();
        tokio::spawn(async move {
            if let Err(e) = notifier.notify(channel, &payload).await {
                tracing::warn!(channel, error = %e, "could not tell the other relay nodes");
            }
        });
    }
}

impl Presence for Cluster {
    fn attach(&self, agent: &AgentName) -> Attached {
        self.hub.attach(agent)
    }

    fn take_over<'a>(
        &'a self,
        agent: &'a AgentName,
    ) -> Pin<Box<dyn Future<Output = ()> + Send + 'a>> {
        Box::pin(self.hand_over_to_me(agent))
    }

    fn claimed(&self, agent: &AgentName, conn: u64, claim: (Epoch, Shown)) {
        self.hub.claimed(agent, conn, claim)
    }

    fn detach(&self, agent: &AgentName, conn: u64) {
        self.hub.detach(agent, conn)
    }

    fn control(&self) -> (Attached, Quiet) {
        self.hub.control()
    }

    fn announce(&self, committed: Vec<Committed>) {
        // The other nodes hear of it from the commit itself (`mailslot_wake`).
        self.hub.announce(committed)
    }

    fn tell(&self, agent: &AgentName, event: ConsentEvent) {
        self.hub.tell(agent, event.clone());
        self.broadcast(
            "mailslot_event",
            Event {
                agent: agent.clone(),
                event,
                node: self.node.clone(),
            },
        );
    }

    /// From the lease table, which every node's sessions claim: a session on another node
    /// is known only there. The lease records a hidden session, so every node leaves it out.
    fn online<'a>(
        &'a self,
        agents: &'a [AgentName],
    ) -> Pin<Box<dyn Future<Output = Result<Vec<Online>, StorageError>> + Send + 'a>> {
        Box::pin(self.notifier.online(agents))
    }

    fn retire(&self, agent: &AgentName) {
        self.hub.retire(agent);
        self.broadcast(
            "mailslot_retire",
            Retire {
                agent: agent.clone(),
                node: self.node.clone(),
            },
        );
    }
}

/// Reads the copies that other nodes' wakes announce, for every wake waiting at once, and
/// pushes them to their sessions here; a wake it cannot serve so makes the session read the
/// queue. Ends with the cluster.
async fn fetch(cluster: Weak<Cluster>, mut wakes: mpsc::Receiver<Wake>) {
    let mut next = None;
    loop {
        let first = match next.take() {
            Some(wake) => wake,
            None => match wakes.recv().await {
                Some(wake) => wake,
                None => return,
            },
        };
        let Some(cluster) = cluster.upgrade() else {
            return;
        };
        let mut ranges: HashMap<AgentName, (Seq, Seq)> = HashMap::new();
        let mut copies = 0;
        let mut wake = Some(first);
        while let Some(w) = wake.take().or_else(|| wakes.try_recv().ok()) {
            match (w.from, w.seq) {
                (Some(from), Some(to)) if from <= to && to - from < FETCH_RANGE => {
                    if copies >= FETCH_COPIES {
                        next = Some(w);
                        break;
                    }
                    copies += to - from + 1;
                    let range = ranges.entry(w.recipient).or_insert((from, to));
                    *range = (range.0.min(from), range.1.max(to));
                }
                _ => cluster.hub.wake(&w.recipient),
            }
        }
        let ranges: Vec<(AgentName, Seq, Seq)> =
            ranges.into_iter().map(|(r, (a, b))| (r, a, b)).collect();
        match cluster.notifier.committed(&ranges).await {
            Ok(read) => cluster.hub.announce(read),
            Err(e) => {
                tracing::warn!(error = %e, "could not read the mail other nodes announced; the sessions read their queues");
                for (recipient, _, _) in &ranges {
                    cluster.hub.wake(recipient);
                }
            }
        }
    }
}

/// Keeps a `LISTEN` connection open and hands what it hears to the cluster.
async fn listen(cluster: Arc<Cluster>, target: Target, mut shutdown: watch::Receiver<bool>) {
    let mut backoff = Duration::from_millis(100);
    let mut first = true;
    loop {
        let connected = tokio::select! {
            _ = shutdown.wait_for(|s| *s) => return,
            c = target.listen(&CHANNELS) => c,
        };
        let mut heard = match connected {
            Ok(heard) => heard,
            Err(e) => {
                tracing::warn!(error = %e, retry_in_ms = backoff.as_millis() as u64, "cannot listen to the other relay nodes");
                tokio::select! {
                    _ = shutdown.wait_for(|s| *s) => return,
                    _ = tokio::time::sleep(backoff) => {}
                }
                backoff = (backoff * 2).min(MAX_BACKOFF);
                continue;
            }
        };
        backoff = Duration::from_millis(100);
        if !first {
            // Whatever was sent while nobody listened is lost: every session reads its queue.
            tracing::info!("listening to the other relay nodes again");
            cluster.hub.wake_all();
        }
        first = false;
        loop {
            tokio::select! {
                _ = shutdown.wait_for(|s| *s) => return,
                n = heard.recv() => match n {
                    Some((channel, payload)) => cluster.heard(&channel, &payload),
                    None => break,
                },
            }
        }
        tracing::warn!("lost the connection that listens to the other relay nodes; reconnecting");
    }
}
