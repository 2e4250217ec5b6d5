//! The gateway's WebSocket RPC, used for one thing: creating a mailbox's session, which
//! nothing over HTTP can do (`sessions_send` to a missing session only says "No session
//! found").
//!
//! The exchange: the gateway sends a `connect.challenge` event; we answer with a `connect`
//! request (protocol 4, the operator role, read and write scopes, the gateway token); then
//! `sessions.resolve` / `sessions.create`. This token-only operator connection has no device
//! identity, which the gateway documents as a reserved exception: it stays behind this one
//! small module, and its failures say so.

use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message as WsMessage;
use tokio_tungstenite::{Connector, MaybeTlsStream, WebSocketStream};

use crate::config::openclaw::{GatewayUrl, Token};
use crate::doorbell::frame::one_line;

/// How long one whole exchange (connect, handshake, requests) may take.
const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(20);
/// The gateway protocol version spoken.
const PROTOCOL: u32 = 4;

/// Why an RPC exchange failed; each says what to check.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RpcError {
    /// The WebSocket could not be opened.
    #[error("cannot open the gateway's WebSocket at {url} ({why}): is the gateway running?")]
    Unreachable {
        /// The WebSocket address.
        url: String,
        /// What failed.
        why: String,
    },
    /// The gateway refused the connect request (usually the token).
    #[error(
        "the gateway refused mailslot's operator connection ({0}); check the token, and that the gateway accepts token-only operator connections (gateway.auth.mode \"token\")"
    )]
    Refused(String),
    /// A request failed.
    #[error("the gateway's {method} failed: {message}")]
    Failed {
        /// The method.
        method: &'static str,
        /// The gateway's message.
        message: String,
    },
    /// The exchange broke off or made no sense.
    #[error("the gateway's WebSocket: {0}")]
    Protocol(String),
}

/// Creates the session `key` for the OpenClaw agent `agent_id` unless it exists. Returns
/// whether it was created now. `label` names it in OpenClaw's session list (labels are
/// unique there: a taken label is left out rather than failing).
pub async fn ensure_session(
    url: &GatewayUrl,
    token: &Token,
    key: &str,
    agent_id: &str,
    label: &str,
) -> Result<bool, RpcError> {
    within_time(async {
        let mut rpc = Rpc::open(url, token).await?;
        if rpc.exists(key).await? {
            rpc.close().await;
            return Ok(false);
        }
        let params = json!({ "key": key, "agentId": agent_id, "label": label });
        let created = match rpc.call("sessions.create", params).await {
            Err(RpcError::Failed { message, .. }) if message.contains("label already in use") => {
                rpc.call(
                    "sessions.create",
                    json!({ "key": key, "agentId": agent_id }),
                )
                .await
            }
            other => other,
        }?;
        rpc.close().await;
        if created["ok"] == false {
            return Err(RpcError::Failed {
                method: "sessions.create",
                message: text(&created["error"]),
            });
        }
        Ok(true)
    })
    .await
}

/// Whether the session `key` exists.
pub async fn session_exists(url: &GatewayUrl, token: &Token, key: &str) -> Result<bool, RpcError> {
    within_time(async {
        let mut rpc = Rpc::open(url, token).await?;
        let exists = rpc.exists(key).await;
        rpc.close().await;
        exists
    })
    .await
}

async fn within_time<T>(work: impl Future<Output = Result<T, RpcError>>) -> Result<T, RpcError> {
    tokio::time::timeout(EXCHANGE_TIMEOUT, work)
        .await
        .unwrap_or_else(|_| {
            Err(RpcError::Protocol(format!(
                "no answer within {} s",
                EXCHANGE_TIMEOUT.as_secs()
            )))
        })
}

/// One authenticated connection.
struct Rpc {
    ws: WebSocketStream<MaybeTlsStream<TcpStream>>,
    next_id: u64,
}

impl Rpc {
    /// Connects, waits for the challenge and authenticates with the token.
    async fn open(url: &GatewayUrl, token: &Token) -> Result<Self, RpcError> {
        let address = url.websocket();
        let unreachable = |why: String| RpcError::Unreachable {
            url: address.clone(),
            why,
        };
        let connector = if url.is_tls() {
            Some(Connector::Rustls(
                crate::tls::client_config().map_err(unreachable)?,
            ))
        } else {
            None
        };
        let (ws, _) =
            tokio_tungstenite::connect_async_tls_with_config(&address, None, false, connector)
                .await
                .map_err(|e| unreachable(one_line(&e.to_string(), 300)))?;
        let mut rpc = Self { ws, next_id: 0 };
        loop {
            let frame = rpc.next_frame().await?;
            if frame["type"] == "event" && frame["event"] == "connect.challenge" {
                break;
            }
        }
        let params = json!({
            "minProtocol": PROTOCOL,
            "maxProtocol": PROTOCOL,
            "client": {
                "id": "cli",
                "displayName": "mailslot",
                "version": env!("CARGO_PKG_VERSION"),
                "platform": std::env::consts::OS,
                "mode": "cli",
            },
            "role": "operator",
            "scopes": ["operator.read", "operator.write"],
            "caps": [],
            "auth": { "token": token.expose() },
            "userAgent": concat!("mailslot/", env!("CARGO_PKG_VERSION")),
        });
        let answer = rpc.request("connect", params).await?;
        if answer["ok"] != true {
            let error = &answer["error"];
            let code = error["details"]["code"]
                .as_str()
                .or_else(|| error["code"].as_str())
                .unwrap_or("no code");
            return Err(RpcError::Refused(format!("{code}: {}", text(error))));
        }
        Ok(rpc)
    }

    async fn exists(&mut self, key: &str) -> Result<bool, RpcError> {
        let found = self
            .call(
                "sessions.resolve",
                json!({ "key": key, "allowMissing": true }),
            )
            .await?;
        Ok(found["ok"] == true)
    }

    /// A request whose answer must be `ok`; its payload.
    async fn call(&mut self, method: &'static str, params: Value) -> Result<Value, RpcError> {
        let answer = self.request(method, params).await?;
        if answer["ok"] == true {
            Ok(answer["payload"].clone())
        } else {
            Err(RpcError::Failed {
                method,
                message: text(&answer["error"]),
            })
        }
    }

    /// Sends a request and waits for the answer with its id (events in between are skipped).
    async fn request(&mut self, method: &str, params: Value) -> Result<Value, RpcError> {
        self.next_id += 1;
        let id = format!("mailslot-{}", self.next_id);
        let frame = json!({ "type": "req", "id": id, "method": method, "params": params });
        self.ws
            .send(WsMessage::Text(frame.to_string().into()))
            .await
            .map_err(|e| RpcError::Protocol(format!("sending {method}: {e}")))?;
        loop {
            let frame = self.next_frame().await?;
            if frame["type"] == "res" && frame["id"] == id.as_str() {
                return Ok(frame);
            }
        }
    }

    /// The next JSON text frame.
    async fn next_frame(&mut self) -> Result<Value, RpcError> {
        loop {
            match self.ws.next().await {
                Some(Ok(WsMessage::Text(t))) => {
                    return serde_json::from_str(&t).map_err(|_| {
                        RpcError::Protocol("the gateway sent a frame that is not JSON".into())
                    });
                }
                Some(Ok(WsMessage::Close(close))) => {
                    let reason = close
                        .map(|c| format!("{} {}", u16::from(c.code), one_line(&c.reason, 200)))
                        .unwrap_or_default();
                    return Err(RpcError::Refused(format!(
                        "the gateway closed the connection: {}",
                        reason.trim()
                    )));
                }
                Some(Ok(_)) => {}
                Some(Err(e)) => {
                    return Err(RpcError::Protocol(one_line(&e.to_string(), 300)));
                }
                None => {
                    return Err(RpcError::Protocol(
                        "the gateway closed the connection".into(),
                    ));
                }
            }
        }
    }

    async fn close(mut self) {
        let _ = self.ws.close(None).await;
    }
}

/// An error object's message.
fn text(error: &Value) -> String {
    let message = error["message"]
        .as_str()
        .or_else(|| error.as_str())
        .unwrap_or("no message");
    one_line(message, 300)
}
