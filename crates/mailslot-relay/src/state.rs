//! What every connection and request shares.

use std::collections::HashSet;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use tokio::sync::watch;

use super::RelayConfig;
use super::inbound::ReceiveBudget;
use super::limits::{ConnectionLimiter, RateLimiter};
use super::link::{DeniedLookups, Links};
use super::metrics::Metrics;
use super::presence::Presence;
use super::storage::{Registry, Storage, StorageError};
use crate::crypto::RelayIdentity;
use crate::protocol::{Address, AgentName, Peer, RelayKey, RelayName};

/// Links from one IP naming relays not met before, per hour, sustained; each costs a fetch of
/// that relay's discovery document.
const FIRST_CONTACTS_PER_HOUR: f64 = 60.0;
/// Such links from one IP at once.
const FIRST_CONTACT_BURST: f64 = 10.0;
/// Seconds between two times a holder is told the same agent waits for its files.
const WAIT_TOLD_EVERY_SECS: f64 = 60.0;

/// Shared relay state.
pub struct RelayState<S> {
    /// Durable storage. Each user names the roles it needs (`S: Queue`, `S: Registry`, …);
    /// only the wiring that reaches every request needs all of [`Storage`].
    pub storage: S,
    /// The storage's stable id for this relay, which clients sign in their hello.
    pub relay_id: String,
    /// Settings.
    pub config: RelayConfig,
    /// The relay's name, the host part of its agents' addresses.
    pub name: RelayName,
    /// The relay's own key, which vouches for its agents' keys.
    pub identity: RelayIdentity,
    /// Where delivery sessions are, and how news reaches them.
    pub presence: Arc<dyn Presence>,
    /// Counters for `/metrics`.
    pub metrics: Metrics,
    /// Per-agent send limits.
    pub send_rate: RateLimiter<AgentName>,
    /// Per-relay limits on deliveries from other relays, by the relay's key (one bucket for
    /// one relay, whatever names it uses).
    pub relay_rate: RateLimiter<RelayKey>,
    /// Per-IP limits on links naming a relay not met before (each costs a discovery fetch).
    pub first_contacts: RateLimiter<IpAddr>,
    /// When denied relays' keys were last looked up.
    pub denied_lookups: DeniedLookups,
    /// The links delivering to other relays.
    pub links: Arc<Links>,
    /// Per-agent contact request limits.
    pub request_rate: RateLimiter<AgentName>,
    /// Per-agent approval attempt limits, against guessing codes.
    pub approve_rate: RateLimiter<AgentName>,
    /// Per-IP registration limits, against name floods.
    pub register_rate: RateLimiter<IpAddr>,
    /// How often a holder is told that one agent waits for its files (waiter, holder): an
    /// agent retrying a reserve in a loop rings the holder's model once a minute at most.
    pub waits_told: RateLimiter<(AgentName, AgentName)>,
    /// Open sockets, per IP and in all.
    pub connections: Arc<ConnectionLimiter>,
    /// Room for large frames being received, over all connections.
    pub receive_budget: ReceiveBudget,
    /// Flips to `true` when the relay shuts down.
    pub shutdown: watch::Receiver<bool>,
    /// Names known to be registered (a retired name is taken out).
    known: Mutex<HashSet<AgentName>>,
}

impl<S: Storage> RelayState<S> {
    /// Builds the state.
    pub fn new(
        storage: S,
        presence: Arc<dyn Presence>,
        config: RelayConfig,
        (name, identity): (RelayName, RelayIdentity),
        shutdown: watch::Receiver<bool>,
    ) -> Self {
        let metrics = Metrics::new(storage.metrics());
        let (total, per_ip) = config.connection_limits();
        Self {
            send_rate: RateLimiter::new(config.send_rate, config.send_burst),
            relay_rate: RateLimiter::new(config.relay_rate, config.relay_burst),
            first_contacts: RateLimiter::new(FIRST_CONTACTS_PER_HOUR / 3600.0, FIRST_CONTACT_BURST),
            denied_lookups: DeniedLookups::default(),
            links: Arc::new(Links::default()),
            request_rate: RateLimiter::new(
                config.requests_per_hour / 3600.0,
                config.requests_per_hour,
            ),
            approve_rate: RateLimiter::new(
                config.approvals_per_hour / 3600.0,
                config.approvals_per_hour,
            ),
            register_rate: RateLimiter::new(
                config.registrations_per_hour / 3600.0,
                config.registration_burst,
            ),
            waits_told: RateLimiter::new(1.0 / WAIT_TOLD_EVERY_SECS, 1.0),
            connections: Arc::new(ConnectionLimiter::new(per_ip, total)),
            receive_budget: ReceiveBudget::new(
                config.max_receiving_bytes,
                config.max_frame_bytes(),
            ),
            relay_id: storage.relay_id().to_owned(),
            storage,
            config,
            name,
            identity,
            presence,
            metrics,
            shutdown,
            known: Mutex::new(HashSet::new()),
        }
    }
}

impl<S: Registry> RelayState<S> {
    /// Whether `name` is registered, asking storage only for names not seen yet.
    pub async fn is_registered(&self, name: &AgentName) -> Result<bool, StorageError> {
        if self
            .known
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains(name)
        {
            return Ok(true);
        }
        let found = self.storage.keys(name.clone()).await?.is_some();
        if found {
            self.remember_registered(name);
        }
        Ok(found)
    }
}

impl<S> RelayState<S> {
    /// Records a name as registered.
    pub fn remember_registered(&self, name: &AgentName) {
        self.known
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(name.clone());
    }

    /// Forgets a name that was retired.
    pub fn forget_registered(&self, name: &AgentName) {
        self.known
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(name);
    }

    /// How this relay keeps `address` in its tables: an agent here by its name, another
    /// relay's agent by its full address (`None` when that is too long to keep).
    pub fn stored_peer(&self, address: &Address) -> Option<AgentName> {
        match self.local_name(address) {
            Some(name) => Some(name.clone()),
            None => AgentName::remote_agent(address),
        }
    }

    /// How this relay keeps a peer an owner blocks: as [`RelayState::stored_peer`], or a
    /// whole relay as `*@host` (`None` when too long to keep, or this relay itself).
    pub fn stored_block(&self, peer: &Peer) -> Option<AgentName> {
        match peer {
            Peer::Agent(address) => self.stored_peer(address),
            Peer::AnyAt(host) if *host == self.name => None,
            Peer::AnyAt(host) => AgentName::any_at(host),
        }
    }

    /// The agent name behind `address` if it lives on this relay.
    pub fn local_name<'a>(&self, address: &'a Address) -> Option<&'a AgentName> {
        match address.host() {
            None => Some(address.name()),
            Some(h) if *h == self.name => Some(address.name()),
            Some(_) => None,
        }
    }
}
