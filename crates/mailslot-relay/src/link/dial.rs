//! The side of a link that holds mail: one task per other relay with mail waiting for it. It
//! claims the relay's mailbox (`@host`), vouches for the other relay's key, connects to its
//! `/v1/relay`, proves this relay's name, and sends the mailbox's copies in order, a window
//! ahead of the answers. A copy is acknowledged here only when the other relay answered that
//! it is on its disk (or refused it for good, which bounces those recipients to the sender
//! first). Anything else ends the connection, and the copies are sent again after a backoff;
//! the other relay deduplicates them. Copies past their TTL bounce, named per recipient.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use futures_util::{FutureExt, SinkExt, StreamExt};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message as WsMessage;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::{Connector, MaybeTlsStream, WebSocketStream};

use super::super::bounce;
use super::super::metrics::RelayLabel;
use super::super::pushes::{self, Pushed, Pushes, Step};
use super::super::state::RelayState;
use super::super::storage::{AckOutcome, Epoch, Queue, Queued, RelayPins, StorageError};
use super::peer::{self, PeerError};
use crate::crypto::sign::Domain;
use crate::crypto::verify_link;
use crate::protocol::{
    Address, AgentName, Bounce, EnvelopeHead, LINK_PATH, LINK_VERSION, LINK_WINDOW, LinkAnswer,
    LinkRequest, MessageId, Refusal, RelayEndpoint, RelayName, Seq, Shown, link_deliver_frame,
    link_payload, read_link_copy,
};

/// How often the supervisor looks for relay mailboxes with mail that no link here serves
/// (stored by another node, on PostgreSQL).
const RESCAN: Duration = Duration::from_secs(30);
/// Copies larger than this on average are read a few at a time.
const LARGE_COPY: usize = 64 * 1024;
/// Free places in the window a read from the mailbox waits for.
const REFILL: usize = 128;
/// How long a link with nothing to send stays open.
const IDLE: Duration = Duration::from_secs(30);
/// The first wait after a failure; it doubles up to the relay's expiry interval (so copies
/// past their TTL bounce on time while the other relay is down), at most a minute.
const FIRST_BACKOFF: Duration = Duration::from_millis(250);

type Socket = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// Starts a link for every relay that has mail waiting and for every one that gets some.
/// Returns at shutdown once every link has stopped (none outlives the relay's storage).
pub async fn supervise<S: Queue + RelayPins>(state: Arc<RelayState<S>>) {
    let mut starts = state.links.serve();
    let mut shutdown = state.shutdown.clone();
    let mut rescan = tokio::time::interval(RESCAN);
    let mut links = tokio::task::JoinSet::new();
    links.spawn(super::bounces::carry(state.clone()));
    loop {
        tokio::select! {
            () = super::stopped(&mut shutdown) => {
                links.shutdown().await;
                return;
            }
            Some((relay, pushes)) = starts.recv() => {
                links.spawn(run(state.clone(), relay, pushes));
            }
            Some(_) = links.join_next() => {}
            _ = rescan.tick() => match state.storage.relay_mailboxes().await {
                Ok(relays) => relays.iter().for_each(|r| state.links.wake(r)),
                Err(e) => tracing::warn!(error = %e, "cannot list the mail waiting for other relays; will retry"),
            },
        }
    }
}

/// Why a link's connection ended.
#[derive(Debug, thiserror::Error)]
enum LinkError {
    #[error(transparent)]
    Peer(#[from] PeerError),
    #[error("storage: {0}")]
    Storage(#[from] StorageError),
    #[error("{0}")]
    Broken(String),
    #[error("the other relay asks to wait: {0}")]
    Later(String, Duration),
    #[error("another link to the same relay took over its mailbox")]
    Fenced,
}

/// One link: delivers until the mailbox is empty, then ends (the next copy starts another).
async fn run<S: Queue + RelayPins>(
    state: Arc<RelayState<S>>,
    relay: RelayName,
    mut pushes: Pushes,
) {
    let Some(mailbox) = AgentName::relay_mailbox(&relay) else {
        return;
    };
    let mut backoff = FIRST_BACKOFF;
    let max_backoff = Duration::from_secs(state.config.expiry_interval_secs.clamp(1, 60));
    loop {
        if *state.shutdown.borrow() {
            return;
        }
        let outcome = match state.storage.claim(mailbox.clone(), Shown::Hidden).await {
            Ok(epoch) => send_mailbox(&state, &relay, &mailbox, epoch, &mut pushes).await,
            Err(e) => Err(LinkError::Storage(e)),
        };
        let wait = match outcome {
            Ok(true) => {
                backoff = FIRST_BACKOFF;
                continue;
            }
            Ok(false) => {
                // Empty: end, then look once more, so a copy committed in between (whose
                // wake reached this task) is not left without a link.
                state.links.ended(&relay, &pushes);
                if let Ok(waiting) = state.storage.pending(mailbox.clone(), 0, 1).await
                    && !waiting.is_empty()
                {
                    state.links.wake(&relay);
                }
                return;
            }
            Err(LinkError::Fenced) => {
                state.links.ended(&relay, &pushes);
                return;
            }
            Err(LinkError::Later(why, wait)) => {
                tracing::info!(%relay, %why, "the other relay asks to wait");
                wait.min(max_backoff)
            }
            Err(e) => {
                state
                    .metrics
                    .link_failures
                    .get_or_create(&RelayLabel::of(&relay))
                    .inc();
                if let LinkError::Peer(changed @ PeerError::KeyChanged { .. }) = &e {
                    changed.log_refusal(&state.config, "refusing a relay whose key changed");
                } else {
                    tracing::warn!(%relay, error = %e, retry_in = ?backoff, "link to another relay failed; will retry");
                }
                let wait = backoff;
                backoff = (backoff * 2).min(max_backoff);
                wait
            }
        };
        let mut shutdown = state.shutdown.clone();
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            () = super::stopped(&mut shutdown) => return,
        }
    }
}

/// Expires what is past its TTL, then connects and delivers the rest. `Ok(true)`: the
/// connection ended cleanly with mail perhaps left; `Ok(false)`: nothing waits.
#[tracing::instrument(level = "debug", name = "link", skip_all, fields(%relay, %epoch))]
async fn send_mailbox<S: Queue + RelayPins>(
    state: &RelayState<S>,
    relay: &RelayName,
    mailbox: &AgentName,
    epoch: Epoch,
    pushes: &mut Pushes,
) -> Result<bool, LinkError> {
    expire(state, relay, mailbox, epoch).await?;
    if count_queued(state, relay, mailbox).await? == 0 {
        return Ok(false);
    }
    let key = peer::pinned_key(state, relay).await?;
    let mut ws = connect(state, relay, &key).await?;
    tracing::info!(%relay, "link to another relay is up");
    let result = stream(state, relay, mailbox, epoch, pushes, &mut ws).await;
    let _ = ws.close(None).await;
    result.map(|()| true)
}

/// Connects to `relay`'s link endpoint and shakes hands: it proves its key, this relay its
/// name.
async fn connect<S>(
    state: &RelayState<S>,
    relay: &RelayName,
    key: &crate::protocol::RelayKey,
) -> Result<Socket, LinkError> {
    let within = state.config.link_timeout();
    let endpoint = RelayEndpoint::of(relay, &state.config.trusted_hosts);
    let url = format!(
        "{}://{relay}{LINK_PATH}",
        if endpoint.is_tls() { "wss" } else { "ws" }
    );
    let connector = if endpoint.is_tls() {
        Some(Connector::Rustls(
            crate::tls::client_config().map_err(LinkError::Broken)?,
        ))
    } else {
        None
    };
    let max = state.config.max_frame_bytes();
    let config = WebSocketConfig::default()
        .max_message_size(Some(max))
        .max_frame_size(Some(max));
    // To the addresses checked for this relay only (see `reach`), never the name again.
    let addrs = peer::addresses(&state.config, relay, &endpoint).await?;
    let (mut ws, _) = tokio::time::timeout(within, async {
        let tcp = TcpStream::connect(&addrs[..]).await?;
        tcp.set_nodelay(true)?;
        tokio_tungstenite::client_async_tls_with_config(&url, tcp, Some(config), connector).await
    })
    .await
    .map_err(|_| LinkError::Broken(format!("{url} did not connect within {within:?}")))?
    .map_err(|e| LinkError::Broken(format!("cannot connect to {url}: {e}")))?;
    let their_nonce = match answer(&mut ws, relay, within).await? {
        LinkAnswer::Challenge { v, relay: r, nonce } if v == LINK_VERSION && r == *relay => nonce,
        LinkAnswer::Challenge { v, relay: r, .. } => {
            return Err(LinkError::Broken(format!(
                "{url} answered as {r} (link version {v}), not {relay} (version {LINK_VERSION})"
            )));
        }
        other => return Err(unexpected(&other)),
    };
    let mut nonce = vec![0u8; 32];
    getrandom::fill(&mut nonce).map_err(|e| LinkError::Broken(format!("no randomness: {e}")))?;
    let payload = link_payload(&state.name, relay, &nonce, &their_nonce);
    let hello = LinkRequest::Hello {
        relay: state.name.clone(),
        nonce,
        signature: state.identity.sign_link(Domain::LinkHello, &payload),
    };
    send(&mut ws, &hello).await?;
    match answer(&mut ws, relay, within).await? {
        LinkAnswer::Welcome { signature } => {
            verify_link(key, Domain::LinkWelcome, &payload, &signature).map_err(|_| {
                LinkError::Broken(format!(
                    "{relay}'s welcome is not signed by its pinned key; refused"
                ))
            })?;
        }
        LinkAnswer::Error { code, message } => {
            return Err(LinkError::Broken(format!(
                "{relay} refused the link ({code:?}): {message}"
            )));
        }
        other => return Err(unexpected(&other)),
    }
    Ok(ws)
}

/// Sends one request (a contact request or an approval) to `relay` over a link of its own,
/// and returns the answer: the request is not mail, and its sender waits for it. The error is
/// what the agent that asked may be told: the same whether nothing listens at `relay`,
/// something else does, or it is not a mailslot relay (the details are logged here).
#[tracing::instrument(level = "debug", name = "link_request", skip_all, fields(%relay))]
pub async fn ask<S: RelayPins>(
    state: &RelayState<S>,
    relay: &RelayName,
    request: LinkRequest,
) -> Result<LinkAnswer, String> {
    let public = |e: LinkError| {
        tracing::info!(%relay, error = %e, "a request to another relay failed");
        match e {
            LinkError::Peer(e) => e.public(relay),
            _ => peer::unreachable_text(relay),
        }
    };
    let key = peer::pinned_key(state, relay)
        .await
        .map_err(|e| public(e.into()))?;
    let mut ws = connect(state, relay, &key).await.map_err(public)?;
    send(&mut ws, &request).await.map_err(public)?;
    let answer = answer(&mut ws, relay, state.config.link_timeout())
        .await
        .map_err(public);
    let _ = ws.close(None).await;
    answer
}

/// The deliveries sent on a connection and not answered yet.
struct Window {
    /// Their sequence numbers and sizes, in order.
    open: VecDeque<(Seq, usize)>,
    bytes: usize,
    /// The most this connection holds unanswered, in bytes.
    budget: usize,
    last_sent: Seq,
    /// The last answer, or the first delivery after none was open: no answer within the
    /// timeout while deliveries are open ends the link; so does nothing to do for [`IDLE`].
    progress: tokio::time::Instant,
}

impl Window {
    fn has_room(&self) -> bool {
        self.open.len() < LINK_WINDOW && self.bytes < self.budget
    }

    /// Room for a good batch read from the mailbox: answers come in small groups, and a read
    /// per group would cost a database round trip for a few copies.
    fn has_room_for_a_read(&self) -> bool {
        self.open.len() + REFILL <= LINK_WINDOW && self.bytes < self.budget
    }

    /// Sends one copy (fed: the caller flushes).
    async fn send(&mut self, ws: &mut Socket, seq: Seq, envelope: &[u8]) -> Result<(), LinkError> {
        if self.open.is_empty() {
            self.progress = tokio::time::Instant::now();
        }
        let frame = link_deliver_frame(seq, envelope)
            .ok_or_else(|| LinkError::Broken(format!("copy {seq} is not text")))?;
        ws.feed(WsMessage::text(frame))
            .await
            .map_err(|e| LinkError::Broken(format!("sending: {e}")))?;
        self.open.push_back((seq, envelope.len()));
        self.bytes += envelope.len();
        self.last_sent = seq;
        Ok(())
    }

    /// Closes the oldest delivery, which must be `seq`.
    fn answered(&mut self, seq: Seq) -> bool {
        match self.open.front() {
            Some(&(front, len)) if front == seq => {
                self.open.pop_front();
                self.bytes -= len;
                self.progress = tokio::time::Instant::now();
                true
            }
            _ => false,
        }
    }
}

/// Sends the mailbox's copies a window ahead of the answers and acknowledges each answered
/// one. Copies come from the mailbox until a read comes back short, then as they are
/// committed (pushed), until a push is dropped or a copy before one was not seen here:
/// then from the mailbox again. Returns when nothing was sent or answered for [`IDLE`].
async fn stream<S: Queue>(
    state: &RelayState<S>,
    relay: &RelayName,
    mailbox: &AgentName,
    epoch: Epoch,
    pushes: &mut Pushes,
    ws: &mut Socket,
) -> Result<(), LinkError> {
    let within = state.config.link_timeout();
    let delivered = state
        .metrics
        .link_delivered
        .get_or_create(&RelayLabel::of(relay))
        .clone();
    let mut window = Window {
        open: VecDeque::new(),
        bytes: 0,
        budget: state.config.outgoing_bytes(),
        last_sent: 0,
        progress: tokio::time::Instant::now(),
    };
    // What was pushed before this connection is in the mailbox, read first.
    pushes.clear();
    let (mut read, mut batch) = (true, 64);
    let mut counted = tokio::time::Instant::now();
    let broken = |e: tokio_tungstenite::tungstenite::Error| {
        LinkError::Broken(format!("sending to {relay}: {e}"))
    };
    loop {
        if read && window.has_room_for_a_read() {
            let want = (LINK_WINDOW - window.open.len()).min(batch);
            let copies = state
                .storage
                .pending(mailbox.clone(), window.last_sent, want)
                .await?;
            read = copies.len() == want;
            // Large copies are read a few at a time.
            let bytes: usize = copies.iter().map(|q| q.envelope.len()).sum();
            batch = if bytes > copies.len() * LARGE_COPY {
                4
            } else {
                64
            };
            for copy in &copies {
                window.send(ws, copy.seq, &copy.envelope).await?;
            }
            ws.flush().await.map_err(broken)?;
            continue;
        }
        let frame = tokio::select! {
            frame = ws.next() => frame,
            Some(pushed) = pushes.recv(), if !read && window.has_room() => {
                // This copy and every one already pushed, within the window; one flush.
                let mut next = Some(pushed);
                while let Some(pushed) = next {
                    match pushed {
                        Pushed::Missed => read = true,
                        Pushed::Copy(copy) => match pushes::step(&copy, window.last_sent) {
                            Step::Skip => {}
                            Step::Read => read = true,
                            Step::Deliver => window.send(ws, copy.seq, &copy.envelope).await?,
                        },
                    }
                    next = (!read && window.has_room()).then(|| pushes.try_recv()).flatten();
                }
                ws.flush().await.map_err(broken)?;
                continue;
            }
            _ = tokio::time::sleep_until(window.progress + if window.open.is_empty() { IDLE } else { within }) => {
                if window.open.is_empty() {
                    return Ok(());
                }
                return Err(LinkError::Broken(format!(
                    "{relay} answered nothing for {within:?} with {} deliveries open",
                    window.open.len()
                )));
            }
        };
        let mut answered: Option<Seq> = None;
        let mut later = None;
        let mut next = Some(frame);
        // Every answer already here is applied with one ack.
        while let Some(frame) = next {
            match read_answer(frame, relay)? {
                LinkAnswer::Taken { seq, refused } => {
                    if !window.answered(seq) {
                        return Err(LinkError::Broken(format!(
                            "{relay} answered delivery {seq} out of order"
                        )));
                    }
                    // A copy for another relay names one recipient (each has its own), so
                    // one without refusals is one delivery.
                    if refused.is_empty() {
                        delivered.inc();
                    } else {
                        bounce_refused(state, relay, mailbox, seq, refused).await?;
                    }
                    answered = Some(seq);
                }
                LinkAnswer::Later {
                    seq,
                    code,
                    message,
                    retry_after_ms,
                } => {
                    later = Some(LinkError::Later(
                        format!("delivery {seq}: {code:?}: {message}"),
                        Duration::from_millis(retry_after_ms),
                    ));
                    break;
                }
                LinkAnswer::Pong {} => {}
                LinkAnswer::Error { code, message } => {
                    later = Some(LinkError::Broken(format!(
                        "{relay} ended the link ({code:?}): {message}"
                    )));
                    break;
                }
                other => return Err(unexpected(&other)),
            }
            next = ws.next().now_or_never().flatten().map(Some);
        }
        if let Some(upto) = answered {
            if state.storage.ack(mailbox.clone(), upto, epoch).await? == AckOutcome::Fenced {
                return Err(LinkError::Fenced);
            }
            if counted.elapsed() >= Duration::from_secs(1) {
                counted = tokio::time::Instant::now();
                count_queued(state, relay, mailbox).await?;
            }
        }
        if let Some(stop) = later {
            return Err(stop);
        }
    }
}

/// How many copies wait for `relay`, shown in `/metrics`.
async fn count_queued<S: Queue>(
    state: &RelayState<S>,
    relay: &RelayName,
    mailbox: &AgentName,
) -> Result<u64, StorageError> {
    let waiting = state.storage.waiting(mailbox.clone()).await?;
    state
        .metrics
        .link_queued
        .get_or_create(&RelayLabel::of(relay))
        .set(i64::try_from(waiting).unwrap_or(i64::MAX));
    Ok(waiting)
}

/// Counts a copy the other relay answered with refusals, and bounces its refused recipients
/// to the sender, before the copy is acknowledged: a crash between the two sends it again,
/// and the same bounce is recorded once. The copy is read back from the mailbox (it is
/// acknowledged only after this), since a link keeps only the numbers of what it sent.
async fn bounce_refused<S: Queue>(
    state: &RelayState<S>,
    relay: &RelayName,
    mailbox: &AgentName,
    seq: Seq,
    refused: Vec<Refusal>,
) -> Result<(), LinkError> {
    let copy = state
        .storage
        .pending(mailbox.clone(), seq.saturating_sub(1), 1)
        .await?
        .pop()
        .filter(|c| c.seq == seq)
        .ok_or_else(|| {
            LinkError::Broken(format!("copy {seq} left the mailbox before its answer"))
        })?;
    let (id, sender, recipients) = read_head(&copy)?;
    let refused: Vec<_> = refused
        .into_iter()
        .filter(|r| recipients.contains(&r.to))
        .collect();
    let label = RelayLabel::of(relay);
    let taken = recipients.len() - refused.len();
    state
        .metrics
        .link_delivered
        .get_or_create(&label)
        .inc_by(taken as u64);
    if refused.is_empty() {
        return Ok(());
    }
    tracing::info!(%relay, %id, refused = ?refused, "the other relay refused recipients; bouncing them");
    let now = jiff::Timestamp::now();
    let bounces: Vec<Bounce> = refused
        .into_iter()
        .map(|r| Bounce {
            id,
            to: r.to,
            expired_at: now,
        })
        .collect();
    state
        .metrics
        .link_bounced
        .get_or_create(&label)
        .inc_by(bounces.len() as u64);
    state
        .storage
        .record_bounces(sender.clone(), bounces)
        .await?;
    bounce::announce(state, [sender]);
    Ok(())
}

/// The id, sender and recipients of a stored copy.
fn read_head(queued: &Queued) -> Result<(MessageId, AgentName, Vec<Address>), LinkError> {
    let (text, _) = read_link_copy(&queued.envelope)
        .ok_or_else(|| LinkError::Broken(format!("copy {} is unreadable", queued.seq)))?;
    let head: EnvelopeHead<'_> = serde_json::from_str(text)
        .map_err(|e| LinkError::Broken(format!("copy {} is unreadable: {e}", queued.seq)))?;
    Ok((
        head.id,
        head.from.name().clone(),
        head.keys.into_iter().map(|k| k.to).collect(),
    ))
}

/// Bounces the copies at the head of the mailbox that are past their TTL, each recipient by
/// name, then acknowledges them.
async fn expire<S: Queue>(
    state: &RelayState<S>,
    relay: &RelayName,
    mailbox: &AgentName,
    epoch: Epoch,
) -> Result<(), LinkError> {
    let ttl_ms = (state.config.ttl_secs as i64).saturating_mul(1000);
    loop {
        let now = jiff::Timestamp::now();
        let batch = state.storage.pending(mailbox.clone(), 0, 256).await?;
        let due: Vec<&Queued> = batch
            .iter()
            .take_while(|q| q.accepted_at_ms.saturating_add(ttl_ms) < now.as_millisecond())
            .collect();
        let Some(last) = due.last().map(|q| q.seq) else {
            return Ok(());
        };
        let mut senders = Vec::new();
        for queued in &due {
            let (id, sender, recipients) = read_head(queued)?;
            let bounces = recipients
                .into_iter()
                .map(|to| Bounce {
                    id,
                    to,
                    expired_at: now,
                })
                .collect::<Vec<_>>();
            state.metrics.expired.inc_by(bounces.len() as u64);
            state
                .storage
                .record_bounces(sender.clone(), bounces)
                .await?;
            senders.push(sender);
        }
        tracing::info!(%relay, expired = due.len(), "mail for another relay expired undelivered; bounced it to its senders");
        if state.storage.ack(mailbox.clone(), last, epoch).await? == AckOutcome::Fenced {
            return Err(LinkError::Fenced);
        }
        bounce::announce(state, senders);
        if due.len() < batch.len() || batch.len() < 256 {
            return Ok(());
        }
    }
}

async fn send(ws: &mut Socket, frame: &LinkRequest) -> Result<(), LinkError> {
    let text = serde_json::to_string(frame).expect("link frames serialize");
    ws.send(WsMessage::text(text))
        .await
        .map_err(|e| LinkError::Broken(format!("sending: {e}")))
}

/// The next answer from `relay`, within `within`.
async fn answer(
    ws: &mut Socket,
    relay: &RelayName,
    within: Duration,
) -> Result<LinkAnswer, LinkError> {
    let frame = tokio::time::timeout(within, ws.next())
        .await
        .map_err(|_| LinkError::Broken(format!("{relay} answered nothing within {within:?}")))?;
    read_answer(frame, relay)
}

fn read_answer(
    frame: Option<Result<WsMessage, tokio_tungstenite::tungstenite::Error>>,
    relay: &RelayName,
) -> Result<LinkAnswer, LinkError> {
    match frame {
        None => Err(LinkError::Broken(format!("{relay} closed the link"))),
        Some(Err(e)) => Err(LinkError::Broken(format!("reading from {relay}: {e}"))),
        Some(Ok(WsMessage::Text(text))) => serde_json::from_str(&text).map_err(|e| {
            LinkError::Broken(format!(
                "{relay} sent a frame that is not a link answer: {e}"
            ))
        }),
        Some(Ok(WsMessage::Close(_))) => Err(LinkError::Broken(format!("{relay} closed the link"))),
        Some(Ok(_)) => Ok(LinkAnswer::Pong {}),
    }
}

fn unexpected(frame: &LinkAnswer) -> LinkError {
    let kind = serde_json::to_value(frame)
        .ok()
        .and_then(|v| v.get("type").and_then(|t| t.as_str()).map(str::to_owned))
        .unwrap_or_default();
    if let LinkAnswer::Error { code, message } = frame {
        return LinkError::Broken(format!("refused ({code:?}): {message}"));
    }
    LinkError::Broken(format!("unexpected {kind} frame"))
}
