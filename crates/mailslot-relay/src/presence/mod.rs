//! Presence: where each agent's delivery session lives, and how news reaches it.
//!
//! A node's sessions attach here. What one node alone knows — which session serves an agent,
//! that mail was committed for it, that a consent event is for it — goes through
//! [`Presence`], so that several nodes over one database can each reach their own sessions
//! when another node has the news. [`Hub`] is the one-node implementation, [`Cluster`] the one for nodes sharing PostgreSQL; the fencing of a
//! replaced session's acks is the storage's (`Queue::claim`), so it holds across nodes too.

mod cluster;
mod hub;

pub use cluster::Cluster;
pub use hub::{Attached, Hub, Kick, Quiet};

use std::future::Future;
use std::pin::Pin;

use super::storage::{Committed, Epoch, StorageError};
use crate::protocol::{AgentName, ConsentEvent, Online, Shown};

/// Where delivery sessions are, and how mail and events reach them.
pub trait Presence: Send + Sync + 'static {
    /// Makes a new connection the agent's delivery session on this node, ending any older
    /// one.
    fn attach(&self, agent: &AgentName) -> Attached;

    /// Waits until a session of the agent on another node has ended with its acks committed,
    /// asking it to end — for a bounded time, since a node that died answers nothing (its
    /// acks are fenced by the claim that follows). Returns at once on one node, whose hub
    /// already makes sessions of an agent take turns.
    fn take_over<'a>(
        &'a self,
        agent: &'a AgentName,
    ) -> Pin<Box<dyn Future<Output = ()> + Send + 'a>>;

    /// Records the lease the session `conn` claimed, so news of a later claim elsewhere ends
    /// it and news of an earlier one does not; and whether it shows the agent online.
    fn claimed(&self, agent: &AgentName, conn: u64, claim: (Epoch, Shown));

    /// Removes the agent's session if it is still `conn`.
    fn detach(&self, agent: &AgentName, conn: u64);

    /// An attachment for a control connection: no pushes, no events, never replaced. Keep
    /// the [`Quiet`] for as long as it lives.
    fn control(&self) -> (Attached, Quiet);

    /// Hands copies just made durable (by this node) to their recipients' sessions, in commit
    /// order. Must not block: it runs on the storage's writer.
    fn announce(&self, committed: Vec<Committed>);

    /// Tells the agent's delivery session about a consent event, wherever it is.
    fn tell(&self, agent: &AgentName, event: ConsentEvent);

    /// Ends the agent's delivery session, wherever it is, because it retired its name.
    fn retire(&self, agent: &AgentName);

    /// Which of `agents` have a live delivery session (one that claimed its lease and is not
    /// [`Shown::Hidden`]), on any node, and since when; by name. Who may ask about whom is the caller's business.
    fn online<'a>(
        &'a self,
        agents: &'a [AgentName],
    ) -> Pin<Box<dyn Future<Output = Result<Vec<Online>, StorageError>> + Send + 'a>>;
}
