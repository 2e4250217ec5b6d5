//! The sealed envelope: what travels through a relay. Only routing fields are readable.

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
