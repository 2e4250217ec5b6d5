//! Agent names and addresses: `name` on one relay, `name@host[:port]` across relays.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use super::ValidationError;

/// The longest agent name, in characters.
pub const MAX_NAME_LEN: usize = 64;
/// The longest host part of an address (DNS names stop at 253), plus room for `:port`.
pub const MAX_HOST_LEN: usize = 253 + 6;

/// An agent's name: `[a-z0-9][a-z0-9._-]{0,63}`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct AgentName(String);

impl AgentName {
    /// Validates `name`; the error says which character or length is wrong.
    pub fn new(name: &str) -> Result<Self, ValidationError> {
        const FIELD: &str = "agent name";
        if name.is_empty() {
            return Err(ValidationError::new(
                FIELD,
                "is empty; use lowercase letters, digits, '.', '_' or '-'",
            ));
        }
        let len = name.chars().count();
        if len > MAX_NAME_LEN {
            return Err(ValidationError::too_long(
                FIELD,
                len,
                MAX_NAME_LEN,
                "characters",
            ));
        }
        for (i, c) in name.chars().enumerate() {
            let ok = c.is_ascii_lowercase()
                || c.is_ascii_digit()
                || (i > 0 && matches!(c, '.' | '_' | '-'));
            if !ok {
                return Err(ValidationError::new(
                    FIELD,
                    format!(
                        "{name:?} has {c:?} at position {}; a name is lowercase letters, digits, '.', '_' and '-', and starts with a letter or digit",
                        i + 1
                    ),
                ));
            }
        }
        Ok(Self(name.to_owned()))
    }

    /// Makes a valid name out of arbitrary text (a folder name), or `None` if nothing usable is left.
    pub fn sanitize(raw: &str) -> Option<Self> {
        let mapped: String = raw
            .chars()
            .flat_map(char::to_lowercase)
            .map(|c| {
                if c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '.' | '_' | '-') {
                    c
                } else {
                    '-'
                }
            })
            .collect();
        let trimmed: String = mapped
            .trim_start_matches(['.', '_', '-'])
            .chars()
            .take(MAX_NAME_LEN)
            .collect();
        Self::new(trimmed.trim_end_matches(['.', '_', '-'])).ok()
    }

    /// The name as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The queue a relay keeps for mail on its way to the relay `relay`: `@relay`. No agent
    /// can hold it: [`AgentName::new`] (every name from the network, a file or a user goes
    /// through it) refuses a name that does not start with a letter or digit, so an agent can
    /// never register, log in as, or address one. Only the relay makes these, and its storage
    /// reads them back with [`AgentName::from_stored`].
    ///
    /// `None` when the relay's name is too long to be stored as a queue name (over
    /// [`MAX_STORED_NAME_BYTES`] bytes).
    pub fn relay_mailbox(relay: &RelayName) -> Option<Self> {
        let name = format!("@{relay}");
        (name.len() <= MAX_STORED_NAME_BYTES).then_some(Self(name))
    }

    /// The relay this is the mailbox of ([`AgentName::relay_mailbox`]), `None` for an agent.
    pub fn mailbox_relay(&self) -> Option<RelayName> {
        RelayName::new(self.0.strip_prefix('@')?).ok()
    }

    /// An agent of another relay as a relay keeps it, the sender of mail that came over a
    /// link: its full address `name@host`, which no local agent's name can be (`@` is not in
    /// the alphabet). `None` for a bare address, or one too long to store.
    pub fn remote_agent(address: &Address) -> Option<Self> {
        let name = format!("{}@{}", address.name(), address.host()?);
        (name.len() <= MAX_STORED_NAME_BYTES).then_some(Self(name))
    }

    /// Every agent of the relay `relay` as a relay keeps a block of them: `*@relay`.
    pub fn any_at(relay: &RelayName) -> Option<Self> {
        let name = format!("*@{relay}");
        (name.len() <= MAX_STORED_NAME_BYTES).then_some(Self(name))
    }

    /// The peer a name a relay keeps in its consent tables stands for.
    pub fn stored_peer(&self) -> Peer {
        match self.0.strip_prefix("*@").map(RelayName::new) {
            Some(Ok(host)) => Peer::AnyAt(host),
            _ => Peer::Agent(self.stored_address()),
        }
    }

    /// The address of a name a relay keeps: a remote agent's full address, else the bare
    /// name of an agent there.
    pub fn stored_address(&self) -> Address {
        match self.0.split_once('@') {
            Some((name, host)) if !name.is_empty() => {
                match (AgentName::new(name), RelayName::new(host)) {
                    (Ok(name), Ok(host)) => Address::remote(name, host),
                    _ => Address::local(self.clone()),
                }
            }
            _ => Address::local(self.clone()),
        }
    }

    /// A name read back from the relay's own storage: an agent's name, a relay mailbox
    /// (`@host`) or another relay's agent (`name@host`).
    pub fn from_stored(name: &str) -> Result<Self, ValidationError> {
        let invalid = || ValidationError::new("stored name", format!("{name:?} is not valid"));
        if let Some(relay) = name.strip_prefix("*@") {
            return RelayName::new(relay)
                .ok()
                .and_then(|r| Self::any_at(&r))
                .ok_or_else(invalid);
        }
        match name.strip_prefix('@') {
            Some(relay) => RelayName::new(relay)
                .ok()
                .and_then(|r| Self::relay_mailbox(&r))
                .ok_or_else(invalid),
            None if name.contains('@') => Address::parse(name)
                .ok()
                .and_then(|a| Self::remote_agent(&a))
                .ok_or_else(invalid),
            None => Self::new(name),
        }
    }
}

/// The longest queue name a relay stores, in bytes (its spool writes a name's length in one
/// byte).
pub const MAX_STORED_NAME_BYTES: usize = 255;

impl fmt::Display for AgentName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl FromStr for AgentName {
    type Err = ValidationError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::new(s)
    }
}

impl TryFrom<String> for AgentName {
    type Error = ValidationError;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        Self::new(&s)
    }
}

impl From<AgentName> for String {
    fn from(n: AgentName) -> Self {
        n.0
    }
}

/// A relay's public name, the host part of an address: a lowercase DNS name, an IPv4 address
/// or a bracketed IPv6 address, with an optional `:port`. It is compared as written, so a relay
/// is known by exactly one name (the one it publishes at `/.well-known/mailslot`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct RelayName(String);

impl RelayName {
    /// Validates `host[:port]`; the error names the part that is wrong.
    pub fn new(host: &str) -> Result<Self, ValidationError> {
        validate_host(host).map(Self)
    }

    /// The name as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The host without the port (IPv6 keeps its brackets).
    pub fn host(&self) -> &str {
        match self.0.rsplit_once(':') {
            Some((host, port)) if !port.contains(']') => host,
            _ => &self.0,
        }
    }

    /// The port, when the name gives one.
    pub fn port(&self) -> Option<u16> {
        let (_, port) = self.0.rsplit_once(':')?;
        port.parse().ok()
    }

    /// Whether the host is this machine: `localhost`, `127.0.0.0/8` or `[::1]`.
    pub fn is_loopback(&self) -> bool {
        let host = self.host();
        host == "localhost"
            || host == "[::1]"
            || host
                .parse::<std::net::Ipv4Addr>()
                .is_ok_and(|ip| ip.is_loopback())
    }
}

impl fmt::Display for RelayName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl FromStr for RelayName {
    type Err = ValidationError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::new(s)
    }
}

impl TryFrom<String> for RelayName {
    type Error = ValidationError;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        Self::new(&s)
    }
}

impl From<RelayName> for String {
    fn from(n: RelayName) -> Self {
        n.0
    }
}

/// Where an agent receives mail: a name, and the relay host when it is not the local one.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Address {
    name: AgentName,
    host: Option<RelayName>,
}

impl Address {
    /// An address on the agent's own relay.
    pub fn local(name: AgentName) -> Self {
        Self { name, host: None }
    }

    /// Parses `name` or `name@host[:port]`; hosts are lowercase DNS names, IPv4, or `[IPv6]`.
    pub fn parse(s: &str) -> Result<Self, ValidationError> {
        let (name, host) = match s.split_once('@') {
            None => (s, None),
            Some((name, host)) => (name, Some(host)),
        };
        let name = AgentName::new(name)?;
        let host = host.map(RelayName::new).transpose()?;
        Ok(Self { name, host })
    }

    /// `name` at the relay `host`.
    pub fn remote(name: AgentName, host: RelayName) -> Self {
        Self {
            name,
            host: Some(host),
        }
    }

    /// The agent name part.
    pub fn name(&self) -> &AgentName {
        &self.name
    }

    /// The relay host part, if the address names one.
    pub fn host(&self) -> Option<&RelayName> {
        self.host.as_ref()
    }
}

/// Whom an owner blocks: one agent (`name`, `name@host`), or every agent of a relay
/// (`*@host`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum Peer {
    /// One agent.
    Agent(Address),
    /// Every agent of the relay `host`.
    AnyAt(RelayName),
}

impl Peer {
    /// Parses `name`, `name@host` or `*@host`.
    pub fn parse(s: &str) -> Result<Self, ValidationError> {
        match s.strip_prefix("*@") {
            Some(host) => RelayName::new(host).map(Peer::AnyAt),
            None => Address::parse(s).map(Peer::Agent),
        }
    }
}

impl fmt::Display for Peer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Peer::Agent(a) => a.fmt(f),
            Peer::AnyAt(host) => write!(f, "*@{host}"),
        }
    }
}

impl FromStr for Peer {
    type Err = ValidationError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

impl TryFrom<String> for Peer {
    type Error = ValidationError;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        Self::parse(&s)
    }
}

impl From<Peer> for String {
    fn from(p: Peer) -> Self {
        p.to_string()
    }
}

impl From<Address> for Peer {
    fn from(a: Address) -> Self {
        Peer::Agent(a)
    }
}

fn validate_host(host: &str) -> Result<String, ValidationError> {
    const FIELD: &str = "address host";
    if host.len() > MAX_HOST_LEN {
        return Err(ValidationError::too_long(
            FIELD,
            host.len(),
            MAX_HOST_LEN,
            "bytes",
        ));
    }
    let (hostname, port) = if let Some(rest) = host.strip_prefix('[') {
        let (v6, after) = rest.split_once(']').ok_or_else(|| {
            ValidationError::new(FIELD, format!("{host:?} opens '[' without ']'"))
        })?;
        if v6.parse::<std::net::Ipv6Addr>().is_err() {
            return Err(ValidationError::new(
                FIELD,
                format!("{v6:?} is not an IPv6 address"),
            ));
        }
        let port = match after {
            "" => None,
            p => Some(p.strip_prefix(':').ok_or_else(|| {
                ValidationError::new(
                    FIELD,
                    format!("{host:?} has {p:?} after ']'; expected ':port'"),
                )
            })?),
        };
        (None, port)
    } else {
        match host.rsplit_once(':') {
            Some((h, p)) => (Some(h), Some(p)),
            None => (Some(host), None),
        }
    };
    if let Some(h) = hostname {
        let ok = !h.is_empty()
            && h.split('.').all(|label| {
                !label.is_empty()
                    && label.len() <= 63
                    && !label.starts_with('-')
                    && !label.ends_with('-')
                    && label
                        .chars()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
            });
        if !ok {
            return Err(ValidationError::new(
                FIELD,
                format!(
                    "{h:?} is not a lowercase host name (labels of a-z, 0-9 and '-', joined by '.')"
                ),
            ));
        }
    }
    if let Some(p) = port {
        let valid = !p.starts_with('0') && p.parse::<u16>().is_ok_and(|n| n > 0);
        if !valid {
            return Err(ValidationError::new(
                FIELD,
                format!("port {p:?} is not a number from 1 to 65535"),
            ));
        }
    }
    Ok(host.to_owned())
}

impl fmt::Display for Address {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.host {
            None => write!(f, "{}", self.name),
            Some(h) => write!(f, "{}@{h}", self.name),
        }
    }
}

impl FromStr for Address {
    type Err = ValidationError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

impl TryFrom<String> for Address {
    type Error = ValidationError;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        Self::parse(&s)
    }
}

impl From<Address> for String {
    fn from(a: Address) -> Self {
        a.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stored_names_are_never_agent_names() {
        let relay = RelayName::new("relay-b.example:7000").unwrap();
        let mailbox = AgentName::relay_mailbox(&relay).unwrap();
        let remote =
            AgentName::remote_agent(&Address::parse("bob@relay-b.example:7000").unwrap()).unwrap();
        for stored in [&mailbox, &remote] {
            assert!(AgentName::new(stored.as_str()).is_err(), "{stored}");
            let json = serde_json::to_string(stored.as_str()).unwrap();
            assert!(serde_json::from_str::<AgentName>(&json).is_err(), "{json}");
            assert_eq!(&AgentName::from_stored(stored.as_str()).unwrap(), stored);
        }
        assert_eq!(mailbox.mailbox_relay(), Some(relay));
        assert_eq!(remote.mailbox_relay(), None);
        assert!(AgentName::remote_agent(&Address::parse("bob").unwrap()).is_none());
        assert!(AgentName::from_stored("@not a host").is_err());
        assert!(AgentName::from_stored("bob@").is_err());
    }

    #[test]
    fn names_at_the_length_limit() {
        assert!(AgentName::new(&"a".repeat(64)).is_ok());
        let err = AgentName::new(&"a".repeat(65)).unwrap_err();
        assert_eq!(err.field, "agent name");
        assert!(
            err.problem.contains("65") && err.problem.contains("64"),
            "{err}"
        );
    }

    #[test]
    fn names_reject_bad_characters() {
        for bad in ["", "Alice", "-bob", ".x", "a b", "é", "a@b"] {
            assert!(AgentName::new(bad).is_err(), "{bad:?} accepted");
        }
        for good in ["a", "0", "a.b_c-d", "agent-7"] {
            assert!(AgentName::new(good).is_ok(), "{good:?} refused");
        }
    }

    #[test]
    fn sanitize_folder_names() {
        assert_eq!(
            AgentName::sanitize("My Project").unwrap().as_str(),
            "my-project"
        );
        assert_eq!(AgentName::sanitize("__x__").unwrap().as_str(), "x");
        assert!(AgentName::sanitize("___").is_none());
        assert_eq!(
            AgentName::sanitize(&"z".repeat(100))
                .unwrap()
                .as_str()
                .len(),
            64
        );
    }

    #[test]
    fn host_length_limit() {
        let label = "a".repeat(63);
        // 4 labels of 63 + 3 dots = 255, then trimmed to exactly MAX_HOST_LEN with a port.
        let long = format!(
            "{label}.{label}.{label}.{}",
            "b".repeat(MAX_HOST_LEN - 3 * 64 - 5)
        );
        let host = format!("{long}:7878");
        assert_eq!(host.len(), MAX_HOST_LEN);
        assert!(Address::parse(&format!("bob@{host}")).is_ok());
        let err = Address::parse(&format!("bob@{long}b:7878")).unwrap_err();
        assert_eq!(err.field, "address host");
        assert!(err.problem.contains(&MAX_HOST_LEN.to_string()), "{err}");
    }

    #[test]
    fn relay_names_split_host_and_port_and_know_loopback() {
        let name = |s: &str| RelayName::new(s).unwrap();
        assert_eq!(name("relay.example.com").host(), "relay.example.com");
        assert_eq!(name("relay.example.com").port(), None);
        assert_eq!(name("relay.example.com:8443").host(), "relay.example.com");
        assert_eq!(name("relay.example.com:8443").port(), Some(8443));
        assert_eq!(name("[::1]:7878").host(), "[::1]");
        assert_eq!(name("[::1]:7878").port(), Some(7878));
        assert_eq!(name("[::1]").host(), "[::1]");
        assert_eq!(name("[::1]").port(), None);
        for local in ["localhost:7878", "127.0.0.1", "127.1.2.3:9", "[::1]"] {
            assert!(name(local).is_loopback(), "{local}");
        }
        for far in [
            "relay.example.com",
            "10.0.0.1:7878",
            "localhost.example",
            "[::2]",
        ] {
            assert!(!name(far).is_loopback(), "{far}");
        }
        let err = RelayName::new("Relay.example").unwrap_err();
        assert_eq!(err.field, "address host");
    }

    #[test]
    fn addresses_round_trip() {
        for s in [
            "bob",
            "bob@relay.example.com",
            "bob@127.0.0.1:7878",
            "bob@[::1]:7878",
            "bob@[::1]",
        ] {
            assert_eq!(Address::parse(s).unwrap().to_string(), s);
        }
        for bad in [
            "bob@",
            "bob@Relay.com",
            "bob@x:0",
            "bob@x:70000",
            "bob@x:07",
            "bob@[zz]",
            "@x",
            "bob@a..b",
        ] {
            assert!(Address::parse(bad).is_err(), "{bad:?} accepted");
        }
    }
}
