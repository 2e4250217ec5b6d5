//! Relay discovery: the document a relay publishes at `/.well-known/mailslot`, the signed
//! answer with one of its agents' keys, and where a relay named in an address is reached.

use std::fmt;

use serde::{Deserialize, Serialize};

use super::{AgentName, Fingerprint, PublicKeys, RelayName, ValidationError, b64};

/// Where a relay publishes its discovery document.
pub const WELL_KNOWN_PATH: &str = "/.well-known/mailslot";
/// Where a relay's WebSocket endpoint is, unless a URL says otherwise.
pub const WEBSOCKET_PATH: &str = "/v1/ws";
/// The largest discovery document or key answer a client reads, in bytes.
pub const MAX_DISCOVERY_BYTES: usize = 16 * 1024;
/// The longest WebSocket path a discovery document may give, in bytes.
const MAX_PATH_LEN: usize = 256;

/// A relay's Ed25519 public key (crypto checks that the bytes are one).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct RelayKey([u8; 32]);

impl RelayKey {
    /// Wraps the 32 bytes of an Ed25519 public key.
    pub fn from_bytes(bytes: [u8; 32]) -> Self {
        Self(bytes)
    }

    /// The key's bytes.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// The key as standard padded base64, as it travels and is stored.
    pub fn to_base64(&self) -> String {
        b64::encode(&self.0)
    }
}

impl TryFrom<String> for RelayKey {
    type Error = ValidationError;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        let bytes = b64::decode(&s)
            .map_err(|_| ValidationError::new("key", "is not base64 (standard, padded)"))?;
        let len = bytes.len();
        bytes.try_into().map(Self).map_err(|_| {
            ValidationError::new("key", format!("is {len} bytes; a relay key is 32 bytes"))
        })
    }
}

impl From<RelayKey> for String {
    fn from(k: RelayKey) -> Self {
        k.to_base64()
    }
}

impl fmt::Debug for RelayKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RelayKey({})", self.to_base64())
    }
}

/// A path on the relay's host: starts with `/`, at most 256 bytes, no query, fragment or space.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct EndpointPath(String);

impl EndpointPath {
    /// Validates `path`.
    pub fn new(path: &str) -> Result<Self, ValidationError> {
        const FIELD: &str = "websocket";
        if path.len() > MAX_PATH_LEN {
            return Err(ValidationError::too_long(
                FIELD,
                path.len(),
                MAX_PATH_LEN,
                "bytes",
            ));
        }
        if !path.starts_with('/') || path.contains(['?', '#']) || path.contains(char::is_whitespace)
        {
            return Err(ValidationError::new(
                FIELD,
                format!("{path:?} is not a path like {WEBSOCKET_PATH}"),
            ));
        }
        Ok(Self(path.to_owned()))
    }

    /// The path as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for EndpointPath {
    type Error = ValidationError;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        Self::new(&s)
    }
}

impl From<EndpointPath> for String {
    fn from(p: EndpointPath) -> Self {
        p.0
    }
}

/// What `GET /.well-known/mailslot` answers: who the relay is. Readers ignore fields they do
/// not know, so later versions can add some.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RelayInfo {
    /// The relay's name: the host part of its agents' addresses.
    pub name: RelayName,
    /// The relay's Ed25519 public key, which signs the keys it vouches for.
    pub key: RelayKey,
    /// The key's fingerprint, for operators to compare.
    pub fingerprint: Fingerprint,
    /// The protocol version the relay speaks.
    pub version: u32,
    /// The path of its WebSocket endpoint.
    pub websocket: EndpointPath,
}

/// What `GET /.well-known/mailslot/agents/{name}` answers: an agent's public keys, signed by
/// the relay's key so they can be checked however they travelled.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentKeys {
    /// The relay that vouches for the keys.
    pub relay: RelayName,
    /// The agent.
    pub agent: AgentName,
    /// Its public keys.
    pub keys: PublicKeys,
    /// Their fingerprint.
    pub fingerprint: Fingerprint,
    /// Ed25519 by the relay key over [`agent_keys_payload`].
    #[serde(with = "b64")]
    pub signature: Vec<u8>,
}

/// The bytes a relay signs to vouch for an agent's keys (crypto adds the domain prefix):
/// `relay ‖ 0 ‖ agent ‖ 0 ‖ signing key ‖ sealing key`.
pub fn agent_keys_payload(relay: &RelayName, agent: &AgentName, keys: &PublicKeys) -> Vec<u8> {
    let mut payload = Vec::with_capacity(relay.as_str().len() + agent.as_str().len() + 66);
    payload.extend_from_slice(relay.as_str().as_bytes());
    payload.push(0);
    payload.extend_from_slice(agent.as_str().as_bytes());
    payload.push(0);
    payload.extend_from_slice(&keys.signing);
    payload.extend_from_slice(&keys.sealing);
    payload
}

/// Where the relay named in an address is reached: TLS (`https://`, `wss://`) unless the host
/// is loopback or listed as trusted, which get plain `http://` and `ws://`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RelayEndpoint {
    name: RelayName,
    tls: bool,
}

impl RelayEndpoint {
    /// The endpoint of `name`; `trusted` lists the hosts (exactly as written, port included)
    /// that may be reached without TLS.
    pub fn of(name: &RelayName, trusted: &[RelayName]) -> Self {
        Self {
            name: name.clone(),
            tls: !(name.is_loopback() || trusted.contains(name)),
        }
    }

    /// Whether it is reached over TLS.
    pub fn is_tls(&self) -> bool {
        self.tls
    }

    /// The relay's name.
    pub fn name(&self) -> &RelayName {
        &self.name
    }

    /// `https://host[:port]`, or `http://` without TLS.
    pub fn http_base(&self) -> String {
        let scheme = if self.tls { "https" } else { "http" };
        format!("{scheme}://{}", self.name)
    }

    /// `wss://host[:port]/v1/ws`, or `ws://` without TLS.
    pub fn websocket_url(&self) -> String {
        let scheme = if self.tls { "wss" } else { "ws" };
        format!("{scheme}://{}{WEBSOCKET_PATH}", self.name)
    }

    /// The discovery document's URL.
    pub fn well_known_url(&self) -> String {
        format!("{}{WELL_KNOWN_PATH}", self.http_base())
    }

    /// The URL of `agent`'s signed keys.
    pub fn agent_keys_url(&self, agent: &AgentName) -> String {
        format!("{}{WELL_KNOWN_PATH}/agents/{agent}", self.http_base())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(s: &str) -> RelayName {
        RelayName::new(s).unwrap()
    }

    #[test]
    fn hosts_map_to_tls_unless_loopback_or_trusted() {
        let far = RelayEndpoint::of(&name("relay.example.com"), &[]);
        assert!(far.is_tls());
        assert_eq!(far.websocket_url(), "wss://relay.example.com/v1/ws");
        assert_eq!(
            far.well_known_url(),
            "https://relay.example.com/.well-known/mailslot"
        );
        let bob = AgentName::new("bob").unwrap();
        assert_eq!(
            far.agent_keys_url(&bob),
            "https://relay.example.com/.well-known/mailslot/agents/bob"
        );
        let port = RelayEndpoint::of(&name("relay.example.com:8443"), &[]);
        assert_eq!(port.websocket_url(), "wss://relay.example.com:8443/v1/ws");

        for local in ["127.0.0.1:7878", "localhost:9", "[::1]:7878"] {
            let e = RelayEndpoint::of(&name(local), &[]);
            assert!(!e.is_tls(), "{local}");
            assert_eq!(e.websocket_url(), format!("ws://{local}/v1/ws"));
            assert_eq!(e.http_base(), format!("http://{local}"));
        }

        let lan = name("relay.lan:7878");
        assert!(RelayEndpoint::of(&lan, &[]).is_tls());
        assert!(!RelayEndpoint::of(&lan, std::slice::from_ref(&lan)).is_tls());
        // Trust is for the name exactly as written: another port is another relay.
        assert!(RelayEndpoint::of(&name("relay.lan:7879"), std::slice::from_ref(&lan)).is_tls());
        assert!(RelayEndpoint::of(&name("relay.lan"), &[lan]).is_tls());
    }

    #[test]
    fn the_signed_payload_separates_its_fields() {
        let keys = PublicKeys {
            signing: [1; 32],
            sealing: [2; 32],
        };
        let a = agent_keys_payload(&name("ab"), &AgentName::new("c").unwrap(), &keys);
        let b = agent_keys_payload(&name("a"), &AgentName::new("bc").unwrap(), &keys);
        assert_ne!(a, b);
        assert_eq!(&a[..5], b"ab\0c\0");
        assert_eq!(a.len(), 5 + 64);
    }

    #[test]
    fn documents_are_validated_when_read() {
        let good = r#"{"name":"relay.example.com","key":"AQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQE=","fingerprint":"7KQF-3MZA-X2P9-B4CD-HJ8N-QRST","version":1,"websocket":"/v1/ws","later":true}"#;
        let info: RelayInfo = serde_json::from_str(good).unwrap();
        assert_eq!(info.name, name("relay.example.com"));
        assert_eq!(info.websocket.as_str(), "/v1/ws");
        for (bad, field) in [
            (good.replace("relay.example.com", "Relay"), "address host"),
            (good.replace("AQEBAQEB", "AQEB"), "key"),
            (good.replace("/v1/ws", "v1/ws?x"), "websocket"),
        ] {
            let err = serde_json::from_str::<RelayInfo>(&bad).unwrap_err();
            assert!(err.to_string().contains(field), "{bad}: {err}");
        }
        let long = format!("/{}", "a".repeat(MAX_PATH_LEN));
        assert!(
            EndpointPath::new(&long)
                .unwrap_err()
                .problem
                .contains("256")
        );
    }
}
