//! One WebSocket connection, from challenge to close: authenticate, then deliver stored mail
//! in order while serving the client's sends, acks, lookups and consent requests. The loop
//! only ever waits on reads and events; writes are queued to [`Outgoing`].

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::ws::{Message, WebSocket};
use futures_util::StreamExt;
use futures_util::stream::{FuturesUnordered, SplitStream};

use tokio::time::{Instant, timeout_at};

use super::accept::{self, QueuedSend};
use super::auth::authenticate;
use super::hub::Attached;
use super::state::RelayState;
use super::storage::{Committed, Storage};
use super::wire::{Ending, Outgoing, close, deliver_frame, error_frame, is_too_large, refuse};
use crate::protocol::{AgentName, ClientFrame, ErrorCode, PROTOCOL_VERSION, Seq, ServerFrame};

/// Deliveries sent and not yet acknowledged, at most.
const WINDOW: u64 = 1024;
/// Envelopes read from storage at a time.
const FETCH: usize = 256;
/// Sends of one connection whose writes may be pending at once.
const PIPELINED: usize = 256;
/// Frames that may wait for the socket: a full window plus answers to pipelined requests.
const QUEUE: usize = WINDOW as usize + PIPELINED + 64;

fn gone(message: &str) -> Ending {
    Ending {
        code: ErrorCode::TooManyErrors,
        message: message.into(),
        close: close::POLICY,
    }
}

/// Runs one connection to completion.
pub async fn run<S: Storage>(state: Arc<RelayState<S>>, mut socket: WebSocket, ip: IpAddr) {
    let mut nonce = vec![0u8; 32];
    if getrandom::fill(&mut nonce).is_err() {
        let ending = Ending {
            code: ErrorCode::Internal,
            message: "no randomness".into(),
            close: close::GOING_AWAY,
        };
        return refuse(&mut socket, ending).await;
    }
    let relay = state.storage.relay_id().to_owned();
    let challenge = ServerFrame::Challenge {
        v: PROTOCOL_VERSION,
        relay: relay.clone(),
        nonce: nonce.clone(),
    };
    let text = serde_json::to_string(&challenge).expect("frames always serialize");
    if socket.send(Message::Text(text.into())).await.is_err() {
        return;
    }
    let agent = match authenticate(&state, &mut socket, &relay, &nonce).await {
        Ok(agent) => agent,
        Err(ending) => {
            state.metrics.reject(ending.code);
            tracing::info!(%ip, code = %ending.code, "authentication refused");
            return refuse(&mut socket, ending).await;
        }
    };
    let (sink, stream) = socket.split();
    let out = Outgoing::spawn(sink, QUEUE);
    let mut attached = state.hub.attach(&agent);
    state.metrics.connections.inc();
    tracing::debug!(%agent, %ip, conn = attached.conn, "connected");
    let ending = serve(&state, stream, &out, &agent, &mut attached).await;
    state.hub.detach(&agent, attached.conn);
    state.metrics.connections.dec();
    if let Some(ending) = &ending {
        state.metrics.reject(ending.code);
        if ending.code == ErrorCode::Internal {
            tracing::error!(%agent, reason = %ending.message, "closing a connection after an internal error");
        } else {
            tracing::debug!(%agent, code = %ending.code, "closing");
        }
    }
    out.finish(ending).await;
}

/// Per-connection delivery progress. Sequence numbers are relay-wide, so the window counts
/// messages, never differences of sequence numbers.
struct Delivery {
    last_sent: Seq,
    last_acked: Seq,
    in_flight: u64,
    need_fetch: bool,
    caught_up: bool,
}

async fn serve<S: Storage>(
    state: &RelayState<S>,
    mut stream: SplitStream<WebSocket>,
    out: &Outgoing,
    agent: &AgentName,
    attached: &mut Attached,
) -> Option<Ending> {
    let mut shutdown = state.shutdown.clone();
    let mut d = Delivery {
        last_sent: 0,
        last_acked: 0,
        in_flight: 0,
        need_fetch: true,
        caught_up: false,
    };
    let mut errors = 0u32;
    let mut sends: FuturesUnordered<QueuedSend> = FuturesUnordered::new();
    let idle = state.config.idle_timeout();
    let mut deadline = Instant::now() + idle;
    loop {
        // Pushed mail was dropped: forget what is queued and read from the database instead.
        if attached.missed.take() {
            while attached.pushes.try_recv().is_ok() {}
            d.need_fetch = true;
        }
        if d.need_fetch && d.in_flight < WINDOW {
            if let Err(ending) = deliver(state, out, agent, &mut d).await {
                return ending;
            }
            continue;
        }
        tokio::select! {
            biased;
            _ = shutdown.changed() => {
                return Some(Ending { code: ErrorCode::ShuttingDown, message: "the relay is shutting down; reconnect shortly".into(), close: close::GOING_AWAY });
            }
                        _ = &mut attached.kicked => {
                return Some(Ending { code: ErrorCode::Replaced, message: format!("another connection for {agent} took over"), close: close::REPLACED });
            }
                        _ = attached.missed.notified(), if !d.need_fetch => {}
            Some(copy) = attached.pushes.recv(), if !d.need_fetch && d.in_flight < WINDOW => {
                if let Err(ending) = push(state, out, agent, &mut d, copy) {
                    return Some(ending);
                }
            }
            Some((reference, id, outcome)) = sends.next(), if !sends.is_empty() => {
                if !out.frame(&accept::answer(state, agent, reference, id, outcome)) {
                    return Some(gone("the client is not reading its frames"));
                }
            }
                        Some(event) = attached.events.recv() => {
                if !out.frame(&ServerFrame::Event { event }) {
                    return Some(gone("the client is not reading its frames"));
                }
            }
            incoming = timeout_at(deadline, stream.next()), if sends.len() < PIPELINED => {
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
                    Some(Ok(frame)) => handle(state, agent, &mut d, &mut sends, frame).await,
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
                if !out.frame(&reply) {
                    return Some(gone("the client is not reading its frames"));
                }
                if errors > state.config.max_errors_per_connection {
                    return Some(Ending { code: ErrorCode::TooManyErrors, message: format!("{errors} bad frames; fix the client and reconnect"), close: close::POLICY });
                }
            }
        }
    }
}

/// Delivers a copy pushed from its commit, unless the database read already delivered it.
fn push<S: Storage>(
    state: &RelayState<S>,
    out: &Outgoing,
    agent: &AgentName,
    d: &mut Delivery,
    copy: Committed,
) -> Result<(), Ending> {
    if copy.seq <= d.last_sent {
        return Ok(());
    }
    let Some(text) = deliver_frame(copy.seq, &copy.envelope) else {
        tracing::error!(%agent, seq = copy.seq, "stored envelope is not UTF-8; skipping it");
        return Ok(());
    };
    if !out.raw(text) {
        return Err(gone("the client is not reading its frames"));
    }
    d.last_sent = copy.seq;
    d.in_flight += 1;
    state.metrics.delivered.inc();
    let now = jiff::Timestamp::now().as_millisecond();
    state
        .metrics
        .delivery_latency
        .observe((now - copy.accepted_at_ms).max(0) as f64 / 1000.0);
    Ok(())
}

/// Queues the next stored envelopes, and `caught_up` once the queue is drained.
async fn deliver<S: Storage>(
    state: &RelayState<S>,
    out: &Outgoing,
    agent: &AgentName,
    d: &mut Delivery,
) -> Result<(), Option<Ending>> {
    let room = (WINDOW - d.in_flight) as usize;
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
        if !out.raw(text) {
            return Err(Some(gone("the client is not reading its frames")));
        }
        d.last_sent = q.seq;
        d.in_flight += 1;
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
            if !out.frame(&ServerFrame::CaughtUp) {
                return Err(Some(gone("the client is not reading its frames")));
            }
        }
    }
    Ok(())
}

/// Answers one frame from an authenticated client; acks succeed silently, and sends are
/// answered when their write completes.
async fn handle<S: Storage>(
    state: &RelayState<S>,
    agent: &AgentName,
    d: &mut Delivery,
    sends: &mut FuturesUnordered<QueuedSend>,
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
                    d.in_flight = d.in_flight.saturating_sub(n);
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
        } => match accept::check(state, agent, reference, envelope).await {
            Ok(queued) => {
                sends.push(queued);
                return None;
            }
            Err(refusal) => *refusal,
        },
        other => match super::consent::handle(state, agent, other).await {
            Ok(answer) => answer,
            Err(other) => match super::directory::handle(state, agent, other).await {
                Ok(answer) => answer,
                Err(unhandled) => error_frame(
                    None,
                    ErrorCode::UnexpectedFrame,
                    format!("unexpected frame {unhandled:?}"),
                    None,
                ),
            },
        },
    })
}
