//! What tools and resources return: JSON views of messages and memories. Another agent's
//! words appear only inside `framed` (see `doorbell::frame`) or as a one-line subject in a
//! fence of its own. No 64-bit integers: counts are u32, times are RFC 3339 strings.

use schemars::JsonSchema;
use serde::Serialize;

use crate::doorbell::frame::{SenderFacts, fence_line, frame_message, mcp_reply_hint};
use crate::store::{Contact, Direction, Memory, Recalled, StoredMessage};

/// A message in a list.
#[derive(Debug, Serialize, JsonSchema)]
pub struct MessageSummary {
    /// The message id (pass it to read, reply, mark_read).
    pub message_id: String,
    /// The conversation it belongs to (pass it to thread).
    pub thread_id: String,
    /// The sender's address, as verified from the signature.
    pub from: String,
    /// The subject: one line, fenced (the sender's words, untrusted).
    pub subject: String,
    /// When it was sent (RFC 3339).
    pub sent_at: String,
    /// Whether it was read.
    pub unread: bool,
    /// "verified", "key_changed" (do not trust), "unverified", or "own".
    pub trust: String,
    /// "in" (received) or "out" (sent by this agent).
    pub direction: String,
    /// Sent mail only, when some copies bounced: the recipients whose copy expired on the
    /// relay before they took it (they never got it).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub bounced: Vec<String>,
}

/// A whole message, framed for reading.
#[derive(Debug, Serialize, JsonSchema)]
pub struct MessageView {
    /// Its summary.
    #[serde(flatten)]
    pub summary: MessageSummary,
    /// The message rendered with its header and its body fenced (the sender's words are
    /// untrusted data).
    pub framed: String,
}

/// A memory.
#[derive(Debug, Serialize, JsonSchema)]
pub struct MemoryView {
    /// Its id (pass it to forget).
    pub memory_id: String,
    /// Its title.
    pub title: String,
    /// Its text.
    pub text: String,
    /// Its tags.
    pub tags: Vec<String>,
    /// When it was last written (RFC 3339).
    pub updated_at: String,
}

impl MessageSummary {
    /// The summary of `stored`.
    pub fn of(stored: &StoredMessage) -> Self {
        let m = &stored.message;
        Self {
            message_id: m.id.to_string(),
            thread_id: m.thread.to_string(),
            from: m.from.to_string(),
            subject: fence_line(&m.subject, 200),
            sent_at: m.sent_at.to_string(),
            unread: stored.read_at.is_none(),
            trust: stored.trust.as_str().to_owned(),
            direction: match stored.direction {
                Direction::In => "in",
                Direction::Out => "out",
            }
            .to_owned(),
            bounced: stored.bounced.iter().map(ToString::to_string).collect(),
        }
    }
}

impl MessageView {
    /// The framed view of `stored`, whose sender is `contact` when pinned.
    pub fn of(stored: &StoredMessage, contact: Option<&Contact>) -> Self {
        Self {
            summary: MessageSummary::of(stored),
            framed: frame_message(
                stored,
                SenderFacts { contact },
                &mcp_reply_hint(&stored.message),
            ),
        }
    }
}

impl MemoryView {
    /// The view of `memory`.
    pub fn of(memory: &Memory) -> Self {
        Self {
            memory_id: memory.id.to_string(),
            title: memory.title.clone(),
            text: memory.body.clone(),
            tags: memory.tags.clone(),
            updated_at: memory.updated_at.to_string(),
        }
    }

    /// The view of a recalled memory.
    pub fn recalled(r: &Recalled) -> Self {
        Self::of(&r.memory)
    }
}
