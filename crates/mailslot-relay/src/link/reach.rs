//! Where this relay may connect when another relay is named to it (by a link's hello, or by an
//! agent writing to `name@host`): the name is resolved here, once, and only public addresses
//! are kept unless the operator allows private ones (`allow_private_relays`, or the relay is
//! named in `trusted_hosts` / `allow_relays`). Every connection for that relay then goes to
//! the addresses kept, so a name cannot resolve to a public address when checked and to a
//! loopback one when used. Without this, naming `127.0.0.1:PORT` made the relay probe its own
//! machine and network for whoever asked.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use crate::protocol::RelayName;

/// Why another relay's addresses are not to be used.
#[derive(Debug, thiserror::Error)]
pub enum ReachError {
    /// The name is, or resolves only to, addresses the operator does not let this relay reach.
    #[error(
        "{relay} is on a loopback, private or link-local address, which this relay does not connect to (its operator may allow it with allow_private_relays)"
    )]
    Private {
        /// The relay.
        relay: RelayName,
    },
    /// The name did not resolve.
    #[error("{relay} does not resolve: {reason}")]
    Resolve {
        /// The relay.
        relay: RelayName,
        /// What the resolver said.
        reason: String,
    },
}

/// The addresses `relay` may be reached at (its port, else `default_port`): every address it
/// resolves to that is public, or every one when private addresses are allowed for it.
pub async fn addresses(
    relay: &RelayName,
    default_port: u16,
    allow_private: bool,
) -> Result<Vec<SocketAddr>, ReachError> {
    let host = relay.host();
    let port = relay.port().unwrap_or(default_port);
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    let found: Vec<SocketAddr> = match bare.parse::<IpAddr>() {
        Ok(ip) => vec![SocketAddr::new(ip, port)],
        Err(_) => tokio::net::lookup_host((bare, port))
            .await
            .map_err(|e| ReachError::Resolve {
                relay: relay.clone(),
                reason: e.to_string(),
            })?
            .collect(),
    };
    let kept: Vec<SocketAddr> = found
        .iter()
        .copied()
        .filter(|a| allow_private || is_public(a.ip()))
        .collect();
    match (found.is_empty(), kept.is_empty()) {
        (true, _) => Err(ReachError::Resolve {
            relay: relay.clone(),
            reason: "no address".into(),
        }),
        (false, true) => Err(ReachError::Private {
            relay: relay.clone(),
        }),
        (false, false) => Ok(kept),
    }
}

/// Whether `relay`'s name itself is not public (`localhost`, or a loopback, private or
/// link-local IP address): mail or requests for it are refused before anything is queued.
pub fn names_private(relay: &RelayName) -> bool {
    let bare = relay.host().trim_start_matches('[').trim_end_matches(']');
    relay.is_loopback() || bare.parse::<IpAddr>().is_ok_and(|ip| !is_public(ip))
}

/// Why `relay` is refused when [`names_private`] and private relays are not allowed.
pub fn private_refusal(relay: &RelayName) -> String {
    ReachError::Private {
        relay: relay.clone(),
    }
    .to_string()
}

/// Whether `ip` is an address on the public internet: not loopback, private (RFC 1918, ULA),
/// link-local, shared (CGNAT), unspecified, broadcast, multicast, documentation or reserved.
pub fn is_public(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => is_public_v4(v4),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => is_public_v4(v4),
            None => is_public_v6(v6),
        },
    }
}

fn is_public_v4(ip: Ipv4Addr) -> bool {
    let [a, b, ..] = ip.octets();
    !(ip.is_loopback()
        || ip.is_private()
        || ip.is_link_local()
        || ip.is_unspecified()
        || ip.is_broadcast()
        || ip.is_multicast()
        || ip.is_documentation()
        || a == 0
        // 100.64.0.0/10, shared address space (carrier-grade NAT).
        || (a == 100 && (64..128).contains(&b))
        // 192.0.0.0/24, protocol assignments; 198.18.0.0/15, benchmarking; 240.0.0.0/4.
        || (a == 192 && b == 0 && ip.octets()[2] == 0)
        || (a == 198 && (18..20).contains(&b))
        || a >= 240)
}

fn is_public_v6(ip: Ipv6Addr) -> bool {
    let first = ip.segments()[0];
    !(ip.is_loopback()
        || ip.is_unspecified()
        || ip.is_multicast()
        || ip.is_unique_local()
        || ip.is_unicast_link_local()
        // 2001:db8::/32, documentation; 64:ff9b:1::/48 and the other NAT64 local uses too.
        || (first == 0x2001 && ip.segments()[1] == 0x0db8)
        || first == 0x0064)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_public_addresses_are_public() {
        for private in [
            "127.0.0.1",
            "127.9.9.9",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "0.0.0.0",
            "255.255.255.255",
            "224.0.0.1",
            "::1",
            "::",
            "fd00::1",
            "fe80::1",
            "::ffff:127.0.0.1",
            "::ffff:10.0.0.1",
        ] {
            assert!(!is_public(private.parse().unwrap()), "{private}");
        }
        for public in ["1.1.1.1", "93.184.216.34", "2606:4700::1111"] {
            assert!(is_public(public.parse().unwrap()), "{public}");
        }
    }

    #[tokio::test]
    async fn loopback_names_are_refused_unless_allowed() {
        for name in ["127.0.0.1:7878", "localhost:9", "[::1]:7878", "10.0.0.5"] {
            let relay = RelayName::new(name).unwrap();
            assert!(
                matches!(
                    addresses(&relay, 443, false).await,
                    Err(ReachError::Private { .. })
                ),
                "{name}"
            );
        }
        for name in [
            "127.0.0.1:7878",
            "localhost:9",
            "[::1]:7878",
            "10.0.0.5",
            "[fd00::1]",
        ] {
            assert!(names_private(&RelayName::new(name).unwrap()), "{name}");
        }
        for name in ["relay.example.com", "1.1.1.1:443"] {
            assert!(!names_private(&RelayName::new(name).unwrap()), "{name}");
        }
        let relay = RelayName::new("127.0.0.1:7878").unwrap();
        assert_eq!(
            addresses(&relay, 443, true).await.unwrap(),
            ["127.0.0.1:7878".parse().unwrap()]
        );
    }
}
