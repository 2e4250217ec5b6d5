//! The unread digest: a short list of unread messages for a model's context (the startup and
//! triage prompts, Claude Code hooks). Subjects are the senders' words, so the list is fenced
//! like a message body.

use std::fmt::Write;

use super::frame::{REMINDER, fenced, fresh_nonce, importance_word, one_line};
use crate::store::{StoredMessage, Trust};

/// The digest of `unread` (newest first) out of `total` unread messages; `how` says which tool
/// or command reads them.
pub fn unread_digest(unread: &[StoredMessage], total: u32, how: &str) -> String {
    if unread.is_empty() {
        return "No unread mail.".into();
    }
    let nonce = fresh_nonce();
    let noun = if total == 1 { "message" } else { "messages" };
    let mut out = format!("[mailslot] {total} unread {noun}");
    if (total as usize) > unread.len() {
        let _ = write!(out, " (the newest {} listed)", unread.len());
    }
    let _ = writeln!(out, ":\n<<<mailslot-untrusted {nonce}>>>");
    for m in unread {
        let trust = match m.trust {
            Trust::Verified => "verified",
            Trust::KeyChanged => "KEY CHANGED, do not trust",
            Trust::Unverified => "unverified",
            Trust::Own => "own",
        };
        let mut marks = trust.to_owned();
        if !m.message.importance.is_normal() {
            marks = format!("{marks}, {}", importance_word(m.message.importance));
        }
        if m.message.ack_required {
            marks.push_str(", acknowledgement requested");
        }
        let line = format!(
            "- {} from {} ({marks}): {}",
            m.message.id,
            m.message.from,
            one_line(&m.message.subject, 120)
        );
        let _ = writeln!(out, "{}", fenced(&line, &nonce));
    }
    let _ = write!(
        out,
        "<<<end mailslot-untrusted {nonce}>>>\n{REMINDER} {how}"
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{Address, Importance, Message};
    use crate::store::Direction;

    #[test]
    fn lines_mark_importance_and_acknowledgement_requests() {
        let mut m = Message::new(
            Address::parse("bob").unwrap(),
            vec![Address::parse("alice").unwrap()],
            "prod is down",
            "x",
        );
        m.importance = Importance::Urgent;
        m.ack_required = true;
        let plain = Message::new(
            Address::parse("carol").unwrap(),
            vec![Address::parse("alice").unwrap()],
            "lunch",
            "x",
        );
        let stored = |message: Message| StoredMessage {
            message,
            direction: Direction::In,
            trust: Trust::Verified,
            stored_at: jiff::Timestamp::now(),
            read_at: None,
            bounced: Vec::new(),
            receipts: Vec::new(),
            delivered: Vec::new(),
            copies: Vec::new(),
            attachments: Vec::new(),
        };
        let text = unread_digest(&[stored(m), stored(plain)], 2, "");
        assert!(
            text.contains("(verified, URGENT, acknowledgement requested): prod is down"),
            "{text}"
        );
        assert!(text.contains("(verified): lunch"), "{text}");
    }
}
