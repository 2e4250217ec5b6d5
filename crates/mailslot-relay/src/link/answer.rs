//! `/v1/relay`, the side of a link that takes mail: another relay proves its name with the
//! key its discovery document gives (pinned here on first contact), this relay answers with
//! its own signature, then each `deliver` is checked and stored like a send, and answered in
//! order once durable: `taken` (with the recipients refused for good, which the other relay
//! bounces) or `later` (a rate limit or a storage failure: it sends again).
//!
//! The checks: the sender's address is at the relay on the other end (a relay speaks only for
//! its own agents), every recipient is an agent here, each copy is within the size limit, the
//! other relay within its rate; the recipients' consent and quotas are applied in the write,
//! per recipient.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::ws::{Message, WebSocket};
use futures_util::stream::FuturesOrdered;
use futures_util::{FutureExt, SinkExt, StreamExt};
use prometheus_client::metrics::counter::Counter;
use tracing::Instrument;

use super::super::inbound::FrameDone;
use super::super::metrics::RelayLabel;
use super::super::state::RelayState;
use super::super::storage::{Accepted, Queue, QueuedCopy, Quota, Registry, RelayPins, Storage};
use super::peer;
use crate::crypto::sign::Domain;
use crate::crypto::verify_link;
use crate::protocol::{
    AgentName, Deliver, ENVELOPE_VERSION, ErrorCode, LINK_VERSION, LINK_WINDOW, LinkAnswer,
    LinkRequest, Refusal, RelayKey, RelayName, Seq, link_payload,
};

/// Serves one link from another relay.
pub async fn run<S: Storage>(
    state: Arc<RelayState<S>>,
    mut socket: WebSocket,
    (ip, done): (IpAddr, FrameDone),
) {
    let (relay, key) = match handshake(&state, &mut socket, ip).await {
        Ok(known) => known,
        Err((code, message)) => {
            tracing::info!(%ip, ?code, %message, "refused a link from another relay");
            state.metrics.reject(code);
            let _ = say(&mut socket, &LinkAnswer::Error { code, message }).await;
            return;
        }
    };
    tracing::info!(%relay, %ip, "link from another relay is up");
    // Counted with the connections, so that shutdown waits for it to close.
    state.metrics.connections.inc();
    serve(&state, &mut socket, (&relay, &key), &done).await;
    state.metrics.connections.dec();
}

/// Takes deliveries until the link closes, goes idle, or the relay shuts down.
async fn serve<S: Storage>(
    state: &Arc<RelayState<S>>,
    socket: &mut WebSocket,
    (relay, key): (&RelayName, &RelayKey),
    done: &FrameDone,
) {
    let idle = state.config.idle_timeout();
    let mut shutdown = state.shutdown.clone();
    let mut answers = FuturesOrdered::new();
    // Each delivery's write is queued only after the one before it queued its own: their
    // checks run at once, but a late registry read (a cold cache after a restart) must not
    // let a later copy into a recipient's queue ahead of an earlier one.
    let mut turn: Option<Turn> = None;
    // The bytes of the deliveries whose answers are pending, in order: reading stops while
    // they are over the relay's outgoing budget, so a link holds a bounded amount of mail.
    let mut sizes = std::collections::VecDeque::new();
    let mut held = 0usize;
    let budget = state.config.outgoing_bytes();
    let received = state
        .metrics
        .link_received
        .get_or_create(&RelayLabel::of(relay))
        .clone();
    loop {
        let room = answers.len() < 2 * LINK_WINDOW && held < budget;
        tokio::select! {
            frame = tokio::time::timeout(idle, socket.recv()), if room => {
                // A large delivery's share of the receive budget is held until it is
                // answered (stored); a ping ends no frame (see `relay::inbound`).
                let share = match &frame {
                    Ok(Some(Ok(Message::Ping(_) | Message::Pong(_)))) => None,
                    _ => done.take(),
                };
                let text = match frame {
                    Err(_) => {
                        tracing::info!(%relay, "link idle; closed");
                        break;
                    }
                    Ok(None | Some(Err(_)) | Some(Ok(Message::Close(_)))) => break,
                    Ok(Some(Ok(Message::Text(text)))) => text,
                    Ok(Some(Ok(_))) => continue,
                };
                if let Some(deliver) = Deliver::read(&text) {
                    sizes.push_back(text.len());
                    held += text.len();
                    let answer = match deliver {
                        Ok(deliver) => {
                            let (mine, next) = tokio::sync::oneshot::channel();
                            let order = (turn.replace(next), mine);
                            take(state, (relay, key), &received, deliver, order)
                        }
                        Err((seq, why)) => refused_all(seq, Vec::new(), why),
                    };
                    let held: Answer = Box::pin(async move {
                        let answer = answer.await;
                        drop(share);
                        answer
                    });
                    answers.push_back(held);
                    continue;
                }
                match serde_json::from_str::<LinkRequest>(&text) {
                    Ok(LinkRequest::Ping {}) => {
                        sizes.push_back(0);
                        answers.push_back(Box::pin(async { LinkAnswer::Pong {} }));
                    }
                    Ok(LinkRequest::Bounced { bounces }) => {
                        sizes.push_back(0);
                        let (state, relay) = (state.clone(), relay.clone());
                        answers.push_back(Box::pin(async move {
                            super::bounces::take(&state, &relay, bounces).await
                        }));
                    }
                    Ok(request @ (LinkRequest::Connect { .. }
                    | LinkRequest::Approved { .. }
                    | LinkRequest::Denied { .. })) => {
                        sizes.push_back(0);
                        let (state, relay) = (state.clone(), relay.clone());
                        answers.push_back(Box::pin(async move {
                            super::consent::apply(&state, &relay, request).await
                        }));
                    }
                    _ => {
                        let message = "expected a deliver or ping frame".to_owned();
                        let _ = say(socket, &LinkAnswer::Error { code: ErrorCode::BadFrame, message }).await;
                        break;
                    }
                }
            }
            Some(answer) = answers.next() => {
                held -= sizes.pop_front().unwrap_or(0);
                let mut sent = socket.feed(text_of(&answer)).await;
                // Every answer already ready goes out with this one, in one write.
                while sent.is_ok()
                    && let Some(answer) = answers.next().now_or_never().flatten()
                {
                    held -= sizes.pop_front().unwrap_or(0);
                    sent = socket.feed(text_of(&answer)).await;
                }
                if sent.is_err() || socket.flush().await.is_err() {
                    break;
                }
            }
            () = super::stopped(&mut shutdown) => {
                let message = "the relay is shutting down".to_owned();
                let _ = say(socket, &LinkAnswer::Error { code: ErrorCode::ShuttingDown, message }).await;
                break;
            }
        }
    }
}

/// Challenges the dialer, checks its hello against its relay's pinned key (fetched and pinned
/// on first contact), refuses a relay denied by name or by key, and welcomes it.
async fn handshake<S: RelayPins>(
    state: &RelayState<S>,
    socket: &mut WebSocket,
    ip: IpAddr,
) -> Result<(RelayName, RelayKey), (ErrorCode, String)> {
    let mut nonce = vec![0u8; 32];
    getrandom::fill(&mut nonce).map_err(|_| (ErrorCode::Internal, "no randomness".into()))?;
    let challenge = LinkAnswer::Challenge {
        v: LINK_VERSION,
        relay: state.name.clone(),
        nonce: nonce.clone(),
    };
    say(socket, &challenge)
        .await
        .map_err(|_| (ErrorCode::Internal, "the socket closed".into()))?;
    let within = state.config.auth_timeout();
    let text = match tokio::time::timeout(within, socket.recv()).await {
        Ok(Some(Ok(Message::Text(text)))) => text,
        Err(_) => {
            return Err((
                ErrorCode::AuthTimeout,
                format!("no hello within {within:?}"),
            ));
        }
        _ => return Err((ErrorCode::BadFrame, "expected a hello".into())),
    };
    let Ok(LinkRequest::Hello {
        relay,
        nonce: theirs,
        signature,
    }) = serde_json::from_str::<LinkRequest>(&text)
    else {
        return Err((ErrorCode::BadFrame, "expected a hello frame".into()));
    };
    if relay == state.name {
        return Err((
            ErrorCode::AuthFailed,
            format!("{relay} is this relay's own name"),
        ));
    }
    if !state.config.links_with(&relay) {
        return Err((
            ErrorCode::NotAllowed,
            format!("this relay does not take mail from {relay} (its operator denied it)"),
        ));
    }
    if theirs.len() != 32 {
        return Err((
            ErrorCode::BadFrame,
            "the hello's nonce is not 32 bytes".into(),
        ));
    }
    let key = peer::hello_key(state, &relay, ip)
        .await
        .map_err(|e| refused(&state.config, &relay, &e))?;
    let payload = link_payload(&relay, &state.name, &theirs, &nonce);
    verify_link(&key, Domain::LinkHello, &payload, &signature).map_err(|_| {
        let command = state.config.pins_command(&format!("trust {relay}"));
        tracing::warn!(%relay, %ip, "a link's hello is not signed by the key pinned for {relay}: someone else under its name, or {relay} has a new key; once its operator confirmed the new one, run `{command}`");
        (
            ErrorCode::AuthFailed,
            format!("the hello is not signed by {relay}'s key"),
        )
    })?;
    peer::refuse_denied(state, &relay, &key)
        .await
        .map_err(|e| refused(&state.config, &relay, &e))?;
    let welcome = LinkAnswer::Welcome {
        signature: state.identity.sign_link(Domain::LinkWelcome, &payload),
    };
    say(socket, &welcome)
        .await
        .map_err(|_| (ErrorCode::Internal, "the socket closed".into()))?;
    Ok((relay, key))
}

/// The refusal a dialer is told when `relay`'s key could not be had or is denied: never
/// another server's words (logged here instead, bounded).
fn refused(
    config: &super::super::RelayConfig,
    relay: &RelayName,
    e: &peer::PeerError,
) -> (ErrorCode, String) {
    match e {
        peer::PeerError::KeyChanged { .. } => {
            e.log_refusal(config, "refusing a link from a relay whose key changed");
        }
        _ => tracing::info!(%relay, error = %e, "cannot vouch for a relay that opened a link"),
    }
    let code = match e {
        peer::PeerError::Denied { .. } => ErrorCode::NotAllowed,
        _ => ErrorCode::AuthFailed,
    };
    (code, e.public(relay))
}

type Answer = std::pin::Pin<Box<dyn std::future::Future<Output = LinkAnswer> + Send>>;

/// Checks one delivery and queues its write; the answer resolves once it is durable.
/// The turn of the delivery before: resolved once its write is queued (or it needs none).
type Turn = tokio::sync::oneshot::Receiver<()>;
/// Says this delivery's write is queued; dropped unsent when it writes nothing.
type TurnDone = tokio::sync::oneshot::Sender<()>;

#[tracing::instrument(level = "debug", name = "link_delivery", skip_all, fields(%relay, seq = deliver.seq, id = %deliver.envelope.id, refused = tracing::field::Empty))]
fn take<S: Registry + Queue>(
    state: &Arc<RelayState<S>>,
    (relay, key): (&RelayName, &RelayKey),
    received: &Counter,
    deliver: Deliver<'_>,
    (before, queued): (Option<Turn>, TurnDone),
) -> Answer {
    let seq = deliver.seq;
    let later = |code, message: String, wait: Duration| -> Answer {
        let answer = LinkAnswer::Later {
            seq,
            code,
            message,
            retry_after_ms: wait.as_millis() as u64,
        };
        Box::pin(async move { answer })
    };
    if let Err(wait) = state.relay_rate.take(key) {
        state.metrics.reject(ErrorCode::RateLimited);
        return later(
            ErrorCode::RateLimited,
            format!(
                "{relay} is delivering faster than {}/s",
                state.config.relay_rate
            ),
            wait,
        );
    }
    let head = deliver.envelope;
    let mut refused = Vec::new();
    let refuse_every = |code| -> Vec<Refusal> {
        head.keys
            .iter()
            .map(|k| Refusal {
                to: k.to.clone(),
                code,
            })
            .collect()
    };
    if head.keys.is_empty() || head.keys.len() > state.config.limits.recipients {
        tracing::warn!(%relay, keys = head.keys.len(), "another relay delivered an envelope naming too many recipients; dropped");
        return refused_all(seq, Vec::new(), String::new());
    }
    if head.v != ENVELOPE_VERSION {
        return refused_all(seq, refuse_every(ErrorCode::InvalidEnvelope), String::new());
    }
    // A relay speaks only for its own agents, and for its own groups: a group copy may be from
    // any poster, but only the group's host fans it out.
    let group = match &deliver.group {
        Some(group) if group.host() != Some(relay) => {
            tracing::warn!(%relay, %group, "another relay delivered a copy of a group not its own; refused");
            return refused_all(seq, refuse_every(ErrorCode::NotSender), String::new());
        }
        Some(group) => match AgentName::remote_agent(group) {
            Some(name) => Some(name),
            None => {
                return refused_all(seq, refuse_every(ErrorCode::InvalidEnvelope), String::new());
            }
        },
        None if head.from.host() != Some(relay) => {
            tracing::warn!(%relay, from = %head.from, "another relay delivered mail from a sender not its own; refused");
            return refused_all(seq, refuse_every(ErrorCode::NotSender), String::new());
        }
        None => None,
    };
    // Kept under its full address: its consent rules, dedup and bounces are its own.
    let Some(sender) = AgentName::remote_agent(&head.from) else {
        return refused_all(seq, refuse_every(ErrorCode::InvalidEnvelope), String::new());
    };
    let limits = &state.config.limits;
    let mut copies: Vec<QueuedCopy> = Vec::with_capacity(head.keys.len());
    let mut names = Vec::with_capacity(head.keys.len());
    for key in &head.keys {
        let here = (key.to.host() == Some(&state.name)).then(|| key.to.name());
        let Some(name) = here.filter(|n| !names.contains(*n)) else {
            refused.push(Refusal {
                to: key.to.clone(),
                code: ErrorCode::UnknownRecipient,
            });
            continue;
        };
        let copy = head.copy_for(&key.to).expect("the key is in this envelope");
        if copy.len() > limits.envelope_bytes {
            refused.push(Refusal {
                to: key.to.clone(),
                code: ErrorCode::TooLarge,
            });
            continue;
        }
        names.push(name.clone());
        copies.push(QueuedCopy {
            id: None,
            recipient: name.clone(),
            envelope: copy.into(),
            group: group.clone(),
        });
    }
    let (state, id, received) = (state.clone(), head.id, received.clone());
    let addresses: Vec<_> = head.keys.iter().map(|k| k.to.clone()).collect();
    Box::pin(
        async move {
            let quota = Quota {
                count: state.config.quota_messages,
                bytes: state.config.quota_bytes,
            };
            let expires =
                jiff::Timestamp::now().as_millisecond() + (state.config.ttl_secs as i64) * 1000;
            let address_of = |name: &AgentName| {
                addresses
                    .iter()
                    .find(|a| a.name() == name)
                    .cloned()
                    .expect("every copy is for an address in the envelope")
            };
            // Registered names only; then the write, which applies consent and quotas to each
            // recipient (all or none, so a refused one is taken out and the rest written again).
            let mut kept = Vec::with_capacity(copies.len());
            for copy in copies {
                match state.is_registered(&copy.recipient).await {
                    Ok(true) => kept.push(copy),
                    Ok(false) => refused.push(Refusal {
                        to: address_of(&copy.recipient),
                        code: ErrorCode::UnknownRecipient,
                    }),
                    Err(e) => {
                        return LinkAnswer::Later {
                            seq,
                            code: ErrorCode::Internal,
                            message: e.to_string(),
                            retry_after_ms: 1000,
                        };
                    }
                }
            }
            // The delivery before this one has queued its write (or needs none).
            if let Some(before) = before {
                let _ = before.await;
            }
            let mut queued = Some(queued);
            while !kept.is_empty() {
                // Queued in call order: once called, the next delivery may queue its own.
                let pending = state.storage.accept(
                    sender.clone(),
                    id,
                    kept.clone(),
                    quota,
                    expires,
                    state.config.effective_default_policy(),
                );
                if let Some(queued) = queued.take() {
                    let _ = queued.send(());
                }
                let outcome = pending.await;
                let (out, code) = match outcome {
                    Ok(Accepted::Stored(recipients)) => {
                        let n = recipients.len() as u64;
                        state.metrics.accepted.inc_by(n);
                        state.metrics.queued.inc_by(n as i64);
                        received.inc_by(n);
                        break;
                    }
                    // A group copy its member's consent does not take (not joined, or blocking
                    // the sender) bounces to the sender like any refusal.
                    Ok(Accepted::Fanned { stored, skipped }) => {
                        let n = stored.len() as u64;
                        state.metrics.accepted.inc_by(n);
                        state.metrics.queued.inc_by(n as i64);
                        received.inc_by(n);
                        refused.extend(skipped.iter().map(|r| Refusal {
                            to: address_of(r),
                            code: ErrorCode::NotAllowed,
                        }));
                        break;
                    }
                    Ok(Accepted::Duplicate) => break,
                    Ok(Accepted::NotAllowed(r)) => (r, ErrorCode::NotAllowed),
                    Ok(Accepted::QuotaFull(r)) => (r, ErrorCode::QuotaFull),
                    Err(e) => {
                        return LinkAnswer::Later {
                            seq,
                            code: ErrorCode::Internal,
                            message: format!("not stored: {e}"),
                            retry_after_ms: 1000,
                        };
                    }
                };
                kept.retain(|c| c.recipient != out);
                refused.push(Refusal {
                    to: address_of(&out),
                    code,
                });
            }
            tracing::Span::current().record("refused", refused.len());
            LinkAnswer::Taken { seq, refused }
        }
        .instrument(tracing::Span::current()),
    )
}

/// An answer refusing every recipient (an envelope that cannot be read refuses none, and is
/// answered as taken: the dialing relay checked it when it took it, so only a broken relay
/// sends one, and its mail is its own).
fn refused_all(seq: Seq, refused: Vec<Refusal>, why: String) -> Answer {
    if !why.is_empty() {
        tracing::warn!(seq, %why, "another relay delivered an unreadable envelope; dropped");
    }
    Box::pin(async move { LinkAnswer::Taken { seq, refused } })
}

async fn say(socket: &mut WebSocket, answer: &LinkAnswer) -> Result<(), axum::Error> {
    socket.send(text_of(answer)).await
}

fn text_of(answer: &LinkAnswer) -> Message {
    Message::Text(
        serde_json::to_string(answer)
            .expect("link frames serialize")
            .into(),
    )
}
