//! Delivery to one agent: stored copies read from its queue and copies pushed from their
//! commit, sent a window ahead of the client's cumulative acks, and the acks applied under
//! the session's lease.

use std::time::Duration;

use axum::extract::ws::{Message, WebSocket};
use futures_util::StreamExt;
use futures_util::stream::SplitStream;
use tokio::time::{Instant, timeout_at};
use tracing::field::Empty;

use super::super::pushes::{self, Step};
use super::super::state::RelayState;
use super::super::storage::{AckOutcome, Committed, Epoch, Queue};
use super::super::wire::{Ending, Outgoing, error_frame};
use super::endings::{gone, internal};
use crate::protocol::{AgentName, ClientFrame, ErrorCode, Seq, ServerFrame, deliver_frame};

/// Deliveries sent and not yet acknowledged, at most.
pub(super) const WINDOW: u64 = 1024;
/// Envelopes read from storage at a time.
const FETCH: usize = 256;
/// Frames an ending session reads, at most, looking for acks already sent.
const SETTLE_FRAMES: usize = 64;
/// How long an ending session looks for acks its client already sent. Frames in the socket's
/// buffer are not always readable at the first poll (the runtime may not have seen the socket
/// become readable yet), so it waits this long at most, and no longer once the client closed.
const SETTLE_WAIT: Duration = Duration::from_millis(50);
/// The size assumed for a delivery before any was made, in bytes.
const FIRST_GUESS: usize = 4096;

/// Per-connection delivery progress. Sequence numbers are relay-wide, so the window counts
/// messages, never differences of sequence numbers.
pub(super) struct Delivery {
    /// The delivery lease; `None` on a control connection, which delivers nothing.
    lease: Option<Epoch>,
    /// A later claim replaced this session: its acks are refused, so it must end.
    pub fenced: bool,
    last_sent: Seq,
    last_acked: Seq,
    in_flight: u64,
    /// The queue holds copies not sent yet: read it before taking pushes.
    pub need_fetch: bool,
    caught_up: bool,
    /// The largest delivery so far, to guess how many fit in the room left.
    largest: usize,
}

impl Delivery {
    /// Nothing sent yet; a session with a lease reads its queue first.
    pub fn new(lease: Option<Epoch>) -> Self {
        Self {
            lease,
            fenced: false,
            last_sent: 0,
            last_acked: 0,
            in_flight: 0,
            need_fetch: lease.is_some(),
            caught_up: false,
            largest: FIRST_GUESS,
        }
    }

    /// Whether the window has room for another delivery.
    pub fn has_room(&self) -> bool {
        self.in_flight < WINDOW
    }

    /// Sends the next stored copies that fit in the connection's room, and `caught_up` once
    /// the queue is drained.
    #[tracing::instrument(level = "debug", name = "deliver", skip_all, fields(%agent, after = self.last_sent, upto = Empty))]
    pub async fn send_from_queue<S: Queue>(
        &mut self,
        state: &RelayState<S>,
        out: &Outgoing,
        agent: &AgentName,
    ) -> Result<(), Option<Ending>> {
        let window = (WINDOW - self.in_flight) as usize;
        let fits = (out.room() / self.largest).max(1);
        let want = window.min(FETCH).min(fits);
        let batch = state
            .storage
            .pending(agent.clone(), self.last_sent, want)
            .await
            .map_err(|e| Some(internal(format!("reading the queue failed: {e}"))))?;
        let now = jiff::Timestamp::now().as_millisecond();
        for q in &batch {
            // What does not fit now is read again once the client has read some.
            if !out.has_room() {
                return Ok(());
            }
            let Some(text) = deliver_frame(q.seq, &q.envelope) else {
                tracing::error!(%agent, seq = q.seq, "stored envelope is not UTF-8; skipping it");
                self.last_sent = q.seq;
                continue;
            };
            self.send(state, out, q.seq, text, now - q.accepted_at_ms)
                .map_err(Some)?;
        }
        tracing::Span::current().record("upto", self.last_sent);
        if batch.len() < want {
            self.need_fetch = false;
            if !self.caught_up {
                self.caught_up = true;
                if !out.frame(&ServerFrame::CaughtUp {}) {
                    return Err(Some(gone(out)));
                }
            }
        }
        Ok(())
    }

    /// Sends a copy pushed from its commit, unless the queue read already sent it, or reads
    /// the queue instead when a copy before it has not been sent (it was committed on another
    /// node and its news is still on the way): a cumulative ack of this one would delete that
    /// one unseen.
    #[tracing::instrument(level = "debug", name = "deliver_pushed", skip_all, fields(%agent, seq = copy.seq))]
    pub fn send_pushed<S>(
        &mut self,
        state: &RelayState<S>,
        out: &Outgoing,
        agent: &AgentName,
        copy: Committed,
    ) -> Result<(), Ending> {
        match pushes::step(&copy, self.last_sent) {
            Step::Skip => return Ok(()),
            Step::Read => {
                self.need_fetch = true;
                return Ok(());
            }
            Step::Deliver => {}
        }
        let Some(text) = deliver_frame(copy.seq, &copy.envelope) else {
            tracing::error!(%agent, seq = copy.seq, "stored envelope is not UTF-8; skipping it");
            return Ok(());
        };
        let waited = jiff::Timestamp::now().as_millisecond() - copy.accepted_at_ms;
        self.send(state, out, copy.seq, text, waited)
    }

    /// Queues one delivery frame, counting it in the window and the metrics.
    fn send<S>(
        &mut self,
        state: &RelayState<S>,
        out: &Outgoing,
        seq: Seq,
        text: String,
        waited_ms: i64,
    ) -> Result<(), Ending> {
        self.largest = self.largest.max(text.len());
        if !out.raw(text) {
            return Err(gone(out));
        }
        self.last_sent = seq;
        self.in_flight += 1;
        state.metrics.delivered.inc();
        state
            .metrics
            .delivery_latency
            .observe(waited_ms.max(0) as f64 / 1000.0);
        Ok(())
    }

    /// Applies a cumulative ack; `Some` is the refusal. The session waits for the commit
    /// before it reads its next frame, so a session that has ended has no ack in flight —
    /// which the agent's next session relies on (see [`super::lease`]).
    #[tracing::instrument(level = "debug", name = "ack", skip_all, fields(%agent, seq = seq))]
    pub async fn ack<S: Queue>(
        &mut self,
        state: &RelayState<S>,
        agent: &AgentName,
        seq: Seq,
    ) -> Option<ServerFrame> {
        if seq > self.last_sent {
            return Some(error_frame(
                None,
                ErrorCode::UnexpectedFrame,
                format!("ack {seq} is beyond the last delivery {}", self.last_sent),
                None,
            ));
        }
        if seq <= self.last_acked {
            return None;
        }
        let epoch = self.lease?;
        match state.storage.ack(agent.clone(), seq, epoch).await {
            Ok(AckOutcome::Fenced) => {
                self.fenced = true;
                None
            }
            Ok(AckOutcome::Applied(n)) => {
                self.last_acked = seq;
                self.in_flight = self.in_flight.saturating_sub(n);
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

    /// A session that is ending (replaced or shut down) still applies the acks its client
    /// sent before that, already received but not read yet: a client that acks and at once
    /// reconnects must not get that mail again. Reads what is already there, waiting
    /// [`SETTLE_WAIT`] at most.
    pub async fn settle_acks<S: Queue>(
        &mut self,
        state: &RelayState<S>,
        agent: &AgentName,
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
                        && self.ack(state, agent, seq).await.is_some()
                    {
                        return;
                    }
                }
                Message::Close(_) => return,
                _ => {}
            }
        }
    }
}
