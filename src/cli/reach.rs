//! The agent's relay as it is right now, for `status` and `doctor`: which one, whether it
//! answers, whether it knows the agent, and the consent it holds for it. Never starts the
//! embedded relay. (Asking is a hello, and on a relay with open registration a hello
//! registers a free name, as every command's does.)

use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use serde::Serialize;

use super::{Ctx, local_relay};
use crate::agent::Agent;
use crate::client::{ClientError, Connection, RelayUrl};
use crate::protocol::{Address, ErrorCode, Peer, Policy};

/// How long to wait for a TCP connection to the embedded relay's port.
const PORT_TIMEOUT: Duration = Duration::from_millis(250);

/// The relay an agent uses and what it said.
#[derive(Debug, Serialize)]
pub(super) struct Reach {
    /// Its URL.
    pub url: String,
    /// Whether it is this home's embedded loopback relay (no relay configured).
    pub embedded: bool,
    /// For the embedded relay: the port is answered by a process this home did not start
    /// (another home's relay, or another program).
    pub foreign_listener: bool,
    /// What it said.
    #[serde(flatten)]
    pub state: State,
}

/// What the relay said about the agent.
#[derive(Debug, Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub(super) enum State {
    /// It knows the agent; the consent it holds for it.
    Registered {
        /// Who may write without asking.
        policy: Policy,
        /// Contacts its owner approved.
        contacts: Vec<Address>,
        /// Agents its owner blocked.
        blocked: Vec<Peer>,
        /// Contact requests waiting for its owner.
        incoming_requests: usize,
    },
    /// It answers, and does not know the agent's name.
    NotRegistered,
    /// It answers, and refuses the agent.
    Refused {
        /// Its words.
        reason: String,
    },
    /// This home's embedded relay is not running; the next command that needs it starts it.
    NotStarted,
    /// Nothing usable answered.
    Unreachable {
        /// Why.
        reason: String,
    },
}

impl Reach {
    /// One line for people: where the relay is and what it said.
    pub fn summary(&self) -> String {
        let which = match (self.embedded, self.foreign_listener) {
            (true, false) => " (this home's loopback relay)",
            (true, true) => {
                " (the loopback relay's port, answered by a process this home did not start)"
            }
            (false, _) => "",
        };
        let said = match &self.state {
            State::Registered { policy, .. } => format!("reachable, registered, policy {policy}"),
            State::NotRegistered => "reachable, the agent is not registered".to_owned(),
            State::Refused { reason } => format!("reachable, refuses the agent: {reason}"),
            State::NotStarted => "not running; the next command that needs it starts it".to_owned(),
            State::Unreachable { reason } => format!("unreachable: {reason}"),
        };
        format!("{}{which}: {said}", self.url)
    }
}

/// Looks at `agent`'s relay now.
pub(super) fn check(ctx: &Ctx, agent: &Agent) -> anyhow::Result<Reach> {
    let (url, embedded, foreign_listener) = match ctx.local_relay()? {
        None => (ctx.relay_url()?, false, false),
        Some(port) => {
            let url: RelayUrl = format!("ws://127.0.0.1:{port}")
                .parse()
                .map_err(anyhow::Error::msg)?;
            let ours = local_relay::status(&ctx.paths.relay_db()).is_some();
            let addr = SocketAddr::from(([127, 0, 0, 1], port));
            let listening = TcpStream::connect_timeout(&addr, PORT_TIMEOUT).is_ok();
            if !listening {
                return Ok(Reach {
                    url: url.to_string(),
                    embedded: true,
                    foreign_listener: false,
                    state: State::NotStarted,
                });
            }
            (url, true, !ours)
        }
    };
    let state = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(ask(&url, agent));
    Ok(Reach {
        url: url.to_string(),
        embedded,
        foreign_listener,
        state,
    })
}

async fn ask(url: &RelayUrl, agent: &Agent) -> State {
    let mut conn =
        match Connection::connect_control(url, &agent.name, &agent.identity, agent.owner).await {
            Ok(conn) => conn,
            Err(e) => return refusal(e),
        };
    let answer = crate::client::consent::state(&mut conn).await;
    conn.close().await;
    match answer {
        Ok(state) => State::Registered {
            policy: state.policy,
            contacts: state.contacts,
            blocked: state.blocked,
            incoming_requests: state.incoming.len(),
        },
        Err(e) => refusal(e),
    }
}

fn refusal(e: ClientError) -> State {
    match e {
        ClientError::Refused {
            code: ErrorCode::UnknownAgent,
            ..
        } => State::NotRegistered,
        ClientError::Refused { .. } => State::Refused {
            reason: e.to_string(),
        },
        // A server that is not a relay says so itself (`ClientError::NotARelay`).
        other => State::Unreachable {
            reason: other.to_string(),
        },
    }
}
