//! The relay-to-relay link (`/v1/relay`): the frames two relays exchange to deliver mail for
//! each other's agents. The dialing relay (the one holding mail) proves its name with its key,
//! the answering relay proves its own, then the dialer sends `deliver` frames in its queue's
//! order and the answerer answers each, in the same order, once the copies are on its disk.

use std::fmt::Write;

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use jiff::Timestamp;

use super::{Address, EnvelopeHead, ErrorCode, RelayName, RequestCode, Seq, b64};

/// Where a relay takes links from other relays.
pub const LINK_PATH: &str = "/v1/relay";
/// The link protocol's version.
pub const LINK_VERSION: u32 = 1;
/// Deliveries a dialer sends ahead of their answers.
pub const LINK_WINDOW: usize = 1024;

/// What the answering relay sends.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum LinkAnswer {
    /// First frame: who answers, and 32 fresh random bytes for the dialer to sign.
    Challenge {
        /// Link protocol version.
        v: u32,
        /// The answering relay's name.
        relay: RelayName,
        /// Its nonce.
        #[serde(with = "b64")]
        nonce: Vec<u8>,
    },
    /// The dialer is who it said; the answerer signs the same exchange with its own key.
    Welcome {
        /// Over [`link_payload`], domain `link-welcome`.
        #[serde(with = "b64")]
        signature: Vec<u8>,
    },
    /// The delivery `seq` is on the answerer's disk for every recipient not in `refused`;
    /// those it will never take (the dialer bounces them to the sender).
    Taken {
        /// The dialer's sequence number.
        seq: Seq,
        /// The recipients refused for good, each with why.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        refused: Vec<Refusal>,
    },
    /// The delivery `seq` was not taken, for now: the dialer waits `retry_after_ms` and sends
    /// it again (with everything after it).
    Later {
        /// The dialer's sequence number.
        seq: Seq,
        /// Why.
        code: ErrorCode,
        /// In words.
        message: String,
        /// How long to wait.
        retry_after_ms: u64,
    },
    /// The link is refused or broken; the connection closes after it.
    Error {
        /// Why.
        code: ErrorCode,
        /// In words, naming the fix.
        message: String,
    },
    /// Answers `ping`.
    Pong {},
    /// A `connect` or `approved` was applied.
    Done {},
    /// A `connect` or `approved` was refused.
    Refused {
        /// Why: `not_allowed`, `unknown_agent`, `bad_code`, `too_many_requests`, ...
        code: ErrorCode,
        /// In words, for the requester's owner.
        message: String,
    },
}

/// Bounces one `bounced` request carries at most.
pub const MAX_LINK_BOUNCES: usize = 100;

/// A copy that expired on the relay of its recipient, for its sender's relay.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RemoteBounce {
    /// The sender, an agent of the relay told.
    pub from: Address,
    /// The message id.
    pub id: super::MessageId,
    /// The recipient whose copy expired, an agent of the telling relay.
    pub to: Address,
    /// When it expired.
    pub expired_at: Timestamp,
}

/// One recipient the answering relay will not take a copy for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Refusal {
    /// The recipient, as the envelope names it.
    pub to: Address,
    /// Why: `unknown_recipient`, `not_allowed`, `quota_full`, `too_large`, ...
    pub code: ErrorCode,
}

/// What the dialing relay sends.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum LinkRequest {
    /// Answers the challenge: the dialer's name, its own nonce and its signature.
    Hello {
        /// The dialing relay's name, as its agents' addresses carry it.
        relay: RelayName,
        /// The dialer's nonce, which the answerer's welcome signs too.
        #[serde(with = "b64")]
        nonce: Vec<u8>,
        /// Over [`link_payload`], domain `link-hello`.
        #[serde(with = "b64")]
        signature: Vec<u8>,
    },
    /// Keeps the link open.
    Ping {},
    /// `from`, an agent of the dialing relay, asks `to`, an agent here, to accept its mail.
    /// The code was made by the dialing relay and given to `from`'s owner only; it is kept
    /// here to check the approval, never shown to `to`.
    Connect {
        /// The requester, `name@<dialing relay>`.
        from: Address,
        /// The agent asked, `name@<this relay>`.
        to: Address,
        /// The requester's note.
        note: String,
        /// The request's code.
        code: RequestCode,
        /// When the request lapses.
        expires_at: Timestamp,
    },
    /// `target`'s owner, on the dialing relay, denied `requester`'s request: it is withdrawn.
    Denied {
        /// The requester, an agent here.
        requester: Address,
        /// The denying agent, `name@<dialing relay>`.
        target: Address,
    },
    /// Copies of mail from agents here expired on the dialing relay before their recipients
    /// took them: the senders get bounces, as for their own relay's.
    Bounced {
        /// At most [`MAX_LINK_BOUNCES`].
        bounces: Vec<RemoteBounce>,
    },
    /// `target`'s owner, on the dialing relay, approved `requester`'s request with `code`:
    /// they are contacts on that relay, and now here too.
    Approved {
        /// The requester, an agent here.
        requester: Address,
        /// The approving agent, `name@<dialing relay>`.
        target: Address,
        /// The code of the request.
        code: RequestCode,
    },
}

/// A `deliver` frame as the answering relay reads it: the envelope's head, its bulk borrowed
/// from the frame, in one pass (a `deliver` is the one frame that carries a large value, so
/// it is kept out of the enum).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Deliver<'a> {
    #[serde(rename = "type")]
    _type: DeliverTag,
    /// The dialer's sequence number of this copy.
    pub seq: Seq,
    /// The group on the dialing relay this is a member's copy of (`team@<dialer>`); the
    /// answerer applies its member's consent as this group's.
    #[serde(default)]
    pub group: Option<Address>,
    /// The sealed envelope, with a key for each of the answerer's recipients only.
    #[serde(borrow)]
    pub envelope: EnvelopeHead<'a>,
}

/// A `deliver` frame whose envelope is not read, to answer one that cannot be.
#[derive(Deserialize)]
struct DeliverSeq<'a> {
    #[serde(rename = "type")]
    _type: DeliverTag,
    seq: Seq,
    #[serde(borrow)]
    #[expect(dead_code, reason = "present, but never read")]
    envelope: &'a RawValue,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "snake_case")]
enum DeliverTag {
    Deliver,
}

impl<'a> Deliver<'a> {
    /// `text` as a deliver frame: `None` for any other frame, `Some(Err((seq, why)))` for a
    /// deliver whose envelope cannot be read.
    pub fn read(text: &'a str) -> Option<Result<Self, (Seq, String)>> {
        match serde_json::from_str(text) {
            Ok(deliver) => Some(Ok(deliver)),
            Err(e) => {
                let frame: DeliverSeq<'_> = serde_json::from_str(text).ok()?;
                Some(Err((frame.seq, e.to_string())))
            }
        }
    }
}

/// A `deliver` frame's text around stored envelope bytes, without parsing them (a relay
/// never decodes mail): one allocation and one copy. The same frame goes to an agent and over
/// a link. `None` when the bytes are not text.
pub fn deliver_frame(seq: Seq, envelope: &[u8]) -> Option<String> {
    let envelope = std::str::from_utf8(envelope).ok()?;
    let mut out = String::with_capacity(envelope.len() + 48);
    write!(out, r#"{{"type":"deliver","seq":{seq},"envelope":"#).ok()?;
    out.push_str(envelope);
    out.push('}');
    Some(out)
}

/// How a group copy waits in another relay's mailbox: the tail of its `deliver` frame,
/// `{"group":"team@host","envelope":…}`. A mailbox holds opaque bytes (the spool's records
/// are frozen), so the group rides in them; a plain copy's bytes are its envelope, which
/// starts `{"v":`, so the two never mix up.
const GROUP_COPY_START: &str = r#"{"group":"#;

/// The bytes queued in `group`'s host's link mailbox for a member's copy `envelope`.
pub fn group_copy(group: &Address, envelope: &[u8]) -> Vec<u8> {
    let group = serde_json::to_string(group).expect("an address always serializes");
    let mut out = Vec::with_capacity(envelope.len() + group.len() + 24);
    out.extend_from_slice(GROUP_COPY_START.as_bytes());
    out.extend_from_slice(group.as_bytes());
    out.extend_from_slice(br#","envelope":"#);
    out.extend_from_slice(envelope);
    out.push(b'}');
    out
}

/// A group copy as it waits in a link mailbox ([`group_copy`]).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct GroupCopy<'a> {
    group: Address,
    #[serde(borrow)]
    envelope: &'a RawValue,
}

/// The envelope text and group of bytes waiting in a link mailbox: a plain copy is its
/// envelope, a group copy names its group ([`group_copy`]). `None` when they are neither.
pub fn read_link_copy(stored: &[u8]) -> Option<(&str, Option<Address>)> {
    let text = std::str::from_utf8(stored).ok()?;
    if !text.starts_with(GROUP_COPY_START) {
        return Some((text, None));
    }
    let copy: GroupCopy<'_> = serde_json::from_str(text).ok()?;
    Some((copy.envelope.get(), Some(copy.group)))
}

/// The `deliver` frame a link sends for bytes waiting in a link mailbox: a group copy's
/// frame names the group. Spliced without parsing, as [`deliver_frame`].
pub fn link_deliver_frame(seq: Seq, stored: &[u8]) -> Option<String> {
    let Some(rest) = stored.strip_prefix(GROUP_COPY_START.as_bytes()) else {
        return deliver_frame(seq, stored);
    };
    let rest = std::str::from_utf8(rest).ok()?;
    let mut out = String::with_capacity(rest.len() + 48);
    write!(out, r#"{{"type":"deliver","seq":{seq},"group":"#).ok()?;
    out.push_str(rest);
    Some(out)
}

/// The bytes both relays sign: the dialer's and the answerer's names and both nonces, so a
/// signature is good for this one exchange between these two relays only (the domain tells
/// the dialer's from the answerer's).
pub fn link_payload(
    dialer: &RelayName,
    answerer: &RelayName,
    dialer_nonce: &[u8],
    answerer_nonce: &[u8],
) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(128);
    for part in [
        dialer.as_str().as_bytes(),
        answerer.as_str().as_bytes(),
        dialer_nonce,
        answerer_nonce,
    ] {
        bytes.extend_from_slice(&(part.len() as u32).to_be_bytes());
        bytes.extend_from_slice(part);
    }
    bytes
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sealed() -> crate::protocol::SealedEnvelope {
        let (alice, bob) = (
            crate::crypto::Identity::generate(),
            crate::crypto::Identity::generate(),
        );
        let to = Address::parse("bob").unwrap();
        let m = crate::protocol::Message::new(
            Address::parse("alice").unwrap(),
            vec![to.clone()],
            "s",
            "b",
        );
        crate::crypto::seal(
            &m,
            &alice,
            &[(to, bob.public().clone())],
            &Default::default(),
        )
        .unwrap()
        .remove(0)
    }

    #[test]
    fn a_spliced_delivery_is_the_frame_an_agent_reads() {
        let env = sealed();
        let text = deliver_frame(42, &env.to_bytes()).unwrap();
        assert_eq!(
            serde_json::from_str::<crate::protocol::ServerFrame>(&text).unwrap(),
            crate::protocol::ServerFrame::Deliver {
                seq: 42,
                envelope: env
            }
        );
        assert!(deliver_frame(1, b"\xff").is_none(), "not text");
    }

    #[test]
    fn a_group_copy_is_delivered_naming_its_group_and_reads_back() {
        let env = sealed();
        let group = Address::parse("team@relay-a.example").unwrap();
        let stored = group_copy(&group, &env.to_bytes());
        let text = link_deliver_frame(9, &stored).unwrap();
        let d = Deliver::read(&text).unwrap().unwrap();
        assert_eq!((d.seq, d.group.as_ref()), (9, Some(&group)));
        assert_eq!(d.envelope.id, env.id);
        let (envelope, read) = read_link_copy(&stored).unwrap();
        assert_eq!(envelope.as_bytes(), env.to_bytes().as_slice());
        assert_eq!(read, Some(group));
        // A plain copy is its envelope, delivered as to an agent.
        let plain = env.to_bytes();
        assert_eq!(link_deliver_frame(3, &plain), deliver_frame(3, &plain));
        assert_eq!(read_link_copy(&plain).unwrap().1, None);
        assert!(read_link_copy(br#"{"group":1}"#).is_none(), "neither");
    }

    #[test]
    fn a_deliver_frame_reads_back_with_its_envelope_head() {
        let env = sealed();
        let text = deliver_frame(7, &env.to_bytes()).unwrap();
        let d = Deliver::read(&text).unwrap().unwrap();
        assert_eq!((d.seq, d.envelope.id), (7, env.id));
        let unreadable = deliver_frame(8, br#"{"v":1}"#).unwrap();
        assert!(matches!(Deliver::read(&unreadable), Some(Err((8, _)))));
        assert!(Deliver::read(r#"{"type":"ping"}"#).is_none());
    }

    #[test]
    fn the_payload_binds_both_names_and_nonces() {
        let (a, b) = (
            RelayName::new("a.example").unwrap(),
            RelayName::new("b.example").unwrap(),
        );
        let p = link_payload(&a, &b, b"n1", b"n2");
        assert_ne!(p, link_payload(&b, &a, b"n1", b"n2"));
        assert_ne!(p, link_payload(&a, &b, b"n2", b"n1"));
    }
}
