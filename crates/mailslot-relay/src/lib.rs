//! The relay server: stores sealed envelopes durably and forwards them over WebSockets.
//! It depends on `mailslot-core` (the protocol, crypto, TLS and bounded fetches) only, so it
//! cannot reach the agent's store, client, doorbell or MCP server; it never reads subjects or
//! bodies.
#![cfg(unix)]

// The shared layers keep the paths they had when the relay was a module of `mailslot`.
pub(crate) use mailslot_core::{crypto, fetch, protocol, tls};

mod accept;
mod answer;
mod bounce;
mod config;
mod consent;
mod copies;
mod directory;
mod discovery;
mod fanout;
mod gone;
mod groups;
mod http;
mod inbound;
mod limits;
mod link;
mod listener;
mod lookup;
mod metrics;
mod migrate;
mod online;
mod presence;
mod pushes;
mod registration;
mod reservations;
mod retire;
mod rotate;
mod session;
mod state;
pub mod storage;
mod wire;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

pub use config::{RegistrationMode, RelayConfig, RelayConfigError, shell_word};
pub use gone::{DatabaseGone, DatabaseWatch};
pub use migrate::migrate;
use presence::{Cluster, Hub, Presence};
pub use registration::{make_invites, make_postgres_invites};
pub use retire::release;
use state::RelayState;

use crate::crypto::{KeyFileError, RelayIdentity};
use crate::protocol::{Fingerprint, RelayName};
use storage::{
    PostgresStorage, Queue, RelayPin, RelayPins, SqliteStorage, Storage, StorageError,
    is_postgres_url,
};

/// How long shutdown waits for connections to close.
const DRAIN: Duration = Duration::from_secs(5);

/// Why the relay could not start.
#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    /// No database path was given.
    #[error(
        "the relay needs a database: pass --db PATH (SQLite) or --db postgres://USER@HOST:PORT/DB, or set db in the relay config"
    )]
    NoDatabase,
    /// Storage failed to open.
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// A relay on PostgreSQL was given no key file.
    #[error(
        "a relay on PostgreSQL needs its key file: pass --identity FILE (or set identity in the relay config), the same file on every node"
    )]
    NoIdentity,
    /// The relay's key file could not be read or made.
    #[error("the relay's key: {0}")]
    Identity(#[from] KeyFileError),
    /// The database belongs to a relay with another key: a node started with the wrong key
    /// file (or none) would serve the relay's name under a key nobody pinned.
    #[error(
        "the relay database {db} belongs to the relay whose key has fingerprint {held}, but this node's key{file} has fingerprint {ours}: every node of one relay uses the same key. Start it with --identity FILE naming that relay's key file (copied from its first node, mode 0600), or give this key a database of its own"
    )]
    OtherKey {
        /// The database, as shown (a URL without its password).
        db: String,
        /// The fingerprint of the key the database recorded at its relay's first start.
        held: Fingerprint,
        /// The fingerprint of this node's key.
        ours: Fingerprint,
        /// ` (FILE)`: where this node's key came from, when it came from a file.
        file: String,
    },
    /// The listen address could not be bound.
    #[error(
        "cannot listen on {addr}: {os}; is another relay running there? Pick another with --listen"
    )]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// What the OS said (in the message, not as a source, so a chain prints it once).
        os: std::io::Error,
    },
}

/// A running relay.
pub struct Relay {
    addr: SocketAddr,
    relay_id: String,
    name: RelayName,
    fingerprint: Fingerprint,
    shutdown: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl Relay {
    /// Opens storage, binds the listener and starts serving. A `db` that is a
    /// `postgres://` (or `postgresql://`) URL selects PostgreSQL, shared with the relay's
    /// other nodes; anything else is a SQLite file.
    ///
    /// The relay's key is read from `config.identity` (by default `<db>.key` beside a SQLite
    /// database), and made there, mode 0600, when the file does not exist yet.
    pub async fn start(config: RelayConfig) -> Result<Self, RelayError> {
        let db: PathBuf = config.db.clone().ok_or(RelayError::NoDatabase)?;
        let postgres = db.to_str().filter(|d| is_postgres_url(d));
        let key_file = match (&config.identity, postgres) {
            (Some(file), _) => file.clone(),
            (None, Some(_)) => return Err(RelayError::NoIdentity),
            (None, None) => identity_beside(&db),
        };
        let (identity, created) = RelayIdentity::load_or_create(&key_file)?;
        if created {
            tracing::info!(file = %key_file.display(), fingerprint = %identity.fingerprint(), "made the relay's key; keep the file with the database");
        }
        let mut config = config;
        config.identity = Some(key_file.clone());
        let started = Self::start_on(&db, postgres, config, identity).await;
        if created && matches!(started, Err(RelayError::OtherKey { .. })) {
            // Made a moment ago for a database that has its own: it never served, and left
            // in place it would be taken for the relay's key at the next start.
            let _ = std::fs::remove_file(&key_file);
        }
        started
    }

    /// Opens the storage `db` names and serves from it as `identity`.
    async fn start_on(
        db: &std::path::Path,
        postgres: Option<&str>,
        config: RelayConfig,
        identity: RelayIdentity,
    ) -> Result<Self, RelayError> {
        match postgres {
            Some(url) => {
                let storage = PostgresStorage::connect(url).await?;
                let node = storage.node_id().to_owned();
                let (target, notifier) = (storage.target().clone(), storage.notifier());
                Self::serve_with(storage, config, identity, move |shutdown| {
                    Cluster::start(node, target, notifier, shutdown)
                })
                .await
            }
            None => {
                let storage = SqliteStorage::open(db)?;
                Self::start_with(storage, config, identity).await
            }
        }
    }

    /// Binds the listener and starts serving from `storage` as `identity`, once the storage
    /// has recorded its key or holds the same one (`config.db` and `config.identity` only
    /// name the database and the key file in the error otherwise).
    pub async fn start_with<S: Storage>(
        storage: S,
        config: RelayConfig,
        identity: RelayIdentity,
    ) -> Result<Self, RelayError> {
        Self::serve_with(storage, config, identity, |_| Arc::new(Hub::default())).await
    }

    /// Serves from `storage`, with the presence `presence` makes (given the shutdown signal).
    async fn serve_with<S: Storage, P: Presence>(
        storage: S,
        config: RelayConfig,
        identity: RelayIdentity,
        presence: impl FnOnce(watch::Receiver<bool>) -> Arc<P>,
    ) -> Result<Self, RelayError> {
        check_own_key(&storage, &config, &identity).await?;
        let listener = TcpListener::bind(config.listen)
            .await
            .map_err(|os| RelayError::Bind {
                addr: config.listen,
                os,
            })?;
        let addr = listener.local_addr().map_err(|os| RelayError::Bind {
            addr: config.listen,
            os,
        })?;
        let relay_id = storage.relay_id().to_owned();
        let name = match &config.host {
            Some(host) => host.clone(),
            None => {
                if !addr.ip().is_loopback() {
                    tracing::warn!(%addr, "the relay has no host set, so it calls itself by the address it listens on; set host in the relay config to the name agents and other relays reach it by");
                }
                RelayName::new(&addr.to_string()).expect("a socket address is a valid host")
            }
        };
        let fingerprint = identity.fingerprint();
        let (shutdown, shutdown_rx) = watch::channel(false);
        let waiting = storage.total_waiting().await?;
        let presence = presence(shutdown_rx.clone());
        let state = Arc::new(RelayState::new(
            storage,
            presence,
            config,
            (name.clone(), identity),
            shutdown_rx.clone(),
        ));
        state.metrics.queued.set(waiting as i64);
        // The listener lives in the storage, so it holds the links, never the state (which
        // holds the storage: the storage would never be dropped, nor its files closed).
        let (presence, links) = (state.presence.clone(), state.links.clone());
        state.storage.on_commit(Box::new(move |committed| {
            presence.announce(links.announce(committed));
        }));
        let large_frames = state.receive_budget.frames_at_once();
        let task = tokio::spawn(serve(state, listener, shutdown_rx));
        // Debug: `mailslot relay` says it once, on stderr, for people and scripts.
        tracing::debug!(%addr, relay = %relay_id, %name, key = %fingerprint, large_frames, "relay listening");
        Ok(Self {
            addr,
            relay_id,
            name,
            fingerprint,
            shutdown,
            task,
        })
    }

    /// The bound address (useful with port 0).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The WebSocket URL clients connect to.
    pub fn url(&self) -> String {
        format!("ws://{}/v1/ws", self.addr)
    }

    /// The relay's stable id.
    pub fn relay_id(&self) -> &str {
        &self.relay_id
    }

    /// The relay's name: the host part of its agents' addresses.
    pub fn name(&self) -> &RelayName {
        &self.name
    }

    /// The fingerprint of the relay's key.
    pub fn fingerprint(&self) -> &Fingerprint {
        &self.fingerprint
    }

    /// Stops accepting, tells every client why, waits for them (at most 5 s), and returns.
    pub async fn shutdown(self) {
        let _ = self.shutdown.send(true);
        let _ = self.task.await;
    }
}

/// Records `identity`'s key in `storage` at the relay's first start, and refuses a node whose
/// key is not the one recorded.
async fn check_own_key<S: RelayPins>(
    storage: &S,
    config: &RelayConfig,
    identity: &RelayIdentity,
) -> Result<(), RelayError> {
    let pinned = match storage.pin_own_key(identity.key()).await? {
        RelayPin::Matches => return Ok(()),
        RelayPin::Pinned => {
            tracing::info!(key = %identity.fingerprint(), "recorded the relay's key in its database: every node of this relay must use it");
            return Ok(());
        }
        RelayPin::Changed { pinned } => pinned,
    };
    let db = match config.db.as_deref().and_then(|d| d.to_str()) {
        Some(url) if is_postgres_url(url) => storage::redact_url(url),
        Some(path) => path.to_owned(),
        None => "in use".to_owned(),
    };
    Err(RelayError::OtherKey {
        db,
        held: crate::crypto::relay_fingerprint(&pinned),
        ours: identity.fingerprint(),
        file: config
            .identity
            .as_ref()
            .map(|f| format!(" ({})", f.display()))
            .unwrap_or_default(),
    })
}

/// The key file of a relay on the SQLite database `db`: `<db>.key`, beside its lock and pid.
pub fn identity_beside(db: &std::path::Path) -> PathBuf {
    let mut file = db.as_os_str().to_owned();
    file.push(".key");
    PathBuf::from(file)
}

async fn serve<S: Storage>(
    state: Arc<RelayState<S>>,
    listener: TcpListener,
    mut shutdown: watch::Receiver<bool>,
) {
    let expiry = tokio::spawn(expire_loop(state.clone()));
    let links = tokio::spawn(link::supervise(state.clone()));
    let app = http::router(state.clone());
    listener::serve(state.clone(), listener, app, shutdown.clone()).await;
    expiry.abort();
    // Sessions see the same signal and close themselves; give them a moment.
    let _ = shutdown.wait_for(|s| *s).await;
    let _ = links.await;
    let deadline = tokio::time::Instant::now() + DRAIN;
    while state.metrics.connections.get() > 0 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn expire_loop<S: Queue>(state: Arc<RelayState<S>>) {
    let mut tick = tokio::time::interval(Duration::from_secs(
        state.config.expiry_interval_secs.max(1),
    ));
    loop {
        tick.tick().await;
        match state
            .storage
            .expire(jiff::Timestamp::now().as_millisecond())
            .await
        {
            Ok(bounced) if bounced.is_empty() => {}
            Ok(bounced) => {
                let n = bounced.len() as u64;
                state.metrics.expired.inc_by(n);
                tracing::info!(
                    expired = n,
                    "deleted envelopes past their TTL; bounced them to their senders"
                );
                bounce::announce(&state, bounced.into_iter().map(|(sender, _)| sender));
            }
            Err(e) => tracing::warn!(error = %e, "expiry failed; will retry"),
        }
        // Other nodes on the same database change the queues too: the gauge is set from the
        // storage's count each round, and moved by this node's own traffic in between.
        if let Ok(waiting) = state.storage.total_waiting().await {
            state.metrics.queued.set(waiting as i64);
        }
    }
}
