//! One WebSocket connection, from challenge to close: authenticate, then deliver stored mail
//! in order while serving the client's sends, acks, lookups and consent requests. The loop
//! only ever waits on reads and events; writes are queued to [`Outgoing`].

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::ws::{Message, WebSocket};
use futures_util::StreamExt;
use futures_util::stream::{FuturesUnordered, SplitStream};

use tokio::sync::OwnedMutexGuard;
use tokio::time::{Instant, timeout_at};

use super::accept::{self, QueuedSend, SendFrame};
use super::auth::{authenticate, welcome};
use super::inbound::{FrameDone, Share};
use super::presence::{Attached, Kick};
use super::pushes::{self, Pushed, Step};
use super::state::RelayState;
use super::storage::{AckOutcome, Committed, Epoch, Storage};
use super::wire::{Bounds, Ending, Outgoing, close, error_frame, is_too_large, refuse};
use crate::protocol::{
    AgentName, ClientFrame, ErrorCode, PROTOCOL_VERSION, Seq, ServerFrame, deliver_frame,
};

/// Deliveries sent and not yet acknowledged, at most.
const WINDOW: u64 = 1024;
/// Envelopes read from storage at a time.
const FETCH: usize = 256;
/// Sends of one connection whose writes may be pending at once.
const PIPELINED: usize = 256;
/// Frames that may wait for the socket: a full window plus answers to pipelined requests.
const QUEUE: usize = WINDOW as usize + PIPELINED + 64;
/// Frames an ending session reads, at most, looking for acks already sent.
const SETTLE_FRAMES: usize = 64;
/// How long an ending session looks for acks its client already sent. Frames in the socket's
/// buffer are not always readable at the first poll (the runtime may not have seen the socket
/// become readable yet), so it waits this long at most, and no longer once the client closed.
const SETTLE_WAIT: Duration = Duration::from_millis(50);
/// The size assumed for a delivery before any was made, in bytes.
const FIRST_GUESS: usize = 4096;

/// The frame that would have gone over the connection's byte bound.
fn gone(out: &Outgoing) -> Ending {
    Ending {
        code: ErrorCode::NotReading,
        message: format!(
            "over {} bytes wait for this client to read them; read every frame as it comes",
            out.limit()
        ),
        close: close::NOT_READING,
    }
}

fn stalled<S: Storage>(state: &RelayState<S>) -> Ending {
    Ending {
        code: ErrorCode::NotReading,
        message: format!(
            "the client read nothing for {} s while frames waited for it; read every frame as it comes",
            state.config.write_timeout_secs
        ),
        close: close::NOT_READING,
    }
}

fn bounds<S: Storage>(state: &RelayState<S>) -> Bounds {
    Bounds {
        frames: QUEUE,
        bytes: state.config.outgoing_bytes(),
        write_timeout: state.config.write_timeout(),
    }
}

/// Runs one connection to completion.
pub async fn run<S: Storage>(
    state: Arc<RelayState<S>>,
    mut socket: WebSocket,
    ip: IpAddr,
    done: FrameDone,
) {
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
    let (agent, control) = match authenticate(&state, &mut socket, &relay, &nonce, ip).await {
        Ok(found) => found,
        Err(ending) => {
            state.metrics.reject(ending.code);
            tracing::info!(%ip, code = %ending.code, "authentication refused");
            return refuse(&mut socket, ending).await;
        }
    };
    if control {
        return run_control(state, socket, agent, nonce, done).await;
    }
    let mut attached = state.presence.attach(&agent);
    // The agent's previous session, if any, ends first (it was just kicked): its acks are
    // then committed, and this session neither counts nor delivers acknowledged mail.
    let turn = match take_turn(&state, &agent, &mut attached).await {
        Ok(turn) => turn,
        Err(ending) => {
            state.presence.detach(&agent, attached.conn);
            state.metrics.reject(ending.code);
            return refuse(&mut socket, ending).await;
        }
    };
    // A session of the agent on another node ends first, likewise (within a bound: a node
    // that died answers nothing); the lease then fences acks from any session it replaced.
    state.presence.take_over(&agent).await;
    let epoch = match state.storage.claim(agent.clone()).await {
        Ok(epoch) => epoch,
        Err(e) => {
            state.presence.detach(&agent, attached.conn);
            let ending = Ending {
                code: ErrorCode::Internal,
                message: format!("could not claim the delivery session: {e}; reconnect"),
                close: close::GOING_AWAY,
            };
            state.metrics.reject(ending.code);
            return refuse(&mut socket, ending).await;
        }
    };
    // Online from the claim, before the welcome: an agent told it is connected is shown so.
    state.presence.claimed(&agent, attached.conn, epoch);
    if let Err(ending) = welcome(&state, &mut socket, &agent).await {
        // Released, or the agent would stay online on PostgreSQL until its next claim.
        if let Err(e) = state.storage.release(agent.clone(), epoch).await {
            tracing::warn!(%agent, error = %e, "could not release the delivery lease");
        }
        state.presence.detach(&agent, attached.conn);
        state.metrics.reject(ending.code);
        return refuse(&mut socket, ending).await;
    }
    let (sink, mut stream) = socket.split();
    let out = Outgoing::spawn(sink, bounds(&state));
    state.metrics.connections.inc();
    tracing::debug!(%agent, %ip, conn = attached.conn, %epoch, "connected");
    let ending = serve(
        &state,
        &mut stream,
        &out,
        &agent,
        &nonce,
        &mut attached,
        (Some(epoch), &done),
    )
    .await;
    // Every ack this session read is committed by now (they are applied before the next
    // frame is read); only now may the agent's next session read the queue, here or elsewhere.
    if let Err(e) = state.storage.release(agent.clone(), epoch).await {
        tracing::warn!(%agent, error = %e, "could not release the delivery lease; a session elsewhere waits for its bound");
    }
    state.presence.detach(&agent, attached.conn);
    drop(turn);
    state.metrics.connections.dec();
    if let Some(ending) = &ending {
        state.metrics.reject(ending.code);
        if ending.code == ErrorCode::Internal {
            tracing::error!(%agent, reason = %ending.message, "closing a connection after an internal error");
        } else {
            tracing::debug!(%agent, code = %ending.code, "closing");
        }
    }
    out.finish(ending, stream).await;
}

/// A control connection: requests only. It takes no turn and attaches to nothing, so the
/// agent's delivery connection keeps running beside it.
async fn run_control<S: Storage>(
    state: Arc<RelayState<S>>,
    mut socket: WebSocket,
    agent: AgentName,
    nonce: Vec<u8>,
    done: FrameDone,
) {
    let (mut attached, _quiet) = state.presence.control();
    if let Err(ending) = welcome(&state, &mut socket, &agent).await {
        state.metrics.reject(ending.code);
        return refuse(&mut socket, ending).await;
    }
    let (sink, mut stream) = socket.split();
    let out = Outgoing::spawn(sink, bounds(&state));
    state.metrics.connections.inc();
    tracing::debug!(%agent, "control connection");
    let ending = serve(
        &state,
        &mut stream,
        &out,
        &agent,
        &nonce,
        &mut attached,
        (None, &done),
    )
    .await;
    state.metrics.connections.dec();
    if let Some(ending) = &ending {
        state.metrics.reject(ending.code);
    }
    out.finish(ending, stream).await;
}

/// Waits until the agent's earlier sessions have ended, unless this one is replaced or the
/// relay shuts down first.
async fn take_turn<S: Storage>(
    state: &RelayState<S>,
    agent: &AgentName,
    attached: &mut Attached,
) -> Result<OwnedMutexGuard<()>, Ending> {
    let mut shutdown = state.shutdown.clone();
    tokio::select! {
        biased;
        _ = shutdown.changed() => Err(shutting_down()),
        kick = &mut attached.kicked => Err(kicked(agent, kick.ok())),
        turn = attached.turn.clone().take() => Ok(turn),
    }
}

fn shutting_down() -> Ending {
    Ending {
        code: ErrorCode::ShuttingDown,
        message: "the relay is shutting down; reconnect shortly".into(),
        close: close::GOING_AWAY,
    }
}

/// The ending of a session the hub ended (`None`: its entry went without a word, which only a
/// newer connection does).
fn kicked(agent: &AgentName, why: Option<Kick>) -> Ending {
    match why {
        Some(Kick::Retired) => Ending {
            code: ErrorCode::NameRetired,
            message: format!("{agent} retired its name on this relay"),
            close: close::AUTH,
        },
        Some(Kick::Replaced) | None => Ending {
            code: ErrorCode::Replaced,
            message: format!("another connection for {agent} took over"),
            close: close::REPLACED,
        },
    }
}

/// Per-connection delivery progress. Sequence numbers are relay-wide, so the window counts
/// messages, never differences of sequence numbers.
struct Delivery {
    /// The delivery lease; `None` on a control connection, which delivers nothing.
    lease: Option<Epoch>,
    /// A later claim replaced this session: its acks are refused, so it must end.
    fenced: bool,
    last_sent: Seq,
    last_acked: Seq,
    in_flight: u64,
    need_fetch: bool,
    caught_up: bool,
    /// The largest delivery so far, to guess how many fit in the room left.
    largest: usize,
}

async fn serve<S: Storage>(
    state: &RelayState<S>,
    stream: &mut SplitStream<WebSocket>,
    out: &Outgoing,
    agent: &AgentName,
    nonce: &[u8],
    attached: &mut Attached,
    (lease, done): (Option<Epoch>, &FrameDone),
) -> Option<Ending> {
    let mut shutdown = state.shutdown.clone();
    let mut d = Delivery {
        lease,
        fenced: false,
        last_sent: 0,
        last_acked: 0,
        in_flight: 0,
        need_fetch: lease.is_some(),
        caught_up: false,
        largest: FIRST_GUESS,
    };
    let mut errors = 0u32;
    let mut sends: FuturesUnordered<QueuedSend> = FuturesUnordered::new();
    let idle = state.config.idle_timeout();
    let mut deadline = Instant::now() + idle;
    loop {
        if d.fenced {
            return Some(kicked(agent, Some(Kick::Replaced)));
        }
        // Deliveries wait while half the connection's byte bound waits for the client.
        if d.need_fetch && d.in_flight < WINDOW && out.has_room() {
            if let Err(ending) = deliver(state, out, agent, &mut d).await {
                return ending;
            }
            continue;
        }
        tokio::select! {
            biased;
            _ = shutdown.changed() => {
                settle_acks(state, agent, &mut d, stream).await;
                return Some(shutting_down());
            }
            kick = &mut attached.kicked => {
                settle_acks(state, agent, &mut d, stream).await;
                return Some(kicked(agent, kick.ok()));
            }
            _ = out.stalled() => return Some(stalled(state)),
            _ = out.drained(), if !out.has_room() => {}
            Some(pushed) = attached.pushes.recv(), if !d.need_fetch && d.in_flight < WINDOW && out.has_room() => match pushed {
                Pushed::Copy(copy) => {
                    if let Err(ending) = push(state, out, agent, &mut d, copy) {
                        return Some(ending);
                    }
                }
                // Pushed mail was dropped: read the database instead.
                Pushed::Missed => d.need_fetch = true,
            },
            Some((reference, id, outcome)) = sends.next(), if !sends.is_empty() => {
                if !out.frame(&accept::answer(state, agent, reference, id, outcome)) {
                    return Some(gone(out));
                }
            }
            Some(event) = attached.events.recv() => {
                if !out.frame(&ServerFrame::Event { event }) {
                    return Some(gone(out));
                }
            }
            incoming = timeout_at(deadline, stream.next()), if sends.len() < PIPELINED => {
                // The frame is in: its share of the receive budget (a large one's) is kept
                // until the frame is stored, and dropped with it otherwise. A ping may come
                // in the middle of a fragmented message, so it ends no frame.
                let share = match &incoming {
                    Ok(Some(Ok(Message::Ping(_) | Message::Pong(_)))) => None,
                    _ => done.take(),
                };
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
                let reply = match text.as_deref() {
                    // Sends are most frames: read them without parsing the envelope's bulk.
                    Some(text) => match SendFrame::read(text) {
                        Some(send) => queue_send(state, agent, &mut sends, (send.reference, share), send.envelope.get()).await,
                        None => match serde_json::from_str::<ClientFrame>(text) {
                            Ok(frame) => handle(state, agent, nonce, &mut d, (&mut sends, share), frame).await,
                            Err(e) => Some(error_frame(None, ErrorCode::BadFrame, format!("not a valid frame: {e}"), None)),
                        },
                    },
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
                    return Some(gone(out));
                }
                if errors > state.config.max_errors_per_connection {
                    return Some(Ending { code: ErrorCode::TooManyErrors, message: format!("{errors} bad frames; fix the client and reconnect"), close: close::POLICY });
                }
            }
        }
    }
}

/// Delivers a copy pushed from its commit, unless the database read already delivered it, or
/// reads the queue instead when a copy before it has not been delivered (it was committed on
/// another node and its news is still on the way): a cumulative ack of this one would
/// delete that one unseen.
fn push<S: Storage>(
    state: &RelayState<S>,
    out: &Outgoing,
    agent: &AgentName,
    d: &mut Delivery,
    copy: Committed,
) -> Result<(), Ending> {
    match pushes::step(&copy, d.last_sent) {
        Step::Skip => return Ok(()),
        Step::Read => {
            d.need_fetch = true;
            return Ok(());
        }
        Step::Deliver => {}
    }
    let Some(text) = deliver_frame(copy.seq, &copy.envelope) else {
        tracing::error!(%agent, seq = copy.seq, "stored envelope is not UTF-8; skipping it");
        return Ok(());
    };
    d.largest = d.largest.max(text.len());
    if !out.raw(text) {
        return Err(gone(out));
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

/// Queues the next stored envelopes that fit in the connection's room, and `caught_up` once
/// the queue is drained.
async fn deliver<S: Storage>(
    state: &RelayState<S>,
    out: &Outgoing,
    agent: &AgentName,
    d: &mut Delivery,
) -> Result<(), Option<Ending>> {
    let window = (WINDOW - d.in_flight) as usize;
    let fits = (out.room() / d.largest).max(1);
    let want = window.min(FETCH).min(fits);
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
        // What does not fit now is read again once the client has read some.
        if !out.has_room() {
            return Ok(());
        }
        let Some(text) = deliver_frame(q.seq, &q.envelope) else {
            tracing::error!(%agent, seq = q.seq, "stored envelope is not UTF-8; skipping it");
            d.last_sent = q.seq;
            continue;
        };
        d.largest = d.largest.max(text.len());
        if !out.raw(text) {
            return Err(Some(gone(out)));
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
            if !out.frame(&ServerFrame::CaughtUp {}) {
                return Err(Some(gone(out)));
            }
        }
    }
    Ok(())
}

/// Applies a cumulative ack; `Some` is the refusal. The session waits for the commit before
/// it reads its next frame, so a session that has ended has no ack in flight — which the
/// agent's next session relies on (see [`take_turn`]).
async fn ack<S: Storage>(
    state: &RelayState<S>,
    agent: &AgentName,
    d: &mut Delivery,
    seq: Seq,
) -> Option<ServerFrame> {
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
    let epoch = d.lease?;
    match state.storage.ack(agent.clone(), seq, epoch).await {
        Ok(AckOutcome::Fenced) => {
            d.fenced = true;
            None
        }
        Ok(AckOutcome::Applied(n)) => {
            d.last_acked = seq;
            d.in_flight = d.in_flight.saturating_sub(n);
            state.metrics.acked.inc_by(n);
            state.metrics.queued.dec_by(n as i64);
            None
        }
        Err(e) => Some(error_frame(
            None,
            ErrorCode::Internal,
            format!("the ack was not stored: {e}; send it again"),
            Some(Duration::from_secs(1)),
        )),
    }
}

/// A session that is ending (replaced or shut down) still applies the acks its client sent
/// before that, already received but not read yet: a client that acks and at once reconnects
/// must not get that mail again. Reads what is already there, waiting [`SETTLE_WAIT`] at most.
async fn settle_acks<S: Storage>(
    state: &RelayState<S>,
    agent: &AgentName,
    d: &mut Delivery,
    stream: &mut SplitStream<WebSocket>,
) {
    let deadline = Instant::now() + SETTLE_WAIT;
    for _ in 0..SETTLE_FRAMES {
        let Ok(Some(Ok(message))) = timeout_at(deadline, stream.next()).await else {
            return;
        };
        match message {
            // An ack frame is tiny; anything larger is not one and is not worth parsing.
            Message::Text(text) if text.len() <= 128 => {
                if let Ok(ClientFrame::Ack { seq }) = serde_json::from_str(&text)
                    && ack(state, agent, d, seq).await.is_some()
                {
                    return;
                }
            }
            Message::Close(_) => return,
            _ => {}
        }
    }
}

/// Checks a send and queues its write; `Some` is the refusal.
async fn queue_send<S: Storage>(
    state: &RelayState<S>,
    agent: &AgentName,
    sends: &mut FuturesUnordered<QueuedSend>,
    (reference, share): (String, Option<Share>),
    envelope: &str,
) -> Option<ServerFrame> {
    match accept::check(state, agent, reference, envelope).await {
        // The frame's share of the receive budget is held until its write is done.
        Ok(queued) => {
            sends.push(Box::pin(async move {
                let written = queued.await;
                drop(share);
                written
            }));
            None
        }
        Err(refusal) => Some(*refusal),
    }
}

/// Answers one frame from an authenticated client; acks succeed silently, and sends are
/// answered when their write completes.
async fn handle<S: Storage>(
    state: &RelayState<S>,
    agent: &AgentName,
    nonce: &[u8],
    d: &mut Delivery,
    (sends, share): (&mut FuturesUnordered<QueuedSend>, Option<Share>),
    frame: ClientFrame,
) -> Option<ServerFrame> {
    Some(match frame {
        ClientFrame::Ping {} => ServerFrame::Pong {},
        ClientFrame::Hello { .. } => error_frame(
            None,
            ErrorCode::UnexpectedFrame,
            "already authenticated",
            None,
        ),
        ClientFrame::Ack { seq } => return ack(state, agent, d, seq).await,
        ClientFrame::Lookup {
            reference,
            agent: wanted,
        } => match state.storage.keys(wanted.clone()).await {
            Ok(Some(keys)) => match state.storage.rotations(wanted.clone()).await {
                Ok(rotations) => ServerFrame::Keys {
                    reference,
                    agent: wanted,
                    keys,
                    rotations,
                },
                Err(e) => error_frame(
                    Some(reference),
                    ErrorCode::Internal,
                    e.to_string(),
                    Some(Duration::from_secs(1)),
                ),
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
        // `SendFrame::read` takes every valid send frame first; this is its general twin.
        ClientFrame::Send {
            reference,
            envelope,
        } => {
            let text = String::from_utf8(envelope.to_bytes()).expect("JSON is UTF-8");
            return queue_send(state, agent, sends, (reference, share), &text).await;
        }
        other => match super::consent::handle(state, agent, nonce, other).await {
            Ok(answer) => answer,
            Err(other) => match super::directory::handle(state, agent, other).await {
                Ok(answer) => answer,
                Err(other) => match super::retire::handle(state, agent, nonce, other).await {
                    Ok(answer) => answer,
                    Err(other) => match super::bounce::handle(state, agent, other).await {
                        Ok(answer) => answer,
                        Err(other) => match super::copies::handle(state, agent, other).await {
                            Ok(answer) => answer,
                            Err(other) => match super::online::handle(state, agent, other).await {
                                Ok(answer) => answer,
                                Err(other) => {
                                    match super::rotate::handle(state, agent, other).await {
                                        Ok(answer) => answer,
                                        Err(unhandled) => error_frame(
                                            None,
                                            ErrorCode::UnexpectedFrame,
                                            format!("unexpected frame {unhandled:?}"),
                                            None,
                                        ),
                                    }
                                }
                            },
                        },
                    },
                },
            },
        },
    })
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};

    use futures_util::SinkExt;
    use tokio::sync::Notify;
    use tokio_tungstenite::tungstenite::Message as WsMessage;

    use super::*;
    use crate::crypto::Identity;
    use crate::crypto::sign::{Domain, signature};
    use crate::protocol::{
        Bounce, CopyKey, MessageId, OwnerKey, Policy, PublicKeys, RelayKey, RelayName, RequestCode,
        hello_payload,
    };
    use crate::relay::storage::{
        Accepted, CommitListener, ConsentChange, ConsentLedger, ConsentOutcome, ConsentState,
        InviteDigest, Pending, Queue, Queued, QueuedCopy, Quota, Registration, Registry, RelayPin,
        RelayPins, SqliteStorage, StorageError, StorageMetrics,
    };
    use crate::relay::{Relay, RelayConfig};

    const TIMEOUT: Duration = Duration::from_secs(20);

    /// How long an ack is held when nothing reads the queue meanwhile (the fixed relay).
    const HOLD: Duration = Duration::from_millis(300);

    /// SQLite storage whose acks are held back, as a busy group commit would: each one is
    /// applied only after a queue read (which then saw the acked mail still stored) or after
    /// [`HOLD`].
    struct SlowAcks {
        inner: SqliteStorage,
        gate: Arc<Gate>,
    }

    #[derive(Default)]
    struct Gate {
        holding: AtomicBool,
        arrived: Notify,
        read_while_held: AtomicBool,
        release: Notify,
    }

    impl Registry for SlowAcks {
        async fn register(
            &self,
            name: AgentName,
            keys: PublicKeys,
            invite: Option<InviteDigest>,
        ) -> Result<Registration, StorageError> {
            self.inner.register(name, keys, invite).await
        }

        async fn keys(&self, name: AgentName) -> Result<Option<PublicKeys>, StorageError> {
            self.inner.keys(name).await
        }

        async fn owner(&self, name: AgentName) -> Result<Option<OwnerKey>, StorageError> {
            self.inner.owner(name).await
        }

        async fn rotate(
            &self,
            rotation: crate::protocol::KeyRotation,
        ) -> Result<bool, StorageError> {
            self.inner.rotate(rotation).await
        }

        async fn rotations(
            &self,
            name: AgentName,
        ) -> Result<Vec<crate::protocol::KeyRotation>, StorageError> {
            self.inner.rotations(name).await
        }

        async fn retire(&self, name: AgentName, until_ms: i64) -> Result<bool, StorageError> {
            self.inner.retire(name, until_ms).await
        }

        async fn set_owner(
            &self,
            name: AgentName,
            key: OwnerKey,
            current: Option<OwnerKey>,
        ) -> Result<bool, StorageError> {
            self.inner.set_owner(name, key, current).await
        }

        async fn set_listing(
            &self,
            agent: AgentName,
            description: Option<String>,
        ) -> Result<(), StorageError> {
            self.inner.set_listing(agent, description).await
        }

        async fn directory(
            &self,
            limit: usize,
        ) -> Result<Vec<(AgentName, PublicKeys, String)>, StorageError> {
            self.inner.directory(limit).await
        }
    }

    impl ConsentLedger for SlowAcks {
        async fn consent(&self, change: ConsentChange) -> Result<ConsentOutcome, StorageError> {
            self.inner.consent(change).await
        }

        async fn has_request(
            &self,
            target: AgentName,
            requester: AgentName,
            code: RequestCode,
            now_ms: i64,
        ) -> Result<bool, StorageError> {
            self.inner
                .has_request(target, requester, code, now_ms)
                .await
        }

        async fn consent_state(
            &self,
            agent: AgentName,
            now_ms: i64,
        ) -> Result<ConsentState, StorageError> {
            self.inner.consent_state(agent, now_ms).await
        }
    }

    impl Queue for SlowAcks {
        fn on_commit(&self, listener: CommitListener) {
            self.inner.on_commit(listener)
        }

        fn accept(
            &self,
            sender: AgentName,
            id: MessageId,
            copies: Vec<QueuedCopy>,
            quota: Quota,
            expires_at_ms: i64,
            default: Policy,
        ) -> Pending<Accepted> {
            self.inner
                .accept(sender, id, copies, quota, expires_at_ms, default)
        }

        async fn pending(
            &self,
            agent: AgentName,
            after: Seq,
            limit: usize,
        ) -> Result<Vec<Queued>, StorageError> {
            let held = self.gate.holding.load(Ordering::SeqCst);
            let read = self.inner.pending(agent, after, limit).await;
            if held {
                self.gate.read_while_held.store(true, Ordering::SeqCst);
                self.gate.release.notify_one();
            }
            read
        }

        async fn claim(&self, agent: AgentName) -> Result<Epoch, StorageError> {
            self.inner.claim(agent).await
        }

        async fn release(&self, agent: AgentName, epoch: Epoch) -> Result<(), StorageError> {
            self.inner.release(agent, epoch).await
        }

        async fn ack(
            &self,
            agent: AgentName,
            upto: Seq,
            epoch: Epoch,
        ) -> Result<AckOutcome, StorageError> {
            self.gate.holding.store(true, Ordering::SeqCst);
            self.gate.arrived.notify_one();
            let _ = tokio::time::timeout(HOLD, self.gate.release.notified()).await;
            let done = self.inner.ack(agent, upto, epoch).await;
            self.gate.holding.store(false, Ordering::SeqCst);
            done
        }

        async fn waiting(&self, agent: AgentName) -> Result<u64, StorageError> {
            self.inner.waiting(agent).await
        }

        async fn remote_bounce_senders(
            &self,
            limit: usize,
        ) -> Result<Vec<AgentName>, StorageError> {
            self.inner.remote_bounce_senders(limit).await
        }

        async fn relay_mailboxes(&self) -> Result<Vec<RelayName>, StorageError> {
            self.inner.relay_mailboxes().await
        }

        async fn total_waiting(&self) -> Result<u64, StorageError> {
            self.inner.total_waiting().await
        }

        async fn expire(&self, now_ms: i64) -> Result<Vec<(AgentName, Bounce)>, StorageError> {
            self.inner.expire(now_ms).await
        }

        async fn bounces(
            &self,
            sender: AgentName,
            limit: usize,
        ) -> Result<Vec<Bounce>, StorageError> {
            self.inner.bounces(sender, limit).await
        }

        async fn copy_statuses(
            &self,
            sender: AgentName,
            keys: Vec<CopyKey>,
        ) -> Result<Vec<crate::relay::storage::CopyStatus>, StorageError> {
            self.inner.copy_statuses(sender, keys).await
        }

        async fn ack_bounces(
            &self,
            sender: AgentName,
            keys: Vec<CopyKey>,
        ) -> Result<u64, StorageError> {
            self.inner.ack_bounces(sender, keys).await
        }

        async fn record_bounces(
            &self,
            sender: AgentName,
            bounces: Vec<Bounce>,
        ) -> Result<(), StorageError> {
            self.inner.record_bounces(sender, bounces).await
        }
    }

    impl RelayPins for SlowAcks {
        async fn pin_relay(
            &self,
            relay: RelayName,
            key: RelayKey,
        ) -> Result<RelayPin, StorageError> {
            self.inner.pin_relay(relay, key).await
        }

        async fn pin_own_key(&self, key: RelayKey) -> Result<RelayPin, StorageError> {
            self.inner.pin_own_key(key).await
        }

        async fn pinned_relay(&self, relay: RelayName) -> Result<Option<RelayKey>, StorageError> {
            self.inner.pinned_relay(relay).await
        }

        async fn relays_pinned_with(&self, key: RelayKey) -> Result<Vec<RelayName>, StorageError> {
            self.inner.relays_pinned_with(key).await
        }
    }

    impl Storage for SlowAcks {
        fn relay_id(&self) -> &str {
            self.inner.relay_id()
        }

        fn metrics(&self) -> &StorageMetrics {
            self.inner.metrics()
        }

        async fn check_health(&self) -> Result<(), StorageError> {
            self.inner.check_health().await
        }
    }

    type Socket = tokio_tungstenite::WebSocketStream<
        tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>,
    >;

    /// The next text frame as JSON (`null` once closed).
    async fn next(ws: &mut Socket) -> serde_json::Value {
        loop {
            match tokio::time::timeout(TIMEOUT, ws.next())
                .await
                .expect("a frame in time")
            {
                Some(Ok(WsMessage::Text(t))) => return serde_json::from_str(&t).unwrap(),
                Some(Ok(WsMessage::Close(_))) | None | Some(Err(_)) => {
                    return serde_json::Value::Null;
                }
                Some(Ok(_)) => {}
            }
        }
    }

    async fn login(url: &str, agent: &AgentName, identity: &Identity) -> Socket {
        let (mut ws, _) = tokio_tungstenite::connect_async(url).await.unwrap();
        let Ok(ServerFrame::Challenge { relay, nonce, .. }) =
            serde_json::from_value(next(&mut ws).await)
        else {
            panic!("expected a challenge")
        };
        let hello = ClientFrame::Hello {
            agent: agent.clone(),
            signature: signature(identity, Domain::Hello, &hello_payload(&relay, &nonce)).to_vec(),
            register: Some(identity.public().to_keys()),
            control: false,
            owner: None,
            invite: None,
        };
        let text = serde_json::to_string(&hello).unwrap();
        ws.send(WsMessage::Text(text.into())).await.unwrap();
        assert_eq!(next(&mut ws).await["type"], "welcome");
        ws
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_ack_still_committing_is_applied_before_the_next_session_reads_the_queue() {
        let dir = tempfile::tempdir().unwrap();
        let gate = Arc::new(Gate::default());
        let storage = SlowAcks {
            inner: SqliteStorage::open(&dir.path().join("relay.db")).unwrap(),
            gate: gate.clone(),
        };
        let bob = AgentName::new("bob").unwrap();
        let identity = Identity::generate();
        let keys = identity.public().to_keys();
        storage.register(bob.clone(), keys, None).await.unwrap();
        let stored = storage
            .accept(
                AgentName::new("alice").unwrap(),
                MessageId::new(),
                vec![QueuedCopy {
                    id: None,
                    recipient: bob.clone(),
                    envelope: Arc::from(&br#"{"opaque":true}"#[..]),
                }],
                Quota {
                    count: 10,
                    bytes: 1 << 20,
                },
                i64::MAX,
                Policy::Open,
            )
            .await
            .unwrap();
        assert!(matches!(stored, Accepted::Stored(_)));
        let config = RelayConfig {
            listen: "127.0.0.1:0".parse().unwrap(),
            ..RelayConfig::default()
        };
        let relay = Relay::start_with(storage, config, crate::crypto::RelayIdentity::generate())
            .await
            .unwrap();
        let url = relay.url();

        let mut first = login(&url, &bob, &identity).await;
        let delivery = next(&mut first).await;
        assert_eq!(delivery["type"], "deliver");
        let seq = delivery["seq"].as_u64().unwrap();
        assert_eq!(next(&mut first).await["type"], "caught_up");
        let ack = serde_json::to_string(&ClientFrame::Ack { seq }).unwrap();
        first.send(WsMessage::Text(ack.into())).await.unwrap();
        first.close(None).await.unwrap();
        // The ack reached storage and is being committed; the client reconnects at once.
        tokio::time::timeout(TIMEOUT, gate.arrived.notified())
            .await
            .expect("the ack reaches storage");
        let mut second = login(&url, &bob, &identity).await;
        let frame = next(&mut second).await;
        assert_eq!(
            frame["type"], "caught_up",
            "acked mail is not delivered again: {frame}"
        );
        assert!(
            !gate.read_while_held.load(Ordering::SeqCst),
            "the queue was read while an ack was being committed"
        );
        relay.shutdown().await;
    }
}
