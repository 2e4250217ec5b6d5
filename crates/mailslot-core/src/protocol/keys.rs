//! Public keys as they travel: two 32-byte values. Crypto checks that they are valid points.

use serde::{Deserialize, Serialize};

use super::{ValidationError, b64};

/// An agent's public keys on the wire: Ed25519 for signatures, X25519 for sealing.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "KeysWire", into = "KeysWire")]
pub struct PublicKeys {
    /// Ed25519 verifying key.
    pub signing: [u8; 32],
    /// X25519 public key.
    pub sealing: [u8; 32],
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct KeysWire {
    #[serde(with = "b64")]
    signing: Vec<u8>,
    #[serde(with = "b64")]
    sealing: Vec<u8>,
}

impl TryFrom<KeysWire> for PublicKeys {
    type Error = ValidationError;
    fn try_from(w: KeysWire) -> Result<Self, Self::Error> {
        let exact = |field: &str, v: Vec<u8>| -> Result<[u8; 32], ValidationError> {
            let len = v.len();
            v.try_into().map_err(|_| {
                ValidationError::new(field, format!("is {len} bytes; a key is 32 bytes"))
            })
        };
        Ok(Self {
            signing: exact("keys.signing", w.signing)?,
            sealing: exact("keys.sealing", w.sealing)?,
        })
    }
}

impl From<PublicKeys> for KeysWire {
    fn from(k: PublicKeys) -> Self {
        Self {
            signing: k.signing.to_vec(),
            sealing: k.sealing.to_vec(),
        }
    }
}
