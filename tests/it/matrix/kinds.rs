//! The kinds of mail in alice's store, what each view must show of them, and the cells.

use mailslot::protocol::{Attachment, Message, MessageId, ThreadId};
use mailslot::store::SentState;
use serde_json::{Value, json};

/// Which side of the mail alice is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Side {
    /// She received it.
    In,
    /// She sent it.
    Out,
    /// It was written to her and refused (her owner blocked the sender): no view may show it.
    Refused,
    /// Her owner wrote it to her (`mailslot tell`, signed with the owner key): received, and
    /// shown as her owner's (trust `owner`; "your owner" where a model reads it).
    Owner,
}

/// Who the owner's mail is from where a model reads it (MCP views and frames).
pub(crate) const OWNER_FROM: &str = "your owner";

/// One kind of mail in alice's store, and what every view must show of it.
#[derive(Debug, Clone)]
pub(crate) struct Kind {
    pub(crate) name: String,
    pub(crate) side: Side,
    pub(crate) id: MessageId,
    pub(crate) thread: ThreadId,
    pub(crate) subject: String,
    /// A word only it has (in its subject, or a reply's body), for search.
    pub(crate) word: String,
    /// Received: the sender as alice stores it. Sent: the one recipient, exactly as addressed.
    pub(crate) peer: String,
    /// Sent: where its copy stands.
    pub(crate) sent: Option<SentState>,
    /// Sent and acknowledged: the recipient's answer.
    pub(crate) answer: Option<&'static str>,
    /// Its attachment.
    pub(crate) attachment: Option<Attachment>,
    /// Received, asking for acknowledgement (alice gave it).
    pub(crate) ack_required: bool,
}

impl Kind {
    /// The subject of a kind whose word is `word`.
    pub(crate) fn subject_with(word: &str) -> String {
        format!("matrix {word}")
    }

    pub(crate) fn new(name: &str, side: Side, message: &Message, peer: impl ToString) -> Self {
        Self {
            name: name.to_owned(),
            side,
            id: message.id,
            thread: message.thread,
            subject: message.subject.clone(),
            word: message.subject.split(' ').nth(1).unwrap().to_owned(),
            peer: peer.to_string(),
            sent: None,
            answer: None,
            attachment: None,
            ack_required: message.ack_required,
        }
    }

    /// Found by searching `word` instead of its subject's (a reply's subject is its original's).
    pub(crate) fn found_by(mut self, word: &str) -> Self {
        self.word = word.to_owned();
        self
    }

    pub(crate) fn stands(mut self, state: SentState) -> Self {
        self.sent = Some(state);
        self
    }

    /// Where a sent kind stands, as views name it.
    pub(crate) fn state(&self) -> &'static str {
        self.sent.map_or("", SentState::as_str)
    }

    pub(crate) fn answer(mut self, answer: &'static str) -> Self {
        self.answer = Some(answer);
        self
    }

    pub(crate) fn attachment(mut self, a: &Attachment) -> Self {
        self.attachment = Some(a.clone());
        self
    }
}

/// The cells checked so far, and the ones that failed.
#[derive(Default)]
pub(crate) struct Cells {
    pub(crate) passed: usize,
    pub(crate) failed: Vec<String>,
}

impl Cells {
    pub(crate) fn record(&mut self, view: &str, kind: &str, outcome: Result<(), String>) {
        match outcome {
            Ok(()) => self.passed += 1,
            Err(why) => {
                // Enough to see what was wrong, not whole pages.
                let why: String = why.chars().take(1200).collect();
                self.failed.push(format!("{view} × {kind}: {why}"))
            }
        }
    }

    /// A view that could not be read at all fails for every kind.
    pub(crate) fn view_failed(&mut self, view: &str, kinds: &[Kind], why: &str) {
        for k in kinds {
            self.record(view, &k.name, Err(format!("the view failed: {why}")));
        }
    }
}

/// `Ok` when `ok`, else what was wrong.
pub(crate) fn want(ok: bool, what: impl FnOnce() -> String) -> Result<(), String> {
    if ok { Ok(()) } else { Err(what()) }
}

/// The entry of `list` (a JSON array) whose `key` is `id`.
pub(crate) fn entry<'a>(list: &'a Value, key: &str, id: &MessageId) -> Option<&'a Value> {
    list.as_array()?
        .iter()
        .find(|e| e[key].as_str() == Some(id.to_string().as_str()))
}

/// A listing of received mail: what it must show of each kind (`from` and `trust` are the keys
/// its entries use).
pub(crate) fn received_entry(list: &Value, id_key: &str, k: &Kind) -> Result<(), String> {
    let found = entry(list, id_key, &k.id);
    match (k.side, found) {
        (Side::In | Side::Owner, None) => Err(format!("not listed: {list}")),
        // The CLI's JSON names the stored sender (the agent itself), the MCP views the owner.
        (Side::Owner, Some(e)) => want(
            e["trust"] == "owner" && (e["from"] == OWNER_FROM || e["from"] == k.peer.as_str()),
            || format!("from and trust: {e}"),
        ),
        (Side::In, Some(e)) => {
            want(e["from"] == k.peer.as_str(), || format!("from: {e}"))?;
            want(e["trust"] == "verified", || format!("trust: {e}"))?;
            want(
                e["ack_required"].as_bool().unwrap_or(false) == k.ack_required,
                || format!("ack_required: {e}"),
            )
        }
        (_, Some(e)) => Err(format!("listed among received mail: {e}")),
        (_, None) => Ok(()),
    }
}

/// A listing of sent mail: where each sent kind stands, per recipient as addressed.
pub(crate) fn sent_entry(list: &Value, id_key: &str, k: &Kind) -> Result<(), String> {
    let found = entry(list, id_key, &k.id);
    match (k.side, found) {
        (Side::Out, None) => Err(format!("not listed: {list}")),
        (Side::Out, Some(e)) => {
            want(e["state"] == k.state(), || format!("state: {e}"))?;
            want(e["to"] == json!([k.peer]), || format!("to: {e}"))?;
            let recipients = e["recipients"].as_array().cloned().unwrap_or_default();
            want(
                recipients.len() == 1
                    && recipients[0]["to"] == k.peer.as_str()
                    && recipients[0]["state"] == k.state(),
                || format!("recipients: {e}"),
            )?;
            if let Some(answer) = k.answer {
                want(
                    recipients[0]["answer"]
                        .as_str()
                        .is_some_and(|a| a.contains(answer)),
                    || format!("answer: {e}"),
                )?;
            }
            Ok(())
        }
        (_, Some(e)) => Err(format!("listed among sent mail: {e}")),
        (_, None) => Ok(()),
    }
}

/// A search for the kind's word: its message (a reply quotes the subject it answers), from whom
/// and as trusted as it is; nothing when it was refused.
pub(crate) fn searched(found: &Value, id_key: &str, k: &Kind) -> Result<(), String> {
    match (k.side, entry(found, id_key, &k.id)) {
        (Side::Refused, _) => want(found.as_array().is_some_and(Vec::is_empty), || {
            format!("found: {found}")
        }),
        (_, None) => Err(format!("not found: {found}")),
        (Side::Owner, Some(e)) => want(e["trust"] == "owner", || format!("trust: {e}")),
        (Side::In, Some(e)) => want(
            e["from"] == k.peer.as_str() && e["trust"] == "verified",
            || format!("from and trust: {e}"),
        ),
        (Side::Out, Some(e)) => want(e["trust"] == "own", || format!("trust: {e}")),
    }
}

/// What reading attachment 0 of a kind gave: its bytes, or an error when it has none.
pub(crate) fn attachment_read(got: Result<Vec<u8>, String>, k: &Kind) -> Result<(), String> {
    match (&k.attachment, got) {
        (Some(a), Ok(bytes)) => want(bytes == a.bytes, || {
            format!("{} bytes, not {}'s {}", bytes.len(), a.name, a.size)
        }),
        (Some(_), Err(why)) => Err(why),
        (None, Ok(bytes)) => Err(format!("an attachment of {} bytes", bytes.len())),
        (None, Err(_)) => Ok(()),
    }
}

/// Whether some element of the array `list` has `key` equal to `value`.
pub(crate) fn has(list: &Value, key: &str, value: &str) -> bool {
    list.as_array()
        .is_some_and(|l| l.iter().any(|e| e[key] == value))
}

/// The kind's attachment, by name (a fenced name contains it) and size; none when it has none.
pub(crate) fn attachments_ok(list: &Value, k: &Kind) -> Result<(), String> {
    let listed = list.as_array().cloned().unwrap_or_default();
    match &k.attachment {
        None => want(listed.is_empty(), || format!("attachments: {list}")),
        Some(a) => want(
            listed.len() == 1
                && listed[0]["name"]
                    .as_str()
                    .is_some_and(|n| n.contains(&a.name))
                && listed[0]["size"] == a.size,
            || format!("attachment {} ({} bytes): {list}", a.name, a.size),
        ),
    }
}
