//! Building outgoing messages: a reply's recipients, subject and thread follow from the
//! message it answers, the same way for the CLI and for MCP tools.

use crate::protocol::{Address, Limits, Message};

/// Why a reply cannot be built.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ComposeError {
    /// Replying to one's own message leaves nobody to write to.
    #[error(
        "message {0} is from you; write to one of its recipients with send instead of replying"
    )]
    OwnMessage(crate::protocol::MessageId),
}

/// A reply to `original` from `me`. With `all`, the other recipients (to and cc) are kept;
/// BCC recipients never are (nobody else knows them).
pub fn reply(
    original: &Message,
    me: &Address,
    all: bool,
    body: String,
) -> Result<Message, ComposeError> {
    let mut to = vec![original.from.clone()];
    let mut cc = Vec::new();
    if all {
        to.extend(
            original
                .to
                .iter()
                .filter(|a| *a != me && **a != original.from)
                .cloned(),
        );
        cc.extend(
            original
                .cc
                .iter()
                .filter(|a| *a != me && !to.contains(a))
                .cloned(),
        );
    }
    to.retain(|a| a != me);
    if to.is_empty() {
        return Err(ComposeError::OwnMessage(original.id));
    }
    let subject = if original.subject.starts_with("Re: ") {
        original.subject.clone()
    } else {
        format!("Re: {}", original.subject)
    };
    let subject = subject
        .chars()
        .take(Limits::default().subject_chars)
        .collect::<String>();
    let mut message = Message::new(me.clone(), to, subject, body);
    message.cc = cc;
    message.thread = original.thread;
    message.in_reply_to = Some(original.id);
    Ok(message)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(s: &str) -> Address {
        Address::parse(s).unwrap()
    }

    #[test]
    fn reply_all_keeps_others_drops_bcc_and_self() {
        let mut original = Message::new(
            addr("bob"),
            vec![addr("alice"), addr("carol")],
            "plan",
            "hi",
        );
        original.cc = vec![addr("dave"), addr("alice")];
        original.bcc = vec![addr("eve")];
        let r = reply(&original, &addr("alice"), true, "ok".into()).unwrap();
        assert_eq!(r.to, vec![addr("bob"), addr("carol")]);
        assert_eq!(r.cc, vec![addr("dave")]);
        assert!(r.bcc.is_empty());
        assert_eq!(r.subject, "Re: plan");
        assert_eq!(r.thread, original.thread);
        assert_eq!(r.in_reply_to, Some(original.id));

        let single = reply(&original, &addr("alice"), false, "ok".into()).unwrap();
        assert_eq!(single.to, vec![addr("bob")]);
        assert!(single.cc.is_empty());
        assert_eq!(
            reply(&single, &addr("alice"), false, "x".into()).unwrap_err(),
            ComposeError::OwnMessage(single.id)
        );
    }
}
