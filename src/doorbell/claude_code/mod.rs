//! Claude Code's doorbells for an idle session, for every account. A message must start a
//! turn in the session by itself, whoever the user is:
//! - the **channel** (`notifications/claude/channel`, rung by `mcp/push.rs`) for accounts with
//!   the channels research preview that launched Claude Code naming mailslot's channel;
//! - else the session's **inbox socket** ([`socket`]), Claude Code's own cross-session
//!   messaging, on for every account since 2.1.224;
//! - else (the socket refused or held by `crossSessionInbound`, or an older Claude Code) the
//!   **rewake hook** ([`wake`]): `mailslot hook wake` in an `asyncRewake` hook entry.
//!
//! One path per session, chosen when `mailslot mcp` starts ([`Session::choose`]) and
//! claimed in the store (`store::IdlePath`), so the rewake hook of a session that the channel
//! or the socket serves stays quiet. Each path takes a message in the shown ledger before it
//! rings, so no hook or other path shows it again. A channel that the launch flags asked for
//! is trusted only once it proved itself (a channel-started prompt recorded by the
//! UserPromptSubmit hook); until then a message it did not show within [`CHANNEL_PROOF`] is
//! handed to the socket, which serves the session from then on.

pub mod launch;
pub mod socket;
pub mod wake;

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use zeroize::Zeroizing;

use super::Ring;
use crate::mailbox::Mailbox;
use crate::store::{IdlePath, SessionKey, Via};
use launch::Inbound;

/// The session's inbox socket, which Claude Code gives its MCP servers.
pub const ENV_SOCKET: &str = "CLAUDE_CODE_MESSAGING_SOCKET";
/// The token that authenticates a line on the socket (a secret: never logged).
pub const ENV_TOKEN: &str = "CLAUDE_CODE_MESSAGING_TOKEN";
/// How long a channel event may take to show up in a prompt before the channel is taken as
/// not registered (no preview, a wrong name) and the socket serves the session instead.
pub const CHANNEL_PROOF: Duration = Duration::from_secs(3);
/// The longest socket path accepted (`sockaddr_un` holds about 104 bytes).
const MAX_SOCKET_PATH: usize = 104;
/// The longest token accepted.
const MAX_TOKEN: usize = 256;

/// Where a session's inbox socket is, and its token.
#[derive(Clone)]
pub struct InboxSocket {
    /// The Unix socket.
    pub path: PathBuf,
    token: Option<Arc<Zeroizing<String>>>,
}

impl std::fmt::Debug for InboxSocket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InboxSocket")
            .field("path", &self.path)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

impl InboxSocket {
    /// The socket Claude Code named in the environment, if it is plausible.
    pub fn from_env() -> Option<Self> {
        let path = PathBuf::from(std::env::var_os(ENV_SOCKET)?);
        if path.as_os_str().is_empty() || path.as_os_str().len() > MAX_SOCKET_PATH {
            tracing::warn!(
                "ignoring {ENV_SOCKET}: empty or over {MAX_SOCKET_PATH} bytes; Claude Code sets it for the session's inbox socket"
            );
            return None;
        }
        let token = std::env::var(ENV_TOKEN)
            .ok()
            .filter(|t| {
                let ok = !t.is_empty()
                    && t.len() <= MAX_TOKEN
                    && t
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
                if !ok {
                    tracing::warn!(
                        "ignoring {ENV_TOKEN}: not 1 to {MAX_TOKEN} letters, digits, '.', '_' or '-'"
                    );
                }
                ok
            })
            .map(|t| Arc::new(Zeroizing::new(t)));
        Some(Self { path, token })
    }

    /// A socket at `path` with `token` (tests, benchmarks).
    pub fn new(path: PathBuf, token: Option<String>) -> Self {
        Self {
            path,
            token: token.map(|t| Arc::new(Zeroizing::new(t))),
        }
    }

    pub(crate) fn token(&self) -> Option<&str> {
        self.token.as_ref().map(|t| t.as_str())
    }
}

/// A path that wakes an idle session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Path {
    /// The channel.
    Channel,
    /// The inbox socket.
    Socket,
    /// The rewake hook (no ring from `mailslot mcp`).
    Hooks,
}

impl Path {
    /// Its name, for people.
    pub fn as_str(self) -> &'static str {
        match self {
            Path::Channel => "channel",
            Path::Socket => "inbox socket",
            Path::Hooks => "rewake hook",
        }
    }
}

/// The path chosen for a session, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Choice {
    /// The path.
    pub path: Path,
    /// Why, for people (logs, doctor).
    pub reason: String,
}

/// What `mailslot mcp` knows of the Claude Code session it serves.
#[derive(Debug, Clone)]
pub struct Session {
    /// The session (`CLAUDE_CODE_SESSION_ID`).
    pub key: SessionKey,
    /// Its inbox socket, if Claude Code gave one (2.1.224 and later).
    pub socket: Option<InboxSocket>,
    /// The `crossSessionInbound` setting, and the file that set it.
    pub inbound: (Inbound, Option<PathBuf>),
    /// What its command line asked for.
    pub flags: launch::Flags,
}

impl Session {
    /// The session of the Claude Code that started this process; `None` outside Claude Code.
    pub fn from_env(key: Option<SessionKey>) -> Option<Self> {
        let key = key?;
        let files = launch::session_settings_files();
        Some(Self {
            key,
            socket: InboxSocket::from_env(),
            inbound: launch::inbound_setting(&files),
            flags: launch::claude_code_flags(),
        })
    }

    /// What a new interactive session started with these settings files would be: a
    /// Claude Code recent enough to give its inbox socket, launched without flags (for
    /// `mailslot doctor` outside a session).
    pub fn new_interactive(files: &[PathBuf]) -> Self {
        Self {
            key: SessionKey::new("new-session").expect("a valid session key"),
            socket: Some(InboxSocket::new(PathBuf::from("inbox.sock"), None)),
            inbound: launch::inbound_setting(files),
            flags: launch::Flags::default(),
        }
    }

    /// Whether the inbox socket can start a turn (present, and neither refused nor held).
    pub fn socket_usable(&self) -> bool {
        self.socket.is_some() && self.inbound.0 == Inbound::Accept
    }

    /// The path that wakes this session while it is idle, and why.
    pub fn choose(&self) -> Choice {
        let set_in = || {
            self.inbound
                .1
                .as_ref()
                .map(|f| format!(" in {}", f.display()))
                .unwrap_or_default()
        };
        if self.flags.headless {
            return Choice {
                path: Path::Hooks,
                reason: "Claude Code runs headless (-p, or an SDK): it answers one prompt and never waits idle, so its hooks show new mail (after a tool call, at the end)".into(),
            };
        }
        if self.flags.channel {
            return Choice {
                path: Path::Channel,
                reason: "Claude Code was launched naming mailslot's channel (--channels or --dangerously-load-development-channels); the socket takes over if the channel does not show the first message".into(),
            };
        }
        match (&self.socket, self.inbound.0) {
            (Some(_), Inbound::Accept) => Choice {
                path: Path::Socket,
                reason: "Claude Code gave the session's inbox socket (cross-session messaging, every account since 2.1.224)".into(),
            },
            (Some(_), inbound) => Choice {
                path: Path::Hooks,
                reason: format!(
                    "crossSessionInbound is \"{}\"{}: the socket cannot start a turn, so the rewake hook (mailslot hook wake) wakes the session",
                    inbound.as_str(),
                    set_in()
                ),
            },
            (None, _) => Choice {
                path: Path::Hooks,
                reason: "Claude Code gave no inbox socket (older than 2.1.224, or messaging off): the rewake hook (mailslot hook wake) wakes the session".into(),
            },
        }
    }
}

/// Where rings go for the session this process serves; shared by the MCP pushes (channel)
/// and the socket doorbell, and changed when an unproven channel fails.
#[derive(Clone)]
pub struct Route(Arc<RouteInner>);

struct RouteInner {
    state: watch::Sender<State>,
    handover: mpsc::UnboundedSender<Ring>,
    handed: Mutex<Option<mpsc::UnboundedReceiver<Ring>>>,
    session: Option<SessionKey>,
    socket_usable: bool,
}

/// Where rings go now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// Not a Claude Code session: every MCP client gets channel events (others ignore them).
    Open,
    /// The channel; `proven` once a channel event reached the model.
    Channel {
        /// Whether a channel-started prompt was seen.
        proven: bool,
    },
    /// The inbox socket.
    Socket,
    /// Neither: the rewake hook wakes the session.
    Hooks,
}

impl Route {
    /// The route of a process that serves no Claude Code session.
    pub fn open() -> Self {
        Self::new(State::Open, None, false)
    }

    /// The route of a bell that always rings (a Codex thread's queue).
    pub fn bell(session: SessionKey) -> Self {
        Self::new(State::Socket, Some(session), false)
    }

    /// The route for `session`, starting on its choice.
    pub fn for_session(session: &Session) -> Self {
        let state = match session.choose().path {
            Path::Channel => State::Channel { proven: false },
            Path::Socket => State::Socket,
            Path::Hooks => State::Hooks,
        };
        Self::new(state, Some(session.key.clone()), session.socket_usable())
    }

    fn new(state: State, session: Option<SessionKey>, socket_usable: bool) -> Self {
        let (handover, handed) = mpsc::unbounded_channel();
        Self(Arc::new(RouteInner {
            state: watch::Sender::new(state),
            handover,
            handed: Mutex::new(Some(handed)),
            session,
            socket_usable,
        }))
    }

    /// Keeps the session's claim in the store in step with the route, until the route is
    /// dropped; [`Route::release`] drops the claim at the end.
    pub fn keep_claimed(&self, mailbox: Mailbox) {
        let Some(session) = self.0.session.clone() else {
            return;
        };
        let mut states = self.watch();
        let route = self.clone();
        tokio::spawn(async move {
            loop {
                let path = route.claimed_path();
                if let Err(e) = mailbox.claim_idle_path(session.clone(), path).await {
                    tracing::warn!(error = %e, "cannot record which doorbell wakes this session");
                }
                if states.changed().await.is_err() {
                    return;
                }
                states.borrow_and_update();
            }
        });
    }

    /// Drops the session's claim (the process is ending; the rewake hook takes over).
    pub async fn release(&self, mailbox: &Mailbox) {
        if let Some(session) = self.0.session.clone()
            && let Err(e) = mailbox.claim_idle_path(session, None).await
        {
            tracing::warn!(error = %e, "cannot release this session's doorbell");
        }
    }

    /// Where rings go now.
    pub fn state(&self) -> State {
        *self.0.state.borrow()
    }

    /// Changes of the state.
    pub fn watch(&self) -> watch::Receiver<State> {
        self.0.state.subscribe()
    }

    /// The Claude Code session, if this process serves one.
    pub fn session(&self) -> Option<&SessionKey> {
        self.0.session.as_ref()
    }

    /// Whether rings go out as channel events.
    pub fn rings_channel(&self) -> bool {
        matches!(self.state(), State::Open | State::Channel { .. })
    }

    /// The path this process claims for its session now, if any.
    pub fn claimed_path(&self) -> Option<IdlePath> {
        match self.state() {
            State::Channel { .. } => Some(IdlePath::Channel),
            State::Socket => Some(IdlePath::Socket),
            State::Open | State::Hooks => None,
        }
    }

    /// The rings handed over from an unproven channel (once: the socket doorbell takes it).
    pub(crate) fn take_handed(&self) -> Option<mpsc::UnboundedReceiver<Ring>> {
        self.0.handed.lock().expect("not poisoned").take()
    }

    /// After a channel event about mail went out: on a proven channel it is recorded as
    /// shown; on an unproven one it is checked after [`CHANNEL_PROOF`], and if no path showed
    /// it, the channel is given up and the ring goes to the socket (when `socket_usable`), or
    /// to the rewake hook.
    pub async fn after_channel_ring(&self, mailbox: &Mailbox, ring: Ring) {
        let socket_usable = self.0.socket_usable;
        let (Some(session), Some(id)) = (self.0.session.clone(), ring.message) else {
            return;
        };
        match self.state() {
            State::Channel { proven: true } => {
                if let Err(e) = mailbox.mark_shown(session, vec![id], Via::Channel).await {
                    tracing::warn!(error = %e, "cannot record a channel event as shown");
                }
            }
            State::Channel { proven: false } => {
                tokio::time::sleep(CHANNEL_PROOF).await;
                if self.state() != (State::Channel { proven: false }) {
                    if self.state() == State::Socket {
                        let _ = self.0.handover.send(ring);
                    }
                    return;
                }
                match mailbox.shown_via(session, id).await {
                    Ok(Some(Via::Channel)) => {
                        tracing::info!(
                            "Claude Code showed a channel event: the channel serves this session"
                        );
                        self.0.state.send_replace(State::Channel { proven: true });
                    }
                    // Another path (a hook, a tool) showed it: still unproven.
                    Ok(Some(_)) => {}
                    Ok(None) if socket_usable => {
                        tracing::warn!(
                            "the channel did not show a message within {CHANNEL_PROOF:?} (no channels preview on this account?): the inbox socket serves this session from now on"
                        );
                        self.0.state.send_replace(State::Socket);
                        let _ = self.0.handover.send(ring);
                    }
                    Ok(None) => {
                        tracing::warn!(
                            "the channel did not show a message within {CHANNEL_PROOF:?} (no channels preview on this account?): the rewake hook wakes this session from now on"
                        );
                        self.0.state.send_replace(State::Hooks);
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot check whether a channel event was shown")
                    }
                }
            }
            State::Open | State::Socket | State::Hooks => {}
        }
    }
}
