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
