//! Relay settings: a TOML file, every key optional, unknown keys refused.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use crate::protocol::{Fingerprint, Limits, Policy, RelayName};

/// The largest config file read.
const MAX_CONFIG_BYTES: u64 = 64 * 1024;
/// Open files kept for the database, the spool, logs and the listener when `max_connections`
/// is derived from the open-file limit.
pub const RESERVED_FILES: usize = 128;

/// Why the relay config could not be read.
#[derive(Debug, thiserror::Error)]
pub enum RelayConfigError {
    /// The file could not be read.
    #[error("cannot read relay config {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// What the OS said.
        source: std::io::Error,
    },
    /// The file is not a valid config.
    #[error("relay config {path} is invalid: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// What is wrong, with line and column.
        message: String,
    },
}

/// Who may register a new name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RegistrationMode {
    /// Anyone, first come first served (within the per-IP rate).
    Open,
    /// Only with an unused invite from the operator.
    Closed,
}

/// Everything a relay can be told. Durations are in seconds, sizes in bytes.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RelayConfig {
    /// Where to listen.
    pub listen: SocketAddr,
    /// The database: a SQLite file, or a `postgres://USER@HOST:PORT/DB` URL (PostgreSQL,
    /// shared by several relay nodes).
    pub db: Option<PathBuf>,
    /// The relay's name: the host part of its agents' addresses (`name@host[:port]`), which
    /// it publishes at `/.well-known/mailslot` [default: the address it listens on].
    pub host: Option<RelayName>,
    /// The relay's key file (made at first start, mode 0600) [default: beside a SQLite
    /// database, `<db>.key`; required with PostgreSQL, where every node must use the same].
    pub identity: Option<PathBuf>,
    /// Message size limits.
    pub limits: Limits,
    /// Seconds a client has to answer the challenge.
    pub auth_timeout_secs: u64,
    /// Seconds a socket has to send a whole HTTP request head (the WebSocket upgrade among
    /// them) after it connected or after its last answer, and an HTTP request to be answered.
    pub request_timeout_secs: u64,
    /// Seconds of silence from a client before its socket is closed.
    pub idle_timeout_secs: u64,
    /// Seconds an undelivered envelope is kept.
    pub ttl_secs: u64,
    /// Seconds between looks for envelopes past their TTL (each one bounces to its sender).
    pub expiry_interval_secs: u64,
    /// Messages waiting per recipient.
    pub quota_messages: u64,
    /// Bytes waiting per recipient.
    pub quota_bytes: u64,
    /// Sends per second per agent, sustained.
    pub send_rate: f64,
    /// Sends an agent may burst above the rate.
    pub send_burst: f64,
    /// Who may register a new name: anyone (`open`), or only with an invite from the
    /// operator (`closed`; `mailslot relay invite`).
    pub registration: RegistrationMode,
    /// Days a retired name stays held (answering as unknown) before anyone may take it.
    pub retired_name_days: u64,
    /// New names one client IP may register per hour, sustained.
    pub registrations_per_hour: f64,
    /// New names one client IP may register at once above that rate.
    pub registration_burst: f64,
    /// Open sockets in all, counted from accept [default: the open-file limit less
    /// [`RESERVED_FILES`]].
    pub max_connections: Option<usize>,
    /// Open sockets per client IP, counted from accept [default: a quarter of
    /// `max_connections`].
    pub max_connections_per_ip: Option<usize>,
    /// Bytes that may wait for one client to read them; more ends its connection (at least
    /// twice the largest frame). Deliveries pause while half of it waits.
    pub max_outgoing_bytes: usize,
    /// Bytes of large frames (those over 1 MiB: attachments) being received at once, over
    /// all connections; a connection waits for room before it reads more of one (at least
    /// one largest frame is always let in).
    pub max_receiving_bytes: usize,
    /// Seconds a client's socket may accept nothing while frames wait for it; then it is
    /// closed, however often the client pings.
    pub write_timeout_secs: u64,
    /// Bad frames tolerated on one connection before it is closed.
    pub max_errors_per_connection: u32,
    /// Whom agents accept mail from unless they chose: `open` on a loopback relay,
    /// `contacts` otherwise.
    pub default_policy: Option<Policy>,
    /// Open contact requests one agent may have.
    pub max_pending_requests: u32,
    /// Open contact requests one agent here may have waiting for it, from everyone; more are
    /// refused (`too_many_requests`) until some are answered or expire.
    pub max_requests_to_agent: u32,
    /// Open contact requests the agents of one other relay may have here, to all agents here
    /// together; more are refused over the link (`too_many_requests`).
    pub max_requests_from_relay: u32,
    /// Seconds a contact request stays open.
    pub request_ttl_secs: u64,
    /// Contact requests an agent may make per hour.
    pub requests_per_hour: f64,
    /// Approval attempts (right or wrong codes) an agent may make per hour.
    pub approvals_per_hour: f64,
    /// Other relays reached without TLS (`ws://`, `http://`), written `host[:port]` exactly as
    /// in addresses; loopback relays always are.
    pub trusted_hosts: Vec<RelayName>,
    /// Relays this one never links with, either way: mail to their agents is refused at send,
    /// and their links are refused. A denied relay is known by its key too: once its key is
    /// known here (pinned, or fetched from the denied name), it is refused under any name.
    pub deny_relays: Vec<RelayName>,
    /// Keys (fingerprints, as `/.well-known/mailslot` shows them) of relays this one never
    /// links with, whatever name they use.
    pub deny_relay_keys: Vec<Fingerprint>,
    /// When set, the only relays this one links with.
    pub allow_relays: Option<Vec<RelayName>>,
    /// Whether other relays on loopback, private, link-local or otherwise non-public
    /// addresses may be reached (discovery documents and links). Off: this relay fetches from
    /// and dials public addresses only, so no one can make it probe its own network; relays
    /// named in `trusted_hosts` or `allow_relays` are reached wherever they are.
    pub allow_private_relays: bool,
    /// Copies per second one other relay (one key, whatever its name) may deliver here,
    /// sustained.
    pub relay_rate: f64,
    /// Copies one other relay may deliver at once above that rate.
    pub relay_burst: f64,
    /// Seconds a link waits for the other relay: to connect and shake hands, and for the
    /// answer to a delivery; then it is closed and tried again later.
    pub link_timeout_secs: u64,
    /// The shortest TTL a file reservation may ask for, in seconds (the protocol allows
    /// 1 s to 24 h): a reservation that lapses before its holder can renew it protects
    /// nothing.
    pub reservation_min_ttl_secs: u32,
}

impl Default for RelayConfig {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 7878)),
            db: None,
            host: None,
            identity: None,
            limits: Limits::default(),
            auth_timeout_secs: 10,
            request_timeout_secs: 10,
            idle_timeout_secs: 90,
            ttl_secs: 7 * 24 * 3600,
            expiry_interval_secs: 60,
            quota_messages: 10_000,
            quota_bytes: 256 * 1024 * 1024,
            send_rate: 100.0,
            send_burst: 1000.0,
            registration: RegistrationMode::Open,
            retired_name_days: 30,
            registrations_per_hour: 60.0,
            registration_burst: 100.0,
            max_connections: None,
            max_connections_per_ip: None,
            max_outgoing_bytes: 8 * 1024 * 1024,
            max_receiving_bytes: 256 * 1024 * 1024,
            write_timeout_secs: 30,
            max_errors_per_connection: 20,
            default_policy: None,
            max_pending_requests: 3,
            max_requests_to_agent: 20,
            max_requests_from_relay: 50,
            request_ttl_secs: 3600,
            requests_per_hour: 20.0,
            approvals_per_hour: 5.0,
            trusted_hosts: Vec::new(),
            deny_relays: Vec::new(),
            deny_relay_keys: Vec::new(),
            allow_relays: None,
            allow_private_relays: false,
            relay_rate: 5000.0,
            relay_burst: 20_000.0,
            link_timeout_secs: 30,
            reservation_min_ttl_secs: 60,
        }
    }
}

impl RelayConfig {
    /// Reads a config file.
    pub fn load(path: &Path) -> Result<Self, RelayConfigError> {
        let read = |source| RelayConfigError::Read {
            path: path.to_owned(),
            source,
        };
        let len = std::fs::metadata(path).map_err(read)?.len();
        if len > MAX_CONFIG_BYTES {
            return Err(RelayConfigError::Parse {
                path: path.to_owned(),
                message: format!("over {MAX_CONFIG_BYTES} bytes"),
            });
        }
        let text = std::fs::read_to_string(path).map_err(read)?;
        toml::from_str(&text).map_err(|e| RelayConfigError::Parse {
            path: path.to_owned(),
            message: e.to_string(),
        })
    }

    /// The auth deadline.
    pub fn auth_timeout(&self) -> Duration {
        Duration::from_secs(self.auth_timeout_secs)
    }

    /// The deadline for an HTTP request head, and for an HTTP answer.
    pub fn request_timeout(&self) -> Duration {
        Duration::from_secs(self.request_timeout_secs)
    }

    /// Open sockets allowed in all and per IP: as configured, else derived from the process's
    /// open-file limit, so that sockets alone can never use up the files the relay needs.
    pub fn connection_limits(&self) -> (usize, usize) {
        let total = self.max_connections.unwrap_or_else(|| {
            let files = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
                .map_or(1024, |(soft, _)| soft);
            usize::try_from(files)
                .unwrap_or(usize::MAX)
                .saturating_sub(RESERVED_FILES)
                .max(1)
        });
        let per_ip = self.max_connections_per_ip.unwrap_or((total / 4).max(1));
        (total, per_ip.min(total))
    }

    /// The bytes that may wait for one client: as configured, but room for two of the
    /// largest frames at least.
    pub fn outgoing_bytes(&self) -> usize {
        self.max_outgoing_bytes.max(2 * self.max_frame_bytes())
    }

    /// The write deadline.
    pub fn write_timeout(&self) -> Duration {
        Duration::from_secs(self.write_timeout_secs)
    }

    /// The idle deadline.
    pub fn idle_timeout(&self) -> Duration {
        Duration::from_secs(self.idle_timeout_secs)
    }

    /// Whether this relay links with `relay` (`deny_relays` and `allow_relays`).
    pub fn links_with(&self, relay: &RelayName) -> bool {
        !self.deny_relays.contains(relay)
            && self
                .allow_relays
                .as_ref()
                .is_none_or(|allowed| allowed.contains(relay))
    }

    /// Whether `relay` may be reached at a loopback, private or link-local address: when the
    /// operator allows such relays, or named this one in `trusted_hosts` or `allow_relays`.
    pub fn may_reach_private(&self, relay: &RelayName) -> bool {
        self.allow_private_relays
            || self.trusted_hosts.contains(relay)
            || self
                .allow_relays
                .as_ref()
                .is_some_and(|allowed| allowed.contains(relay))
    }

    /// How long a link waits for the other relay.
    pub fn link_timeout(&self) -> Duration {
        Duration::from_secs(self.link_timeout_secs.max(1))
    }

    /// The policy for agents that set none.
    pub fn effective_default_policy(&self) -> Policy {
        self.default_policy
            .unwrap_or(if self.listen.ip().is_loopback() {
                Policy::Open
            } else {
                Policy::Contacts
            })
    }

    /// `mailslot relay pins ARGS --db DB` for this relay's database, for a log line that tells
    /// the operator what to run (a PostgreSQL URL without its password).
    pub fn pins_command(&self, args: &str) -> String {
        let db = match self.db.as_deref().and_then(Path::to_str) {
            Some(url) if super::storage::is_postgres_url(url) => {
                format!(" --db {}", shell_word(&super::storage::redact_url(url)))
            }
            Some(_) | None => self
                .db
                .as_deref()
                .map(|db| format!(" --db {}", shell_word(&db.to_string_lossy())))
                .unwrap_or_default(),
        };
        format!("mailslot relay pins {args}{db}")
    }

    /// The largest WebSocket message read: room for the largest envelope a client built to
    /// the protocol's default limits may send, even when this relay's limit is lower, so such
    /// a frame is answered `too_large` (naming the limit) and the connection carries on.
    /// Only a larger frame, which no conforming client sends, ends the connection.
    pub fn max_frame_bytes(&self) -> usize {
        self.limits
            .envelope_bytes
            .max(Limits::default().envelope_bytes)
            + crate::protocol::FRAME_OVERHEAD
    }
}

/// `text` as one shell word, for a command to paste: as it is when it needs no quoting, else
/// in single quotes.
pub fn shell_word(text: &str) -> String {
    let plain = !text.is_empty()
        && text
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "/._-+=:@%,".contains(c));
    if plain {
        text.to_owned()
    } else {
        format!("'{}'", text.replace('\'', r"'\''"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pins_command_names_the_database_quoted_and_without_a_password() {
        let with = |db: &str| RelayConfig {
            db: Some(PathBuf::from(db)),
            ..RelayConfig::default()
        };
        assert_eq!(
            with("/var/lib/mailslot/relay.db").pins_command("trust relay-b.example"),
            "mailslot relay pins trust relay-b.example --db /var/lib/mailslot/relay.db"
        );
        assert_eq!(
            with("/tmp/it's here/relay.db").pins_command("trust b"),
            r"mailslot relay pins trust b --db '/tmp/it'\''s here/relay.db'"
        );
        let pg = with("postgres://mailslot:s3cret@db:5432/mailslot").pins_command("trust b");
        assert!(!pg.contains("s3cret"), "{pg}");
        assert!(
            pg.starts_with("mailslot relay pins trust b --db 'postgres://mailslot:"),
            "{pg}"
        );
    }
}
