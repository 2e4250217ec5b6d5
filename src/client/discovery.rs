//! Other relays, over HTTP(S): their discovery document and the keys of their agents, checked
//! against the relay key pinned for them. A bare name, or a name at the agent's own relay, is
//! a local agent; any other `name@host` is looked up at `host` and pinned under the full
//! address, never under a name looked up on the agent's own relay.

use std::time::Duration;

use super::{ClientError, Connection, RelayUrl};
use crate::crypto::{PublicIdentity, relay_fingerprint, verify_agent_keys};
use crate::fetch::BodyError;
use crate::protocol::{
    Address, AgentKeys, ErrorCode, Fingerprint, MAX_DISCOVERY_BYTES, RelayEndpoint, RelayInfo,
    RelayName, WELL_KNOWN_PATH,
};
use crate::store::{KeyCheck, StoreHandle};

/// How long each request to a relay may take.
const TIMEOUT: Duration = Duration::from_secs(10);

/// An agent's keys as they were found and pinned.
#[derive(Debug, Clone)]
pub struct Resolved {
    /// The address they are pinned under.
    pub address: Address,
    /// The keys presented now.
    pub keys: PublicIdentity,
    /// How they compare with what was pinned before.
    pub check: KeyCheck,
    /// The other relay that vouched for them, and its key's fingerprint; `None` for a local
    /// agent (its keys came from the agent's own relay).
    pub relay: Option<(RelayName, Fingerprint)>,
}

/// Whether `host` names the relay at `own`: its URL's host and port as written, or the name
/// the relay publishes (asked only when they differ).
pub async fn is_own_relay(own: &RelayUrl, host: &RelayName) -> Result<bool, ClientError> {
    if host.as_str() == own.authority() {
        return Ok(true);
    }
    Ok(own_relay_name(own).await? == *host)
}

/// The name the relay at `own` publishes in its discovery document, asked over the scheme of
/// its URL (HTTPS for `wss://`). The agent's full address is `name@` this. The relay is the
/// one the owner configured, so its word on its own name is taken as it is.
pub async fn own_relay_name(own: &RelayUrl) -> Result<RelayName, ClientError> {
    let base = format!(
        "{}://{}",
        if own.is_tls() { "https" } else { "http" },
        own.authority()
    );
    let loopback = RelayName::new(own.authority()).is_ok_and(|n| n.is_loopback());
    let info: RelayInfo = get_json(
        &client(own.is_tls(), loopback)?,
        &format!("{base}{WELL_KNOWN_PATH}"),
    )
    .await?;
    Ok(info.name)
}

/// Looks up `address`'s keys and pins them under it: from the agent's own relay over `conn`
/// when the address is local, else from the relay its host names (reached over TLS unless
/// loopback or listed in `trusted`), whose key is pinned on first contact and must not change.
pub async fn resolve_keys(
    conn: &mut Connection,
    store: &StoreHandle,
    trusted: &[RelayName],
    address: &Address,
) -> Result<Resolved, ClientError> {
    let remote = match address.host() {
        Some(host) if !conn.is_own_relay(host).await? => Some(host.clone()),
        _ => None,
    };
    let (keys, relay) = match remote {
        None => {
            let raw = conn.lookup(address.name()).await?;
            let keys = PublicIdentity::try_from(raw).map_err(|e| {
                ClientError::Protocol(format!("the relay returned invalid keys: {e}"))
            })?;
            (keys, None)
        }
        Some(host) => {
            let (keys, fingerprint) = remote_keys(store, trusted, &host, address).await?;
            (keys, Some((host, fingerprint)))
        }
    };
    // A local agent is pinned under its bare name, however its address was spelt.
    let pinned_as = match relay {
        None => Address::local(address.name().clone()),
        Some(_) => address.clone(),
    };
    let presented = keys.clone();
    let check = store
        .call(move |s| s.check_and_pin(&pinned_as, &presented))
        .await?;
    Ok(Resolved {
        address: address.clone(),
        keys,
        check,
        relay,
    })
}

/// Fetches the discovery document of `relay`, checks that it names itself `relay` and that
/// its key is the one pinned for it (pinning it on first contact).
pub async fn relay_key(
    store: &StoreHandle,
    trusted: &[RelayName],
    relay: &RelayName,
) -> Result<RelayInfo, ClientError> {
    let info = discover(trusted, relay).await?;
    let (name, key) = (relay.clone(), info.key);
    match store
        .call(move |s| s.check_and_pin_relay(&name, &key))
        .await?
    {
        KeyCheck::Pinned | KeyCheck::Matches => Ok(info),
        KeyCheck::Changed { pinned, presented } => Err(ClientError::RelayKeyChanged {
            relay: relay.clone(),
            pinned,
            presented,
        }),
    }
}

/// The discovery document of `relay`, checked (it names the relay as asked, and its
/// fingerprint is its key's) but not compared with any pinned key.
pub async fn discover(trusted: &[RelayName], relay: &RelayName) -> Result<RelayInfo, ClientError> {
    let endpoint = RelayEndpoint::of(relay, trusted);
    let url = endpoint.well_known_url();
    let http = client(endpoint.is_tls(), relay.is_loopback())?;
    let info: RelayInfo = get_json(&http, &url).await?;
    if info.name != *relay {
        return Err(ClientError::Protocol(format!(
            "{url} says the relay there is {}, not {relay}; write the address with @{} instead",
            info.name, info.name
        )));
    }
    if relay_fingerprint(&info.key) != info.fingerprint {
        return Err(ClientError::Protocol(format!(
            "{url} gives a fingerprint ({}) that is not its key's",
            info.fingerprint
        )));
    }
    Ok(info)
}

/// The keys of `address` on the relay `host`, vouched for by the relay's key (pinned on first
/// contact; a changed one is refused). Nothing is pinned for the agent: the caller pins what it
/// uses.
pub(super) async fn remote_keys(
    store: &StoreHandle,
    trusted: &[RelayName],
    host: &RelayName,
    address: &Address,
) -> Result<(PublicIdentity, Fingerprint), ClientError> {
    let info = relay_key(store, trusted, host).await?;
    agent_keys(trusted, host, &info, address).await
}

/// The keys of `address` on the relay `host`, vouched for by its key, which is compared with
/// the one pinned for it when there is one: nothing is pinned, neither the relay's key nor the
/// agent's (looking someone up is not meeting them).
pub async fn peek_remote_keys(
    store: &StoreHandle,
    trusted: &[RelayName],
    host: &RelayName,
    address: &Address,
) -> Result<(PublicIdentity, Fingerprint), ClientError> {
    let info = discover(trusted, host).await?;
    let relay = host.clone();
    if let Some(pinned) = store.call(move |s| s.pinned_relay(&relay)).await?
        && pinned.key != info.key
    {
        return Err(ClientError::RelayKeyChanged {
            relay: host.clone(),
            pinned: pinned.fingerprint,
            presented: info.fingerprint,
        });
    }
    agent_keys(trusted, host, &info, address).await
}

/// The fingerprint of `address`'s keys on its own relay (`name@host`), vouched for by that
/// relay's key; nothing is pinned. For an owner to compare with the agent's owner.
pub async fn remote_fingerprint(
    trusted: &[RelayName],
    address: &Address,
) -> Result<Fingerprint, ClientError> {
    let host = address
        .host()
        .ok_or_else(|| ClientError::Protocol(format!("{address} names no relay")))?;
    let info = discover(trusted, host).await?;
    let (keys, _) = agent_keys(trusted, host, &info, address).await?;
    Ok(keys.fingerprint())
}

/// The keys of `address` at `host`, whose discovery document is `info`, checked against its key.
async fn agent_keys(
    trusted: &[RelayName],
    host: &RelayName,
    info: &RelayInfo,
    address: &Address,
) -> Result<(PublicIdentity, Fingerprint), ClientError> {
    let endpoint = RelayEndpoint::of(host, trusted);
    let url = endpoint.agent_keys_url(address.name());
    let answer: AgentKeys = get_json(&client(endpoint.is_tls(), host.is_loopback())?, &url).await?;
    let bad = |problem: String| ClientError::Protocol(format!("{url}: {problem}"));
    if answer.relay != *host || answer.agent != *address.name() {
        return Err(bad(format!(
            "the answer is for {}@{}, not {address}",
            answer.agent, answer.relay
        )));
    }
    verify_agent_keys(
        &info.key,
        host,
        address.name(),
        &answer.keys,
        &answer.signature,
    )
    .map_err(|_| {
        bad(format!(
            "the keys are not signed by {host}'s key ({}); they were altered on the way or do not come from {host}",
            info.fingerprint
        ))
    })?;
    let keys =
        PublicIdentity::try_from(answer.keys).map_err(|e| bad(format!("invalid keys: {e}")))?;
    if keys.fingerprint() != answer.fingerprint {
        return Err(bad(format!(
            "the fingerprint {} is not the keys'",
            answer.fingerprint
        )));
    }
    Ok((keys, info.fingerprint.clone()))
}

/// An HTTP client that follows no redirects (a relay answers for itself) and, for loopback,
/// uses no proxy.
fn client(tls: bool, loopback: bool) -> Result<reqwest::Client, ClientError> {
    let setup = |reason: String| ClientError::Unreachable {
        url: "(discovery)".into(),
        reason,
    };
    let mut builder = reqwest::Client::builder()
        .timeout(TIMEOUT)
        .redirect(reqwest::redirect::Policy::none())
        .user_agent(concat!("mailslot/", env!("CARGO_PKG_VERSION")))
        .tls_backend_preconfigured(crate::tls::http_tls(tls).map_err(setup)?);
    if loopback {
        builder = builder.no_proxy();
    }
    builder
        .build()
        .map_err(|e| setup(format!("cannot make an HTTP client: {e}")))
}

/// The error body every relay refusal carries.
#[derive(serde::Deserialize)]
struct Refusal {
    code: ErrorCode,
    message: String,
}

/// GETs `url` and parses its JSON, reading at most [`MAX_DISCOVERY_BYTES`]. A refusal with a
/// relay's error body becomes [`ClientError::Refused`].
async fn get_json<T: serde::de::DeserializeOwned>(
    http: &reqwest::Client,
    url: &str,
) -> Result<T, ClientError> {
    let unreachable = |reason: String| ClientError::Unreachable {
        url: url.to_owned(),
        reason,
    };
    let response = http
        .get(url)
        .send()
        .await
        .map_err(|e| unreachable(e.to_string()))?;
    let status = response.status();
    let body = crate::fetch::body(response, MAX_DISCOVERY_BYTES)
        .await
        .map_err(|e| match e {
            BodyError::Read(e) => unreachable(e.to_string()),
            BodyError::TooLarge(max) => {
                ClientError::Protocol(format!("{url} answered more than {max} bytes"))
            }
        })?;
    if !status.is_success() {
        return Err(match serde_json::from_slice::<Refusal>(&body) {
            Ok(Refusal { code, message }) => ClientError::Refused {
                code,
                message,
                retry_after_ms: None,
            },
            // Trouble that passes (a failing or overloaded server, a proxy's timeout): retried.
            Err(_)
                if status.is_server_error()
                    || status == reqwest::StatusCode::TOO_MANY_REQUESTS
                    || status == reqwest::StatusCode::REQUEST_TIMEOUT =>
            {
                unreachable(format!("it answered {status}"))
            }
            Err(_) => {
                ClientError::Protocol(format!("{url} answered {status}; is it a mailslot relay?"))
            }
        });
    }
    serde_json::from_slice(&body)
        .map_err(|e| ClientError::Protocol(format!("{url} answered what is not expected: {e}")))
}
