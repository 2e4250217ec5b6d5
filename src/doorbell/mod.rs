//! Doorbells: turn "a message was committed to the store" (and consent news) into pushes
//! into the LLM client's session. This module renders each event once, framed
//! ([`frame`]); the sinks (MCP notifications, Claude Code channel events) subscribe to the
//! rings. The unread footer ([`footer`]) is the pull-side fallback on every tool result.

pub mod bell;
pub mod claude_code;
pub mod codex;
pub mod digest;
pub mod footer;
pub mod frame;
pub mod hooks;
pub mod openclaw;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use tokio::sync::broadcast;
use tokio::time::{Duration, Instant};

use crate::client::RelayNews;
use crate::mailbox::{Arrived, Feed, Heard, Mailbox, MailboxError, MailboxEvent};
use crate::protocol::{Address, AgentName, Bounce, ConsentEvent, MessageId, ReceiptKind, Waiting};
use crate::store::{ReceiptRecord, Trust};
use frame::{SenderFacts, fence_line, frame_message, mcp_reply_hint};

/// Rings kept for slow sinks before the oldest are dropped (the inbox still has the mail;
/// see [`Feed`] for what a sink that falls behind is told).
const RING_BACKLOG: usize = 256;

/// One ring of the doorbell, rendered for a model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ring {
    /// The message that arrived, if this ring is about mail.
    pub message: Option<MessageId>,
    /// What the model is shown (framed when it carries another agent's words).
    pub content: String,
    /// Identifier keys to string values: `kind`, and for mail `from`, `message_id`,
    /// `thread_id`, `trust`.
    pub meta: BTreeMap<String, String>,
}

/// The `from` of a ring for the owner's verified message: no agent is named so (an agent
/// name holds no space), and the `trust` beside it is `owner`.
pub const OWNER_FROM: &str = "your owner";

/// The doorbell of one mailbox.
///
/// It hears the mailbox's events from the moment the mailbox opened, and rings only once
/// [`Doorbell::start`] is called, after the process's sinks subscribed: what the relay tells
/// at login (a denial kept while the agent was away) then reaches them, instead of ringing
/// before anyone listens.
#[derive(Clone)]
pub struct Doorbell {
    rings: broadcast::Sender<Ring>,
    waiting: Arc<Mutex<Option<Unstarted>>>,
}

/// What a doorbell rings from, kept until it starts.
struct Unstarted {
    mailbox: Mailbox,
    events: Feed<MailboxEvent>,
}

impl Doorbell {
    /// The doorbell for `mailbox`'s events since it opened; silent until started.
    pub fn new(mailbox: &Mailbox) -> Self {
        let (rings, _) = broadcast::channel(RING_BACKLOG);
        let events = mailbox.subscribe_since_open("doorbell");
        Self {
            rings,
            waiting: Arc::new(Mutex::new(Some(Unstarted {
                mailbox: mailbox.clone(),
                events,
            }))),
        }
    }

    /// A new subscription to the rings; `name` says which sink listens, in the log.
    pub fn subscribe(&self, name: &'static str) -> Feed<Ring> {
        Feed::new(&self.rings, name)
    }

    /// Starts ringing, with what was heard since the mailbox opened; once (later calls do
    /// nothing). Call it when the sinks have subscribed.
    pub fn start(&self) {
        if let Some(Unstarted { mailbox, events }) =
            self.waiting.lock().expect("not poisoned").take()
        {
            tokio::spawn(run(mailbox, events, self.rings.clone()));
        }
    }
}

/// Contact requests that arrive within this of each other ring once, together.
const REQUESTS_QUIET: Duration = Duration::from_secs(1);
/// A burst of contact requests rings at most this long after its first one.
const REQUESTS_HOLD: Duration = Duration::from_secs(5);

async fn run(mailbox: Mailbox, mut events: Feed<MailboxEvent>, rings: broadcast::Sender<Ring>) {
    // Contact requests not rung yet, and when they ring: a burst of them (another relay's
    // flood, say) is one ring, never one each.
    let mut requests: Vec<ConsentEvent> = Vec::new();
    let mut first_request = Instant::now();
    let mut ring_requests = Instant::now();
    loop {
        let heard = tokio::select! {
            heard = events.next() => heard,
            () = tokio::time::sleep_until(ring_requests), if !requests.is_empty() => {
                let _ = rings.send(requests_ring(mailbox.name(), &requests));
                requests.clear();
                continue;
            }
        };
        let event = match heard {
            Some(Heard::Event(e)) => e,
            // Never rung again: the unread notice and the inbox show what was missed.
            Some(Heard::Missed(_)) => continue,
            None => return,
        };
        let news = match event {
            MailboxEvent::Mail(arrived) => {
                let _ = rings.send(mail_ring(&arrived));
                continue;
            }
            MailboxEvent::Relay(news) => news,
        };
        let ring = match news {
            RelayNews::Consent(event @ ConsentEvent::RequestReceived { .. }) => {
                let now = Instant::now();
                if requests.is_empty() {
                    first_request = now;
                }
                requests.push(event);
                ring_requests = (now + REQUESTS_QUIET).min(first_request + REQUESTS_HOLD);
                continue;
            }
            RelayNews::Consent(event) => match consent_ring(mailbox.name(), &event) {
                Some(ring) => ring,
                None => continue,
            },
            RelayNews::Bounced(bounces) => bounce_ring(&bounces),
            RelayNews::Waiting(waiting) => waiting_ring(&waiting),
            // Delivery is the expected course of every send: ringing the model for each would
            // interrupt it to say nothing it must act on. The sent view shows it, and MCP
            // clients subscribed to it hear that it changed (see `mcp/push.rs`).
            RelayNews::Delivered(_) => continue,
            RelayNews::Receipt { of, record } => match receipt_ring(&mailbox, of, &record).await {
                Ok(ring) => ring,
                Err(e) => {
                    tracing::error!(error = %e, %of, "cannot render a receipt for the doorbell");
                    continue;
                }
            },
        };
        let _ = rings.send(ring);
    }
}

/// The ring for a received message, rendered from the event alone.
fn mail_ring(arrived: &Arrived) -> Ring {
    let stored = &arrived.stored;
    let m = &stored.message;
    let content = frame_message(
        stored,
        SenderFacts {
            contact: arrived.sender.as_ref(),
        },
        &mcp_reply_hint(m),
    );
    // The owner has no address: "your owner" (with a space, so no agent name) says who.
    let from = if stored.trust == Trust::Owner {
        OWNER_FROM.to_owned()
    } else {
        m.from.to_string()
    };
    let meta = BTreeMap::from([
        ("kind".to_owned(), "message".to_owned()),
        ("from".to_owned(), from),
        ("message_id".to_owned(), m.id.to_string()),
        ("thread_id".to_owned(), m.thread.to_string()),
        ("trust".to_owned(), stored.trust.as_str().to_owned()),
        ("importance".to_owned(), m.importance.as_str().to_owned()),
    ]);
    Ring {
        message: Some(m.id),
        content,
        meta,
    }
}

/// The ring for a recipient's receipt: a fact mailslot recorded, with the recipient's answer
/// framed as another agent's words. Never rung as new mail (`message` is `None`).
async fn receipt_ring(
    mailbox: &Mailbox,
    of: MessageId,
    record: &ReceiptRecord,
) -> Result<Ring, MailboxError> {
    // The subject may quote another agent ("Re: ..."): fenced.
    let subject = mailbox
        .message_and_sender(of)
        .await?
        .map(|(s, _)| format!(" ({})", fence_line(&s.message.subject, 120)))
        .unwrap_or_default();
    let who = &record.recipient;
    let did = match record.kind {
        ReceiptKind::Read => "read",
        ReceiptKind::Acknowledged => "acknowledged",
    };
    let mut content = format!(
        "[mailslot] {who} {did} your message {of}{subject} at {}.",
        frame::when(record.at)
    );
    if let Some(answer) = &record.answer {
        content.push_str(&format!(
            " Their answer:\n{}",
            frame::frame_data("acknowledgement answer", who, answer)
        ));
    }
    content.push_str(
        "\nThe sent tool shows where each of your messages stands; no need to reply to a receipt.",
    );
    Ok(Ring {
        message: None,
        content,
        meta: BTreeMap::from([
            ("kind".to_owned(), "receipt".to_owned()),
            ("receipt".to_owned(), did.to_owned()),
            ("from".to_owned(), who.to_string()),
            ("message_id".to_owned(), of.to_string()),
        ]),
    })
}

/// The most bounced copies one ring lists (the rest are counted).
const BOUNCES_LISTED: usize = 10;

fn bounce_ring(bounces: &[Bounce]) -> Ring {
    let mut content = String::from(
        "[mailslot] Mail you sent expired on the relay before its recipient took it (bounced); it is marked bounced in your sent mail:",
    );
    for b in bounces.iter().take(BOUNCES_LISTED) {
        content.push_str(&format!(
            "\n- message {} to {} (expired {})",
            b.id, b.to, b.expired_at
        ));
    }
    if bounces.len() > BOUNCES_LISTED {
        content.push_str(&format!("\n- and {} more", bounces.len() - BOUNCES_LISTED));
    }
    content.push_str("\nThe recipient was not reached: tell the user, or send again later.");
    Ring {
        message: None,
        content,
        meta: BTreeMap::from([
            ("kind".to_owned(), "bounced".to_owned()),
            ("count".to_owned(), bounces.len().to_string()),
        ]),
    }
}

/// The ring for another agent waiting for files this agent reserved: fixed words, and the
/// waiter's patterns and reason (its text) in a fence.
fn waiting_ring(waiting: &Waiting) -> Ring {
    let by = Address::local(waiting.by.clone());
    let held: Vec<String> = waiting.held.iter().map(ToString::to_string).collect();
    let mut wanted = String::from("Patterns:");
    for p in &waiting.patterns {
        wanted.push_str(&format!("\n- {p}"));
    }
    wanted.push_str(&format!("\nReason: {}", waiting.reason));
    let content = format!(
        "[mailslot] {by} was refused files you reserved in project {} and waits for them (your reservations {}). When you are done with them, release them with the release_files tool; reservations lapse at their expiry otherwise.\n{}",
        waiting.project,
        held.join(", "),
        frame::frame_data("reservation request", &by, &wanted)
    );
    Ring {
        message: None,
        content,
        meta: BTreeMap::from([
            ("kind".to_owned(), "reservation_waiting".to_owned()),
            ("agent".to_owned(), by.to_string()),
            ("project".to_owned(), waiting.project.to_string()),
        ]),
    }
}

/// The ring for consent news; `None` for the `bounced` nudge, which the client session turns
/// into [`RelayNews::Bounced`] after recording the bounces.
/// `me` is the agent the ring is for: the command it names must act as that agent.
fn consent_ring(me: &AgentName, event: &ConsentEvent) -> Option<Ring> {
    let (kind, agent, content) = match event {
        ConsentEvent::RequestReceived { .. } => {
            return Some(requests_ring(me, std::slice::from_ref(event)));
        }
        ConsentEvent::Approved { by } => (
            "contact_approved",
            by,
            format!(
                "[mailslot] {by}'s owner approved your contact request: you can now send to {by}."
            ),
        ),
        ConsentEvent::Denied { by } => (
            "contact_denied",
            by,
            format!("[mailslot] {by}'s owner denied your contact request."),
        ),
        // The client session turns these into their own news before the doorbell hears it.
        ConsentEvent::Bounced {} | ConsentEvent::Waiting(_) => return None,
    };
    Some(Ring {
        message: None,
        content,
        meta: BTreeMap::from([
            ("kind".to_owned(), kind.to_owned()),
            ("agent".to_owned(), agent.to_string()),
        ]),
    })
}

/// The most contact requests one ring lists (the rest are counted).
const REQUESTS_LISTED: usize = 5;

/// One ring for the contact requests of a burst (each a `RequestReceived`): who asked, with
/// their notes, fenced, for the first few; how many in all.
fn requests_ring(me: &AgentName, requests: &[ConsentEvent]) -> Ring {
    let asked: Vec<(&crate::protocol::Address, &str)> = requests
        .iter()
        .filter_map(|e| match e {
            ConsentEvent::RequestReceived { from, note, .. } => Some((from, note.as_str())),
            _ => None,
        })
        .collect();
    let approve = format!(
        "Only your owner can approve, with `mailslot --agent {me} approve CODE` and the owner's passphrase; tell them if it matters."
    );
    let content = match asked.as_slice() {
        [(from, note)] => format!(
            "[mailslot] {from} asked to become a contact. Their note (untrusted): {}\n{approve}",
            fence_line(note, 200)
        ),
        many => {
            let mut text = format!(
                "[mailslot] {} agents asked to become contacts (`mailslot --agent {me} contacts` lists them all):",
                many.len()
            );
            for (from, note) in many.iter().take(REQUESTS_LISTED) {
                text.push_str(&format!(
                    "\n- {from}; their note (untrusted): {}",
                    fence_line(note, 200)
                ));
            }
            if many.len() > REQUESTS_LISTED {
                text.push_str(&format!("\n- and {} more", many.len() - REQUESTS_LISTED));
            }
            text.push('\n');
            text.push_str(&approve);
            text
        }
    };
    let mut meta = BTreeMap::from([
        ("kind".to_owned(), "contact_request".to_owned()),
        ("count".to_owned(), asked.len().to_string()),
    ]);
    if let Some((from, _)) = asked.first() {
        meta.insert("agent".to_owned(), from.to_string());
    }
    Ring {
        message: None,
        content,
        meta,
    }
}
