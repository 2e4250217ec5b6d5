//! One WebSocket connection, from challenge to close: the handshake, then (on a delivery
//! connection) the agent's lease, then the loop that delivers stored mail in order while
//! answering the client's requests.
//!
//! - `handshake`: the challenge, the hello (registering a new name), the welcome.
//! - `lease`: the agent's turn and its delivery lease, taken before the welcome and given
//!   back after the last ack.
//! - `serve`: the loop, which waits on reads and events only; writes go to [`Outgoing`].
//! - `delivery`: the window of copies sent ahead of the client's acks, and the acks.
//! - `requests`: one `match` over the client's frames, each arm calling its handler.
//! - `endings`: what the client is told when the relay ends the session.
//! - `denials`: denials kept for a requester that was offline, handed over once.

mod delivery;
mod denials;
mod endings;
mod handshake;
mod lease;
mod requests;
mod serve;
#[cfg(test)]
mod tests;

use std::net::IpAddr;
use std::sync::Arc;

use axum::extract::ws::WebSocket;
use futures_util::StreamExt;
use tracing::field::Empty;

use super::RelayConfig;
use super::inbound::FrameDone;
use super::state::RelayState;
use super::storage::Storage;
use super::wire::{Bounds, Outgoing, refuse};
use crate::protocol::{ErrorCode, Shown};
use handshake::Hello;

/// Frames that may wait for the socket: a full window plus answers to pipelined requests.
const QUEUE: usize = delivery::WINDOW as usize + serve::PIPELINED + 64;

fn bounds(config: &RelayConfig) -> Bounds {
    Bounds {
        frames: QUEUE,
        bytes: config.outgoing_bytes(),
        write_timeout: config.write_timeout(),
    }
}

/// Runs one connection to completion.
#[tracing::instrument(level = "debug", name = "session", skip_all, fields(%ip, agent = Empty))]
pub async fn run<S: Storage>(
    state: Arc<RelayState<S>>,
    mut socket: WebSocket,
    (ip, shown): (IpAddr, Shown),
    done: FrameDone,
) {
    let Some(hello) = handshake::greet(&state, &mut socket, ip).await else {
        return;
    };
    tracing::Span::current().record("agent", tracing::field::display(&hello.agent));
    if hello.control {
        // Boxed: inline, its own `serve` would double every connection's task.
        return Box::pin(run_control(state, socket, hello, done)).await;
    }
    let agent = &hello.agent;
    let Some(mut lease) = lease::claim(&state, &mut socket, (agent, shown)).await else {
        return;
    };
    let (sink, mut stream) = socket.split();
    let out = Outgoing::spawn(sink, bounds(&state.config));
    state.metrics.connections.inc();
    tracing::debug!(%agent, %ip, conn = lease.attached.conn, epoch = %lease.epoch, "connected");
    let ending = serve::serve(
        &state,
        (&mut stream, &out),
        (agent, &hello.nonce),
        &mut lease.attached,
        (Some(lease.epoch), shown, &done),
    )
    .await;
    lease::release(&state, agent, lease).await;
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
    Hello { agent, nonce, .. }: Hello,
    done: FrameDone,
) {
    let (mut attached, _quiet) = state.presence.control();
    if let Err(ending) = handshake::welcome(&state, &mut socket, &agent).await {
        state.metrics.reject(ending.code);
        return refuse(&mut socket, ending).await;
    }
    let (sink, mut stream) = socket.split();
    let out = Outgoing::spawn(sink, bounds(&state.config));
    state.metrics.connections.inc();
    tracing::debug!(%agent, "control connection");
    let ending = serve::serve(
        &state,
        (&mut stream, &out),
        (&agent, &nonce),
        &mut attached,
        (None, Shown::Hidden, &done),
    )
    .await;
    state.metrics.connections.dec();
    if let Some(ending) = &ending {
        state.metrics.reject(ending.code);
    }
    out.finish(ending, stream).await;
}
