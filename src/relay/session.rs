//! One WebSocket connection, from challenge to close: authenticate, then deliver stored mail
//! in order while serving the client's sends, acks and lookups.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::ws::{CloseFrame, Message, WebSocket};
use tokio::time::{Instant, timeout, timeout_at};

use super::state::RelayState;
use super::storage::{Accepted, Copy, Quota, Registration, Storage};
use crate::crypto::PublicIdentity;
use crate::crypto::sign::{self, Domain};
use crate::protocol::{
    AgentName, ClientFrame, ENVELOPE_VERSION, ErrorCode, MAX_REF_CHARS, PROTOCOL_VERSION,
    SealedEnvelope, Seq, ServerFrame, hello_payload,
};

/// Deliveries sent and not yet acknowledged, at most.
const WINDOW: u64 = 4096;
/// Envelopes read from storage at a time.
const FETCH: usize = 256;

/// WebSocket close codes (4000–4999 are for applications).
mod close {
    pub const GOING_AWAY: u16 = 1001;
    pub const POLICY: u16 = 1008;
    pub const TOO_BIG: u16 = 1009;
    pub const AUTH: u16 = 4001;
    pub const REPLACED: u16 = 4002;
}

/// Why a session ends, with the frame to send first.
struct Ending {
    code: ErrorCode,
    message: String,
    close: u16,
}

fn error_frame(
    reference: Option<String>,
    code: ErrorCode,
    message: impl Into<String>,
    retry: Option<Duration>,
) -> ServerFrame {
    ServerFrame::Error {
        reference,
        code,
        message: message.into(),
        retry_after_ms: retry.map(|d| d.as_millis() as u64),
    }
}

/// Writes a delivery without re-parsing the stored envelope: the relay never decodes mail.
fn deliver_frame(seq: Seq, envelope: &[u8]) -> Option<String> {
    let envelope = std::str::from_utf8(envelope).ok()?;
    Some(format!(
        r#"{{"type":"deliver","seq":{seq},"envelope":{envelope}}}"#
    ))
}

async fn send(socket: &mut WebSocket, frame: &ServerFrame) -> bool {
    let text = serde_json::to_string(frame).expect("frames always serialize");
    socket.send(Message::Text(text.into())).await.is_ok()
}

async fn end(socket: &mut WebSocket, ending: Ending) {
    let _ = send(
        socket,
        &error_frame(None, ending.code, ending.message.clone(), None),
    )
    .await;
    let reason: String = ending.message.chars().take(120).collect();
    let _ = socket
        .send(Message::Close(Some(CloseFrame {
            code: ending.close,
            reason: reason.into(),
        })))
        .await;
}

/// Whether a read failed because the client's frame was over the size limit.
fn is_too_large(e: axum::Error) -> bool {
    use tokio_tungstenite::tungstenite::Error;
    e.into_inner()
        .downcast_ref::<Error>()
        .is_some_and(|e| matches!(e, Error::Capacity(_)))
}

/// Runs one connection to completion.
pub async fn run<S: Storage>(state: Arc<RelayState<S>>, mut socket: WebSocket, ip: IpAddr) {
    let mut nonce = vec![0u8; 32];
    if getrandom::fill(&mut nonce).is_err() {
        return end(
            &mut socket,
            Ending {
                code: ErrorCode::Internal,
                message: "no randomness".into(),
                close: close::GOING_AWAY,
            },
        )
        .await;
    }
    let relay = state.storage.relay_id().to_owned();
    let challenge = ServerFrame::Challenge {
        v: PROTOCOL_VERSION,
        relay: relay.clone(),
        nonce: nonce.clone(),
    };
    if !send(&mut socket, &challenge).await {
        return;
    }
    let agent = match authenticate(&state, &mut socket, &relay, &nonce).await {
        Ok(agent) => agent,
        Err(ending) => {
            state.metrics.reject(ending.code);
            tracing::info!(%ip, code = %ending.code, "authentication refused");
            return end(&mut socket, ending).await;
        }
    };
    let attached = state.hub.attach(&agent);
    state.metrics.connections.inc();
    tracing::debug!(%agent, %ip, conn = attached.conn, "connected");
    let ending = serve(
        &state,
        &mut socket,
        &agent,
        attached.wake.clone(),
        attached.kicked,
        attached.events,
    )
    .await;
    state.hub.detach(&agent, attached.conn);
    state.metrics.connections.dec();
    if let Some(ending) = ending {
        state.metrics.reject(ending.code);
        tracing::debug!(%agent, code = %ending.code, "closing");
        end(&mut socket, ending).await;
    }
}

async fn authenticate<S: Storage>(
    state: &RelayState<S>,
    socket: &mut WebSocket,
    relay: &str,
    nonce: &[u8],
) -> Result<AgentName, Ending> {
    let auth = |code, message: String| Ending {
        code,
        message,
        close: close::AUTH,
    };
    let deadline = state.config.auth_timeout();
    let text = match timeout(deadline, socket.recv()).await {
        Err(_) => {
            return Err(auth(
                ErrorCode::AuthTimeout,
                format!("no hello within {} s of the challenge", deadline.as_secs()),
            ));
        }
        Ok(Some(Ok(Message::Text(t)))) => t,
        Ok(_) => {
            return Err(auth(
                ErrorCode::BadFrame,
                "expected a hello text frame".into(),
            ));
        }
    };
    let Ok(ClientFrame::Hello {
        agent,
        signature,
        register,
    }) = serde_json::from_str::<ClientFrame>(&text)
    else {
        return Err(auth(
            ErrorCode::UnexpectedFrame,
            "the first frame must be a valid hello".into(),
        ));
    };
    let internal = |e: super::storage::StorageError| Ending {
        code: ErrorCode::Internal,
        message: e.to_string(),
        close: close::GOING_AWAY,
    };
    if let Some(keys) = register {
        let candidate = PublicIdentity::try_from(keys.clone()).map_err(|e| {
            auth(
                ErrorCode::AuthFailed,
                format!("the keys to register are invalid: {e}"),
            )
        })?;
        // Signing the nonce with the key being registered proves the registrant holds it.
        if sign::verify_detached(
            &candidate,
            Domain::Hello,
            &hello_payload(relay, nonce),
            &signature,
        )
        .is_err()
        {
            return Err(auth(
                ErrorCode::AuthFailed,
                "the hello signature does not match the keys to register".into(),
            ));
        }
        let known = state.storage.keys(agent.clone()).await.map_err(internal)?;
        let outcome = if known.as_ref() == Some(&keys) {
            Registration::Unchanged
        } else {
            state
                .storage
                .register(agent.clone(), keys)
                .await
                .map_err(internal)?
        };
        match outcome {
            Registration::NameTaken => {
                return Err(auth(
                    ErrorCode::NameTaken,
                    format!(
                        "{agent} is registered on this relay with other keys; choose another name"
                    ),
                ));
            }
            Registration::Created => tracing::info!(%agent, "registered"),
            Registration::Unchanged => {}
        }
        state.remember_registered(&agent);
    }
    let Some(keys) = state.storage.keys(agent.clone()).await.map_err(internal)? else {
        return Err(auth(
            ErrorCode::UnknownAgent,
            format!(
                "no agent named {agent} on this relay; register it by sending your keys in the hello"
            ),
        ));
    };
    let keys = PublicIdentity::try_from(keys)
        .map_err(|e| internal(super::storage::StorageError::Database(e.to_string())))?;
    if sign::verify_detached(
        &keys,
        Domain::Hello,
        &hello_payload(relay, nonce),
        &signature,
    )
    .is_err()
    {
        return Err(auth(
            ErrorCode::AuthFailed,
            format!("the hello signature does not match {agent}'s registered key"),
        ));
    }
    let waiting = state
        .storage
        .waiting(agent.clone())
        .await
        .map_err(internal)?;
    if !send(
        socket,
        &ServerFrame::Welcome {
            agent: agent.clone(),
            waiting,
        },
    )
    .await
    {
        return Err(auth(ErrorCode::Internal, "the connection dropped".into()));
    }
    Ok(agent)
}

/// Per-connection delivery progress.
struct Delivery {
    last_sent: Seq,
    last_acked: Seq,
    need_fetch: bool,
    caught_up: bool,
}

async fn serve<S: Storage>(
    state: &RelayState<S>,
    socket: &mut WebSocket,
    agent: &AgentName,
    wake: Arc<tokio::sync::Notify>,
    mut kicked: tokio::sync::oneshot::Receiver<()>,
    mut events: tokio::sync::mpsc::Receiver<crate::protocol::ConsentEvent>,
) -> Option<Ending> {
    let mut shutdown = state.shutdown.clone();
    let mut d = Delivery {
        last_sent: 0,
        last_acked: 0,
        need_fetch: true,
        caught_up: false,
    };
    let mut errors = 0u32;
    let idle = state.config.idle_timeout();
    let mut deadline = Instant::now() + idle;
    loop {
        if d.need_fetch && d.last_sent - d.last_acked < WINDOW {
            if let Err(ending) = deliver(state, socket, agent, &mut d).await {
                return ending;
            }
            continue;
        }
        tokio::select! {
            biased;
            _ = shutdown.changed() => {
                return Some(Ending { code: ErrorCode::ShuttingDown, message: "the relay is shutting down; reconnect shortly".into(), close: close::GOING_AWAY });
            }
            _ = &mut kicked => {
                return Some(Ending { code: ErrorCode::Replaced, message: format!("another connection for {agent} took over"), close: close::REPLACED });
            }
            _ = wake.notified(), if !d.need_fetch => d.need_fetch = true,
            Some(event) = events.recv() => {
                if !send(socket, &ServerFrame::Event { event }).await {
                    return None;
                }
            }
            incoming = timeout_at(deadline, socket.recv()) => {
                let text = match incoming {
                    Err(_) => return Some(Ending { code: ErrorCode::BadFrame, message: format!("no frame for {} s; send ping to keep the connection", idle.as_secs()), close: close::GOING_AWAY }),
                    Ok(Some(Err(e))) => {
                        return is_too_large(e).then(|| Ending {
                            code: ErrorCode::TooLarge,
                            message: format!("a frame is at most {} bytes", state.config.max_frame_bytes()),
                            close: close::TOO_BIG,
                        });
                    }
                    Ok(None) => return None,
                    Ok(Some(Ok(Message::Close(_)))) => return None,
                    Ok(Some(Ok(Message::Ping(_) | Message::Pong(_)))) => { deadline = Instant::now() + idle; continue }
                    Ok(Some(Ok(Message::Binary(_)))) => None,
                    Ok(Some(Ok(Message::Text(t)))) => Some(t),
                };
                deadline = Instant::now() + idle;
                let reply = match text.as_deref().map(serde_json::from_str::<ClientFrame>) {
                    Some(Ok(frame)) => handle(state, agent, &mut d, frame).await,
                    Some(Err(e)) => Some(error_frame(None, ErrorCode::BadFrame, format!("not a valid frame: {e}"), None)),
                    None => Some(error_frame(None, ErrorCode::BadFrame, "send JSON text frames, not binary", None)),
                };
                let Some(reply) = reply else { continue };
                if let ServerFrame::Error { code, .. } = &reply {
                    state.metrics.reject(*code);
                    if matches!(code, ErrorCode::BadFrame | ErrorCode::UnexpectedFrame | ErrorCode::InvalidEnvelope | ErrorCode::NotSender | ErrorCode::TooLarge) {
                        errors += 1;
                    }
                }
                if !send(socket, &reply).await {
                    return None;
                }
                if errors > state.config.max_errors_per_connection {
                    return Some(Ending { code: ErrorCode::TooManyErrors, message: format!("{errors} bad frames; fix the client and reconnect"), close: close::POLICY });
                }
            }
        }
    }
}

/// Sends the next stored envelopes, and `caught_up` once the queue is drained.
async fn deliver<S: Storage>(
    state: &RelayState<S>,
    socket: &mut WebSocket,
    agent: &AgentName,
    d: &mut Delivery,
) -> Result<(), Option<Ending>> {
    let room = (WINDOW - (d.last_sent - d.last_acked)) as usize;
    let want = room.min(FETCH);
    let batch = state
        .storage
        .pending(agent.clone(), d.last_sent, want)
        .await
        .map_err(|e| {
            Some(Ending {
                code: ErrorCode::Internal,
                message: format!("reading the queue failed: {e}"),
                close: close::GOING_AWAY,
            })
        })?;
    let now = jiff::Timestamp::now().as_millisecond();
    for q in &batch {
        let Some(text) = deliver_frame(q.seq, &q.envelope) else {
            tracing::error!(%agent, seq = q.seq, "stored envelope is not UTF-8; skipping it");
            continue;
        };
        if socket.send(Message::Text(text.into())).await.is_err() {
            return Err(None);
        }
        d.last_sent = q.seq;
        state.metrics.delivered.inc();
        state
            .metrics
            .delivery_latency
            .observe((now - q.accepted_at_ms).max(0) as f64 / 1000.0);
    }
    if batch.len() < want {
        d.need_fetch = false;
        if !d.caught_up {
            d.caught_up = true;
            if !send(socket, &ServerFrame::CaughtUp).await {
                return Err(None);
            }
        }
    }
    Ok(())
}

/// Answers one frame from an authenticated client; acks succeed silently.
async fn handle<S: Storage>(
    state: &RelayState<S>,
    agent: &AgentName,
    d: &mut Delivery,
    frame: ClientFrame,
) -> Option<ServerFrame> {
    Some(match frame {
        ClientFrame::Ping => ServerFrame::Pong,
        ClientFrame::Hello { .. } => error_frame(
            None,
            ErrorCode::UnexpectedFrame,
            "already authenticated",
            None,
        ),
        ClientFrame::Ack { seq } => {
            if seq > d.last_sent {
                return Some(error_frame(
                    None,
                    ErrorCode::UnexpectedFrame,
                    format!("ack {seq} is beyond the last delivery {}", d.last_sent),
                    None,
                ));
            }
            if seq <= d.last_acked {
                return None;
            }
            match state.storage.ack(agent.clone(), seq).await {
                Ok(n) => {
                    d.last_acked = seq;
                    state.metrics.acked.inc_by(n);
                    state.metrics.queued.dec_by(n as i64);
                    return None;
                }
                Err(e) => error_frame(
                    None,
                    ErrorCode::Internal,
                    format!("the ack was not stored: {e}; send it again"),
                    Some(Duration::from_secs(1)),
                ),
            }
        }
        ClientFrame::Lookup {
            reference,
            agent: wanted,
        } => match state.storage.keys(wanted.clone()).await {
            Ok(Some(keys)) => ServerFrame::Keys {
                reference,
                agent: wanted,
                keys,
            },
            Ok(None) => error_frame(
                Some(reference),
                ErrorCode::UnknownAgent,
                format!("no agent named {wanted} on this relay"),
                None,
            ),
            Err(e) => error_frame(
                Some(reference),
                ErrorCode::Internal,
                e.to_string(),
                Some(Duration::from_secs(1)),
            ),
        },
        ClientFrame::Send {
            reference,
            envelope,
        } => accept(state, agent, reference, envelope).await,
        other => match super::consent::handle(state, agent, other).await {
            Ok(answer) => answer,
            Err(unhandled) => error_frame(
                None,
                ErrorCode::UnexpectedFrame,
                format!("unexpected frame {unhandled:?}"),
                None,
            ),
        },
    })
}

async fn accept<S: Storage>(
    state: &RelayState<S>,
    agent: &AgentName,
    reference: String,
    envelope: SealedEnvelope,
) -> ServerFrame {
    if reference.chars().count() > MAX_REF_CHARS {
        return error_frame(
            None,
            ErrorCode::BadFrame,
            format!("ref is over {MAX_REF_CHARS} characters"),
            None,
        );
    }
    let refuse =
        |code, message: String, retry| error_frame(Some(reference.clone()), code, message, retry);
    if let Err(wait) = state.send_rate.take(agent) {
        return refuse(
            ErrorCode::RateLimited,
            format!(
                "{agent} is sending faster than {}/s",
                state.config.send_rate
            ),
            Some(wait),
        );
    }
    if envelope.v != ENVELOPE_VERSION {
        return refuse(
            ErrorCode::InvalidEnvelope,
            format!("envelope version {} is not {ENVELOPE_VERSION}", envelope.v),
            None,
        );
    }
    if state.local_name(&envelope.from) != Some(agent) {
        return refuse(
            ErrorCode::NotSender,
            format!(
                "the envelope is from {}, but this connection is {agent}",
                envelope.from
            ),
            None,
        );
    }
    let limits = &state.config.limits;
    if envelope.keys.is_empty() || envelope.keys.len() > limits.recipients {
        return refuse(
            ErrorCode::InvalidEnvelope,
            format!(
                "an envelope names 1 to {} recipients, not {}",
                limits.recipients,
                envelope.keys.len()
            ),
            None,
        );
    }
    let mut copies = Vec::with_capacity(envelope.keys.len());
    let mut unknown = Vec::new();
    for key in &envelope.keys {
        let Some(name) = state.local_name(&key.to) else {
            unknown.push(key.to.to_string());
            continue;
        };
        match state.is_registered(name).await {
            Ok(true) => {}
            Ok(false) => {
                unknown.push(key.to.to_string());
                continue;
            }
            Err(e) => {
                return refuse(
                    ErrorCode::Internal,
                    e.to_string(),
                    Some(Duration::from_secs(1)),
                );
            }
        }
        if name != agent {
            match state
                .storage
                .allows(
                    agent.clone(),
                    name.clone(),
                    state.config.effective_default_policy(),
                )
                .await
            {
                Ok(true) => {}
                Ok(false) => {
                    return refuse(
                        ErrorCode::NotAllowed,
                        format!(
                            "{name} does not accept mail from {agent}; ask first with `mailslot connect {name}`"
                        ),
                        None,
                    );
                }
                Err(e) => {
                    return refuse(
                        ErrorCode::Internal,
                        e.to_string(),
                        Some(Duration::from_secs(1)),
                    );
                }
            }
        }
        if copies.iter().any(|c: &Copy| &c.recipient == name) {
            return refuse(
                ErrorCode::InvalidEnvelope,
                format!("{} is named twice", key.to),
                None,
            );
        }
        let copy = envelope
            .for_recipient(&key.to)
            .expect("the key is in this envelope")
            .to_bytes();
        if copy.len() > limits.envelope_bytes {
            return refuse(
                ErrorCode::TooLarge,
                format!(
                    "the envelope is {} bytes, over the limit of {}",
                    copy.len(),
                    limits.envelope_bytes
                ),
                None,
            );
        }
        copies.push(Copy {
            recipient: name.clone(),
            envelope: copy,
        });
    }
    if !unknown.is_empty() {
        return refuse(
            ErrorCode::UnknownRecipient,
            format!("no agent named {} on this relay", unknown.join(", ")),
            None,
        );
    }
    let quota = Quota {
        count: state.config.quota_messages,
        bytes: state.config.quota_bytes,
    };
    let expires = jiff::Timestamp::now().as_millisecond() + (state.config.ttl_secs as i64) * 1000;
    match state
        .storage
        .accept(agent.clone(), envelope.id, copies, quota, expires)
        .await
    {
        Ok(Accepted::Stored(recipients)) => {
            state.metrics.accepted.inc_by(recipients.len() as u64);
            state.metrics.queued.inc_by(recipients.len() as i64);
            for r in &recipients {
                state.hub.wake(r);
            }
            ServerFrame::Sent {
                reference,
                id: envelope.id,
            }
        }
        Ok(Accepted::Duplicate) => ServerFrame::Sent {
            reference,
            id: envelope.id,
        },
        Ok(Accepted::QuotaFull(r)) => refuse(
            ErrorCode::QuotaFull,
            format!(
                "{r}'s mailbox is full ({} messages or {} bytes waiting); nothing was stored",
                quota.count, quota.bytes
            ),
            Some(Duration::from_secs(60)),
        ),
        Err(e) => refuse(
            ErrorCode::Internal,
            format!("not stored: {e}"),
            Some(Duration::from_secs(1)),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spliced_deliveries_parse_as_frames() {
        let alice = crate::crypto::Identity::generate();
        let bob = crate::crypto::Identity::generate();
        let to = crate::protocol::Address::parse("bob").unwrap();
        let m = crate::protocol::Message::new(
            crate::protocol::Address::parse("alice").unwrap(),
            vec![to.clone()],
            "s",
            "b",
        );
        let env = crate::crypto::seal(
            &m,
            &alice,
            &[(to, bob.public().clone())],
            &Default::default(),
        )
        .unwrap()
        .remove(0);
        let text = deliver_frame(42, &env.to_bytes()).unwrap();
        assert_eq!(
            serde_json::from_str::<ServerFrame>(&text).unwrap(),
            ServerFrame::Deliver {
                seq: 42,
                envelope: env
            }
        );
    }
}
