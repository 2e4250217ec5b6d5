//! Relay URLs: `ws://host:port` or `wss://host:port` (TLS), optionally with a path; without
//! one the endpoint path `/v1/ws` is added.

use std::fmt;
use std::str::FromStr;

use crate::protocol::WEBSOCKET_PATH;
/// The longest URL accepted.
const MAX_URL_LEN: usize = 2048;

/// A validated relay WebSocket URL: `ws://` (plain) or `wss://` (TLS, certificate checked
/// against the platform's trusted roots, or `SSL_CERT_FILE` / `SSL_CERT_DIR` when set).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RelayUrl(String);

impl RelayUrl {
    /// The URL as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether the connection uses TLS (`wss://`).
    pub fn is_tls(&self) -> bool {
        self.0.starts_with("wss://")
    }

    /// The host and port, for messages and addresses.
    pub fn authority(&self) -> &str {
        let rest = self.0.split_once("://").map_or(self.0.as_str(), |(_, r)| r);
        rest.split('/').next().unwrap_or(rest)
    }

    /// The host alone (what a TLS certificate must name).
    pub fn host(&self) -> &str {
        let authority = self.authority();
        match authority.rsplit_once(':') {
            Some((host, port)) if port.bytes().all(|b| b.is_ascii_digit()) => host,
            _ => authority,
        }
    }
}

impl FromStr for RelayUrl {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if s.len() > MAX_URL_LEN {
            return Err(format!(
                "relay URL is over {MAX_URL_LEN} characters; give only ws://host:port or wss://host:port"
            ));
        }
        let Some((scheme, rest)) = ["wss", "ws"]
            .into_iter()
            .find_map(|scheme| Some((scheme, s.strip_prefix(scheme)?.strip_prefix("://")?)))
        else {
            return Err(format!(
                "{s:?} is not a relay URL; write it like ws://127.0.0.1:7878, or wss://relay.example.com for TLS"
            ));
        };
        let (authority, path) = rest.split_once('/').map_or((rest, ""), |(a, p)| (a, p));
        if authority.is_empty() || authority.contains(['@', '?', '#', ' ']) {
            return Err(format!(
                "{s:?} has no valid host; write it like {scheme}://relay.example.com:7878"
            ));
        }
        if path.contains(['?', '#', ' ']) {
            return Err(format!(
                "{s:?} has a query or fragment; give only {scheme}://host:port[/path]"
            ));
        }
        let path = if path.is_empty() {
            WEBSOCKET_PATH.to_owned()
        } else {
            format!("/{path}")
        };
        Ok(Self(format!("{scheme}://{authority}{path}")))
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

    fn url(s: &str) -> RelayUrl {
        s.parse().unwrap()
    }

    #[test]
    fn urls_get_the_endpoint_path_and_bad_ones_say_how_to_fix_them() {
        assert_eq!(
            url("ws://127.0.0.1:7878").as_str(),
            "ws://127.0.0.1:7878/v1/ws"
        );
        assert_eq!(
            url("ws://r.example:80/custom").as_str(),
            "ws://r.example:80/custom"
        );
        assert_eq!(url("ws://r.example:80/v1/ws").authority(), "r.example:80");
        assert_eq!(url("ws://r.example:80/v1/ws").host(), "r.example");
        assert_eq!(url("ws://[::1]:7878").host(), "[::1]");
        assert_eq!(url("ws://[::1]").host(), "[::1]");
        assert!(!url("ws://r.example").is_tls());
        assert!(
            "http://r.example"
                .parse::<RelayUrl>()
                .unwrap_err()
                .contains("ws://")
        );
        assert!("ws://".parse::<RelayUrl>().is_err());
        let long = format!("ws://r.example/{}", "a".repeat(MAX_URL_LEN));
        assert!(long.parse::<RelayUrl>().unwrap_err().contains("2048"));
    }

    #[test]
    fn wss_urls_are_validated_like_ws_ones() {
        let tls = url("wss://relay.example.com");
        assert_eq!(tls.as_str(), "wss://relay.example.com/v1/ws");
        assert!(tls.is_tls());
        assert_eq!(tls.authority(), "relay.example.com");
        assert_eq!(tls.host(), "relay.example.com");
        let with_port = url("wss://relay.example.com:8443/mail/ws");
        assert_eq!(with_port.as_str(), "wss://relay.example.com:8443/mail/ws");
        assert_eq!(with_port.authority(), "relay.example.com:8443");
        assert_eq!(with_port.host(), "relay.example.com");
        assert_eq!(
            "wss://relay.example.com"
                .parse::<RelayUrl>()
                .map(|u| u.to_string()),
            Ok("wss://relay.example.com/v1/ws".to_owned())
        );

        let no_host = "wss://".parse::<RelayUrl>().unwrap_err();
        assert!(
            no_host.contains("wss://relay.example.com:7878"),
            "{no_host}"
        );
        let userinfo = "wss://me@relay.example.com"
            .parse::<RelayUrl>()
            .unwrap_err();
        assert!(userinfo.contains("no valid host"), "{userinfo}");
        let query = "wss://relay.example.com/v1/ws?x=1"
            .parse::<RelayUrl>()
            .unwrap_err();
        assert!(query.contains("wss://host:port[/path]"), "{query}");
        for bad in [
            "https://relay.example.com",
            "wss:relay.example.com",
            "WSS//x",
        ] {
            let e = bad.parse::<RelayUrl>().unwrap_err();
            assert!(e.contains("wss://"), "{bad}: {e}");
        }
    }

    #[test]
    fn wss_urls_deserialize_from_config() {
        #[derive(serde::Deserialize)]
        struct C {
            relay: RelayUrl,
        }
        let c: C = toml::from_str(r#"relay = "wss://relay.example.com:443""#).unwrap();
        assert_eq!(c.relay.as_str(), "wss://relay.example.com:443/v1/ws");
        assert!(toml::from_str::<C>(r#"relay = "wss://""#).is_err());
    }
}
