//! The message: what one agent writes to others, before sealing and after opening.

use std::collections::HashSet;

use jiff::Timestamp;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

use super::{
    Address, Importance, KeyRotation, Limits, MessageId, Receipt, ThreadId, ValidationError, b64,
};

/// A message. Fields are public for building; [`Message::validate`] runs at every boundary
/// (sealing, opening, storing), so an invalid one never travels or lands.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Message {
    /// Chosen by the sender; also the idempotency key.
    pub id: MessageId,
    /// The sender. Receivers check it against the verified signing key, never trust it alone.
    pub from: Address,
    /// Primary recipients.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub to: Vec<Address>,
    /// Copied recipients, visible to all.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cc: Vec<Address>,
    /// Blind copies. The sender's copy lists all; a BCC recipient's copy lists only itself;
    /// everyone else's copy lists none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub bcc: Vec<Address>,
    /// The conversation this message belongs to.
    pub thread: ThreadId,
    /// The message this one answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub in_reply_to: Option<MessageId>,
    /// One line, no control characters.
    pub subject: String,
    /// Text or Markdown.
    pub body: String,
    /// Optional structured payload.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<Value>,
    /// Optional snapshot of where the sender's work stands.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context: Option<Value>,
    /// Files carried inline.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attachments: Vec<Attachment>,
    /// When the sender wrote it.
    pub sent_at: Timestamp,
    /// How urgent the sender says it is. Left out when normal, so normal mail stays readable
    /// by clients from before importance.
    #[serde(default, skip_serializing_if = "Importance::is_normal")]
    pub importance: Importance,
    /// The sender asks its recipients to acknowledge it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub ack_required: bool,
    /// Set when this is a receipt for a message its recipient sent: recorded against that
    /// message, never shown as mail.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub receipt: Option<Receipt>,
    /// Set when this letter announces the sender's new keys (it is signed by them): the
    /// recipient re-pins on a valid statement, and never shows it as mail.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rotation: Option<KeyRotation>,
}

/// A file carried inside a message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Attachment {
    /// File name, without any directory.
    pub name: String,
    /// Media type, like `text/plain`.
    pub media_type: String,
    /// Length of `bytes`.
    pub size: u32,
    /// Lowercase hex SHA-256 of `bytes`.
    pub sha256: String,
    /// The content.
    #[serde(with = "b64")]
    pub bytes: Vec<u8>,
}

impl Attachment {
    /// Builds an attachment, computing its size and digest.
    pub fn new(name: impl Into<String>, media_type: impl Into<String>, bytes: Vec<u8>) -> Self {
        Self {
            name: name.into(),
            media_type: media_type.into(),
            size: u32::try_from(bytes.len()).unwrap_or(u32::MAX),
            sha256: sha256_hex(&bytes),
            bytes,
        }
    }

    fn validate(&self, limits: &Limits) -> Result<(), ValidationError> {
        let name_len = self.name.chars().count();
        if name_len == 0 {
            return Err(ValidationError::new(
                "name",
                "is empty; give the file a name",
            ));
        }
        if name_len > limits.attachment_name_chars {
            return Err(ValidationError::too_long(
                "name",
                name_len,
                limits.attachment_name_chars,
                "characters",
            ));
        }
        if self
            .name
            .chars()
            .any(|c| c == '/' || c == '\\' || c.is_control())
            || self.name == "."
            || self.name == ".."
        {
            return Err(ValidationError::new(
                "name",
                "must be a plain file name: no '/', '\\', control characters, '.' or '..'",
            ));
        }
        let mt_len = self.media_type.chars().count();
        if mt_len > limits.media_type_chars {
            return Err(ValidationError::too_long(
                "media_type",
                mt_len,
                limits.media_type_chars,
                "characters",
            ));
        }
        let valid_media_type = self.media_type.split_once('/').is_some_and(|(t, s)| {
            let token = |x: &str| {
                !x.is_empty()
                    && x.bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b"!#$&-^_.+".contains(&b))
            };
            token(t) && token(s)
        });
        if !valid_media_type {
            return Err(ValidationError::new(
                "media_type",
                format!("{:?} is not a media type like text/plain", self.media_type),
            ));
        }
        if self.bytes.len() > limits.attachment_bytes {
            return Err(ValidationError::new(
                "bytes",
                format!(
                    "{:?} is {} bytes, over the limit of {} bytes for one attachment; send a smaller file or split it",
                    self.name,
                    self.bytes.len(),
                    limits.attachment_bytes
                ),
            ));
        }
        if self.size as usize != self.bytes.len() {
            return Err(ValidationError::new(
                "size",
                format!(
                    "says {} but the content is {} bytes",
                    self.size,
                    self.bytes.len()
                ),
            ));
        }
        if self.sha256 != sha256_hex(&self.bytes) {
            return Err(ValidationError::new(
                "sha256",
                "does not match the content; the attachment is corrupt",
            ));
        }
        Ok(())
    }
}

fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

impl Message {
    /// A new message in a new thread, sent now, with no optional parts.
    pub fn new(
        from: Address,
        to: Vec<Address>,
        subject: impl Into<String>,
        body: impl Into<String>,
    ) -> Self {
        Self {
            id: MessageId::new(),
            from,
            to,
            cc: Vec::new(),
            bcc: Vec::new(),
            thread: ThreadId::new(),
            in_reply_to: None,
            subject: subject.into(),
            body: body.into(),
            data: None,
            context: None,
            attachments: Vec::new(),
            sent_at: now_millis(),
            importance: Importance::Normal,
            ack_required: false,
            receipt: None,
            rotation: None,
        }
    }

    /// A receipt from `from` to `to`, the sender of the message it is about (in `thread`).
    pub fn receipt(from: Address, to: Address, thread: ThreadId, receipt: Receipt) -> Self {
        let mut m = Self::new(from, vec![to], "", "");
        m.thread = thread;
        m.in_reply_to = Some(receipt.of);
        m.receipt = Some(receipt);
        m
    }

    /// The announcement of `rotation` (the keys `from` moved to) to one contact.
    pub fn rotation(from: Address, to: Address, rotation: KeyRotation) -> Self {
        let mut m = Self::new(from, vec![to], "", "");
        m.rotation = Some(rotation);
        m
    }

    /// Whether this is a notice (a receipt, a key rotation) rather than mail: recorded or
    /// acted on, never listed.
    pub fn is_notice(&self) -> bool {
        self.receipt.is_some() || self.rotation.is_some()
    }

    /// Every recipient: to, then cc, then bcc.
    pub fn recipients(&self) -> impl Iterator<Item = &Address> {
        self.to.iter().chain(&self.cc).chain(&self.bcc)
    }

    /// Checks every field against `limits`; the error names the field and the limit.
    pub fn validate(&self, limits: &Limits) -> Result<(), ValidationError> {
        let total = self.to.len() + self.cc.len() + self.bcc.len();
        if total == 0 {
            return Err(ValidationError::new(
                "to",
                "is empty; name at least one recipient in to, cc or bcc",
            ));
        }
        if total > limits.recipients {
            return Err(ValidationError::new(
                "to",
                format!(
                    "to, cc and bcc name {total} recipients, over the limit of {}; send several messages",
                    limits.recipients
                ),
            ));
        }
        let mut seen = HashSet::new();
        for (field, list) in [("to", &self.to), ("cc", &self.cc), ("bcc", &self.bcc)] {
            for (i, addr) in list.iter().enumerate() {
                if !seen.insert(addr) {
                    return Err(ValidationError::new(
                        format!("{field}[{i}]"),
                        format!("repeats {addr}; name each recipient once"),
                    ));
                }
            }
        }
        let subject_len = self.subject.chars().count();
        if subject_len > limits.subject_chars {
            return Err(ValidationError::too_long(
                "subject",
                subject_len,
                limits.subject_chars,
                "characters",
            ));
        }
        if let Some(pos) = self.subject.chars().position(char::is_control) {
            return Err(ValidationError::new(
                "subject",
                format!(
                    "has a control character at position {}; keep it to one line and put the rest in the body",
                    pos + 1
                ),
            ));
        }
        if self.body.len() > limits.body_bytes {
            return Err(ValidationError::too_long(
                "body",
                self.body.len(),
                limits.body_bytes,
                "bytes",
            ));
        }
        for (field, value, limit) in [
            ("data", &self.data, limits.data_bytes),
            ("context", &self.context, limits.context_bytes),
        ] {
            if let Some(v) = value {
                let len = serde_json::to_vec(v).map(|b| b.len()).unwrap_or(usize::MAX);
                if len > limit {
                    return Err(ValidationError::too_long(
                        field,
                        len,
                        limit,
                        "bytes of JSON",
                    ));
                }
            }
        }
        if self.attachments.len() > limits.attachments {
            return Err(ValidationError::new(
                "attachments",
                format!(
                    "has {} files, over the limit of {}",
                    self.attachments.len(),
                    limits.attachments
                ),
            ));
        }
        for (i, a) in self.attachments.iter().enumerate() {
            a.validate(limits)
                .map_err(|e| e.within(&format!("attachments[{i}]")))?;
        }
        let total: usize = self.attachments.iter().map(|a| a.bytes.len()).sum();
        if total > limits.attachments_bytes {
            return Err(ValidationError::new(
                "attachments",
                format!(
                    "carry {total} bytes together, over the limit of {} bytes per message; send them in several messages",
                    limits.attachments_bytes
                ),
            ));
        }
        if let Some(receipt) = &self.receipt {
            self.validate_receipt(receipt)?;
        }
        if let Some(rotation) = &self.rotation {
            self.validate_notice("rotation")?;
            if &rotation.agent != self.from.name() || self.receipt.is_some() {
                return Err(ValidationError::new(
                    "rotation",
                    "announces the sender's own keys, and nothing else",
                ));
            }
        }
        Ok(())
    }

    /// A receipt is a notice to the sender of the message it names.
    fn validate_receipt(&self, receipt: &Receipt) -> Result<(), ValidationError> {
        receipt.validate().map_err(|e| e.within("receipt"))?;
        self.validate_notice("receipt")?;
        if self.in_reply_to != Some(receipt.of) {
            return Err(ValidationError::new(
                "receipt",
                "in_reply_to must name the message the receipt is about",
            ));
        }
        Ok(())
    }

    /// A notice (a receipt, a key rotation) goes to one agent and carries nothing but
    /// itself, so it can never smuggle mail past the inbox.
    fn validate_notice(&self, field: &str) -> Result<(), ValidationError> {
        if self.to.len() != 1 || !self.cc.is_empty() || !self.bcc.is_empty() {
            return Err(ValidationError::new(
                field,
                "goes to exactly one recipient in to",
            ));
        }
        let carries_mail = !self.subject.is_empty()
            || !self.body.is_empty()
            || self.data.is_some()
            || self.context.is_some()
            || !self.attachments.is_empty()
            || self.ack_required
            || !self.importance.is_normal();
        if carries_mail {
            return Err(ValidationError::new(
                field,
                "carries no subject, body, data, context, attachments, importance or ack_required",
            ));
        }
        Ok(())
    }
}

/// Now, truncated to milliseconds so it survives every storage format unchanged.
pub fn now_millis() -> Timestamp {
    Timestamp::from_millisecond(Timestamp::now().as_millisecond()).unwrap_or(Timestamp::UNIX_EPOCH)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::AgentName;

    fn addr(s: &str) -> Address {
        Address::parse(s).unwrap()
    }

    fn msg() -> Message {
        Message::new(
            Address::local(AgentName::new("alice").unwrap()),
            vec![addr("bob")],
            "hi",
            "body",
        )
    }

    fn field_of(m: &Message, limits: &Limits) -> String {
        m.validate(limits).unwrap_err().field
    }

    #[test]
    fn subject_limit() {
        let limits = Limits::default();
        let mut m = msg();
        m.subject = "é".repeat(256);
        m.validate(&limits).unwrap();
        m.subject.push('x');
        let err = m.validate(&limits).unwrap_err();
        assert_eq!(err.field, "subject");
        assert!(
            err.problem.contains("257") && err.problem.contains("256"),
            "{err}"
        );
        m.subject = "two\nlines".into();
        assert_eq!(field_of(&m, &limits), "subject");
    }

    #[test]
    fn body_limit() {
        let limits = Limits::default();
        let mut m = msg();
        m.body = "x".repeat(limits.body_bytes);
        m.validate(&limits).unwrap();
        m.body.push('x');
        let err = m.validate(&limits).unwrap_err();
        assert_eq!(err.field, "body");
        assert!(err.problem.contains("65536"), "{err}");
    }

    #[test]
    fn recipient_limits() {
        let limits = Limits::default();
        let mut m = msg();
        m.to = (0..limits.recipients)
            .map(|i| addr(&format!("r{i}")))
            .collect();
        m.validate(&limits).unwrap();
        m.cc.push(addr("one-more"));
        assert_eq!(field_of(&m, &limits), "to");
        m.to.clear();
        m.cc.clear();
        assert_eq!(field_of(&m, &limits), "to");
        m.to = vec![addr("bob")];
        m.bcc = vec![addr("bob")];
        assert_eq!(field_of(&m, &limits), "bcc[0]");
    }

    #[test]
    fn data_and_context_limits() {
        let limits = Limits::default();
        for which in ["data", "context"] {
            let mut m = msg();
            // A JSON string of n characters serializes to n + 2 bytes.
            let set = |m: &mut Message, n: usize| {
                let v = Some(Value::String("x".repeat(n)));
                if which == "data" {
                    m.data = v
                } else {
                    m.context = v
                }
            };
            set(&mut m, limits.data_bytes - 2);
            m.validate(&limits).unwrap();
            set(&mut m, limits.data_bytes - 1);
            assert_eq!(field_of(&m, &limits), which);
        }
    }

    #[test]
    fn new_fields_are_left_out_when_default() {
        let m = msg();
        let json = serde_json::to_string(&m).unwrap();
        assert!(
            !json.contains("importance")
                && !json.contains("ack_required")
                && !json.contains("receipt")
        );
        let mut m = msg();
        m.importance = Importance::Urgent;
        m.ack_required = true;
        let back: Message = serde_json::from_str(&serde_json::to_string(&m).unwrap()).unwrap();
        assert_eq!(back, m);
        let bad = serde_json::to_string(&m)
            .unwrap()
            .replace("urgent", "critical");
        assert!(serde_json::from_str::<Message>(&bad).is_err());
    }

    #[test]
    fn receipts_carry_nothing_else() {
        use crate::protocol::{MAX_ANSWER_CHARS, ReceiptKind};
        let limits = Limits::default();
        let original = msg();
        let receipt = |answer: Option<String>| Receipt {
            of: original.id,
            kind: ReceiptKind::Acknowledged,
            answer,
        };
        let ok = Message::receipt(addr("bob"), addr("alice"), original.thread, receipt(None));
        ok.validate(&limits).unwrap();
        let long = Message::receipt(
            addr("bob"),
            addr("alice"),
            original.thread,
            receipt(Some("x".repeat(MAX_ANSWER_CHARS + 1))),
        );
        assert_eq!(field_of(&long, &limits), "receipt.answer");
        let mut two = ok.clone();
        two.cc = vec![addr("carol")];
        assert_eq!(field_of(&two, &limits), "receipt");
        let mut with_body = ok.clone();
        with_body.body = "click here".into();
        assert_eq!(field_of(&with_body, &limits), "receipt");
        let mut urgent = ok.clone();
        urgent.importance = Importance::Urgent;
        assert_eq!(field_of(&urgent, &limits), "receipt");
        let mut elsewhere = ok;
        elsewhere.in_reply_to = None;
        assert_eq!(field_of(&elsewhere, &limits), "receipt");
    }

    #[test]
    fn attachment_limits() {
        let limits = Limits::default();
        let mut m = msg();
        m.attachments = (0..limits.attachments)
            .map(|i| Attachment::new(format!("f{i}.txt"), "text/plain", vec![1, 2]))
            .collect();
        m.validate(&limits).unwrap();
        m.attachments
            .push(Attachment::new("late.txt", "text/plain", vec![]));
        assert_eq!(field_of(&m, &limits), "attachments");

        let mut m = msg();
        m.attachments = vec![Attachment::new(
            "n".repeat(limits.attachment_name_chars),
            "text/plain",
            vec![],
        )];
        m.validate(&limits).unwrap();
        m.attachments[0].name.push('n');
        assert_eq!(field_of(&m, &limits), "attachments[0].name");

        let mut a = Attachment::new(
            "a.bin",
            format!("application/{}", "x".repeat(limits.media_type_chars - 12)),
            vec![],
        );
        m.attachments = vec![a.clone()];
        m.validate(&limits).unwrap();
        a.media_type.push('x');
        m.attachments = vec![a];
        assert_eq!(field_of(&m, &limits), "attachments[0].media_type");

        for (bad, field) in [("../etc", "name"), ("bad type", "media_type")] {
            let mut a = Attachment::new("ok.txt", "text/plain", vec![1]);
            if field == "name" {
                a.name = bad.into()
            } else {
                a.media_type = bad.into()
            }
            m.attachments = vec![a];
            assert_eq!(field_of(&m, &limits), format!("attachments[0].{field}"));
        }
        let mut a = Attachment::new("ok.txt", "text/plain", vec![1]);
        a.bytes = vec![2];
        m.attachments = vec![a.clone()];
        assert_eq!(field_of(&m, &limits), "attachments[0].sha256");
        a.bytes = vec![1, 1];
        m.attachments = vec![a];
        assert_eq!(field_of(&m, &limits), "attachments[0].size");
    }

    #[test]
    fn attachment_bytes_are_bounded_per_file_and_per_message() {
        let limits = Limits {
            attachment_bytes: 10,
            attachments_bytes: 15,
            ..Limits::default()
        };
        let mut m = msg();
        m.attachments = vec![Attachment::new(
            "a.bin",
            "application/octet-stream",
            vec![0; 10],
        )];
        m.validate(&limits).unwrap();
        m.attachments = vec![Attachment::new(
            "a.bin",
            "application/octet-stream",
            vec![0; 11],
        )];
        let e = m.validate(&limits).unwrap_err();
        assert_eq!(e.field, "attachments[0].bytes");
        assert!(
            e.problem
                .contains("\"a.bin\" is 11 bytes, over the limit of 10"),
            "{e}"
        );
        m.attachments = vec![
            Attachment::new("a.bin", "application/octet-stream", vec![0; 8]),
            Attachment::new("b.bin", "application/octet-stream", vec![0; 8]),
        ];
        let e = m.validate(&limits).unwrap_err();
        assert_eq!(e.field, "attachments");
        assert!(
            e.problem
                .contains("16 bytes together, over the limit of 15"),
            "{e}"
        );
    }
}
