//! Relay URLs: `ws://host:port` (or with a path); `wss://` is recognised and refused until TLS
//! support lands, with a message saying so.

use std::fmt;
use std::str::FromStr;

/// The path of the WebSocket endpoint, added when a URL has none.
const WS_PATH: &str = "/v1/ws";
/// The longest URL accepted.
const MAX_URL_LEN: usize = 2048;

/// A validated relay WebSocket URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RelayUrl(String);

impl RelayUrl {
    /// The URL as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The host and port, for messages and addresses.
    pub fn authority(&self) -> &str {
        let rest = self.0.trim_start_matches("ws://");
        rest.split('/').next().unwrap_or(rest)
    }
}

impl FromStr for RelayUrl {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if s.len() > MAX_URL_LEN {
            return Err(format!("relay URL is over {MAX_URL_LEN} characters"));
        }
        if s.starts_with("wss://") {
            return Err("wss:// relays are not supported yet; run the relay behind a TLS proxy and use ws:// on a trusted network".into());
        }
        let Some(rest) = s.strip_prefix("ws://") else {
            return Err(format!(
                "{s:?} is not a relay URL; write it like ws://127.0.0.1:7878"
            ));
        };
        let (authority, path) = rest.split_once('/').map_or((rest, ""), |(a, p)| (a, p));
        if authority.is_empty() || authority.contains(['@', '?', '#', ' ']) {
            return Err(format!(
                "{s:?} has no valid host; write it like ws://relay.example.com:7878"
            ));
        }
        if path.contains(['?', '#', ' ']) {
            return Err(format!(
                "{s:?} has a query or fragment; give only ws://host:port[/path]"
            ));
        }
        let path = if path.is_empty() {
            WS_PATH.to_owned()
        } else {
            format!("/{path}")
        };
        Ok(Self(format!("ws://{authority}{path}")))
    }
}

impl<'de> serde::Deserialize<'de> for RelayUrl {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d)?
            .parse()
            .map_err(serde::de::Error::custom)
    }
}

impl fmt::Display for RelayUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_get_the_endpoint_path_and_bad_ones_say_how_to_fix_them() {
        assert_eq!(
            "ws://127.0.0.1:7878".parse::<RelayUrl>().unwrap().as_str(),
            "ws://127.0.0.1:7878/v1/ws"
        );
        assert_eq!(
            "ws://r.example:80/custom"
                .parse::<RelayUrl>()
                .unwrap()
                .as_str(),
            "ws://r.example:80/custom"
        );
        assert_eq!(
            "ws://r.example:80/v1/ws"
                .parse::<RelayUrl>()
                .unwrap()
                .authority(),
            "r.example:80"
        );
        assert!(
            "wss://r.example"
                .parse::<RelayUrl>()
                .unwrap_err()
                .contains("TLS")
        );
        assert!(
            "http://r.example"
                .parse::<RelayUrl>()
                .unwrap_err()
                .contains("ws://")
        );
        assert!("ws://".parse::<RelayUrl>().is_err());
    }
}
