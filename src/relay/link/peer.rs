//! Another relay's identity: its discovery document fetched from the host its name gives
//! (over TLS unless loopback or trusted), checked, and its key pinned on first contact. A
//! changed key is refused, never replaced: the operator must look into it.

use std::time::Duration;

use super::super::state::RelayState;
use super::super::storage::{RelayPin, Storage};
use crate::crypto::relay_fingerprint;
use crate::fetch::BodyError;
use crate::protocol::{MAX_DISCOVERY_BYTES, RelayEndpoint, RelayInfo, RelayKey, RelayName};

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
        "{relay} presents the key {presented}, not the key {pinned} pinned for it; nothing is delivered either way until its operator confirms a new key and the pin is removed here"
    )]
    KeyChanged {
        /// The relay.
        relay: RelayName,
        /// The pinned key's fingerprint.
        pinned: String,
        /// The presented key's fingerprint.
        presented: String,
    },
    /// The storage failed.
    #[error("storage: {0}")]
    Storage(String),
}

/// `relay`'s key, from its discovery document, pinned here (on first contact) or matching the
/// pin.
pub async fn pinned_key<S: Storage>(
    state: &RelayState<S>,
    relay: &RelayName,
) -> Result<RelayKey, PeerError> {
    let info = discover(state, relay).await?;
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
async fn discover<S: Storage>(
    state: &RelayState<S>,
    relay: &RelayName,
) -> Result<RelayInfo, PeerError> {
    let endpoint = RelayEndpoint::of(relay, &state.config.trusted_hosts);
    let url = endpoint.well_known_url();
    let unreachable = |reason: String| PeerError::Unreachable {
        url: url.clone(),
        reason,
    };
    let invalid = |problem: String| PeerError::Invalid {
        url: url.clone(),
        problem,
    };
    let http = client(
        endpoint.is_tls(),
        relay.is_loopback(),
        state.config.link_timeout(),
    )
    .map_err(unreachable)?;
    let response = http
        .get(&url)
        .send()
        .await
        .map_err(|e| unreachable(e.to_string()))?;
    if !response.status().is_success() {
        return Err(unreachable(format!("answered {}", response.status())));
    }
    let body = crate::fetch::body(response, MAX_DISCOVERY_BYTES)
        .await
        .map_err(|e| match e {
            BodyError::Read(e) => unreachable(e.to_string()),
            BodyError::TooLarge(max) => invalid(format!("the document is over {max} bytes")),
        })?;
    let info: RelayInfo = serde_json::from_slice(&body)
        .map_err(|e| invalid(format!("not a discovery document: {e}")))?;
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

/// An HTTP client that follows no redirects (a relay answers for itself) and, for loopback,
/// uses no proxy.
fn client(tls: bool, loopback: bool, timeout: Duration) -> Result<reqwest::Client, String> {
    let mut builder = reqwest::Client::builder()
        .timeout(timeout)
        .redirect(reqwest::redirect::Policy::none())
        .user_agent(concat!("mailslot-relay/", env!("CARGO_PKG_VERSION")))
        .tls_backend_preconfigured(crate::tls::http_tls(tls)?);
    if loopback {
        builder = builder.no_proxy();
    }
    builder
        .build()
        .map_err(|e| format!("cannot make an HTTP client: {e}"))
}
