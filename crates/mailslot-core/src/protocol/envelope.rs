//! The sealed envelope: what travels through a relay. Only routing fields are readable.

use std::borrow::Cow;

use jiff::Timestamp;
use serde::{Deserialize, Serialize};

use super::{Address, Limits, MessageId, ValidationError, b64};

/// The envelope format this build writes and reads.
pub const ENVELOPE_VERSION: u8 = 1;

/// A message sealed for one or more recipients. The relay reads `id`, `from`, `sent_at` and
/// each key's `to`; the subject, body and everything else are inside `ciphertext`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SealedEnvelope {
    /// Format version, [`ENVELOPE_VERSION`].
    pub v: u8,
    /// The message id (also inside, and checked against it on opening).
    pub id: MessageId,
    /// The claimed sender (also inside, and checked against the signature on opening).
    pub from: Address,
    /// When it was sent (also inside).
    pub sent_at: Timestamp,
    /// The content nonce (24 bytes, XChaCha20-Poly1305).
    #[serde(with = "b64")]
    pub nonce: Vec<u8>,
    /// The signed letter, encrypted once under a random content key.
    #[serde(with = "b64")]
    pub ciphertext: Vec<u8>,
    /// The content key, wrapped for each recipient of this copy.
    pub keys: Vec<KeyWrap>,
}

/// The content key sealed to one recipient with HPKE (RFC 9180).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeyWrap {
    /// The recipient this key is for.
    pub to: Address,
    /// HPKE encapsulated key.
    #[serde(with = "b64")]
    pub enc: Vec<u8>,
    /// The wrapped content key.
    #[serde(with = "b64")]
    pub key: Vec<u8>,
}

impl SealedEnvelope {
    /// The recipients this copy can be opened by.
    pub fn recipients(&self) -> impl Iterator<Item = &Address> {
        self.keys.iter().map(|k| &k.to)
    }

    /// The copy a relay stores for one recipient: the same ciphertext, only that key.
    pub fn for_recipient(&self, to: &Address) -> Option<Self> {
        let key = self.keys.iter().find(|k| &k.to == to)?.clone();
        Some(Self {
            keys: vec![key],
            ..self.clone()
        })
    }

    /// Serializes to the wire form (compact JSON).
    pub fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("an envelope always serializes")
    }

    /// Parses the wire form, refusing oversized input before reading it and any encoding
    /// other than the canonical one [`SealedEnvelope::to_bytes`] writes.
    pub fn from_bytes(bytes: &[u8], limits: &Limits) -> Result<Self, ValidationError> {
        if bytes.len() > limits.envelope_bytes {
            return Err(ValidationError::too_long(
                "envelope",
                bytes.len(),
                limits.envelope_bytes,
                "bytes",
            ));
        }
        let env: Self = serde_json::from_slice(bytes).map_err(|e| {
            ValidationError::new("envelope", format!("is not a valid sealed envelope: {e}"))
        })?;
        if env.v != ENVELOPE_VERSION {
            return Err(ValidationError::new(
                "envelope.v",
                format!(
                    "is {}; this build reads version {ENVELOPE_VERSION}; upgrade mailslot",
                    env.v
                ),
            ));
        }
        // One value, one encoding: any other spelling (whitespace, key order, `t` for `T` in a
        // time) is refused, so an envelope cannot change in transit without being noticed.
        if env.to_bytes() != bytes {
            return Err(ValidationError::new(
                "envelope",
                "is not in canonical form (compact JSON, fields in order)",
            ));
        }
        if env.keys.is_empty() {
            return Err(ValidationError::new(
                "envelope.keys",
                "is empty; an envelope needs at least one recipient",
            ));
        }
        if env.keys.len() > limits.recipients {
            return Err(ValidationError::new(
                "envelope.keys",
                format!(
                    "has {} recipients, over the limit of {}",
                    env.keys.len(),
                    limits.recipients
                ),
            ));
        }
        Ok(env)
    }
}

/// An envelope as a relay reads it: the routing fields parsed, the sealed parts kept as the
/// base64 text they arrived in (borrowed from the frame when they hold no escapes). Routing
/// mail this way never decodes or copies the bulk; [`EnvelopeHead::copy_for`] writes each
/// recipient's copy in the canonical form [`SealedEnvelope::from_bytes`] accepts.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EnvelopeHead<'a> {
    /// Format version, [`ENVELOPE_VERSION`].
    pub v: u8,
    /// The message id.
    pub id: MessageId,
    /// The claimed sender.
    pub from: Address,
    /// When it was sent.
    pub sent_at: Timestamp,
    /// The content nonce, base64.
    #[serde(borrow)]
    pub nonce: Cow<'a, str>,
    /// The ciphertext, base64.
    #[serde(borrow)]
    pub ciphertext: Cow<'a, str>,
    /// The wrapped content keys.
    #[serde(borrow)]
    pub keys: Vec<KeyWrapHead<'a>>,
}

/// A [`KeyWrap`] as a relay reads it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeyWrapHead<'a> {
    /// The recipient this key is for.
    pub to: Address,
    /// HPKE encapsulated key, base64.
    #[serde(borrow)]
    pub enc: Cow<'a, str>,
    /// The wrapped content key, base64.
    #[serde(borrow)]
    pub key: Cow<'a, str>,
}

impl EnvelopeHead<'_> {
    /// The copy a relay stores for one recipient, serialized: the same sealed parts, only
    /// that key. `None` when the envelope has no key for `to`.
    ///
    /// Written directly, in [`SealedEnvelope`]'s field order, because this runs for every
    /// copy the relay stores: serde's writer escaped the bulk byte by byte and grew its
    /// buffer as it went. The tests hold it to [`SealedEnvelope::to_bytes`].
    pub fn copy_for(&self, to: &Address) -> Option<Vec<u8>> {
        let key = self.keys.iter().find(|k| &k.to == to)?;
        let bulk = self.nonce.len() + self.ciphertext.len() + key.enc.len() + key.key.len();
        let mut out = Vec::with_capacity(bulk + 256);
        out.extend_from_slice(br#"{"v":"#);
        json(&mut out, &self.v);
        out.extend_from_slice(br#","id":"#);
        json(&mut out, &self.id);
        out.extend_from_slice(br#","from":"#);
        json(&mut out, &self.from);
        out.extend_from_slice(br#","sent_at":"#);
        json(&mut out, &self.sent_at);
        out.extend_from_slice(br#","nonce":"#);
        text(&mut out, &self.nonce);
        out.extend_from_slice(br#","ciphertext":"#);
        text(&mut out, &self.ciphertext);
        out.extend_from_slice(br#","keys":[{"to":"#);
        json(&mut out, &key.to);
        out.extend_from_slice(br#","enc":"#);
        text(&mut out, &key.enc);
        out.extend_from_slice(br#","key":"#);
        text(&mut out, &key.key);
        out.extend_from_slice(b"}]}");
        Some(out)
    }
}

/// Appends a value as serde_json writes it.
fn json(out: &mut Vec<u8>, value: &impl Serialize) {
    serde_json::to_writer(out, value).expect("envelope fields always serialize");
}

/// Appends a string field. Borrowed text came out of the frame unescaped, so it holds no
/// quote, backslash or control character (serde_json borrows only then, and refuses raw
/// control characters): its JSON form is the text in quotes. Owned text had escapes in the
/// frame and is escaped again the canonical way.
#[expect(
    clippy::ptr_arg,
    reason = "whether the text is borrowed is what matters here"
)]
fn text(out: &mut Vec<u8>, s: &Cow<'_, str>) {
    match s {
        Cow::Borrowed(raw) => {
            out.push(b'"');
            out.extend_from_slice(raw.as_bytes());
            out.push(b'"');
        }
        Cow::Owned(s) => json(out, s),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crypto::{Identity, seal};
    use crate::protocol::Message;

    fn sealed_for_two() -> SealedEnvelope {
        let alice = Identity::generate();
        let (bob, carol) = (Identity::generate(), Identity::generate());
        let to = |n| Address::parse(n).unwrap();
        let m = Message::new(to("alice"), vec![to("bob"), to("carol")], "s", "b/+=");
        let keys = [
            (to("bob"), bob.public().clone()),
            (to("carol"), carol.public().clone()),
        ];
        // To and cc recipients share one envelope.
        let env = seal(&m, &alice, &keys, &Limits::default())
            .unwrap()
            .remove(0);
        assert_eq!(env.keys.len(), 2);
        env
    }

    #[test]
    fn a_head_copy_is_the_canonical_copy() {
        let env = sealed_for_two();
        let text = String::from_utf8(env.to_bytes()).unwrap();
        let head: EnvelopeHead<'_> = serde_json::from_str(&text).unwrap();
        assert!(
            matches!(head.ciphertext, Cow::Borrowed(_)),
            "the bulk is not copied"
        );
        for to in env.recipients() {
            assert_eq!(
                head.copy_for(to).unwrap(),
                env.for_recipient(to).unwrap().to_bytes()
            );
        }
        assert!(head.copy_for(&Address::parse("dave").unwrap()).is_none());
    }

    #[test]
    fn a_head_copy_of_an_escaped_envelope_is_canonical_again() {
        let env = sealed_for_two();
        let escaped = String::from_utf8(env.to_bytes())
            .unwrap()
            .replace('/', "\\/");
        let head: EnvelopeHead<'_> = serde_json::from_str(&escaped).unwrap();
        let to = env.recipients().next().unwrap();
        assert_eq!(
            head.copy_for(to).unwrap(),
            env.for_recipient(to).unwrap().to_bytes()
        );
    }
}
