//! `whois`: what one agent is to this one, in one answer — its fingerprint (the pinned key's,
//! else the one its relay presents now), whether it is a contact, its directory listing and
//! whether it is online. Looking up pins nothing: a key is pinned when mail is exchanged.

use jiff::Timestamp;
use serde::Serialize;

use super::ask::Ask;
use super::discovery::peek_remote_keys;
use super::{ClientError, consent, directory, is_own_relay, presence};
use crate::crypto::PublicIdentity;
use crate::protocol::{Address, ClientFrame, ErrorCode, Fingerprint, Peer, RelayName, ServerFrame};
use crate::store::StoreHandle;

/// Whether the agent exists, as far as can be told.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum Found {
    /// Its relay has keys for it.
    Registered,
    /// Its relay knows no agent of that name (never registered, or retired).
    Unknown {
        /// Said for people.
        reason: String,
    },
    /// Its relay could not be asked, or its answer could not be trusted.
    Unreachable {
        /// Why.
        reason: String,
    },
}

/// Where the fingerprint shown comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum KeySource {
    /// The keys pinned on first contact.
    Pinned,
    /// The keys its relay presents now; not pinned.
    Relay,
}

/// The agent's consent relation with this one, as this agent's relay holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ContactStatus {
    /// Its owner and ours approved: mail flows both ways.
    Approved,
    /// It asked to become a contact; our owner decides.
    PendingIncoming,
    /// We asked; its owner decides.
    PendingOutgoing,
    /// Our owner blocked it.
    Blocked,
    /// None of these (an agent on another relay is always this: consent is per relay).
    None,
}

/// What one agent is to this one.
#[derive(Debug, Clone, Serialize)]
pub struct Whois {
    /// The address asked about.
    pub address: Address,
    /// Whether it exists.
    pub found: Found,
    /// Its fingerprint, when one is known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fingerprint: Option<Fingerprint>,
    /// Where [`Whois::fingerprint`] comes from.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<KeySource>,
    /// The fingerprint its relay presents now, when that is not the pinned one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub presented: Option<Fingerprint>,
    /// Key changes recorded for it and not resolved by the owner.
    pub key_changes: u32,
    /// The fingerprints of those changes, newest first: what `contacts trust` accepts once
    /// the peer's owner confirmed one.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub changed_to: Vec<Fingerprint>,
    /// The other relay that vouches for its keys, and that relay's fingerprint.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vouched_by: Option<(RelayName, Fingerprint)>,
    /// Its contact status with this agent.
    pub contact: ContactStatus,
    /// Its own one-line description in the directory, if listed: its words, not ours.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub listing: Option<String>,
    /// When its current delivery session began, if it is online and this agent may see it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub online_since: Option<Timestamp>,
}

/// Answers `whois address` over `conn`, reading pinned keys from `store` (pinning nothing).
/// An address on another relay is looked up there (over TLS unless loopback or in `trusted`).
pub async fn whois(
    conn: &mut impl Ask,
    store: &StoreHandle,
    trusted: &[RelayName],
    address: &Address,
) -> Result<Whois, ClientError> {
    match address.host() {
        Some(host) if !is_own_relay(conn.relay_url(), host).await? => {
            remote(store, trusted, host, address).await
        }
        _ => local(conn, store, address).await,
    }
}

async fn local(
    conn: &mut impl Ask,
    store: &StoreHandle,
    address: &Address,
) -> Result<Whois, ClientError> {
    let name = address.name().clone();
    let pinned_as = Address::local(name.clone());
    let pinned = store.call(move |s| s.contact(&pinned_as)).await?;
    let wanted = name.clone();
    let presented = match conn
        .ask(Box::new(move |reference| ClientFrame::Lookup {
            reference,
            agent: wanted,
        }))
        .await
    {
        Ok(ServerFrame::Keys { keys, .. }) => Some(
            PublicIdentity::try_from(keys)
                .map_err(|e| {
                    ClientError::Protocol(format!("the relay returned invalid keys: {e}"))
                })?
                .fingerprint(),
        ),
        Ok(other) => {
            return Err(ClientError::Protocol(format!(
                "expected keys, got {other:?}"
            )));
        }
        Err(ClientError::Refused {
            code: ErrorCode::UnknownAgent,
            ..
        }) => None,
        Err(e) => return Err(e),
    };
    let mut whois = keyed(address, pinned, presented.clone(), None);
    whois.changed_to = changed_to(store, Address::local(name.clone())).await?;
    if presented.is_none() {
        whois.found = Found::Unknown {
            reason: format!("no agent named {name} on this relay (never registered, or retired)"),
        };
        return Ok(whois);
    }
    whois.contact = contact_status(&consent::state(conn).await?, &Address::local(name.clone()));
    whois.listing = directory::list(conn)
        .await?
        .into_iter()
        .find(|e| e.agent == name)
        .map(|e| e.description);
    whois.online_since = presence::online(conn, Some(vec![name]))
        .await?
        .into_iter()
        .next()
        .map(|o| o.since);
    Ok(whois)
}

async fn remote(
    store: &StoreHandle,
    trusted: &[RelayName],
    host: &RelayName,
    address: &Address,
) -> Result<Whois, ClientError> {
    let pinned_as = address.clone();
    let pinned = store.call(move |s| s.contact(&pinned_as)).await?;
    let changed_to = changed_to(store, address.clone()).await?;
    Ok(Whois {
        changed_to,
        ..match peek_remote_keys(store, trusted, host, address).await {
            Ok((keys, relay)) => keyed(
                address,
                pinned,
                Some(keys.fingerprint()),
                Some((host.clone(), relay)),
            ),
            Err(ClientError::Refused {
                code: ErrorCode::UnknownAgent,
                ..
            }) => Whois {
                found: Found::Unknown {
                    reason: format!("{host} knows no agent named {}", address.name()),
                },
                ..keyed(address, pinned, None, None)
            },
            Err(e) => Whois {
                found: Found::Unreachable {
                    reason: format!("{host} could not be asked about {address}: {e}"),
                },
                ..keyed(address, pinned, None, None)
            },
        }
    })
}

/// The fingerprints `address` presented that differ from its pinned keys, unsettled.
async fn changed_to(
    store: &StoreHandle,
    address: Address,
) -> Result<Vec<Fingerprint>, ClientError> {
    Ok(store.call(move |s| s.presented_changes(&address)).await?)
}

/// A registered agent's entry from its pinned keys and the fingerprint presented now: the
/// pinned one is shown, the presented one only when it differs.
fn keyed(
    address: &Address,
    pinned: Option<crate::store::Contact>,
    presented: Option<Fingerprint>,
    vouched_by: Option<(RelayName, Fingerprint)>,
) -> Whois {
    let (fingerprint, key, presented, key_changes) = match (pinned, presented) {
        (Some(p), presented) => {
            let differs = presented.filter(|f| *f != p.fingerprint);
            (
                Some(p.fingerprint),
                Some(KeySource::Pinned),
                differs,
                p.key_changes,
            )
        }
        (None, Some(f)) => (Some(f), Some(KeySource::Relay), None, 0),
        (None, None) => (None, None, None, 0),
    };
    Whois {
        address: address.clone(),
        found: Found::Registered,
        fingerprint,
        key,
        presented,
        key_changes,
        changed_to: Vec::new(),
        vouched_by,
        contact: ContactStatus::None,
        listing: None,
        online_since: None,
    }
}

fn contact_status(state: &consent::ConsentState, name: &Address) -> ContactStatus {
    if state.contacts.contains(name) {
        ContactStatus::Approved
    } else if state.blocked.contains(&Peer::Agent(name.clone()))
        || name
            .host()
            .is_some_and(|h| state.blocked.contains(&Peer::AnyAt(h.clone())))
    {
        ContactStatus::Blocked
    } else if state.incoming.iter().any(|r| r.agent == *name) {
        ContactStatus::PendingIncoming
    } else if state.outgoing.iter().any(|r| r.agent == *name) {
        ContactStatus::PendingOutgoing
    } else {
        ContactStatus::None
    }
}
