//! The owner's voice: a message an owner writes to their own agent, signed with the owner
//! key and written straight into the agent's store (the owner and the agent share the
//! home). It never travels: no frame carries it and nothing received from a relay can become
//! one. This file says what such a message is and the exact bytes the owner signs.

use super::{Address, AgentName, Importance, Limits, Message, ValidationError};

/// The longest subject `tell` makes from the body's first line when none is given.
const DERIVED_SUBJECT_CHARS: usize = 80;

/// A message from `agent`'s owner to `agent`, sent now: from and to are the agent itself
/// (the owner has no address; what marks it as the owner's is the owner key's signature), a
/// thread of its own, and nothing but a subject and a body. With no subject, the body's
/// first line (cut to 80 characters) is the subject. Checked against the default limits.
pub fn owner_message(
    agent: &AgentName,
    subject: Option<&str>,
    body: &str,
) -> Result<Message, ValidationError> {
    if body.trim().is_empty() {
        return Err(ValidationError::new(
            "body",
            "is empty; write what your agent should hear",
        ));
    }
    let subject = match subject {
        Some(s) => s.to_owned(),
        None => first_line(body),
    };
    let me = Address::local(agent.clone());
    let message = Message::new(me.clone(), vec![me], subject, body);
    message.validate(&Limits::default())?;
    Ok(message)
}

fn first_line(body: &str) -> String {
    let line = body.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
    let mut out: String = line
        .trim()
        .chars()
        .filter(|c| !c.is_control())
        .take(DERIVED_SUBJECT_CHARS)
        .collect();
    if line.trim().chars().count() > DERIVED_SUBJECT_CHARS {
        out.pop();
        out.push('…');
    }
    out
}

/// The bytes the owner signs for `message` to `agent` (after the domain prefix
/// `mailslot/v1/owner-voice\0`), or `None` when the message is not of the owner's shape
/// (from and to the agent alone, no copies, no reply, no data, context, attachments,
/// importance, acknowledgement request or notice): only what the bytes cover can be shown
/// as the owner's words.
///
/// `agent ‖ 0 ‖ id ‖ 0 ‖ thread ‖ 0 ‖ sent_at (milliseconds since the epoch, decimal) ‖ 0 ‖
/// subject length (bytes, u32 big-endian) ‖ subject ‖ body`. Names, ids and the decimal
/// time hold no NUL; the subject's length says where the body starts.
pub fn voice_payload(agent: &AgentName, message: &Message) -> Option<Vec<u8>> {
    let me = Address::local(agent.clone());
    let shaped = message.from == me
        && message.to == [me]
        && message.cc.is_empty()
        && message.bcc.is_empty()
        && message.in_reply_to.is_none()
        && message.data.is_none()
        && message.context.is_none()
        && message.attachments.is_empty()
        && message.importance == Importance::Normal
        && !message.ack_required
        && !message.is_notice();
    if !shaped {
        return None;
    }
    let subject = message.subject.as_bytes();
    let mut bytes = Vec::with_capacity(128 + subject.len() + message.body.len());
    for part in [
        agent.as_str().to_owned(),
        message.id.to_string(),
        message.thread.to_string(),
        message.sent_at.as_millisecond().to_string(),
    ] {
        bytes.extend_from_slice(part.as_bytes());
        bytes.push(0);
    }
    bytes.extend_from_slice(&(subject.len() as u32).to_be_bytes());
    bytes.extend_from_slice(subject);
    bytes.extend_from_slice(message.body.as_bytes());
    Some(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bob() -> AgentName {
        AgentName::new("bob").unwrap()
    }

    #[test]
    fn the_subject_is_the_first_line_unless_given() {
        let m = owner_message(&bob(), None, "\n  Stop the deploy.\nThen tell me why.").unwrap();
        assert_eq!(m.subject, "Stop the deploy.");
        assert_eq!(m.from, Address::parse("bob").unwrap());
        assert_eq!(m.to, [Address::parse("bob").unwrap()]);
        let long = "x".repeat(200);
        let m = owner_message(&bob(), None, &long).unwrap();
        assert_eq!(m.subject.chars().count(), DERIVED_SUBJECT_CHARS);
        let m = owner_message(&bob(), Some("Deploy"), "Stop it.").unwrap();
        assert_eq!(m.subject, "Deploy");
    }

    #[test]
    fn empty_and_oversized_bodies_are_refused_naming_the_field() {
        let err = owner_message(&bob(), None, "  \n").unwrap_err();
        assert!(err.to_string().contains("body"), "{err}");
        let big = "y".repeat(Limits::default().body_bytes + 1);
        let err = owner_message(&bob(), None, &big).unwrap_err();
        assert!(err.to_string().contains("body"), "{err}");
        let err = owner_message(&bob(), Some("two\nlines"), "x").unwrap_err();
        assert!(err.to_string().contains("subject"), "{err}");
    }

    #[test]
    fn every_shown_part_is_covered_and_other_shapes_have_no_payload() {
        let m = owner_message(&bob(), Some("s"), "body").unwrap();
        let payload = voice_payload(&bob(), &m).unwrap();
        for change in [
            |m: &mut Message| m.body.push('!'),
            |m: &mut Message| m.subject.push('!'),
            |m: &mut Message| m.sent_at += jiff::SignedDuration::from_millis(1),
            |m: &mut Message| m.thread = crate::protocol::ThreadId::new(),
            |m: &mut Message| m.id = crate::protocol::MessageId::new(),
        ] {
            let mut changed = m.clone();
            change(&mut changed);
            assert_ne!(voice_payload(&bob(), &changed).unwrap(), payload);
        }
        // Moving bytes between subject and body changes the payload too.
        let mut moved = m.clone();
        moved.subject = "sb".into();
        moved.body = "ody".into();
        assert_ne!(voice_payload(&bob(), &moved).unwrap(), payload);
        assert!(voice_payload(&AgentName::new("eve").unwrap(), &m).is_none());
        for change in [
            |m: &mut Message| m.cc.push(Address::parse("eve").unwrap()),
            |m: &mut Message| m.from = Address::parse("eve").unwrap(),
            |m: &mut Message| m.data = Some(serde_json::json!({"a": 1})),
            |m: &mut Message| m.importance = Importance::Urgent,
            |m: &mut Message| m.in_reply_to = Some(crate::protocol::MessageId::new()),
        ] {
            let mut changed = m.clone();
            change(&mut changed);
            assert!(voice_payload(&bob(), &changed).is_none());
        }
    }
}
