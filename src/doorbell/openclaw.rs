//! The OpenClaw doorbell: each new message is delivered into the agent's dedicated OpenClaw
//! session, so an OpenClaw agent hears its mail without polling.
//!
//! For every ring about mail: `POST {gateway}/tools/invoke` with `sessions_send`, the
//! top-level `sessionKey` set to the target session (so the call comes from that session and
//! OpenClaw runs exactly one turn, not its agent-to-agent ping-pong through the main session),
//! `timeoutSeconds: 0`, and as the message the ring's framed text with a marker line on top
//! and a line naming the reply tool as OpenClaw shows it (`mailslot__reply`). A missing
//! session is created over the gateway's WebSocket ([`rpc`]), then the message is sent again.
//!
//! Deliveries run in their own task, one message after the other, and never block the MCP
//! server. Failures are retried with backoff for [`GIVE_UP_AFTER`]; after an unclear failure
//! (timeout, 5xx, a connection reset after sending) the session's history is searched for
//! the message's marker before sending again, so a message is never delivered twice. Every
//! failure is logged with what to fix and kept as a status for `mailslot doctor`. The message
//! itself is in the store whatever happens: the doorbell only rings.
//!
//! Of several `mailslot mcp` processes for one agent, only the one holding the agent's
//! `openclaw-doorbell.lock` delivers (the others would deliver the same mail again).

pub mod check;
pub mod gateway;
pub mod rpc;
pub mod status;

use std::fs::File;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio::task::AbortHandle;
use tokio::time::Instant;

use super::{Doorbell, Ring};
use crate::config::openclaw::OpenClawConfig;
use crate::mailbox::{Feed, Heard, Mailbox};
use crate::protocol::{Address, MessageId};
use gateway::{Failure, Gateway, Sent};
pub use status::{DeliveryState, DeliveryStatus};

/// How long a message is retried before it is given up (it stays in the inbox).
pub const GIVE_UP_AFTER: Duration = Duration::from_secs(15 * 60);
/// Messages waiting for delivery before new ones are dropped (they stay in the inbox).
const QUEUE: usize = 1024;
/// The first and the longest wait between attempts.
const FIRST_WAIT: Duration = Duration::from_secs(1);
const LONGEST_WAIT: Duration = Duration::from_secs(60);
/// Over this size a message is announced rather than shown (the gateway takes 2 MiB bodies).
const MAX_MESSAGE_BYTES: usize = 1024 * 1024;
/// The lock file that elects the delivering process, in the agent's folder.
const LOCK_FILE: &str = "openclaw-doorbell.lock";

/// The marker that identifies a message's delivery in a session's history.
pub fn marker(id: &MessageId) -> String {
    format!("[mailslot:{id}]")
}

/// The text delivered into the session for the ring about message `id`: the marker line,
/// the framed message, and how to reply with the tool as OpenClaw names it.
pub fn compose(config: &OpenClawConfig, mailbox: &Address, id: &MessageId, ring: &Ring) -> String {
    let reply = config.reply_tool();
    // The owner's verified message has no sender to reply to: the owner reads the session.
    let (head, how) = if ring.meta.get("trust").map(String::as_str) == Some("owner") {
        (
            format!(
                "{} A message from your owner to {mailbox}, delivered by mailslot.",
                marker(id)
            ),
            "How to answer: in this session; your owner reads it here (not with the reply tool)."
                .to_owned(),
        )
    } else {
        (
            format!(
                "{} New mail for {mailbox}, delivered by mailslot.",
                marker(id)
            ),
            format!(
                "How to reply: call the tool {reply} with message_id \"{id}\" (the reply goes to the sender through mailslot)."
            ),
        )
    };
    let text = format!("{head}\n{}\n{how}", ring.content);
    if text.len() <= MAX_MESSAGE_BYTES {
        return text;
    }
    format!(
        "{head}\nIt is too large to show here ({} bytes): read it with the tool {}__read and message_id \"{id}\".\n{how}",
        ring.content.len(),
        config.mcp_server
    )
}

/// Starts the OpenClaw doorbell when `config` is there (the `[openclaw]` table) and names this
/// agent. A doorbell that cannot start is logged and left out: the MCP server runs anyway.
pub fn start(
    config: Option<&OpenClawConfig>,
    mailbox: &Mailbox,
    doorbell: &Doorbell,
) -> Option<OpenClawSink> {
    OpenClawSink::start(config?.clone(), mailbox, doorbell).unwrap_or_else(|e| {
        tracing::error!(
            "the OpenClaw doorbell did not start (mail still arrives in the inbox): {e}"
        );
        None
    })
}

/// A running OpenClaw doorbell; dropping it stops it.
pub struct OpenClawSink {
    status: watch::Receiver<Option<DeliveryStatus>>,
    tasks: Vec<AbortHandle>,
}

impl OpenClawSink {
    /// Starts delivering `mailbox`'s mail rung by `doorbell` into OpenClaw, unless `config`
    /// leaves this agent out (`Ok(None)`). Fails only when no HTTP client can be made.
    pub fn start(
        config: OpenClawConfig,
        mailbox: &Mailbox,
        doorbell: &Doorbell,
    ) -> Result<Option<Self>, String> {
        if !config.rings_for(mailbox.name()) {
            tracing::info!(agent = %mailbox.name(), "openclaw.agents leaves this agent out; no OpenClaw doorbell");
            return Ok(None);
        }
        let gateway = Gateway::new(config.gateway_url.clone(), config.token.clone())?;
        if let Err(f) = gateway.token() {
            // Said now so the owner sees it at start; read again at each attempt.
            tracing::warn!(
                "OpenClaw doorbell: {}",
                f.describe(&config.gateway_url, &config.token)
            );
        }
        if !config.gateway_url.is_loopback() && !config.gateway_url.is_tls() {
            tracing::warn!(
                "OpenClaw doorbell: {} is plain http to another machine, so the gateway token crosses the network unencrypted; use https://",
                config.gateway_url
            );
        }
        let (status_tx, status) = watch::channel(status::load(mailbox.dir()));
        let (queue, waiting) = mpsc::channel(QUEUE);
        let rings = doorbell.subscribe("openclaw");
        let sink = Arc::new(Worker {
            lock: std::sync::Mutex::new(DeliveryLock::new(mailbox.dir().join(LOCK_FILE))),
            address: mailbox.address().clone(),
            mailbox: mailbox.name().clone(),
            config,
            gateway,
            status: status_tx,
        });
        let reader = tokio::spawn(read_rings(rings, queue));
        let worker = tokio::spawn(run(sink, waiting));
        let writer = tokio::spawn(persist(status.clone(), mailbox.dir().to_owned()));
        Ok(Some(Self {
            status,
            tasks: vec![
                reader.abort_handle(),
                worker.abort_handle(),
                writer.abort_handle(),
            ],
        }))
    }

    /// Watches the last delivery's outcome.
    pub fn status(&self) -> watch::Receiver<Option<DeliveryStatus>> {
        self.status.clone()
    }
}

impl Drop for OpenClawSink {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// A ring about mail, waiting for delivery.
struct Pending {
    id: MessageId,
    ring: Ring,
    rang_at: Instant,
}

/// Moves rings about mail into the queue at once, so a slow delivery never makes the
/// doorbell drop rings.
async fn read_rings(mut rings: Feed<Ring>, queue: mpsc::Sender<Pending>) {
    loop {
        let ring = match rings.next().await {
            Some(Heard::Event(ring)) => ring,
            // Missed rings are not delivered: the inbox still has the mail.
            Some(Heard::Missed(_)) => continue,
            None => return,
        };
        let Some(id) = ring.message else { continue };
        let pending = Pending {
            id,
            ring,
            rang_at: Instant::now(),
        };
        if queue.try_send(pending).is_err() {
            tracing::warn!(%id, "OpenClaw doorbell: {QUEUE} messages wait already; this one is not delivered (it is in the inbox)");
        }
    }
}

/// Writes each new status to the agent's folder for `mailslot doctor`, one write at a time,
/// so the file always ends with the latest.
async fn persist(mut status: watch::Receiver<Option<DeliveryStatus>>, dir: PathBuf) {
    status.mark_unchanged();
    while status.changed().await.is_ok() {
        let Some(latest) = status.borrow_and_update().clone() else {
            continue;
        };
        let dir = dir.clone();
        let saved = tokio::task::spawn_blocking(move || status::save(&dir, &latest)).await;
        if let Ok(Err(e)) = saved {
            tracing::warn!(error = %e, "cannot record the OpenClaw delivery status");
        }
    }
}

async fn run(worker: Arc<Worker>, mut waiting: mpsc::Receiver<Pending>) {
    while let Some(pending) = waiting.recv().await {
        worker.send_to_session(pending).await;
    }
}

struct Worker {
    config: OpenClawConfig,
    gateway: Gateway,
    mailbox: crate::protocol::AgentName,
    address: Address,
    lock: std::sync::Mutex<DeliveryLock>,
    status: watch::Sender<Option<DeliveryStatus>>,
}

/// How an attempt ended.
enum Step {
    /// Delivered (sent now, or found in the session).
    Delivered {
        found: bool,
    },
    /// Try again at once (the session was just created).
    Again,
    Failed(Failure),
}

impl Worker {
    async fn send_to_session(&self, pending: Pending) {
        let Pending { id, ring, rang_at } = pending;
        if !self.lock.lock().expect("not poisoned").holds() {
            tracing::debug!(%id, "another mailslot process delivers this agent's mail to OpenClaw");
            return;
        }
        let from = ring
            .meta
            .get("from")
            .map(String::as_str)
            .unwrap_or_default();
        let key = self
            .config
            .session_key
            .render(&self.config.agent_id, &self.mailbox, from);
        let marker = marker(&id);
        let text = compose(&self.config, &self.address, &id, &ring);
        let deadline = rang_at + GIVE_UP_AFTER;
        let mut state = Attempts::default();
        let mut reported: Option<String> = None;
        loop {
            let failure = match self.attempt(&key, &marker, &text, &mut state).await {
                Step::Delivered { found } => {
                    tracing::info!(%id, session = %key, found_in_history = found, "delivered to OpenClaw");
                    self.record(DeliveryState::Delivered, &id, &key, None);
                    return;
                }
                Step::Again => continue,
                Step::Failed(f) => f,
            };
            let message = failure.describe(&self.config.gateway_url, &self.config.token);
            if !failure.retryable() {
                tracing::error!(%id, session = %key, "OpenClaw delivery failed, not retried (the message is in the inbox): {message}");
                self.record(DeliveryState::Failed, &id, &key, Some(message));
                return;
            }
            let wait = failure.retry_after().unwrap_or_else(|| state.backoff());
            if Instant::now() + wait > deadline {
                tracing::error!(%id, session = %key, "OpenClaw delivery given up after {} min (the message is in the inbox): {message}", GIVE_UP_AFTER.as_secs() / 60);
                self.record(DeliveryState::Failed, &id, &key, Some(message));
                return;
            }
            if reported.as_ref() != Some(&message) {
                tracing::warn!(%id, session = %key, retry_in_ms = wait.as_millis() as u64, "OpenClaw delivery failed: {message}");
                self.record(DeliveryState::Retrying, &id, &key, Some(message.clone()));
                reported = Some(message);
            } else {
                tracing::debug!(%id, "OpenClaw delivery failed again: {message}");
            }
            tokio::time::sleep(wait).await;
        }
    }

    async fn attempt(&self, key: &str, marker: &str, text: &str, state: &mut Attempts) -> Step {
        if state.maybe_sent {
            match self.gateway.history_has(key, marker).await {
                Ok(true) => return Step::Delivered { found: true },
                Ok(false) => state.maybe_sent = false,
                Err(f) => return Step::Failed(f),
            }
        }
        match self.gateway.send(key, text).await {
            Sent::Accepted { run_id } => {
                tracing::debug!(
                    run_id = run_id.as_deref().unwrap_or("?"),
                    "OpenClaw accepted the message"
                );
                Step::Delivered { found: false }
            }
            Sent::NoSession if state.created => Step::Failed(Failure::Session(format!(
                "the gateway still says \"No session found: {key}\" after creating it; check that openclaw.agent_id ({}) is an agent in openclaw.json",
                self.config.agent_id
            ))),
            Sent::NoSession => {
                let token = match self.gateway.token() {
                    Ok(t) => t,
                    Err(f) => return Step::Failed(f),
                };
                let label = format!("mailslot {key}");
                match rpc::ensure_session(
                    &self.config.gateway_url,
                    &token,
                    key,
                    &self.config.agent_id,
                    &label,
                )
                .await
                {
                    Ok(created) => {
                        tracing::info!(session = %key, created, "OpenClaw session ready");
                        state.created = true;
                        Step::Again
                    }
                    Err(e) => Step::Failed(Failure::Session(e.to_string())),
                }
            }
            Sent::Failed(f) => {
                if f.ambiguous() {
                    state.maybe_sent = true;
                }
                Step::Failed(f)
            }
        }
    }

    /// Keeps the outcome for watchers and, in the agent's folder, for `mailslot doctor`.
    fn record(&self, state: DeliveryState, id: &MessageId, key: &str, error: Option<String>) {
        let status = DeliveryStatus {
            state,
            message_id: id.to_string(),
            session_key: key.to_owned(),
            at: jiff::Timestamp::now(),
            error,
        };
        self.status.send_replace(Some(status));
    }
}

/// What one message's attempts have learned.
#[derive(Default)]
struct Attempts {
    /// An attempt may have delivered it: search the session before sending again.
    maybe_sent: bool,
    /// The session was created (or found) for it.
    created: bool,
    /// Waits so far.
    waits: u32,
}

impl Attempts {
    /// 1 s, 2 s, 4 s … up to a minute, each ±20 % so that processes do not retry in step.
    fn backoff(&mut self) -> Duration {
        let base = FIRST_WAIT
            .saturating_mul(1 << self.waits.min(6))
            .min(LONGEST_WAIT);
        self.waits += 1;
        let mut byte = [0u8; 1];
        let _ = getrandom::fill(&mut byte);
        let factor = 0.8 + 0.4 * f64::from(byte[0]) / 255.0;
        base.mul_f64(factor)
    }
}

/// The lock that makes one process per agent the one that delivers.
struct DeliveryLock {
    path: PathBuf,
    held: Option<File>,
}

impl DeliveryLock {
    fn new(path: PathBuf) -> Self {
        Self { path, held: None }
    }

    /// Whether this process delivers: it holds the lock, or takes it now. If the lock file
    /// cannot be used at all, this process delivers (a duplicate is better than silence).
    fn holds(&mut self) -> bool {
        if self.held.is_some() {
            return true;
        }
        let file = match std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&self.path)
        {
            Ok(f) => f,
            Err(e) => {
                tracing::warn!(error = %e, path = %self.path.display(), "cannot open the OpenClaw doorbell lock; delivering anyway");
                return true;
            }
        };
        match file.try_lock() {
            Ok(()) => {
                self.held = Some(file);
                true
            }
            Err(std::fs::TryLockError::WouldBlock) => false,
            Err(std::fs::TryLockError::Error(e)) => {
                tracing::warn!(error = %e, "cannot take the OpenClaw doorbell lock; delivering anyway");
                true
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn config() -> OpenClawConfig {
        #[derive(serde::Deserialize)]
        struct File {
            openclaw: OpenClawConfig,
        }
        toml::from_str::<File>("[openclaw]\ntoken_env = \"T\"\n")
            .unwrap()
            .openclaw
    }

    #[test]
    fn the_message_starts_with_the_marker_and_names_the_reply_tool() {
        let id = MessageId::new();
        let ring = Ring {
            message: Some(id),
            content: format!(
                "[mailslot message {id}]\nFrom: alice\n<<<mailslot-untrusted n>>>\nhi\n<<<end mailslot-untrusted n>>>\nreminder"
            ),
            meta: BTreeMap::new(),
        };
        let bob = Address::parse("bob").unwrap();
        let text = compose(&config(), &bob, &id, &ring);
        assert!(
            text.starts_with(&format!("[mailslot:{id}] New mail for bob")),
            "{text}"
        );
        assert!(gateway::carries_marker(&text, &marker(&id)));
        assert!(text.contains(&ring.content));
        assert!(text.ends_with(&format!("call the tool mailslot__reply with message_id \"{id}\" (the reply goes to the sender through mailslot).")), "{text}");

        let owners = Ring {
            meta: BTreeMap::from([("trust".to_owned(), "owner".to_owned())]),
            ..ring.clone()
        };
        let text = compose(&config(), &bob, &id, &owners);
        assert!(
            text.starts_with(&format!("[mailslot:{id}] A message from your owner to bob")),
            "{text}"
        );
        assert!(gateway::carries_marker(&text, &marker(&id)));
        assert!(text.ends_with("not with the reply tool)."), "{text}");

        let huge = Ring {
            content: "x".repeat(MAX_MESSAGE_BYTES + 1),
            ..ring
        };
        let text = compose(&config(), &bob, &id, &huge);
        assert!(
            text.len() < 1000 && text.contains("mailslot__read"),
            "{text}"
        );
    }

    #[test]
    fn backoff_doubles_to_a_minute_with_jitter() {
        let mut a = Attempts::default();
        let waits: Vec<Duration> = (0..10).map(|_| a.backoff()).collect();
        assert!(waits[0] >= Duration::from_millis(800) && waits[0] <= Duration::from_millis(1200));
        assert!(waits[3] >= Duration::from_millis(6400) && waits[3] <= Duration::from_millis(9600));
        assert!(waits.iter().all(|w| *w <= LONGEST_WAIT.mul_f64(1.2)));
        assert!(waits[9] >= LONGEST_WAIT.mul_f64(0.8));
    }

    #[test]
    fn one_process_delivers() {
        let dir = tempfile::tempdir().unwrap();
        let mut first = DeliveryLock::new(dir.path().join(LOCK_FILE));
        let mut second = DeliveryLock::new(dir.path().join(LOCK_FILE));
        assert!(first.holds());
        assert!(!second.holds());
        assert!(first.holds());
        drop(first);
        assert!(second.holds());
    }
}
