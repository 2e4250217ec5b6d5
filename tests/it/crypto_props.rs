//! Property tests for signing and sealing: round trips, tamper detection, BCC privacy.

use mailslot::crypto::sign::{self, Domain};
use mailslot::crypto::{Identity, OpenError, PublicIdentity, open, seal};
use mailslot::protocol::{
    Address, AgentName, Attachment, Limits, Message, MessageId, SealedEnvelope,
};
use proptest::prelude::*;
use serde_json::json;

fn addr(name: &str) -> Address {
    Address::local(AgentName::new(name).unwrap())
}

/// A valid message from `sender` whose recipients are the given roles: 0 = to, 1 = cc, 2 = bcc.
fn message_strategy() -> impl Strategy<Value = (Message, usize)> {
    let roles = prop::collection::vec(0u8..3, 1..=5);
    let subject = "\\PC{0,60}";
    let body = "(?s).{0,400}";
    let data = prop::option::of(prop::collection::btree_map(
        "[a-z]{1,8}",
        any::<i32>(),
        0..4,
    ));
    let attachment = prop::option::of(prop::collection::vec(any::<u8>(), 0..64));
    let reply = any::<bool>();
    (
        roles,
        subject,
        body,
        data,
        attachment,
        reply,
        "[a-z0-9][a-z0-9._-]{0,8}",
    )
        .prop_map(
            |(roles, subject, body, data, attachment, reply, host_tag)| {
                let mut m = Message::new(addr("sender"), Vec::new(), subject, body);
                let n = roles.len();
                for (i, role) in roles.into_iter().enumerate() {
                    let a = addr(&format!("r{i}-{host_tag}"));
                    match role {
                        0 => m.to.push(a),
                        1 => m.cc.push(a),
                        _ => m.bcc.push(a),
                    }
                }
                m.data = data.map(|d| json!(d));
                m.context = Some(json!({"step": 3, "branch": "main"}));
                if let Some(bytes) = attachment {
                    m.attachments.push(Attachment::new(
                        "notes.bin",
                        "application/octet-stream",
                        bytes,
                    ));
                }
                if reply {
                    m.in_reply_to = Some(MessageId::new());
                }
                (m, n)
            },
        )
}

struct World {
    sender: Identity,
    recipients: Vec<(Address, Identity)>,
    keys: Vec<(Address, PublicIdentity)>,
}

fn world(message: &Message) -> World {
    let recipients: Vec<(Address, Identity)> = message
        .recipients()
        .map(|a| (a.clone(), Identity::generate()))
        .collect();
    let keys = recipients
        .iter()
        .map(|(a, id)| (a.clone(), id.public().clone()))
        .collect();
    World {
        sender: Identity::generate(),
        recipients,
        keys,
    }
}

/// What recipient `me` should see: no BCC list, except itself when it was a BCC recipient.
fn expected_view(message: &Message, me: &Address) -> Message {
    let mut view = message.clone();
    view.bcc.retain(|b| b == me);
    view
}

fn open_for(
    copies: &[SealedEnvelope],
    me: &Address,
    id: &Identity,
    sender: &PublicIdentity,
) -> Result<Message, OpenError> {
    let limits = Limits::default();
    let copy = copies
        .iter()
        .find(|c| c.recipients().any(|r| r == me))
        .expect("a copy for every recipient");
    open(&copy.for_recipient(me).unwrap(), me, id, sender, &limits)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn every_recipient_opens_what_was_sealed((message, _) in message_strategy()) {
        let w = world(&message);
        let copies = seal(&message, &w.sender, &w.keys, &Limits::default()).unwrap();
        let visible = message.to.len() + message.cc.len();
        prop_assert_eq!(copies.len(), usize::from(visible > 0) + message.bcc.len());
        for (me, id) in &w.recipients {
            let opened = open_for(&copies, me, id, w.sender.public()).unwrap();
            prop_assert_eq!(opened, expected_view(&message, me));
        }
    }

    #[test]
    fn no_copy_reveals_other_bcc_recipients((message, _) in message_strategy()) {
        prop_assume!(message.bcc.len() >= 2 || (!message.bcc.is_empty() && !message.to.is_empty()));
        let w = world(&message);
        let copies = seal(&message, &w.sender, &w.keys, &Limits::default()).unwrap();
        for (me, id) in &w.recipients {
            let copy = copies.iter().find(|c| c.recipients().any(|r| r == me)).unwrap();
            let readable: Vec<&Address> = copy.recipients().collect();
            let opened = open_for(&copies, me, id, w.sender.public()).unwrap();
            for other in message.bcc.iter().filter(|b| *b != me) {
                prop_assert!(!readable.contains(&other), "routing of {}'s copy names bcc {}", me, other);
                prop_assert!(!opened.bcc.contains(other), "{} learned bcc {}", me, other);
            }
        }
    }

    #[test]
    fn any_flipped_byte_of_a_delivered_copy_fails((message, _) in message_strategy(), pos in any::<prop::sample::Index>(), mask in 1u8..=255) {
        let w = world(&message);
        let limits = Limits::default();
        let copies = seal(&message, &w.sender, &w.keys, &limits).unwrap();
        let (me, id) = &w.recipients[0];
        let copy = copies.iter().find(|c| c.recipients().any(|r| r == me)).unwrap().for_recipient(me).unwrap();
        let mut bytes = copy.to_bytes();
        let i = pos.index(bytes.len());
        bytes[i] ^= mask;
        let reopened = SealedEnvelope::from_bytes(&bytes, &limits)
            .map_err(|e| e.to_string())
            .and_then(|env| open(&env, me, id, w.sender.public(), &limits).map_err(|e| e.to_string()));
        prop_assert!(reopened.is_err(), "flipping byte {} with {:#04x} still opened", i, mask);
    }

    #[test]
    fn any_flipped_byte_of_a_signature_or_its_bytes_fails(bytes in prop::collection::vec(any::<u8>(), 0..512), pos in any::<prop::sample::Index>(), mask in 1u8..=255) {
        let id = Identity::generate();
        let mut signed = sign::sign(&id, Domain::Letter, &bytes);
        prop_assert_eq!(sign::verify(id.public(), Domain::Letter, &signed).unwrap(), &bytes[..]);
        let i = pos.index(signed.len());
        signed[i] ^= mask;
        prop_assert!(sign::verify(id.public(), Domain::Letter, &signed).is_err());
    }

    #[test]
    fn outsiders_cannot_open((message, _) in message_strategy()) {
        let w = world(&message);
        let copies = seal(&message, &w.sender, &w.keys, &Limits::default()).unwrap();
        let outsider = Identity::generate();
        let stranger = addr("stranger");
        for copy in &copies {
            prop_assert_eq!(
                open(copy, &stranger, &outsider, w.sender.public(), &Limits::default()),
                Err(OpenError::NotForMe(stranger.clone()))
            );
            // Claiming a recipient's address does not give its keys.
            let victim = copy.recipients().next().unwrap().clone();
            prop_assert_eq!(
                open(copy, &victim, &outsider, w.sender.public(), &Limits::default()),
                Err(OpenError::Decrypt)
            );
        }
    }
}

#[test]
fn every_single_flipped_bit_of_a_copy_is_detected() {
    let message = Message::new(
        addr("alice"),
        vec![addr("bob"), addr("carol")],
        "plan",
        "ship friday",
    );
    let w = world(&message);
    let limits = Limits::default();
    let copy = seal(&message, &w.sender, &w.keys, &limits)
        .unwrap()
        .remove(0);
    let (bob, bob_id) = &w.recipients[0];
    let delivered = copy.for_recipient(bob).unwrap().to_bytes();
    for i in 0..delivered.len() {
        for bit in 0..8 {
            let mut bytes = delivered.clone();
            bytes[i] ^= 1 << bit;
            let ok = SealedEnvelope::from_bytes(&bytes, &limits)
                .ok()
                .is_some_and(|env| open(&env, bob, bob_id, w.sender.public(), &limits).is_ok());
            assert!(!ok, "flipping bit {bit} of byte {i} went unnoticed");
        }
    }
}

#[test]
fn a_letter_signed_by_someone_else_is_refused() {
    let message = Message::new(addr("alice"), vec![addr("bob")], "hi", "from alice, honest");
    let w = world(&message);
    let mallory = Identity::generate();
    let forged = seal(&message, &mallory, &w.keys, &Limits::default())
        .unwrap()
        .remove(0);
    let (bob, bob_id) = &w.recipients[0];
    // Bob checks against the keys he holds for alice.
    let err = open(&forged, bob, bob_id, w.sender.public(), &Limits::default()).unwrap_err();
    assert!(matches!(err, OpenError::Signature(_)), "{err:?}");
}

#[test]
fn envelope_size_limit_is_exact() {
    let message = Message::new(addr("alice"), vec![addr("bob")], "size", "x".repeat(500));
    let w = world(&message);
    let copy = seal(&message, &w.sender, &w.keys, &Limits::default())
        .unwrap()
        .remove(0);
    let bytes = copy.to_bytes();
    let exact = Limits {
        envelope_bytes: bytes.len(),
        ..Limits::default()
    };
    assert_eq!(SealedEnvelope::from_bytes(&bytes, &exact).unwrap(), copy);
    let under = Limits {
        envelope_bytes: bytes.len() - 1,
        ..Limits::default()
    };
    assert_eq!(
        SealedEnvelope::from_bytes(&bytes, &under)
            .unwrap_err()
            .field,
        "envelope"
    );
}

#[test]
fn oversized_envelopes_are_refused_before_parsing() {
    let limits = Limits {
        envelope_bytes: 64,
        ..Limits::default()
    };
    let err = SealedEnvelope::from_bytes(&[b' '; 65], &limits).unwrap_err();
    assert_eq!(err.field, "envelope");
    assert!(err.problem.contains("64"), "{err}");
    let message = Message::new(addr("alice"), vec![addr("bob")], "big", "x".repeat(2000));
    let w = world(&message);
    let err = seal(
        &message,
        &w.sender,
        &w.keys,
        &Limits {
            envelope_bytes: 1000,
            ..Limits::default()
        },
    )
    .unwrap_err();
    assert!(err.to_string().contains("envelope"), "{err}");
}
