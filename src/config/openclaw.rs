//! The `[openclaw]` table of `config.toml`: where the OpenClaw gateway is and how mail is
//! delivered into it (the sink itself is `doorbell::openclaw`). Every value is validated when
//! the file is read, with an error that names the field and the fix. The token is never in
//! the file: it comes from an environment variable or a private file, read only when used.
//!
//! ```toml
//! [openclaw]
//! gateway_url = "http://127.0.0.1:18789"
//! token_env = "OPENCLAW_GATEWAY_TOKEN"
//! ```

use std::fmt;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use zeroize::Zeroizing;

use crate::protocol::AgentName;

/// OpenClaw's default gateway address.
pub const DEFAULT_GATEWAY_URL: &str = "http://127.0.0.1:18789";
/// The OpenClaw agent that owns the sessions, unless configured.
pub const DEFAULT_AGENT_ID: &str = "main";
/// The session key scheme: one dedicated session per mailslot mailbox.
pub const DEFAULT_SESSION_KEY: &str = "agent:{agent_id}:dm:mailbox-{mailbox}";
/// The name mailslot's MCP server has under `mcp.servers` in `openclaw.json`.
pub const DEFAULT_MCP_SERVER: &str = "mailslot";
/// The largest token file read.
const MAX_TOKEN_BYTES: u64 = 4096;
/// The longest peer name put into a session key (after sanitizing).
const PEER_CHARS: usize = 64;
/// The longest session key template.
const SESSION_KEY_CHARS: usize = 200;

/// The validated `[openclaw]` table.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(try_from = "RawOpenClaw")]
pub struct OpenClawConfig {
    /// The gateway's base URL (`http://127.0.0.1:18789`), without a trailing slash.
    pub gateway_url: GatewayUrl,
    /// Where the gateway token is read from.
    pub token: TokenSource,
    /// The OpenClaw agent id that owns the sessions (`main`).
    pub agent_id: String,
    /// How a mailbox's session key is made.
    pub session_key: SessionKeyTemplate,
    /// mailslot's MCP server name in `openclaw.json`; the agent sees `<name>__reply`.
    pub mcp_server: String,
    /// Only these mailslot agents ring OpenClaw; `None` is every agent of this home.
    pub agents: Option<Vec<AgentName>>,
}

impl OpenClawConfig {
    /// Whether the mailslot agent `name` rings OpenClaw.
    pub fn rings_for(&self, name: &AgentName) -> bool {
        self.agents.as_ref().is_none_or(|list| list.contains(name))
    }

    /// The tool the OpenClaw agent calls to answer (`mailslot__reply`).
    pub fn reply_tool(&self) -> String {
        format!("{}__reply", self.mcp_server)
    }
}

/// The table as written; [`OpenClawConfig`] is what it becomes once validated.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawOpenClaw {
    gateway_url: Option<String>,
    token_env: Option<String>,
    token_file: Option<PathBuf>,
    /// Present only to refuse it with a better message than "unknown field".
    token: Option<toml::Value>,
    agent_id: Option<String>,
    session_key: Option<String>,
    mcp_server: Option<String>,
    agents: Option<Vec<AgentName>>,
}

impl TryFrom<RawOpenClaw> for OpenClawConfig {
    type Error = String;

    fn try_from(raw: RawOpenClaw) -> Result<Self, String> {
        if raw.token.is_some() {
            return Err(
                "openclaw.token: the gateway token is never written in config.toml; \
                 put it in an environment variable and name it with token_env, or in a file \
                 only you can read (chmod 600) and name it with token_file"
                    .into(),
            );
        }
        let gateway_url =
            GatewayUrl::parse(raw.gateway_url.as_deref().unwrap_or(DEFAULT_GATEWAY_URL))?;
        let token = match (raw.token_env, raw.token_file) {
            (Some(var), None) => TokenSource::env(&var)?,
            (None, Some(path)) => TokenSource::file(path)?,
            (Some(_), Some(_)) => {
                return Err("openclaw: set only one of token_env and token_file".into());
            }
            (None, None) => {
                return Err(
                    "openclaw: no token source; add token_env = \"OPENCLAW_GATEWAY_TOKEN\" \
                     (an environment variable holding gateway.auth.token from openclaw.json) \
                     or token_file = \"/absolute/path\" (a file only you can read)"
                        .into(),
                );
            }
        };
        let agent_id = raw.agent_id.unwrap_or_else(|| DEFAULT_AGENT_ID.into());
        if !is_agent_id(&agent_id) {
            return Err(format!(
                "openclaw.agent_id {agent_id:?}: an OpenClaw agent id is 1 to 64 lowercase \
                 letters, digits, '-' or '_', starting with a letter or digit (the default \
                 agent is \"main\")"
            ));
        }
        let session_key = SessionKeyTemplate::parse(
            raw.session_key.as_deref().unwrap_or(DEFAULT_SESSION_KEY),
            &agent_id,
        )?;
        let mcp_server = raw.mcp_server.unwrap_or_else(|| DEFAULT_MCP_SERVER.into());
        if mcp_server.is_empty()
            || mcp_server.len() > 64
            || !mcp_server
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        {
            return Err(format!(
                "openclaw.mcp_server {mcp_server:?}: write the name mailslot has under \
                 mcp.servers in openclaw.json (letters, digits, '-' or '_'; the default is \
                 \"mailslot\")"
            ));
        }
        if raw.agents.as_ref().is_some_and(Vec::is_empty) {
            return Err(
                "openclaw.agents is empty, so no agent would ring OpenClaw; list the \
                 mailslot agents whose mail goes to OpenClaw, or leave it out for all of them"
                    .into(),
            );
        }
        Ok(Self {
            gateway_url,
            token,
            agent_id,
            session_key,
            mcp_server,
            agents: raw.agents,
        })
    }
}

fn is_agent_id(id: &str) -> bool {
    let mut chars = id.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
        && id.len() <= 64
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_')
}

/// The gateway's base URL: `http` or `https`, a host, an optional port and path prefix; no
/// credentials, query or fragment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GatewayUrl(reqwest::Url);

impl GatewayUrl {
    /// Parses and checks `text`.
    pub fn parse(text: &str) -> Result<Self, String> {
        let example = "write it like http://127.0.0.1:18789";
        let url = reqwest::Url::parse(text)
            .map_err(|e| format!("openclaw.gateway_url {text:?} is not a URL ({e}); {example}"))?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(format!(
                "openclaw.gateway_url {text:?} is not an http:// or https:// URL; {example}"
            ));
        }
        if url.host_str().is_none_or(str::is_empty) {
            return Err(format!(
                "openclaw.gateway_url {text:?} has no host; {example}"
            ));
        }
        if !url.username().is_empty() || url.password().is_some() {
            return Err(format!(
                "openclaw.gateway_url {text:?} carries credentials; take them out and put the \
                 token in token_env or token_file"
            ));
        }
        if url.query().is_some() || url.fragment().is_some() {
            return Err(format!(
                "openclaw.gateway_url {text:?} has a query or fragment; give only the gateway's \
                 address, {example}"
            ));
        }
        Ok(Self(url))
    }

    /// `{gateway}/{path}` (the path without a leading slash).
    pub fn join(&self, path: &str) -> String {
        format!("{}/{path}", self.base())
    }

    /// The WebSocket address of the gateway (`ws://` or `wss://`, same host and prefix).
    pub fn websocket(&self) -> String {
        let base = self.base();
        match base.strip_prefix("https://") {
            Some(rest) => format!("wss://{rest}"),
            None => format!("ws://{}", base.trim_start_matches("http://")),
        }
    }

    /// Whether TLS is used.
    pub fn is_tls(&self) -> bool {
        self.0.scheme() == "https"
    }

    /// Whether the host is a loopback address (or `localhost`).
    pub fn is_loopback(&self) -> bool {
        let host = self.0.host_str().unwrap_or_default();
        host.eq_ignore_ascii_case("localhost")
            || host
                .trim_start_matches('[')
                .trim_end_matches(']')
                .parse::<std::net::IpAddr>()
                .is_ok_and(|ip| ip.is_loopback())
    }

    fn base(&self) -> String {
        self.0.as_str().trim_end_matches('/').to_owned()
    }
}

impl fmt::Display for GatewayUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.base())
    }
}

/// Where the gateway token comes from. Never the command line (it would show in `ps`), never
/// the config file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenSource {
    /// An environment variable's name.
    Env(String),
    /// A file only its owner can read.
    File(PathBuf),
}

impl TokenSource {
    fn env(name: &str) -> Result<Self, String> {
        let mut chars = name.chars();
        let valid = chars
            .next()
            .is_some_and(|c| c.is_ascii_uppercase() || c == '_')
            && name.len() <= 128
            && chars.all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_');
        if !valid {
            // The value is not repeated: it may be a token pasted in the wrong place.
            return Err(
                "openclaw.token_env is not an environment variable's name; write the \
                 name (uppercase letters, digits and '_', like OPENCLAW_GATEWAY_TOKEN), never \
                 the token itself"
                    .into(),
            );
        }
        Ok(Self::Env(name.to_owned()))
    }

    fn file(path: PathBuf) -> Result<Self, String> {
        if !path.is_absolute() {
            return Err(format!(
                "openclaw.token_file {:?} is not an absolute path; write the full path, like \
                 /home/me/.config/mailslot/openclaw-token",
                path.display()
            ));
        }
        Ok(Self::File(path))
    }

    /// Where the token comes from, for messages ("the environment variable X").
    pub fn describe(&self) -> String {
        match self {
            TokenSource::Env(name) => format!("the environment variable {name}"),
            TokenSource::File(path) => format!("the file {}", path.display()),
        }
    }

    /// Reads the token now. The error says what to fix; it never contains the token.
    pub fn read(&self) -> Result<Token, String> {
        let token = match self {
            TokenSource::Env(name) => match std::env::var(name) {
                Ok(v) => Zeroizing::new(v),
                Err(std::env::VarError::NotPresent) => {
                    return Err(format!(
                        "the environment variable {name} (openclaw.token_env) is not set; set it \
                         to the gateway's token (gateway.auth.token in openclaw.json) where \
                         mailslot mcp starts (for OpenClaw: mcp.servers.<name>.env in \
                         openclaw.json)"
                    ));
                }
                Err(std::env::VarError::NotUnicode(_)) => {
                    return Err(format!(
                        "the environment variable {name} (openclaw.token_env) is not UTF-8 text"
                    ));
                }
            },
            TokenSource::File(path) => read_private_file(path)?,
        };
        let trimmed = token.trim();
        if trimmed.is_empty() {
            return Err(format!(
                "{} (the OpenClaw gateway token) is empty; put gateway.auth.token from \
                 openclaw.json in it",
                self.describe()
            ));
        }
        if trimmed.chars().any(char::is_control) {
            return Err(format!(
                "{} holds more than one line or control characters; it must hold only the \
                 gateway token",
                self.describe()
            ));
        }
        Ok(Token(Zeroizing::new(trimmed.to_owned())))
    }
}

/// The token file, refused when others can read or write it.
fn read_private_file(path: &Path) -> Result<Zeroizing<String>, String> {
    use std::os::unix::fs::PermissionsExt;
    let shown = path.display();
    let meta = std::fs::metadata(path)
        .map_err(|e| format!("cannot read the token file {shown} (openclaw.token_file): {e}"))?;
    if !meta.is_file() {
        return Err(format!(
            "the token file {shown} (openclaw.token_file) is not a file"
        ));
    }
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(format!(
            "the token file {shown} can be read by others (mode {mode:03o}); make it private \
             with: chmod 600 {shown}"
        ));
    }
    if meta.len() > MAX_TOKEN_BYTES {
        return Err(format!(
            "the token file {shown} is over {MAX_TOKEN_BYTES} bytes; it must hold only the \
             gateway token"
        ));
    }
    let bytes = Zeroizing::new(
        std::fs::read(path).map_err(|e| format!("cannot read the token file {shown}: {e}"))?,
    );
    std::str::from_utf8(&bytes)
        .map(|s| Zeroizing::new(s.to_owned()))
        .map_err(|_| format!("the token file {shown} is not UTF-8 text"))
}

/// The gateway token. Its `Debug` never shows it; it is wiped when dropped.
#[derive(Clone)]
pub struct Token(Zeroizing<String>);

impl Token {
    /// The token, to put in an `Authorization` header or a connect frame.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Token([redacted])")
    }
}

/// How a session key is made: `agent:<agent id>:` and then anything of `[a-z0-9:_-]` with the
/// placeholders `{agent_id}`, `{mailbox}` (the mailslot agent whose mail it is) and `{sender}`
/// (the sender's address). Placeholder values are sanitized with [`sanitize_peer`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionKeyTemplate(String);

const PLACEHOLDERS: [&str; 3] = ["{agent_id}", "{mailbox}", "{sender}"];

impl SessionKeyTemplate {
    /// Checks `template` for the OpenClaw agent `agent_id`.
    pub fn parse(template: &str, agent_id: &str) -> Result<Self, String> {
        let field = "openclaw.session_key";
        if template.chars().count() > SESSION_KEY_CHARS {
            return Err(format!("{field} is over {SESSION_KEY_CHARS} characters"));
        }
        // Everything outside the placeholders must already be what OpenClaw keeps: it
        // lowercases keys, so an uppercase letter would name another session than written.
        let mut rest = template.to_owned();
        for p in PLACEHOLDERS {
            rest = rest.replace(p, "x");
        }
        if let Some(open) = rest.find('{') {
            let name: String = rest[open..].chars().take_while(|c| *c != '}').collect();
            return Err(format!(
                "{field} {template:?}: unknown placeholder {name}}}; use {{agent_id}}, \
                 {{mailbox}} (this mailslot agent) or {{sender}} (the sender's address)"
            ));
        }
        if let Some(bad) = rest.chars().find(|c| {
            !(c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, ':' | '_' | '-'))
        }) {
            return Err(format!(
                "{field} {template:?}: {bad:?} is not allowed; OpenClaw session keys are \
                 lowercase letters, digits, ':', '_' and '-' (the default is {DEFAULT_SESSION_KEY:?})"
            ));
        }
        let mut parts = template.splitn(3, ':');
        let (first, agent, tail) = (parts.next(), parts.next(), parts.next());
        let agent_ok = agent.is_some_and(|a| a == "{agent_id}" || a == agent_id);
        if first != Some("agent") || !agent_ok || tail.is_none_or(str::is_empty) {
            return Err(format!(
                "{field} {template:?}: a session key is agent:<agent id>:<rest>, with the agent \
                 id {{agent_id}} or {agent_id:?} (openclaw.agent_id); the default is \
                 {DEFAULT_SESSION_KEY:?}"
            ));
        }
        Ok(Self(template.to_owned()))
    }

    /// The session key for mail to `mailbox` from `sender`.
    pub fn render(&self, agent_id: &str, mailbox: &AgentName, sender: &str) -> String {
        self.0
            .replace("{agent_id}", agent_id)
            .replace("{mailbox}", &sanitize_peer(mailbox.as_str()))
            .replace("{sender}", &sanitize_peer(sender))
    }

    /// Whether every sender gets a session of its own.
    pub fn per_sender(&self) -> bool {
        self.0.contains("{sender}")
    }

    /// The template as written.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// A name made fit for a session key: lowercase, `[a-z0-9_-]` only (anything else becomes
/// `-`), at most 64 characters, never empty.
pub fn sanitize_peer(name: &str) -> String {
    let clean: String = name
        .chars()
        .flat_map(char::to_lowercase)
        .map(|c| {
            if c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-' {
                c
            } else {
                '-'
            }
        })
        .take(PEER_CHARS)
        .collect();
    if clean.is_empty() { "-".into() } else { clean }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<OpenClawConfig, String> {
        #[derive(Deserialize)]
        struct File {
            openclaw: OpenClawConfig,
        }
        toml::from_str::<File>(text)
            .map(|f| f.openclaw)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn defaults_and_a_full_table() {
        let c = parse("[openclaw]\ntoken_env = \"OPENCLAW_GATEWAY_TOKEN\"\n").unwrap();
        assert_eq!(c.gateway_url.to_string(), "http://127.0.0.1:18789");
        assert_eq!(c.token, TokenSource::Env("OPENCLAW_GATEWAY_TOKEN".into()));
        assert_eq!(c.agent_id, "main");
        assert_eq!(c.reply_tool(), "mailslot__reply");
        let bob = AgentName::new("bob").unwrap();
        assert_eq!(
            c.session_key.render(&c.agent_id, &bob, "alice"),
            "agent:main:dm:mailbox-bob"
        );
        assert!(c.rings_for(&bob));

        let c = parse(
            "[openclaw]\ngateway_url = \"https://gw.example.com/openclaw/\"\n\
             token_file = \"/etc/mailslot/token\"\nagent_id = \"ops\"\n\
             session_key = \"agent:ops:mail:{mailbox}:{sender}\"\nmcp_server = \"mail\"\n\
             agents = [\"bob\"]\n",
        )
        .unwrap();
        assert_eq!(
            c.gateway_url.join("tools/invoke"),
            "https://gw.example.com/openclaw/tools/invoke"
        );
        assert_eq!(c.gateway_url.websocket(), "wss://gw.example.com/openclaw");
        assert!(!c.gateway_url.is_loopback());
        assert_eq!(c.reply_tool(), "mail__reply");
        assert!(c.session_key.per_sender());
        assert_eq!(
            c.session_key
                .render("ops", &bob, "Alice.Smith@relay.example.com:443"),
            "agent:ops:mail:bob:alice-smith-relay-example-com-443"
        );
        assert!(!c.rings_for(&AgentName::new("carol").unwrap()));
    }

    #[test]
    fn every_bad_value_names_its_field_and_the_fix() {
        let cases = [
            ("token = \"abc\"", "never written in config.toml"),
            ("", "add token_env"),
            (
                "token_env = \"A\"\ntoken_file = \"/t\"",
                "only one of token_env and token_file",
            ),
            (
                "token_env = \"3f9a0c1b2d4e5f60718293a4b5c6d7e8\"",
                "never the token itself",
            ),
            ("token_file = \"token.txt\"", "openclaw.token_file"),
            (
                "token_env = \"T\"\ngateway_url = \"ftp://x\"",
                "openclaw.gateway_url",
            ),
            (
                "token_env = \"T\"\ngateway_url = \"127.0.0.1:18789\"",
                "openclaw.gateway_url",
            ),
            (
                "token_env = \"T\"\ngateway_url = \"http://u:p@h:1\"",
                "credentials",
            ),
            (
                "token_env = \"T\"\ngateway_url = \"http://h:1/?x=1\"",
                "query",
            ),
            (
                "token_env = \"T\"\nagent_id = \"Main\"",
                "openclaw.agent_id",
            ),
            (
                "token_env = \"T\"\nsession_key = \"agent:main:{peer}\"",
                "unknown placeholder {peer}",
            ),
            (
                "token_env = \"T\"\nsession_key = \"agent:main:Bob\"",
                "lowercase",
            ),
            (
                "token_env = \"T\"\nsession_key = \"agent:other:{mailbox}\"",
                "agent:<agent id>:<rest>",
            ),
            (
                "token_env = \"T\"\nsession_key = \"main:{mailbox}\"",
                "agent:<agent id>:<rest>",
            ),
            (
                "token_env = \"T\"\nmcp_server = \"mail slot\"",
                "openclaw.mcp_server",
            ),
            ("token_env = \"T\"\nagents = []", "openclaw.agents"),
            ("token_env = \"T\"\nagents = [\"Bob\"]", "agent name"),
            (
                "token_env = \"T\"\ngateway = \"http://h\"",
                "unknown field `gateway`",
            ),
        ];
        for (body, expected) in cases {
            let err = parse(&format!("[openclaw]\n{body}\n")).unwrap_err();
            assert!(err.contains(expected), "{body:?}: {err}");
            assert!(
                !err.contains("3f9a0c1b"),
                "a pasted token is not echoed: {err}"
            );
        }
    }

    #[test]
    fn sanitizing_peers() {
        assert_eq!(sanitize_peer("bob"), "bob");
        assert_eq!(sanitize_peer("Bob.Dev_2-x"), "bob-dev_2-x");
        assert_eq!(
            sanitize_peer("alice@relay.example.com:7878"),
            "alice-relay-example-com-7878"
        );
        assert_eq!(sanitize_peer("../../etc"), "------etc");
        assert_eq!(
            sanitize_peer("é🦀"),
            "é🦀".chars().map(|_| '-').collect::<String>()
        );
        assert_eq!(sanitize_peer(""), "-");
        assert_eq!(sanitize_peer(&"a".repeat(100)).len(), 64);
    }

    #[test]
    fn tokens_come_from_the_environment_or_a_private_file() {
        let missing = TokenSource::Env("MAILSLOT_TEST_SURELY_UNSET_TOKEN".into());
        let err = missing.read().unwrap_err();
        assert!(
            err.contains("MAILSLOT_TEST_SURELY_UNSET_TOKEN") && err.contains("not set"),
            "{err}"
        );

        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        std::fs::write(&path, "s3cret-token\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let source = TokenSource::File(path.clone());
        let err = source.read().unwrap_err();
        assert!(
            err.contains("chmod 600") && err.contains("644") && !err.contains("s3cret"),
            "{err}"
        );
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let token = source.read().unwrap();
        assert_eq!(token.expose(), "s3cret-token");
        assert_eq!(format!("{token:?}"), "Token([redacted])");
        std::fs::write(&path, "a\nb\n").unwrap();
        assert!(source.read().unwrap_err().contains("more than one line"));
        std::fs::write(&path, "  \n").unwrap();
        assert!(source.read().unwrap_err().contains("empty"));
    }
}
