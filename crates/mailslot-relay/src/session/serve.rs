//! One authenticated connection's loop. It only ever waits on reads and events: deliveries
//! and answers are queued to [`Outgoing`], whose writer task drains them.

use axum::extract::ws::{Message, WebSocket};
use futures_util::StreamExt;
use futures_util::stream::SplitStream;
use tokio::time::{Instant, timeout_at};

use super::super::accept;
use super::super::inbound::FrameDone;
use super::super::presence::{Attached, Kick};
use super::super::pushes::Pushed;
use super::super::state::RelayState;
use super::super::storage::{Epoch, Storage};
use super::super::wire::{Ending, Outgoing, close, is_too_large};
use super::delivery::Delivery;
use super::denials;
use super::endings::{gone, kicked, shutting_down, stalled};
use super::requests::{self, Sends};
use crate::protocol::{AgentName, ErrorCode, ServerFrame, Shown};

/// Sends of one connection whose writes may be pending at once.
pub(super) const PIPELINED: usize = 256;

/// Serves `agent` until the connection ends; `Some` is why the relay ends it.
pub(super) async fn serve<S: Storage>(
    state: &RelayState<S>,
    (stream, out): (&mut SplitStream<WebSocket>, &Outgoing),
    (agent, nonce): (&AgentName, &[u8]),
    attached: &mut Attached,
    (lease, shown, done): (Option<Epoch>, Shown, &FrameDone),
) -> Option<Ending> {
    // The agent's own delivery session hears of denials; a hidden window (the dashboard)
    // leaves them kept for it.
    let hears_denials = lease.is_some() && shown == Shown::Online;
    if hears_denials && !denials::hand_over(state, agent, out).await {
        return Some(gone(out));
    }
    let mut shutdown = state.shutdown.clone();
    let mut delivery = Delivery::new(lease);
    let mut errors = 0u32;
    let mut sends = Sends::new();
    let idle = state.config.idle_timeout();
    let mut deadline = Instant::now() + idle;
    loop {
        if delivery.fenced {
            return Some(kicked(agent, Some(Kick::Replaced)));
        }
        // Deliveries wait while half the connection's byte bound waits for the client.
        if delivery.need_fetch && delivery.has_room() && out.has_room() {
            if let Err(ending) = delivery.send_from_queue(state, out, agent).await {
                return ending;
            }
            continue;
        }
        tokio::select! {
            biased;
            _ = shutdown.changed() => {
                delivery.settle_acks(state, agent, stream).await;
                return Some(shutting_down());
            }
            kick = &mut attached.kicked => {
                delivery.settle_acks(state, agent, stream).await;
                return Some(kicked(agent, kick.ok()));
            }
            _ = out.stalled() => return Some(stalled(&state.config)),
            _ = out.drained(), if !out.has_room() => {}
            Some(pushed) = attached.pushes.recv(), if !delivery.need_fetch && delivery.has_room() && out.has_room() => match pushed {
                Pushed::Copy(copy) => {
                    if let Err(ending) = delivery.send_pushed(state, out, agent, copy) {
                        return Some(ending);
                    }
                }
                // Pushed mail was dropped: read the database instead.
                Pushed::Missed => delivery.need_fetch = true,
            },
            Some((reference, id, outcome)) = sends.next(), if !sends.is_empty() => {
                if !out.frame(&accept::answer(state, agent, reference, id, outcome)) {
                    return Some(gone(out));
                }
            }
            Some(event) = attached.events.recv() => {
                // A denial stays kept until a login hands it over: this connection may close
                // before its client reads the event (a `sync` that just caught up), and the
                // client's store makes a repeat no news.
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
                let reply = requests::answer(state, (agent, nonce), &mut delivery, (&mut sends, share), text.as_deref()).await;
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
