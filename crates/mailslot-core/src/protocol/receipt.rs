//! Receipts: a recipient telling a message's sender that it read or acknowledged it. A receipt
//! travels as a sealed [`super::Message`] of its own (signed, sealed, queued, retried and
//! deduplicated like mail), but the receiving client records it against the sent message
//! instead of showing it as mail.

use serde::{Deserialize, Serialize};

use super::{MessageId, ValidationError};

/// The longest answer an acknowledgement carries, in characters.
pub const MAX_ANSWER_CHARS: usize = 500;

/// What a receipt says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReceiptKind {
    /// The recipient's client handed the message over read (sent only when the recipient's
    /// owner turned read receipts on).
    Read,
    /// The recipient acknowledged it (the `acknowledge` tool or command).
    Acknowledged,
}

impl ReceiptKind {
    /// Its name, as in JSON and the store.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Read => "read",
            Self::Acknowledged => "acknowledged",
        }
    }

    /// The kind the store names `s`.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "read" => Some(Self::Read),
            "acknowledged" => Some(Self::Acknowledged),
            _ => None,
        }
    }
}

/// The receipt a message carries instead of mail.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Receipt {
    /// The message it is about (sent by the receipt's recipient).
    pub of: MessageId,
    /// Read or acknowledged.
    pub kind: ReceiptKind,
    /// A short answer, only with an acknowledgement.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answer: Option<String>,
}

impl Receipt {
    /// Checks the answer: only on an acknowledgement, at most [`MAX_ANSWER_CHARS`].
    pub fn validate(&self) -> Result<(), ValidationError> {
        let Some(answer) = &self.answer else {
            return Ok(());
        };
        if self.kind != ReceiptKind::Acknowledged {
            return Err(ValidationError::new(
                "answer",
                "only an acknowledgement carries an answer",
            ));
        }
        validate_answer(answer)
    }
}

/// Checks an acknowledgement's answer: at most [`MAX_ANSWER_CHARS`] characters.
pub fn validate_answer(answer: &str) -> Result<(), ValidationError> {
    let len = answer.chars().count();
    if len > MAX_ANSWER_CHARS {
        return Err(ValidationError::new(
            "answer",
            format!(
                "is {len} characters, over the limit of {MAX_ANSWER_CHARS}; keep it short and send the rest as a reply"
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_bounded_and_only_on_acknowledgements() {
        let mut r = Receipt {
            of: MessageId::new(),
            kind: ReceiptKind::Acknowledged,
            answer: Some("é".repeat(MAX_ANSWER_CHARS)),
        };
        r.validate().unwrap();
        r.answer.as_mut().unwrap().push('x');
        let err = r.validate().unwrap_err();
        assert_eq!(err.field, "answer");
        assert!(
            err.problem.contains("501") && err.problem.contains("500"),
            "{err}"
        );
        r.answer = Some("ok".into());
        r.kind = ReceiptKind::Read;
        assert_eq!(r.validate().unwrap_err().field, "answer");
        r.answer = None;
        r.validate().unwrap();
        for k in [ReceiptKind::Read, ReceiptKind::Acknowledged] {
            assert_eq!(ReceiptKind::parse(k.as_str()), Some(k));
        }
    }
}
