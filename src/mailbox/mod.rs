//! An agent's mailbox while it runs: its store, its relay connection (or the knowledge that
//! another process holds it), and the events that say mail arrived. This is the domain layer
//! under `mcp/` and the doorbells; it knows nothing of MCP.
//!
//! New mail is announced from the store, never from the wire: the watcher reads what was
//! committed after the last position it announced, each message once and whole
//! ([`Arrived`]). So an announcement always follows the commit, mail stored by another
//! process for the same agent is announced too, and nothing is announced twice.

mod ask;
mod compose;
mod consent;
mod events;
mod files;
mod groups;
mod ids;
mod lock;
mod memory;
mod peers;
mod reading;
mod receipts;
mod reservations;
mod rotate;
mod send;
mod tell;
mod wait;
mod watch;

use std::fs::File;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Mutex;
use tokio_util::sync::CancellationToken;

pub use compose::{ComposeError, reply, reply_at};
pub use events::{Arrived, Feed, Heard, MailboxEvent};
pub use files::{
    AttachmentSource, FileError, Folders, MAX_INLINE_BYTES, is_text, load as load_attachment,
    paths_of_file_uris, save as save_file,
};
pub use lock::ConnectionLock;
pub use memory::AgentStatus;
pub use reading::Listed;
pub use receipts::AckOutcome;
pub use rotate::{Rotated, rotate_keys, trust_presented_key};
pub use send::SendOutcome;
pub use wait::Delivered;

use crate::agent::Agent;
use crate::client::{ClientError, RelayUrl, SessionConfig, SessionHandle, spawn_session};
use crate::crypto::Identity;
use crate::protocol::{Address, AgentName, OwnerKey, RelayName, Shown, ValidationError};
use crate::store::{StoreError, StoreHandle};
use events::Signals;

/// Where the relay connection stands, for people and for tool results.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RelayStatus {
    /// Connecting for the first time.
    Connecting,
    /// Connected and authenticated.
    Online,
    /// Not connected; retrying.
    Offline {
        /// Why, for people.
        reason: String,
    },
    /// Another process for this agent holds the connection; this one serves from the store.
    Elsewhere {
        /// That process, if known.
        pid: Option<u32>,
    },
}

impl RelayStatus {
    /// One sentence for a person or a model.
    pub fn describe(&self, relay: &RelayUrl) -> String {
        match self {
            RelayStatus::Connecting => format!("connecting to the relay at {}", relay.authority()),
            RelayStatus::Online => format!("connected to the relay at {}", relay.authority()),
            RelayStatus::Offline { reason } => format!(
                "the relay at {} is unreachable ({reason}); mail is queued and goes out when it is back",
                relay.authority()
            ),
            RelayStatus::Elsewhere { pid } => format!(
                "another mailslot process{} holds this agent's relay connection and sends and receives for it",
                pid.map(|p| format!(" (pid {p})")).unwrap_or_default()
            ),
        }
    }
}

/// Why a mailbox operation failed.
#[derive(Debug, thiserror::Error)]
pub enum MailboxError {
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A value was invalid.
    #[error(transparent)]
    Invalid(#[from] ValidationError),
    /// The relay refused the message for good; it stays in the sent mail, marked failed.
    #[error("not sent: {0}")]
    NotSent(String),
    /// A request to the relay failed.
    #[error(transparent)]
    Relay(#[from] ClientError),
    /// A reply could not be built.
    #[error(transparent)]
    Compose(#[from] ComposeError),
    /// The request needs the relay connection, which another process holds.
    #[error(
        "another mailslot process{} holds this agent's relay connection; ask there, or have the owner use the mailslot CLI",
        pid.map(|p| format!(" (pid {p})")).unwrap_or_default()
    )]
    ConnectionElsewhere {
        /// That process, if known.
        pid: Option<u32>,
    },
    /// Starting a thread or opening a file failed.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// The agent's files (its keys) could not be read or written.
    #[error(transparent)]
    Agent(#[from] crate::agent::AgentError),
    /// Keys change only while no session uses them.
    #[error(
        "a mailslot process{} holds this agent's relay connection; stop it (close the MCP client that runs `mailslot mcp`), then run this again: keys change only while no session uses them",
        pid.map(|p| format!(" (pid {p})")).unwrap_or_default()
    )]
    KeysInUse {
        /// That process, if known.
        pid: Option<u32>,
    },
}

/// The relay connection, if this process holds it.
struct Holder {
    session: Arc<SessionHandle>,
    _lock: File,
}

impl Holder {
    /// Ends the session and waits for its task, then lets the lock go: a follower that takes
    /// the lock never finds this session's connection still open, even while a call still
    /// shares the handle.
    async fn release(self) {
        self.session.stop().await;
    }
}

/// Who runs a mailbox, with the file of the agent's sessions lock it holds or looks through.
enum Role {
    /// A session of the agent (`mailslot mcp`, `wait`, `send`): shown online while it holds
    /// the connection.
    Session {
        /// Its mark, held while it runs (see [`ConnectionLock::mark_session`]).
        _mark: File,
    },
    /// The owner's dashboard: it holds the connection, hidden from presence, only while no
    /// session of the agent runs, and gives it up as soon as one does.
    Window(File),
}

struct Inner {
    name: AgentName,
    address: Address,
    identity: Arc<Identity>,
    owner: Option<OwnerKey>,
    store: StoreHandle,
    relay: RelayUrl,
    dir: PathBuf,
    lock: ConnectionLock,
    holder: Mutex<Option<Holder>>,
    role: Role,
    /// Relays reached over plain HTTP besides loopback (`trusted_hosts`): for `whois`, and the
    /// session's remote recipients and senders.
    trusted: Vec<RelayName>,
    /// What the session tells this mailbox, and what it announces.
    signals: Arc<Signals>,
    /// Counts watcher rounds, so waiters can re-check the store after each.
    rounds: tokio::sync::watch::Sender<u64>,
    stop: CancellationToken,
}

/// A running mailbox; cheap to clone.
#[derive(Clone)]
pub struct Mailbox(Arc<Inner>);

impl Mailbox {
    /// Runs the opened `agent`: starts its relay connection, or serves from the store if
    /// another process holds it. Other relays are reached over TLS unless loopback.
    pub async fn open(agent: Agent, relay: RelayUrl) -> Result<Self, MailboxError> {
        Self::open_trusting(agent, relay, Vec::new()).await
    }

    /// [`Mailbox::open`], reaching the relays in `trusted` (the config's `trusted_hosts`) over
    /// plain HTTP too when it looks up or verifies agents there.
    pub async fn open_trusting(
        agent: Agent,
        relay: RelayUrl,
        trusted: Vec<RelayName>,
    ) -> Result<Self, MailboxError> {
        let session = ConnectionLock::for_agent(&agent.dir).mark_session()?;
        Self::open_as(agent, (relay, trusted), Role::Session { _mark: session }).await
    }

    /// [`Mailbox::open_trusting`] for the owner's dashboard: its connection does not show the
    /// agent online, and it holds it only while no session of the agent runs (taking it
    /// back when the last one ends).
    pub async fn open_window(
        agent: Agent,
        relay: RelayUrl,
        trusted: Vec<RelayName>,
    ) -> Result<Self, MailboxError> {
        let sessions = ConnectionLock::for_agent(&agent.dir).sessions_file()?;
        Self::open_as(agent, (relay, trusted), Role::Window(sessions)).await
    }

    async fn open_as(
        agent: Agent,
        (relay, trusted): (RelayUrl, Vec<RelayName>),
        role: Role,
    ) -> Result<Self, MailboxError> {
        let Agent {
            name,
            identity,
            store,
            dir,
            owner,
        } = agent;
        let store = StoreHandle::spawn(store)?;
        let (rounds, _) = tokio::sync::watch::channel(0);
        let inner = Arc::new(Inner {
            address: Address::local(name.clone()),
            name,
            identity: Arc::new(identity),
            owner,
            store,
            relay,
            lock: ConnectionLock::for_agent(&dir),
            dir,
            holder: Mutex::new(None),
            role,
            trusted,
            signals: Arc::new(Signals::new()),
            rounds,
            stop: CancellationToken::new(),
        });
        let mailbox = Self(inner);
        // Read before the session starts: mail it commits is then after `start`, announced.
        let start = mailbox.0.store.call(|s| s.latest_position()).await?;
        mailbox.try_hold().await?;
        tokio::spawn(watch::run(mailbox.clone(), start));
        Ok(mailbox)
    }

    /// The agent's name.
    pub fn name(&self) -> &AgentName {
        &self.0.name
    }

    /// The agent's address.
    pub fn address(&self) -> &Address {
        &self.0.address
    }

    /// The agent's keys (for its fingerprint; private keys never leave `crypto`).
    pub fn identity(&self) -> &Identity {
        &self.0.identity
    }

    /// The relay this mailbox uses.
    pub fn relay(&self) -> &RelayUrl {
        &self.0.relay
    }

    /// The agent's folder.
    pub fn dir(&self) -> &std::path::Path {
        &self.0.dir
    }

    /// A new subscription to the mailbox's events; `name` says who listens, in the log.
    pub fn subscribe(&self, name: &'static str) -> Feed<MailboxEvent> {
        Feed::new(&self.0.signals.events, name)
    }

    /// The mailbox's events since it opened, before its relay session could tell anything,
    /// for its doorbell (the first caller; later callers hear only what comes next).
    pub fn subscribe_since_open(&self, name: &'static str) -> Feed<MailboxEvent> {
        self.0.signals.since_open(name)
    }

    /// Where the relay connection stands now.
    pub fn status(&self) -> RelayStatus {
        self.0.signals.status.borrow().clone()
    }

    /// Watches the relay status.
    pub fn watch_status(&self) -> tokio::sync::watch::Receiver<RelayStatus> {
        self.0.signals.status.subscribe()
    }

    /// Stops the relay connection and the watcher.
    pub async fn close(&self) {
        self.0.stop.cancel();
        if let Some(holder) = self.0.holder.lock().await.take() {
            holder.release().await;
        }
    }

    async fn session(&self) -> Option<Arc<SessionHandle>> {
        self.0
            .holder
            .lock()
            .await
            .as_ref()
            .map(|h| h.session.clone())
    }

    /// Takes the connection lock if it is free and starts the session; otherwise records who
    /// holds it. Called at start and by the watcher, so a follower takes over when the
    /// holder exits.
    async fn try_hold(&self) -> Result<(), MailboxError> {
        let mut holder = self.0.holder.lock().await;
        if self.0.stop.is_cancelled() {
            return Ok(());
        }
        let elsewhere = || {
            let pid = self.0.lock.holder();
            self.0
                .signals
                .status
                .send_if_modified(|s| replace_if_changed(s, RelayStatus::Elsewhere { pid }));
        };
        // The owner's window makes way for a session of the agent, at once.
        if let Role::Window(sessions) = &self.0.role
            && ConnectionLock::session_running(sessions)?
        {
            if let Some(held) = holder.take() {
                held.release().await;
            }
            elsewhere();
            return Ok(());
        }
        if holder.is_some() {
            return Ok(());
        }
        let Some(lock) = self.0.lock.try_take()? else {
            elsewhere();
            return Ok(());
        };
        self.0.signals.status.send_replace(RelayStatus::Connecting);
        let session = spawn_session(
            SessionConfig {
                url: self.0.relay.clone(),
                agent: self.0.name.clone(),
                identity: self.0.identity.clone(),
                owner: self.0.owner,
                store: self.0.store.clone(),
                trusted: self.0.trusted.clone(),
                shown: match self.0.role {
                    Role::Session { .. } => Shown::Online,
                    Role::Window(_) => Shown::Hidden,
                },
            },
            self.0.signals.clone(),
        );
        *holder = Some(Holder {
            session: Arc::new(session),
            _lock: lock,
        });
        Ok(())
    }
}

fn replace_if_changed(current: &mut RelayStatus, new: RelayStatus) -> bool {
    if *current == new {
        false
    } else {
        *current = new;
        true
    }
}

/// How long a send waits for the relay's answer before saying the message is queued.
pub const SEND_WAIT: Duration = Duration::from_secs(5);
