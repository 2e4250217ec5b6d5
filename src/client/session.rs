//! The long-running client: stays connected, reconnects with jittered exponential backoff,
//! sends the outbox whenever asked (and after every reconnect), takes delivery of mail as it
//! is pushed, and tells its one [`Listener`] (the mailbox) what happened, as it happens. A
//! send waiting for the relay's answer gets its own ([`SessionHandle::expect`]), resolved the
//! moment that message is recorded, never by filtering a stream of everyone's answers.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{Notify, mpsc, oneshot, watch};

use super::bounces;
use super::deliveries;
use super::denials;
use super::inbound::{Received, open_parked, receive};
use super::outbound::{Answered, flush};
use super::{ClientError, Connection, RelayUrl, refusal};
use crate::crypto::Identity;
use crate::protocol::{
    AgentName, Bounce, ClientFrame, ConsentEvent, MessageId, OwnerKey, RelayName, ServerFrame,
    Shown,
};
use crate::store::{Delivery, OpenCopy, ReceiptRecord, StoreHandle, Trust};

/// Keepalive interval (the relay closes sockets silent for 90 s).
const PING_EVERY: Duration = Duration::from_secs(30);
/// How often letters kept for their senders' relays are looked at (the first try waits as
/// long: `store::parked`'s backoff starts there).
const PARKED_BEAT: Duration = Duration::from_secs(15);
/// First and longest waits between reconnection attempts.
const BACKOFF_MIN: Duration = Duration::from_millis(250);
const BACKOFF_MAX: Duration = Duration::from_secs(30);
/// Requests waiting for the connection.
const CALL_QUEUE: usize = 64;
/// How soon after a send the relay is asked whether its copies were taken, and the longest
/// wait between such checks while copies are open (the wait doubles from one to the other).
const CHECK_SOON: Duration = Duration::from_secs(2);
const CHECK_MAX: Duration = Duration::from_secs(60);

/// What the session reports to its listener.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientEvent {
    /// Authenticated with the relay.
    Connected {
        /// Messages that were waiting.
        waiting: u64,
    },
    /// The connection dropped or could not be made; the session retries after `retry_in`.
    Disconnected {
        /// Why, for people.
        reason: String,
        /// When the next attempt is.
        retry_in: Duration,
    },
    /// A received message was committed to the store.
    NewMail {
        /// Its id.
        id: MessageId,
        /// How far its sender is vouched for.
        trust: Trust,
    },
    /// News from the relay about the agent's contacts and sent mail.
    Relay(RelayNews),
}

/// News from the relay, recorded in the store (where there is anything to record) before it
/// is told. The mailbox passes it on to its subscribers as it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RelayNews {
    /// Consent news.
    Consent(ConsentEvent),
    /// Copies of sent messages expired on the relay undelivered.
    Bounced(Vec<Bounce>),
    /// Recipients took their copies of sent messages, as the relay said (each once).
    Delivered(Vec<Delivery>),
    /// Another agent was refused files this agent reserved, and waits for them.
    Waiting(crate::protocol::Waiting),
    /// A recipient read or acknowledged a sent message.
    Receipt {
        /// The sent message.
        of: MessageId,
        /// What was recorded (its answer is the recipient's words: frame it).
        record: ReceiptRecord,
    },
}

impl RelayNews {
    /// Whether the sent view changed: a copy was delivered or bounced, or a receipt came.
    pub fn changes_sent_view(&self) -> bool {
        matches!(
            self,
            RelayNews::Bounced(_) | RelayNews::Delivered(_) | RelayNews::Receipt { .. }
        )
    }
}

/// Hears the session's events, in order, on the session's task: it must return at once.
pub trait Listener: Send + Sync + 'static {
    /// One event.
    fn heard(&self, event: ClientEvent);
}

/// The relay's answer for one message a caller waits for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SendAnswer {
    /// The relay stored it for its recipients.
    Sent,
    /// It was refused: for good (`will_retry` false, marked failed), or for now.
    NotSent {
        /// Why.
        reason: String,
        /// Whether it stays queued.
        will_retry: bool,
    },
    /// The connection was lost before the answer; it stays queued.
    Offline {
        /// Why, for people.
        reason: String,
    },
}

/// The sends waiting for their answers, by message.
#[derive(Default)]
struct Waiting(Mutex<HashMap<MessageId, oneshot::Sender<SendAnswer>>>);

impl Waiting {
    fn answer(&self, id: &MessageId, answer: SendAnswer) {
        if let Some(waiter) = self.0.lock().expect("not poisoned").remove(id) {
            let _ = waiter.send(answer);
        }
    }

    fn answer_all(&self, answer: &SendAnswer) {
        for (_, waiter) in self.0.lock().expect("not poisoned").drain() {
            let _ = waiter.send(answer.clone());
        }
    }
}

/// One send's answer, to come. Made before the message is queued, so the answer cannot come
/// first; dropping it stops waiting.
pub struct WaitingSend {
    id: MessageId,
    answer: oneshot::Receiver<SendAnswer>,
    waiting: Arc<Waiting>,
}

impl WaitingSend {
    /// The answer; `None` when the session stopped first.
    pub async fn answer(&mut self) -> Option<SendAnswer> {
        (&mut self.answer).await.ok()
    }
}

impl Drop for WaitingSend {
    fn drop(&mut self) {
        self.waiting
            .0
            .lock()
            .expect("not poisoned")
            .remove(&self.id);
    }
}

/// Builds a request frame around the reference the session picks.
pub type MakeFrame = Box<dyn FnOnce(String) -> ClientFrame + Send>;

/// A request for the relay and where its answer goes.
struct Call {
    make: MakeFrame,
    answer: oneshot::Sender<Result<ServerFrame, ClientError>>,
}

/// Controls a running session.
pub struct SessionHandle {
    flush: Arc<Notify>,
    stop: watch::Sender<bool>,
    waiting: Arc<Waiting>,
    calls: mpsc::Sender<Call>,
    /// Closes (its sender dropped) when the session's task has ended, however it ended.
    ended: watch::Receiver<()>,
}

impl SessionHandle {
    /// Asks the session to send the outbox now (after queueing a message).
    pub fn flush(&self) {
        self.flush.notify_one();
    }

    /// Waits for the relay's answer for message `id`: call it before queueing the message.
    pub fn expect(&self, id: MessageId) -> WaitingSend {
        let (tx, answer) = oneshot::channel();
        self.waiting.0.lock().expect("not poisoned").insert(id, tx);
        WaitingSend {
            id,
            answer,
            waiting: self.waiting.clone(),
        }
    }

    /// Sends a request over the session's connection and waits for the answer (refusals are
    /// errors). While disconnected it fails at once with [`ClientError::Unreachable`]: the
    /// session owns the agent's only connection, so nothing else may open another.
    pub async fn call(&self, make: MakeFrame) -> Result<ServerFrame, ClientError> {
        let (answer, answered) = oneshot::channel();
        let gone = || ClientError::Closed("the session has stopped".into());
        self.calls
            .send(Call { make, answer })
            .await
            .map_err(|_| gone())?;
        answered.await.map_err(|_| gone())?
    }

    /// Stops the session after the current step and waits until its task has ended, so its
    /// connection is closed and it hears nothing more. Others may still share the handle: their
    /// calls then fail as the session's.
    pub async fn stop(&self) {
        let _ = self.stop.send(true);
        let mut ended = self.ended.clone();
        while ended.changed().await.is_ok() {}
    }
}

/// What a session needs.
pub struct SessionConfig {
    /// The relay.
    pub url: RelayUrl,
    /// The agent.
    pub agent: AgentName,
    /// Its keys.
    pub identity: Arc<Identity>,
    /// Its owner's public key, registered with the relay if it has none yet.
    pub owner: Option<OwnerKey>,
    /// Its store.
    pub store: StoreHandle,
    /// Other relays reached over plain HTTP besides loopback (the config's `trusted_hosts`).
    pub trusted: Vec<RelayName>,
    /// Whether its connection shows the agent online (not when an owner's window holds it).
    pub shown: Shown,
}

/// Starts the session in the background; `listener` hears every event from the first
/// connection on.
pub fn spawn(config: SessionConfig, listener: Arc<dyn Listener>) -> SessionHandle {
    let flush = Arc::new(Notify::new());
    let waiting = Arc::new(Waiting::default());
    let (stop, stopped) = watch::channel(false);
    let (calls, queue) = mpsc::channel(CALL_QUEUE);
    let me = Me {
        config,
        listener,
        waiting: waiting.clone(),
    };
    let (alive, ended) = watch::channel(());
    let flush_now = flush.clone();
    tokio::spawn(async move {
        let _alive = alive;
        run(me, flush_now, queue, stopped).await;
    });
    SessionHandle {
        flush,
        stop,
        waiting,
        calls,
        ended,
    }
}

/// The session's own state: its configuration and whom it tells.
struct Me {
    config: SessionConfig,
    listener: Arc<dyn Listener>,
    waiting: Arc<Waiting>,
}

impl Me {
    fn emit(&self, event: ClientEvent) {
        self.listener.heard(event);
    }
}

/// A wait between `BACKOFF_MIN` and `BACKOFF_MAX`, doubling per failure, with ±50 % jitter so
/// that many agents do not reconnect in lockstep after a relay restart.
fn backoff(failures: u32) -> Duration {
    let base = BACKOFF_MIN
        .saturating_mul(1 << failures.min(16))
        .min(BACKOFF_MAX);
    let mut byte = [0u8; 1];
    let _ = getrandom::fill(&mut byte);
    base.mul_f64(0.5 + f64::from(byte[0]) / 255.0)
}

async fn run(
    me: Me,
    flush_now: Arc<Notify>,
    mut calls: mpsc::Receiver<Call>,
    mut stop: watch::Receiver<bool>,
) {
    let mut failures = 0u32;
    loop {
        let error = tokio::select! {
            _ = stop.wait_for(|s| *s) => return,
            error = connected(&me, &flush_now, &mut calls, &mut failures) => error,
        };
        let reason = error.to_string();
        let retry_in = backoff(failures);
        failures = failures.saturating_add(1);
        me.emit(ClientEvent::Disconnected {
            reason: reason.clone(),
            retry_in,
        });
        // After the listener heard it, so a send that saw no outage yet is answered here.
        me.waiting.answer_all(&SendAnswer::Offline {
            reason: reason.clone(),
        });
        let pause = tokio::time::sleep(retry_in);
        tokio::pin!(pause);
        loop {
            tokio::select! {
                _ = stop.wait_for(|s| *s) => return,
                _ = &mut pause => break,
                Some(call) = calls.recv() => {
                    let _ = call.answer.send(Err(ClientError::Unreachable {
                        url: me.config.url.to_string(),
                        reason: reason.clone(),
                    }));
                }
            }
        }
    }
}

/// One connection's life, until it is lost. A successful connection resets the backoff.
async fn connected(
    me: &Me,
    flush_now: &Notify,
    calls: &mut mpsc::Receiver<Call>,
    failures: &mut u32,
) -> ClientError {
    match serve(me, flush_now, calls, failures).await {
        Ok(never) => match never {},
        Err(e) => e,
    }
}

async fn serve(
    me: &Me,
    flush_now: &Notify,
    calls: &mut mpsc::Receiver<Call>,
    failures: &mut u32,
) -> Result<std::convert::Infallible, ClientError> {
    let config = &me.config;
    let mut conn = Connection::connect_shown(
        &config.url,
        &config.agent,
        &config.identity,
        config.owner,
        config.shown,
    )
    .await?;
    *failures = 0;
    me.emit(ClientEvent::Connected {
        waiting: conn.waiting(),
    });
    send_outbox(&mut conn, me).await?;
    collect_bounces(&mut conn, me).await?;
    let mut checks = Checks::default();
    check_deliveries(&mut conn, me, &mut checks).await?;
    let mut ping = tokio::time::interval(PING_EVERY);
    ping.tick().await;
    // Letters kept for their senders' relays are tried on this beat; each waits its own
    // backoff in the store, so a beat with nothing due reads one index and does nothing.
    let mut parked = tokio::time::interval(PARKED_BEAT);
    loop {
        let next_check = checks.next;
        // Acknowledge what is committed before waiting for more.
        if !conn.has_backlog() {
            conn.ack_committed().await?;
        }
        tokio::select! {
            frame = conn.recv() => match refusal(frame?)? {
                ServerFrame::Deliver { seq, envelope } => {
                    let received = receive(&mut conn, &config.store, &config.trusted, &config.agent, &config.identity, envelope).await?;
                    announce(me, received);
                    conn.committed(seq).await?;
                }
                ServerFrame::Event { event: ConsentEvent::Bounced {} } => {
                    collect_bounces(&mut conn, me).await?;
                }
                ServerFrame::Event { event: ConsentEvent::Waiting(waiting) } => {
                    me.emit(ClientEvent::Relay(RelayNews::Waiting(waiting)));
                }
                ServerFrame::Event { event } => {
                    // A hidden connection (the dashboard) is no session of the agent: it shows
                    // a denial but keeps none, so the agent's own next session (which the
                    // relay tells again) still hears it as news.
                    let news = config.shown == Shown::Hidden
                        || denials::keep(&config.store, &event).await?;
                    if news {
                        me.emit(ClientEvent::Relay(RelayNews::Consent(event)));
                    }
                }
                _ => {}
            },
            _ = flush_now.notified() => {
                if send_outbox(&mut conn, me).await? {
                    checks.soon();
                }
            }
            _ = sleep_until(next_check) => check_deliveries(&mut conn, me, &mut checks).await?,
            Some(call) = calls.recv() => {
                let answer = conn.call(call.make).await;
                // A lost connection fails the call and ends this connection's life.
                let lost = matches!(answer, Err(ClientError::Closed(_) | ClientError::Unreachable { .. }));
                let reason = answer.as_ref().err().map(ToString::to_string);
                let _ = call.answer.send(answer);
                if lost {
                    return Err(ClientError::Closed(reason.unwrap_or_default()));
                }
            }
            _ = ping.tick() => conn.send(&ClientFrame::Ping {}).await?,
            _ = parked.tick() => open_parked_due(&mut conn, me).await?,
        }
    }
}

/// Tells the listener what became of a delivery.
fn announce(me: &Me, received: Received) {
    match received {
        Received::New { id, from, trust } => {
            tracing::debug!(%id, %from, "received and committed");
            if trust == Trust::KeyChanged {
                tracing::warn!(%from, %id, "a sender's key changed; the message is marked untrusted");
            }
            me.emit(ClientEvent::NewMail { id, trust });
        }
        Received::Receipt { of, record } => {
            me.emit(ClientEvent::Relay(RelayNews::Receipt { of, record }));
        }
        Received::Duplicate(_)
        | Received::Unreadable { .. }
        | Received::Parked { .. }
        | Received::Rotated { .. } => {}
    }
}

/// Opens the letters kept for their senders' relays whose next try is due.
async fn open_parked_due(conn: &mut Connection, me: &Me) -> Result<(), ClientError> {
    let config = &me.config;
    let opened = open_parked(
        conn,
        &config.store,
        &config.trusted,
        &config.agent,
        &config.identity,
        false,
    )
    .await?;
    for received in opened {
        announce(me, received);
    }
    Ok(())
}

async fn collect_bounces(conn: &mut Connection, me: &Me) -> Result<(), ClientError> {
    let recorded = bounces::collect(conn, &me.config.store).await?;
    if !recorded.is_empty() {
        tracing::warn!(
            count = recorded.len(),
            "sent mail expired on the relay undelivered; marked bounced"
        );
        me.emit(ClientEvent::Relay(RelayNews::Bounced(recorded)));
    }
    Ok(())
}

/// When to ask the relay again where this agent's open copies stand.
struct Checks {
    /// Where the last check stopped.
    cursor: Option<OpenCopy>,
    /// The next check; none while no copy is open.
    next: Option<tokio::time::Instant>,
    /// The wait after the next check.
    wait: Duration,
}

impl Default for Checks {
    fn default() -> Self {
        Self {
            cursor: None,
            next: None,
            wait: CHECK_SOON,
        }
    }
}

impl Checks {
    /// Copies were just sent: check soon, then back off again.
    fn soon(&mut self) {
        let soon = tokio::time::Instant::now() + CHECK_SOON;
        self.next = Some(self.next.map_or(soon, |next| next.min(soon)));
        self.wait = CHECK_SOON;
    }

    /// A check ended: again after the wait (doubled for the next time) while copies are
    /// open, else not until a send.
    fn checked(&mut self, again: bool) {
        if again {
            self.next = Some(tokio::time::Instant::now() + self.wait);
            self.wait = (self.wait * 2).min(CHECK_MAX);
        } else {
            self.next = None;
        }
    }
}

/// Waits until `at`, or forever when there is nothing to wait for.
async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Asks the relay where the open copies stand, records and announces the deliveries, and
/// collects bounces it mentions.
async fn check_deliveries(
    conn: &mut Connection,
    me: &Me,
    checks: &mut Checks,
) -> Result<(), ClientError> {
    let checked = deliveries::check(conn, &me.config.store, &mut checks.cursor).await?;
    if !checked.delivered.is_empty() {
        me.emit(ClientEvent::Relay(RelayNews::Delivered(checked.delivered)));
    }
    if checked.bounced {
        collect_bounces(conn, me).await?;
    }
    checks.checked(checked.open && !checked.unsupported);
    Ok(())
}

/// Sends the outbox, answering each waiting send as its message is recorded; returns whether
/// the relay took any message.
async fn send_outbox(conn: &mut Connection, me: &Me) -> Result<bool, ClientError> {
    let config = &me.config;
    let mut sent = false;
    flush(
        conn,
        &config.store,
        &config.trusted,
        &config.identity,
        &mut |answered: Answered<'_>| match answered {
            Ok(id) => {
                sent = true;
                me.waiting.answer(&id, SendAnswer::Sent);
            }
            Err(failure) => me.waiting.answer(
                &failure.id,
                SendAnswer::NotSent {
                    reason: failure.reason.clone(),
                    will_retry: failure.will_retry,
                },
            ),
        },
    )
    .await?;
    Ok(sent)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_with_jitter_and_is_capped() {
        for failures in 0..40 {
            let wait = backoff(failures);
            let base = BACKOFF_MIN
                .saturating_mul(1 << failures.min(16))
                .min(BACKOFF_MAX);
            assert!(
                wait >= base.mul_f64(0.5) && wait <= base.mul_f64(1.5),
                "{failures}: {wait:?}"
            );
        }
        assert!(backoff(40) <= BACKOFF_MAX.mul_f64(1.5));
    }
}
