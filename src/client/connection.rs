//! One authenticated WebSocket connection to a relay (`ws://`, or `wss://` over TLS), with
//! request/answer matching: frames that arrive while a request waits (deliveries) are kept, in
//! order, for [`Connection::recv`].

use std::collections::VecDeque;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use tokio_tungstenite::tungstenite::Message as WsMessage;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;

use super::tls::{RelaySocket, open_socket};
use super::{ClientError, RelayUrl, refusal};
use crate::crypto::sign::{self, Domain};
use crate::crypto::{Identity, Owner};
use crate::protocol::{
    Address, AgentName, ClientFrame, ErrorCode, FRAME_OVERHEAD, HIDDEN_QUERY, InviteToken,
    KeyRotation, Limits, MessageId, OwnerAct, OwnerKey, PROTOCOL_VERSION, PublicKeys, RelayName,
    SealedEnvelope, Seq, ServerFrame, Shown, hello_payload, retire_payload,
};

/// How long to wait for the relay to answer the connection or a request.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(15);

/// An authenticated connection.
pub struct Connection {
    ws: RelaySocket,
    backlog: VecDeque<ServerFrame>,
    next_ref: u64,
    waiting: u64,
    url: RelayUrl,
    /// The last delivery committed to the store, and whether it is acknowledged yet.
    committed: Option<Seq>,
    unacked: usize,
    /// Who this connection is, and the challenge it answered: what owner signatures bind to.
    agent: AgentName,
    relay: String,
    nonce: Vec<u8>,
    /// The owner key the relay has for the agent, from the welcome.
    owner: Option<OwnerKey>,
    /// The name the relay publishes, once asked (once per connection).
    published: Option<RelayName>,
}

/// A delivery connection (shown in presence or not), or a control one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Delivery(Shown),
    Control,
}

/// Acknowledge at least this often while a backlog drains.
const ACK_EVERY: usize = 256;

impl Connection {
    /// Connects, answers the challenge as `agent` (registering its keys, and `owner` as its
    /// owner key, if the relay does not know them yet), and waits for the welcome. This is the
    /// agent's delivery connection: it replaces any other one the agent has.
    pub async fn connect(
        url: &RelayUrl,
        agent: &AgentName,
        identity: &Identity,
        owner: Option<OwnerKey>,
    ) -> Result<Self, ClientError> {
        Self::open(
            url,
            agent,
            identity,
            owner,
            None,
            Kind::Delivery(Shown::Online),
        )
        .await
    }

    /// Like [`Connection::connect`], shown in presence as `shown` says: an owner's window
    /// that receives the agent's mail but is no session of it connects [`Shown::Hidden`].
    pub async fn connect_shown(
        url: &RelayUrl,
        agent: &AgentName,
        identity: &Identity,
        owner: Option<OwnerKey>,
        shown: Shown,
    ) -> Result<Self, ClientError> {
        Self::open(url, agent, identity, owner, None, Kind::Delivery(shown)).await
    }

    /// Like [`Connection::connect`], but a control connection: requests only (sends, lookups,
    /// consent), no deliveries, and the agent's delivery connection (a running `mailslot mcp`)
    /// is left alone.
    pub async fn connect_control(
        url: &RelayUrl,
        agent: &AgentName,
        identity: &Identity,
        owner: Option<OwnerKey>,
    ) -> Result<Self, ClientError> {
        Self::open(url, agent, identity, owner, None, Kind::Control).await
    }

    /// Like [`Connection::connect_control`], offering `invite` in case the agent's name is new
    /// and the relay registers by invite only (the invite is used up only then).
    pub async fn register(
        url: &RelayUrl,
        agent: &AgentName,
        identity: &Identity,
        owner: Option<OwnerKey>,
        invite: Option<InviteToken>,
    ) -> Result<Self, ClientError> {
        Self::open(url, agent, identity, owner, invite, Kind::Control).await
    }

    async fn open(
        url: &RelayUrl,
        agent: &AgentName,
        identity: &Identity,
        owner: Option<OwnerKey>,
        invite: Option<InviteToken>,
        kind: Kind,
    ) -> Result<Self, ClientError> {
        let unreachable = |reason: String| ClientError::Unreachable {
            url: url.to_string(),
            reason,
        };
        let max = Limits::default().envelope_bytes + FRAME_OVERHEAD;
        let config = WebSocketConfig::default()
            .max_message_size(Some(max))
            .max_frame_size(Some(max))
            .read_buffer_size(16 * 1024);
        let query = (kind == Kind::Delivery(Shown::Hidden)).then_some(HIDDEN_QUERY);
        let ws = tokio::time::timeout(ANSWER_TIMEOUT, open_socket(url, query, Some(config)))
            .await
            .map_err(|_| {
                unreachable(format!("no answer within {} s", ANSWER_TIMEOUT.as_secs()))
            })??;
        let mut conn = Self {
            ws,
            backlog: VecDeque::new(),
            next_ref: 0,
            waiting: 0,
            url: url.clone(),
            committed: None,
            unacked: 0,
            agent: agent.clone(),
            relay: String::new(),
            nonce: Vec::new(),
            owner: None,
            published: None,
        };
        let (relay, nonce) = match conn.recv_timed().await? {
            ServerFrame::Challenge { v, relay, nonce } if v == PROTOCOL_VERSION => (relay, nonce),
            ServerFrame::Challenge { v, .. } => {
                return Err(ClientError::Protocol(format!(
                    "the relay speaks protocol {v}; this mailslot speaks {PROTOCOL_VERSION}"
                )));
            }
            other => {
                return Err(ClientError::Protocol(format!(
                    "expected a challenge, got {other:?}"
                )));
            }
        };
        let signature =
            sign::signature(identity, Domain::Hello, &hello_payload(&relay, &nonce)).to_vec();
        let register: PublicKeys = identity.public().to_keys();
        conn.send(&ClientFrame::Hello {
            agent: agent.clone(),
            signature,
            register: Some(register),
            control: kind == Kind::Control,
            owner,
            invite,
        })
        .await?;
        conn.relay = relay;
        conn.nonce = nonce;
        match refusal(conn.recv_timed().await?)? {
            ServerFrame::Welcome { waiting, owner, .. } => {
                conn.waiting = waiting;
                conn.owner = owner;
            }
            other => {
                return Err(ClientError::Protocol(format!(
                    "expected a welcome, got {other:?}"
                )));
            }
        }
        Ok(conn)
    }

    /// Whether frames read earlier are waiting for [`Connection::recv`].
    pub fn has_backlog(&self) -> bool {
        !self.backlog.is_empty()
    }

    /// How many messages waited when the connection was made.
    pub fn waiting(&self) -> u64 {
        self.waiting
    }

    /// The relay's id, from its challenge: the same across its restarts and nodes, and moved
    /// with its data by `relay migrate`.
    pub fn relay_id(&self) -> &str {
        &self.relay
    }

    /// The relay this connection is to.
    pub fn url(&self) -> &RelayUrl {
        &self.url
    }

    /// The name the relay publishes at `/.well-known/mailslot` (the host of the agent's full
    /// address), asked once per connection.
    pub async fn relay_name(&mut self) -> Result<RelayName, ClientError> {
        if let Some(name) = &self.published {
            return Ok(name.clone());
        }
        let name = super::discovery::own_relay_name(&self.url).await?;
        self.published = Some(name.clone());
        Ok(name)
    }

    /// Whether `host` names this relay: its URL's host and port as written, or its published
    /// name.
    pub async fn is_own_relay(&mut self, host: &RelayName) -> Result<bool, ClientError> {
        Ok(host.as_str() == self.url.authority() || self.relay_name().await? == *host)
    }

    /// The authenticated agent.
    pub fn agent(&self) -> &AgentName {
        &self.agent
    }

    /// The agent's full address, `name@` the relay's published name: the sender of mail to
    /// another relay.
    pub async fn full_address(&mut self) -> Result<Address, ClientError> {
        Ok(Address::remote(
            self.agent.clone(),
            self.relay_name().await?,
        ))
    }

    /// Whether `address` is an agent on this relay: a bare name, or a name at this relay.
    pub async fn is_local(&mut self, address: &Address) -> Result<bool, ClientError> {
        match address.host() {
            None => Ok(true),
            Some(host) => self.is_own_relay(host).await,
        }
    }

    /// The owner key the relay holds for the agent (as of the welcome).
    pub fn owner(&self) -> Option<&OwnerKey> {
        self.owner.as_ref()
    }

    /// Gives up the agent's name on the relay, signed with its key for this connection; the
    /// relay's answer says until when the name stays held.
    pub async fn retire(&mut self, identity: &Identity) -> Result<String, ClientError> {
        let payload = retire_payload(&self.relay, &self.nonce, &self.agent);
        let signature = sign::signature(identity, Domain::Retire, &payload).to_vec();
        match self
            .call(|reference| ClientFrame::Retire {
                reference,
                signature,
            })
            .await?
        {
            ServerFrame::Done { detail, .. } => Ok(detail),
            other => Err(ClientError::Protocol(format!(
                "expected done, got {other:?}"
            ))),
        }
    }

    /// The owner's signature over `act` for this connection; only good on it.
    pub fn owner_signature(&self, owner: &Owner, act: &OwnerAct<'_>) -> Vec<u8> {
        owner
            .sign(&self.relay, &self.nonce, &self.agent, act)
            .to_vec()
    }

    /// Sends one frame.
    pub async fn send(&mut self, frame: &ClientFrame) -> Result<(), ClientError> {
        let text = serde_json::to_string(frame).expect("frames always serialize");
        self.ws
            .send(WsMessage::Text(text.into()))
            .await
            .map_err(|e| ClientError::Closed(e.to_string()))
    }

    /// The next frame: kept ones first, then from the socket.
    pub async fn recv(&mut self) -> Result<ServerFrame, ClientError> {
        if let Some(frame) = self.backlog.pop_front() {
            return Ok(frame);
        }
        self.read().await
    }

    async fn recv_timed(&mut self) -> Result<ServerFrame, ClientError> {
        tokio::time::timeout(ANSWER_TIMEOUT, self.recv())
            .await
            .map_err(|_| {
                ClientError::Closed(format!("no answer within {} s", ANSWER_TIMEOUT.as_secs()))
            })?
    }

    async fn read(&mut self) -> Result<ServerFrame, ClientError> {
        loop {
            let msg = match self.ws.next().await {
                None => return Err(ClientError::Closed("end of stream".into())),
                Some(Err(e)) => return Err(ClientError::Closed(e.to_string())),
                Some(Ok(m)) => m,
            };
            match msg {
                WsMessage::Text(text) => {
                    return serde_json::from_str(&text)
                        .map_err(|e| ClientError::Protocol(format!("bad frame: {e}")));
                }
                WsMessage::Close(frame) => {
                    return Err(ClientError::Closed(
                        frame
                            .map(|f| f.reason.to_string())
                            .unwrap_or_else(|| "closed".into()),
                    ));
                }
                WsMessage::Binary(_) => {
                    return Err(ClientError::Protocol(
                        "the relay sent a binary frame".into(),
                    ));
                }
                WsMessage::Ping(_) | WsMessage::Pong(_) | WsMessage::Frame(_) => {}
            }
        }
    }

    fn fresh_ref(&mut self) -> String {
        self.next_ref += 1;
        format!("r{}", self.next_ref)
    }

    /// Sends a request and waits for its answer, keeping other frames for later.
    async fn request(
        &mut self,
        frame: ClientFrame,
        reference: &str,
    ) -> Result<ServerFrame, ClientError> {
        self.send(&frame).await?;
        let wait = async {
            loop {
                let answer = self.read().await?;
                let matches = match (&answer, answer.reference()) {
                    (_, Some(r)) => r == reference,
                    // An error without a ref answers the frame just sent (e.g. a bad frame).
                    (ServerFrame::Error { .. }, None) => true,
                    _ => false,
                };
                if matches {
                    return Ok(answer);
                }
                self.backlog.push_back(answer);
            }
        };
        tokio::time::timeout(ANSWER_TIMEOUT, wait)
            .await
            .map_err(|_| {
                ClientError::Closed(format!("no answer within {} s", ANSWER_TIMEOUT.as_secs()))
            })?
    }

    /// The keys the relay has registered for `agent`.
    pub async fn lookup(&mut self, agent: &AgentName) -> Result<PublicKeys, ClientError> {
        Ok(self.lookup_with_rotations(agent).await?.0)
    }

    /// The keys the relay has registered for `agent`, with the signed rotations that led to
    /// them (oldest first; unchecked: see `crypto::follows`).
    pub async fn lookup_with_rotations(
        &mut self,
        agent: &AgentName,
    ) -> Result<(PublicKeys, Vec<KeyRotation>), ClientError> {
        match self
            .call(|reference| ClientFrame::Lookup {
                reference,
                agent: agent.clone(),
            })
            .await?
        {
            ServerFrame::Keys {
                keys, rotations, ..
            } => Ok((keys, rotations)),
            ServerFrame::Group { group, .. } => Err(ClientError::Refused {
                code: ErrorCode::InvalidEnvelope,
                message: format!(
                    "{} is a group: send to it alone, with no other recipients",
                    group.name
                ),
                retry_after_ms: None,
            }),
            other => Err(ClientError::Protocol(format!(
                "expected keys, got {other:?}"
            ))),
        }
    }

    /// Replaces this agent's registered keys with `rotation.new`; the relay's sentence.
    pub async fn rotate_keys(&mut self, rotation: KeyRotation) -> Result<String, ClientError> {
        match self
            .call(|reference| ClientFrame::RotateKeys {
                reference,
                rotation,
            })
            .await?
        {
            ServerFrame::Done { detail, .. } => Ok(detail),
            other => Err(ClientError::Protocol(format!(
                "expected done, got {other:?}"
            ))),
        }
    }

    /// Sends an envelope and waits until the relay stored it.
    pub async fn send_envelope(
        &mut self,
        envelope: SealedEnvelope,
    ) -> Result<MessageId, ClientError> {
        Ok(self.send_to(envelope, None).await?.0)
    }

    /// Sends an envelope (to `group`'s roster, when named) and waits until the relay stored
    /// it; with the members a group send skipped (not joined, or blocking the sender).
    pub async fn send_to(
        &mut self,
        envelope: SealedEnvelope,
        group: Option<AgentName>,
    ) -> Result<(MessageId, Vec<Address>), ClientError> {
        match self
            .call(|reference| ClientFrame::Send {
                reference,
                envelope,
                group,
            })
            .await?
        {
            ServerFrame::Sent { id, skipped, .. } => Ok((id, skipped)),
            other => Err(ClientError::Protocol(format!(
                "expected sent, got {other:?}"
            ))),
        }
    }

    /// Sends a request built around a fresh ref and returns its answer; refusals are errors.
    pub async fn call(
        &mut self,
        make: impl FnOnce(String) -> ClientFrame,
    ) -> Result<ServerFrame, ClientError> {
        let reference = self.fresh_ref();
        refusal(self.request(make(reference.clone()), &reference).await?)
    }

    /// Records that the delivery `seq` is committed to the store, acknowledging every
    /// `ACK_EVERY` deliveries; [`Connection::ack_committed`] acknowledges the rest.
    pub async fn committed(&mut self, seq: Seq) -> Result<(), ClientError> {
        self.committed = Some(seq);
        self.unacked += 1;
        if self.unacked >= ACK_EVERY {
            self.ack_committed().await?;
        }
        Ok(())
    }

    /// Acknowledges everything committed so far, if anything is unacknowledged.
    pub async fn ack_committed(&mut self) -> Result<(), ClientError> {
        if let (Some(seq), true) = (self.committed, self.unacked > 0) {
            self.send(&ClientFrame::Ack { seq }).await?;
            self.unacked = 0;
        }
        Ok(())
    }

    /// Closes politely.
    pub async fn close(mut self) {
        let _ = self.ws.close(None).await;
    }
}

impl ClientError {
    /// Whether retrying later can help (rate, quota, relay trouble) rather than never.
    pub fn is_temporary(&self) -> bool {
        match self {
            ClientError::Refused { code, .. } => matches!(
                code,
                ErrorCode::RateLimited
                    | ErrorCode::QuotaFull
                    | ErrorCode::Internal
                    | ErrorCode::ShuttingDown
                    | ErrorCode::TooManyConnections
            ),
            ClientError::Store(_)
            | ClientError::Protocol(_)
            | ClientError::RelayKeyChanged { .. } => false,
            // A proxy answers for its relay while that is down (502, 503).
            ClientError::Unreachable { .. }
            | ClientError::NotARelay { .. }
            | ClientError::Closed(_) => true,
        }
    }
}
