//! Another relay's identity: its discovery document fetched from the host its name gives
//! (over TLS unless loopback or trusted; at public addresses only unless the operator allows
//! private ones, see [`super::reach`]), checked, and its key pinned on first contact. A
//! changed key is refused, never replaced: the operator must look into it. A relay is known
//! by its key: one denied under any name (or by its fingerprint) is refused under every name.

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use super::super::RelayConfig;
use super::super::state::RelayState;
use super::super::storage::{RelayPin, RelayPins};
use super::reach::{self, ReachError};
use crate::crypto::relay_fingerprint;
use crate::fetch::BodyError;
use crate::protocol::{MAX_DISCOVERY_BYTES, RelayEndpoint, RelayInfo, RelayKey, RelayName};

/// The most of another server's words (an error, a body) kept in a log line.
const LOGGED_REASON: usize = 200;
/// How often a denied name whose key is not known yet is looked up again.
const DENIED_LOOKUP_EVERY: Duration = Duration::from_secs(60);

/// Why another relay could not be vouched for.
#[derive(Debug, thiserror::Error)]
pub enum PeerError {
    /// Its discovery document could not be had.
    #[error("cannot reach {url}: {reason}")]
    Unreachable {
        /// The document's URL.
        url: String,
        /// Why.
        reason: String,
    },
    /// The document is not one relay's true statement about itself.
    #[error("{url}: {problem}")]
    Invalid {
        /// The document's URL.
        url: String,
        /// What is wrong.
        problem: String,
    },
    /// It presents another key than the one pinned for it.
    #[error(
        "{relay} presents the key {presented}, not the key {pinned} pinned for it; nothing is delivered either way until its operator confirms a new key and the pin is replaced here"
    )]
    KeyChanged {
        /// The relay.
        relay: RelayName,
        /// The pinned key's fingerprint.
        pinned: String,
        /// The presented key's fingerprint.
        presented: String,
    },
    /// Its addresses are ones this relay does not connect to.
    #[error(transparent)]
    Private(ReachError),
    /// The operator denied it (by name, or by its key under another name).
    #[error("{relay} is a relay this relay's operator denied{why}")]
    Denied {
        /// The relay.
        relay: RelayName,
        /// How it is known to be denied.
        why: String,
    },
    /// The storage failed.
    #[error("storage: {0}")]
    Storage(String),
}

impl PeerError {
    /// What may be told to whoever named `relay` (another relay's link, an agent): never
    /// another server's words, and the same whether nothing listens there, something else
    /// does, or a server answers that is not a mailslot relay, so that naming a host is no
    /// way to learn what runs on it. The details are logged here ([`Self::to_string`]).
    pub fn public(&self, relay: &RelayName) -> String {
        match self {
            Self::Unreachable { .. } | Self::Invalid { .. } => unreachable_text(relay),
            Self::Private(_) | Self::Denied { .. } | Self::KeyChanged { .. } => self.to_string(),
            Self::Storage(_) => "this relay's storage failed; try again later".into(),
        }
    }
}

impl PeerError {
    /// Logs a refusal of a relay whose key changed as an error naming the command that
    /// settles it here, once its operator confirmed the new key (`what`: the refusal).
    pub fn log_refusal(&self, config: &RelayConfig, what: &str) {
        if let Self::KeyChanged {
            relay, presented, ..
        } = self
        {
            let command = config.pins_command(&format!("trust {relay}"));
            tracing::error!(%relay, error = %self, "{what}; once its operator confirmed that {presented} is its key, run `{command}` (it compares both fingerprints and asks)");
        }
    }
}

/// The one answer for a relay that could not be reached or is not a mailslot relay.
pub fn unreachable_text(relay: &RelayName) -> String {
    format!("relay {relay} could not be reached or is not a mailslot relay")
}

/// At most [`LOGGED_REASON`] characters of `text`, for a log line.
fn bounded(text: &str) -> String {
    match text.char_indices().nth(LOGGED_REASON) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text.to_owned(),
    }
}

/// `relay`'s key, from its discovery document, pinned here (on first contact) or matching the
/// pin, and not denied.
pub async fn pinned_key<S: RelayPins>(
    state: &RelayState<S>,
    relay: &RelayName,
) -> Result<RelayKey, PeerError> {
    let key = fetch_and_pin(state, relay).await?;
    refuse_denied(state, relay, &key).await?;
    Ok(key)
}

/// The key a link's hello from `relay` is checked against: the pinned one, without asking
/// anyone; else, for a relay met for the first time, the one its discovery document gives
/// (pinned then), within the per-IP allowance of such look-ups, since whoever connects names
/// the relay before it has proved anything.
pub async fn hello_key<S: RelayPins>(
    state: &RelayState<S>,
    relay: &RelayName,
    ip: IpAddr,
) -> Result<RelayKey, PeerError> {
    let pinned = state
        .storage
        .pinned_relay(relay.clone())
        .await
        .map_err(|e| PeerError::Storage(e.to_string()))?;
    if let Some(key) = pinned {
        return Ok(key);
    }
    if state.first_contacts.take(&ip).is_err() {
        tracing::info!(%ip, %relay, "too many links from one IP naming relays not met before; refused without a look-up");
        return Err(PeerError::Unreachable {
            url: RelayEndpoint::of(relay, &state.config.trusted_hosts).well_known_url(),
            reason: format!("{ip} named too many new relays; not looked up"),
        });
    }
    fetch_and_pin(state, relay).await
}

/// Refuses `key` (presented by `relay`) when the operator denied it: by fingerprint, or under
/// a denied name it is pinned for here, or that a denied name's discovery document gives.
pub async fn refuse_denied<S: RelayPins>(
    state: &RelayState<S>,
    relay: &RelayName,
    key: &RelayKey,
) -> Result<(), PeerError> {
    let denied = |why: String| PeerError::Denied {
        relay: relay.clone(),
        why,
    };
    let fingerprint = relay_fingerprint(key);
    if state.config.deny_relay_keys.contains(&fingerprint) {
        return Err(denied(format!(" (its key {fingerprint})")));
    }
    if state.config.deny_relays.is_empty() {
        return Ok(());
    }
    let names = state
        .storage
        .relays_pinned_with(*key)
        .await
        .map_err(|e| PeerError::Storage(e.to_string()))?;
    if let Some(name) = names.iter().find(|n| state.config.deny_relays.contains(n)) {
        return Err(denied(format!(" (its key is {name}'s)")));
    }
    // Denied names whose keys are not known yet are looked up (names the operator chose, at
    // most once a minute each), so a relay denied before it was ever met is known by its key.
    for name in &state.config.deny_relays {
        let pinned = state
            .storage
            .pinned_relay(name.clone())
            .await
            .map_err(|e| PeerError::Storage(e.to_string()))?;
        if pinned.is_some() || !state.denied_lookups.due(name) {
            continue;
        }
        match fetch_and_pin(state, name).await {
            Ok(theirs) if theirs == *key => {
                return Err(denied(format!(" (its key is {name}'s)")));
            }
            Ok(_) => {}
            Err(e) => {
                tracing::info!(denied = %name, error = %e, "cannot learn a denied relay's key yet")
            }
        }
    }
    Ok(())
}

/// Fetches `relay`'s discovery document and pins its key, or checks it against the pin.
async fn fetch_and_pin<S: RelayPins>(
    state: &RelayState<S>,
    relay: &RelayName,
) -> Result<RelayKey, PeerError> {
    let info = discover(&state.config, relay).await?;
    match state
        .storage
        .pin_relay(relay.clone(), info.key)
        .await
        .map_err(|e| PeerError::Storage(e.to_string()))?
    {
        RelayPin::Pinned => {
            tracing::info!(%relay, fingerprint = %info.fingerprint, "pinned another relay's key on first contact");
            Ok(info.key)
        }
        RelayPin::Matches => Ok(info.key),
        RelayPin::Changed { pinned } => Err(PeerError::KeyChanged {
            relay: relay.clone(),
            pinned: relay_fingerprint(&pinned).to_string(),
            presented: info.fingerprint.to_string(),
        }),
    }
}

/// `relay`'s discovery document, checked: it names `relay`, and its fingerprint is its key's.
async fn discover(config: &RelayConfig, relay: &RelayName) -> Result<RelayInfo, PeerError> {
    let endpoint = RelayEndpoint::of(relay, &config.trusted_hosts);
    let url = endpoint.well_known_url();
    let unreachable = |reason: String| PeerError::Unreachable {
        url: url.clone(),
        reason,
    };
    let invalid = |problem: String| PeerError::Invalid {
        url: url.clone(),
        problem,
    };
    let addrs = addresses(config, relay, &endpoint).await?;
    let http =
        client(relay, &addrs, endpoint.is_tls(), config.link_timeout()).map_err(unreachable)?;
    let response = http
        .get(&url)
        .send()
        .await
        .map_err(|e| unreachable(bounded(&e.to_string())))?;
    if !response.status().is_success() {
        return Err(unreachable(format!("answered {}", response.status())));
    }
    let body = crate::fetch::body(response, MAX_DISCOVERY_BYTES)
        .await
        .map_err(|e| match e {
            BodyError::Read(e) => unreachable(bounded(&e.to_string())),
            BodyError::TooLarge(max) => invalid(format!("the document is over {max} bytes")),
        })?;
    let info: RelayInfo = serde_json::from_slice(&body)
        .map_err(|e| invalid(bounded(&format!("not a discovery document: {e}"))))?;
    if info.name != *relay {
        return Err(invalid(format!(
            "the relay there calls itself {}, not {relay}",
            info.name
        )));
    }
    if relay_fingerprint(&info.key) != info.fingerprint {
        return Err(invalid("its fingerprint is not its key's".into()));
    }
    Ok(info)
}

/// The addresses `relay` may be reached at (see [`reach`]).
pub async fn addresses(
    config: &RelayConfig,
    relay: &RelayName,
    endpoint: &RelayEndpoint,
) -> Result<Vec<SocketAddr>, PeerError> {
    let port = if endpoint.is_tls() { 443 } else { 80 };
    reach::addresses(relay, port, config.may_reach_private(relay))
        .await
        .map_err(|e| match e {
            ReachError::Private { .. } => PeerError::Private(e),
            ReachError::Resolve { .. } => PeerError::Unreachable {
                url: endpoint.well_known_url(),
                reason: e.to_string(),
            },
        })
}

/// An HTTP client that follows no redirects (a relay answers for itself), goes to `addrs`
/// only (resolved and checked before), and uses no proxy (which would resolve the name again
/// where nothing checks it).
fn client(
    relay: &RelayName,
    addrs: &[SocketAddr],
    tls: bool,
    timeout: Duration,
) -> Result<reqwest::Client, String> {
    let host = relay.host();
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    reqwest::Client::builder()
        .timeout(timeout)
        .redirect(reqwest::redirect::Policy::none())
        .user_agent(concat!("mailslot-relay/", env!("CARGO_PKG_VERSION")))
        .tls_backend_preconfigured(crate::tls::http_tls(tls)?)
        .no_proxy()
        .resolve_to_addrs(bare, addrs)
        .build()
        .map_err(|e| format!("cannot make an HTTP client: {e}"))
}

/// When each denied name whose key is not known here was last looked up.
#[derive(Default)]
pub struct DeniedLookups(std::sync::Mutex<std::collections::HashMap<RelayName, Instant>>);

impl DeniedLookups {
    /// Whether `name` was not looked up in the last minute; marks it as looked up now.
    fn due(&self, name: &RelayName) -> bool {
        let mut last = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        if last
            .get(name)
            .is_some_and(|at| now.duration_since(*at) < DENIED_LOOKUP_EVERY)
        {
            return false;
        }
        last.insert(name.clone(), now);
        true
    }
}
