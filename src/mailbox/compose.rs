//! Building outgoing messages: a reply's recipients, subject and thread follow from the
//! message it answers, the same way for the CLI and for MCP tools.

use super::MailboxError;
use crate::client::{RelayUrl, own_relay_name};
use crate::protocol::{Address, AgentName, Limits, Message, RelayName};
use crate::store::StoredMessage;

/// Why a reply cannot be built.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ComposeError {
    /// Replying to one's own message leaves nobody to write to.
    #[error(
        "message {0} is from you; write to one of its recipients with send instead of replying"
    )]
    OwnMessage(crate::protocol::MessageId),
    /// The owner's messages (`mailslot tell`) have no address to answer: the owner is a
    /// person at the agent's session, not an agent.
    #[error(
        "message {0} is from your owner, who wrote it to you with `mailslot tell`, not by mail: there is no address to reply to. Answer your owner in your session (the conversation), not with the reply tool"
    )]
    OwnerMessage(crate::protocol::MessageId),
}

/// Whether building a reply to `original` needs the name this agent's relay publishes: only
/// when an address in it names a relay other than `authority` (the relay URL's host and port),
/// which may or may not be this agent's own.
pub fn needs_home(original: &Message, authority: &str) -> bool {
    std::iter::once(&original.from)
        .chain(&original.to)
        .chain(&original.cc)
        .filter_map(Address::host)
        .any(|h| h.as_str() != authority)
}

/// A reply to `original` from the agent `me`, whose relay publishes the name `home`. With
/// `all`, the other recipients (to and cc) are kept; BCC recipients never are (nobody else
/// knows them). Addresses are rewritten as this agent must write them: a bare name in mail from
/// another relay is an agent there (`carol` from `alice@relay-a` is `carol@relay-a`), and a
/// name at `home` is a local agent (bare). So a reply to `alice@relay-a` goes to
/// `alice@relay-a`, and this agent is left out under either spelling of its address.
pub fn reply(
    original: &Message,
    me: &AgentName,
    home: &RelayName,
    all: bool,
    body: String,
) -> Result<Message, ComposeError> {
    let sender_relay = original.from.host().filter(|h| *h != home);
    let mine = |a: &Address| match a.host() {
        None => match sender_relay {
            Some(relay) => Address::remote(a.name().clone(), relay.clone()),
            None => a.clone(),
        },
        Some(h) if h == home => Address::local(a.name().clone()),
        Some(_) => a.clone(),
    };
    let me = Address::local(me.clone());
    let from = mine(&original.from);
    // Group mail names the group alone, never this agent: all of it is answered to the group
    // (whose relay fans it out again, to the sender too), the sender alone otherwise.
    let group = match (
        original.to.as_slice(),
        original.cc.is_empty() && original.bcc.is_empty(),
    ) {
        ([to], true) if mine(to) != me => Some(mine(to)),
        _ => None,
    };
    let mut to = match (&group, all) {
        (Some(group), true) => vec![group.clone()],
        _ => vec![from.clone()],
    };
    let mut cc = Vec::new();
    if all && group.is_none() {
        for a in original.to.iter().map(mine) {
            if a != me && !to.contains(&a) {
                to.push(a);
            }
        }
        for a in original.cc.iter().map(mine) {
            if a != me && !to.contains(&a) && !cc.contains(&a) {
                cc.push(a);
            }
        }
    }
    to.retain(|a| *a != me);
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
    let mut message = Message::new(me, to, subject, body);
    message.cc = cc;
    message.thread = original.thread;
    message.in_reply_to = Some(original.id);
    Ok(message)
}

/// [`reply`] from the agent `me` of the relay at `relay`, asking that relay for its published
/// name only when the original names another relay (see [`needs_home`]). The owner's
/// messages, verified or not, are refused: they came from no address.
pub async fn reply_at(
    original: &StoredMessage,
    me: &AgentName,
    relay: &RelayUrl,
    all: bool,
    body: String,
) -> Result<Message, MailboxError> {
    if original.owner.is_some() {
        return Err(ComposeError::OwnerMessage(original.message.id).into());
    }
    let original = &original.message;
    let home = match needs_home(original, relay.authority()) {
        true => own_relay_name(relay).await?,
        false => RelayName::new(relay.authority())?,
    };
    Ok(reply(original, me, &home, all, body)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(s: &str) -> Address {
        Address::parse(s).unwrap()
    }

    fn name(s: &str) -> AgentName {
        AgentName::new(s).unwrap()
    }

    fn relay(s: &str) -> RelayName {
        RelayName::new(s).unwrap()
    }

    #[test]
    fn group_mail_is_answered_to_the_group_or_to_its_sender() {
        let original = Message::new(addr("lead"), vec![addr("team")], "plan", "hi");
        let here = relay("relay-a.example");
        let all = reply(&original, &name("bob"), &here, true, "ok".into()).unwrap();
        assert_eq!(all.to, vec![addr("team")], "reply_all answers the group");
        assert!(all.cc.is_empty());
        let one = reply(&original, &name("bob"), &here, false, "ok".into()).unwrap();
        assert_eq!(one.to, vec![addr("lead")], "reply answers the sender");
        // A member on another relay answers the group where it is.
        let far = Message::new(
            addr("lead@relay-a.example"),
            vec![addr("team@relay-a.example")],
            "plan",
            "hi",
        );
        let all = reply(
            &far,
            &name("dave"),
            &relay("relay-b.example"),
            true,
            "ok".into(),
        )
        .unwrap();
        assert_eq!(all.to, vec![addr("team@relay-a.example")]);
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
        let r = reply(
            &original,
            &name("alice"),
            &relay("relay-a.example"),
            true,
            "ok".into(),
        )
        .unwrap();
        assert_eq!(r.to, vec![addr("bob"), addr("carol")]);
        assert_eq!(r.cc, vec![addr("dave")]);
        assert!(r.bcc.is_empty());
        assert_eq!(r.subject, "Re: plan");
        assert_eq!(r.thread, original.thread);
        assert_eq!(r.in_reply_to, Some(original.id));

        let single = reply(
            &original,
            &name("alice"),
            &relay("relay-a.example"),
            false,
            "ok".into(),
        )
        .unwrap();
        assert_eq!(single.to, vec![addr("bob")]);
        assert!(single.cc.is_empty());
        assert_eq!(
            reply(
                &single,
                &name("alice"),
                &relay("relay-a.example"),
                false,
                "x".into()
            )
            .unwrap_err(),
            ComposeError::OwnMessage(single.id)
        );
    }

    #[test]
    fn a_reply_across_relays_keeps_full_addresses_and_leaves_me_out_under_either_spelling() {
        // bob on relay-b got this from alice on relay-a: carol is alice's neighbour, dave and
        // bob's own address are on relay-b, erin on a third relay.
        let mut original = Message::new(
            addr("alice@relay-a.example"),
            vec![
                addr("bob@relay-b.example"),
                addr("carol"),
                addr("dave@relay-b.example"),
            ],
            "plan",
            "hi",
        );
        original.cc = vec![addr("erin@relay-c.example"), addr("bob@relay-b.example")];
        let home = relay("relay-b.example");
        assert!(needs_home(&original, "127.0.0.1:7878"));
        let r = reply(&original, &name("bob"), &home, true, "ok".into()).unwrap();
        assert_eq!(
            r.to,
            vec![
                addr("alice@relay-a.example"),
                addr("carol@relay-a.example"),
                addr("dave")
            ]
        );
        assert_eq!(r.cc, vec![addr("erin@relay-c.example")]);
        assert_eq!(
            r.from,
            addr("bob"),
            "the outbox makes it the full address when sealing"
        );
        let single = reply(&original, &name("bob"), &home, false, "ok".into()).unwrap();
        assert_eq!(single.to, vec![addr("alice@relay-a.example")]);

        // A bare bob in mail from relay-a is relay-a's bob, not this one: kept.
        let mut namesake = original.clone();
        namesake.to = vec![addr("bob"), addr("bob@relay-b.example")];
        namesake.cc.clear();
        let r = reply(&namesake, &name("bob"), &home, true, "ok".into()).unwrap();
        assert_eq!(
            r.to,
            vec![addr("alice@relay-a.example"), addr("bob@relay-a.example")]
        );

        // Mail from a local sender written with this relay's name: all local, bare.
        let mut local = original.clone();
        local.from = addr("dave@relay-b.example");
        local.to = vec![addr("bob"), addr("carol")];
        local.cc.clear();
        let r = reply(&local, &name("bob"), &home, true, "ok".into()).unwrap();
        assert_eq!(r.to, vec![addr("dave"), addr("carol")]);
        assert!(!needs_home(
            &Message::new(addr("dave"), vec![addr("bob")], "s", "b"),
            "127.0.0.1:7878"
        ));
    }
}
