//! Where things live and which agent a command is for: file, environment, defaults.
//!
//! Precedence, highest first: command-line flags (which clap also reads from `MAILSLOT_*`
//! environment variables), the config file, built-in defaults.

pub mod openclaw;

use std::path::{Path, PathBuf};

use directories::ProjectDirs;
use serde::Deserialize;

use crate::client::RelayUrl;
use crate::protocol::{AgentName, RelayName};

/// Overrides the data home (all agents live under it).
pub const ENV_HOME: &str = "MAILSLOT_HOME";
/// Chooses the agent.
pub const ENV_AGENT: &str = "MAILSLOT_AGENT";
/// Points at a config file.
pub const ENV_CONFIG: &str = "MAILSLOT_CONFIG";
/// Chooses the relay (`ws://host:port`, or `wss://host[:port]` for TLS).
pub const ENV_RELAY: &str = "MAILSLOT_RELAY";
/// The port of the loopback relay started when no relay is configured (default 7878).
pub const ENV_LOCAL_RELAY_PORT: &str = "MAILSLOT_LOCAL_RELAY_PORT";
/// Sets the log filter (tracing's `EnvFilter` syntax), e.g. `debug`, or `mailslot_relay=debug` for
/// the relay's alone (its crate; the agent's side logs as `mailslot`, the protocol and crypto as
/// `mailslot_core`).
pub const ENV_LOG: &str = "MAILSLOT_LOG";
/// The Claude Code session a stdio `mailslot mcp` serves (Claude Code sets it for its MCP
/// servers); what its tool results show is recorded under it, as the hooks record theirs.
pub const ENV_CLAUDE_CODE_SESSION: &str = "CLAUDE_CODE_SESSION_ID";
/// The program that opens the dashboard's launch page (`file://…`, its one argument) in a
/// browser; without it, `xdg-open` (`open` on macOS).
pub const ENV_BROWSER: &str = "MAILSLOT_BROWSER";
/// Every environment variable a client config may set for mailslot (it also reads
/// [`ENV_CLAUDE_CODE_SESSION`], which Claude Code sets itself).
pub const ENV_VARS: &[&str] = &[
    ENV_HOME,
    ENV_AGENT,
    ENV_CONFIG,
    ENV_RELAY,
    ENV_LOCAL_RELAY_PORT,
    ENV_LOG,
];

/// The largest config file read, in bytes.
const MAX_CONFIG_BYTES: u64 = 64 * 1024;

/// Why configuration could not be worked out.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// No home directory could be found and none was given.
    #[error("cannot find a home directory for mailslot's data; set {ENV_HOME} or pass --home")]
    NoHome,
    /// The config file could not be read.
    #[error("cannot read the config file {path}: {source}")]
    Read {
        /// The config file.
        path: PathBuf,
        /// What the OS said.
        source: std::io::Error,
    },
    /// The config file is too large.
    #[error("the config file {path} is over {MAX_CONFIG_BYTES} bytes; it is not a mailslot config")]
    TooLarge {
        /// The config file.
        path: PathBuf,
    },
    /// The config file is not valid.
    #[error("the config file {path} is invalid: {message}")]
    Parse {
        /// The config file.
        path: PathBuf,
        /// TOML's own message, with line and column.
        message: String,
    },
    /// No agent was named and the folder name makes none.
    #[error(
        "no agent chosen and the folder name {folder:?} makes no valid name; pass --agent NAME or set {ENV_AGENT}"
    )]
    NoAgent {
        /// The current folder.
        folder: String,
    },
}

/// The optional `config.toml`. Unknown keys are errors, so typos never pass silently.
#[derive(Debug, Default, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// The agent used when neither `--agent` nor `MAILSLOT_AGENT` names one.
    pub default_agent: Option<AgentName>,
    /// The relay used when neither `--relay` nor `MAILSLOT_RELAY` names one.
    pub relay: Option<RelayUrl>,
    /// The loopback relay's port when no relay is configured (for several homes side by side).
    pub local_relay_port: Option<u16>,
    /// The OpenClaw doorbell (`[openclaw]`): deliver new mail into an OpenClaw session.
    pub openclaw: Option<openclaw::OpenClawConfig>,
    /// Other relays reached without TLS (`http://`, `ws://`), by name exactly as in addresses
    /// (`"relay.lan:7878"`); loopback needs no listing, anything else gets TLS.
    #[serde(default)]
    pub trusted_hosts: Vec<RelayName>,
}

impl Config {
    /// Reads `path`; a missing file is the default config.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let read_err = |source| ConfigError::Read {
            path: path.to_owned(),
            source,
        };
        let meta = match std::fs::metadata(path) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Self::default()),
            Err(e) => return Err(read_err(e)),
        };
        if meta.len() > MAX_CONFIG_BYTES {
            return Err(ConfigError::TooLarge {
                path: path.to_owned(),
            });
        }
        let text = std::fs::read_to_string(path).map_err(read_err)?;
        toml::from_str(&text).map_err(|e| ConfigError::Parse {
            path: path.to_owned(),
            message: e.to_string(),
        })
    }
}

/// The folders and files mailslot uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Paths {
    home: PathBuf,
    config_file: PathBuf,
}

impl Paths {
    /// With an explicit home, everything (config included) lives under it; otherwise the
    /// platform's data and config folders are used.
    pub fn new(home: Option<PathBuf>, config_file: Option<PathBuf>) -> Result<Self, ConfigError> {
        let (home, default_config) = match home {
            Some(h) => {
                let cfg = h.join("config.toml");
                (h, cfg)
            }
            None => {
                let dirs = ProjectDirs::from("", "", "mailslot").ok_or(ConfigError::NoHome)?;
                (
                    dirs.data_dir().to_owned(),
                    dirs.config_dir().join("config.toml"),
                )
            }
        };
        Ok(Self {
            home,
            config_file: config_file.unwrap_or(default_config),
        })
    }

    /// The data home.
    pub fn home(&self) -> &Path {
        &self.home
    }

    /// The config file, which need not exist.
    pub fn config_file(&self) -> &Path {
        &self.config_file
    }

    /// The embedded relay's database.
    pub fn relay_db(&self) -> PathBuf {
        self.home.join("relay").join("relay.db")
    }

    /// The owner key file: the person's key, sealed under their passphrase, that signs
    /// consent changes for every agent in this home.
    pub fn owner_key(&self) -> PathBuf {
        self.home.join("owner.key")
    }

    /// The agents that have a folder in this home, by name.
    pub fn agent_names(&self) -> std::io::Result<Vec<AgentName>> {
        let dir = self.home.join("agents");
        let mut names = match std::fs::read_dir(&dir) {
            Ok(entries) => entries
                .filter_map(|e| e.ok())
                .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                .filter_map(|e| AgentName::new(&e.file_name().to_string_lossy()).ok())
                .collect(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(e),
        };
        names.sort();
        Ok(names)
    }

    /// One agent's folder.
    pub fn agent_dir(&self, name: &AgentName) -> PathBuf {
        self.home.join("agents").join(name.as_str())
    }
}

/// The agent for this command: the flag (or its environment variable), else the config's
/// default, else the current folder's name made valid.
pub fn resolve_agent(
    flag: Option<AgentName>,
    config: &Config,
    cwd: &Path,
) -> Result<AgentName, ConfigError> {
    if let Some(name) = flag.or_else(|| config.default_agent.clone()) {
        return Ok(name);
    }
    let folder = cwd
        .file_name()
        .map(|f| f.to_string_lossy().into_owned())
        .unwrap_or_default();
    AgentName::sanitize(&folder).ok_or(ConfigError::NoAgent { folder })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(s: &str) -> AgentName {
        AgentName::new(s).unwrap()
    }

    #[test]
    fn agent_precedence() {
        let config = Config {
            default_agent: Some(name("from-config")),
            relay: None,
            local_relay_port: None,
            openclaw: None,
            trusted_hosts: Vec::new(),
        };
        let cwd = Path::new("/work/My Repo");
        assert_eq!(
            resolve_agent(Some(name("flag")), &config, cwd).unwrap(),
            name("flag")
        );
        assert_eq!(
            resolve_agent(None, &config, cwd).unwrap(),
            name("from-config")
        );
        assert_eq!(
            resolve_agent(None, &Config::default(), cwd).unwrap(),
            name("my-repo")
        );
        assert!(matches!(
            resolve_agent(None, &Config::default(), Path::new("/")),
            Err(ConfigError::NoAgent { .. })
        ));
    }

    #[test]
    fn config_file_rejects_unknown_keys_and_bad_names() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.toml");
        assert_eq!(Config::load(&path).unwrap(), Config::default());
        std::fs::write(&path, "default_agent = \"alice\"\n").unwrap();
        assert_eq!(
            Config::load(&path).unwrap().default_agent,
            Some(name("alice"))
        );
        std::fs::write(&path, "default_agnet = \"alice\"\n").unwrap();
        let err = Config::load(&path).unwrap_err().to_string();
        assert!(err.contains("default_agnet"), "{err}");
        let padded = format!(
            "default_agent = \"alice\"\n{}",
            "#".repeat(MAX_CONFIG_BYTES as usize - 24)
        );
        assert_eq!(padded.len() as u64, MAX_CONFIG_BYTES);
        std::fs::write(&path, &padded).unwrap();
        assert!(Config::load(&path).is_ok());
        std::fs::write(&path, padded + "#").unwrap();
        assert!(matches!(
            Config::load(&path),
            Err(ConfigError::TooLarge { .. })
        ));
        std::fs::write(&path, "default_agent = \"Alice\"\n").unwrap();
        let err = Config::load(&path).unwrap_err().to_string();
        assert!(err.contains("agent name"), "{err}");
        std::fs::write(&path, "trusted_hosts = [\"relay.lan:7878\"]\n").unwrap();
        assert_eq!(
            Config::load(&path).unwrap().trusted_hosts,
            vec![RelayName::new("relay.lan:7878").unwrap()]
        );
        std::fs::write(&path, "trusted_hosts = [\"http://relay.lan\"]\n").unwrap();
        let err = Config::load(&path).unwrap_err().to_string();
        assert!(err.contains("address host"), "{err}");
    }
}
