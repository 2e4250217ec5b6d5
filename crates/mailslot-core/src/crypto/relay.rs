//! A relay's own key: Ed25519, made at the relay's first start and kept in a 0600 file (by
//! `keys/`). It
//! signs the agents' keys the relay vouches for, so other relays and remote clients can check
//! them against the key they pinned for the relay.

use std::fmt;
use std::path::Path;

use ed25519_dalek::{Signature, Signer, SigningKey, VerifyingKey};
use serde::{Deserialize, Serialize};
use zeroize::{Zeroize, Zeroizing};

use super::KeyFileError;
use super::sign::{Domain, VerifyError, domain_bytes};
use crate::protocol::{
    AgentName, Fingerprint, PublicKeys, RelayKey, RelayName, agent_keys_payload, b64,
};

const FILE_VERSION: u8 = 1;
const FINGERPRINT_DOMAIN: &[u8] = b"mailslot/v1/relay-fingerprint\0";

/// The relay's private key. Never printed: `Debug` shows only the fingerprint.
pub struct RelayIdentity {
    signing: SigningKey,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RelayKeyFile {
    v: u8,
    relay_key: String,
}

impl RelayIdentity {
    /// A fresh key from the OS random number generator.
    pub fn generate() -> Self {
        let mut seed = Zeroizing::new([0u8; 32]);
        getrandom::fill(seed.as_mut()).expect("the OS random number generator is unavailable");
        Self {
            signing: SigningKey::from_bytes(&seed),
        }
    }

    /// What its key file holds (written by `keys/`).
    pub fn to_key_file(&self) -> Zeroizing<Vec<u8>> {
        let mut file = RelayKeyFile {
            v: FILE_VERSION,
            relay_key: b64::encode(self.signing.as_bytes()),
        };
        let text = Zeroizing::new(serde_json::to_vec(&file).expect("a key file always serializes"));
        file.relay_key.zeroize();
        text
    }

    /// Parses what [`RelayIdentity::to_key_file`] wrote; `origin` names where it came from,
    /// for errors (it is not read here).
    pub fn from_key_file(text: &[u8], origin: &Path) -> Result<Self, KeyFileError> {
        let malformed = |problem: &str| KeyFileError::Malformed {
            path: origin.to_owned(),
            problem: problem.to_owned(),
        };
        let mut file: RelayKeyFile =
            serde_json::from_slice(text).map_err(|e| malformed(&e.to_string()))?;
        if file.v != FILE_VERSION {
            return Err(malformed(&format!(
                "version {} is not {FILE_VERSION}",
                file.v
            )));
        }
        let bytes = Zeroizing::new(
            b64::decode(&file.relay_key).map_err(|_| malformed("relay_key is not base64"))?,
        );
        file.relay_key.zeroize();
        let seed: &[u8; 32] = bytes
            .as_slice()
            .try_into()
            .map_err(|_| malformed("relay_key is not 32 bytes"))?;
        Ok(Self {
            signing: SigningKey::from_bytes(seed),
        })
    }

    /// The public key.
    pub fn key(&self) -> RelayKey {
        RelayKey::from_bytes(self.signing.verifying_key().to_bytes())
    }

    /// The public key's fingerprint.
    pub fn fingerprint(&self) -> Fingerprint {
        relay_fingerprint(&self.key())
    }

    /// The signature vouching that `agent` on the relay `relay` has `keys`.
    pub fn sign_agent_keys(
        &self,
        relay: &RelayName,
        agent: &AgentName,
        keys: &PublicKeys,
    ) -> Vec<u8> {
        let bytes = domain_bytes(Domain::AgentKeys, &agent_keys_payload(relay, agent, keys));
        self.signing.sign(&bytes).to_bytes().to_vec()
    }

    /// This relay's half of a link handshake: `payload` (see `protocol::link_payload`) under
    /// `domain`, which is [`Domain::LinkHello`] for the dialer, [`Domain::LinkWelcome`] for the
    /// answerer.
    pub fn sign_link(&self, domain: Domain, payload: &[u8]) -> Vec<u8> {
        self.signing
            .sign(&domain_bytes(domain, payload))
            .to_bytes()
            .to_vec()
    }
}

impl fmt::Debug for RelayIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RelayIdentity")
            .field("fingerprint", &self.fingerprint())
            .finish_non_exhaustive()
    }
}

/// The human-comparable digest of a relay's public key (its own domain, so it never equals an
/// agent's or an owner's).
pub fn relay_fingerprint(key: &RelayKey) -> Fingerprint {
    super::fingerprint_of(FINGERPRINT_DOMAIN, &[key.as_bytes()])
}

/// Checks that the relay key `key` vouched for `agent`'s `keys` on `relay`.
pub fn verify_agent_keys(
    key: &RelayKey,
    relay: &RelayName,
    agent: &AgentName,
    keys: &PublicKeys,
    signature: &[u8],
) -> Result<(), VerifyError> {
    let key = VerifyingKey::from_bytes(key.as_bytes()).map_err(|_| VerifyError)?;
    let signature = Signature::from_slice(signature).map_err(|_| VerifyError)?;
    let bytes = domain_bytes(Domain::AgentKeys, &agent_keys_payload(relay, agent, keys));
    key.verify_strict(&bytes, &signature)
        .map_err(|_| VerifyError)
}

/// Checks the other relay's half of a link handshake, made with [`RelayIdentity::sign_link`].
pub fn verify_link(
    key: &RelayKey,
    domain: Domain,
    payload: &[u8],
    signature: &[u8],
) -> Result<(), VerifyError> {
    let key = VerifyingKey::from_bytes(key.as_bytes()).map_err(|_| VerifyError)?;
    let signature = Signature::from_slice(signature).map_err(|_| VerifyError)?;
    key.verify_strict(&domain_bytes(domain, payload), &signature)
        .map_err(|_| VerifyError)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_file_round_trip_and_debug_shows_no_secret() {
        let made = RelayIdentity::generate();
        let text = made.to_key_file();
        let again = RelayIdentity::from_key_file(&text, Path::new("relay.db.key")).unwrap();
        assert_eq!(again.key(), made.key());
        let shown = format!("{made:?}");
        assert!(!shown.contains(&b64::encode(made.signing.as_bytes())));
        assert!(shown.contains(made.fingerprint().as_str()));
    }

    #[test]
    fn vouched_keys_verify_only_as_signed() {
        let relay = RelayIdentity::generate();
        let name = RelayName::new("relay.example.com").unwrap();
        let bob = AgentName::new("bob").unwrap();
        let keys = PublicKeys {
            signing: [1; 32],
            sealing: [2; 32],
        };
        let sig = relay.sign_agent_keys(&name, &bob, &keys);
        assert!(verify_agent_keys(&relay.key(), &name, &bob, &keys, &sig).is_ok());
        let other = RelayName::new("other.example.com").unwrap();
        assert!(verify_agent_keys(&relay.key(), &other, &bob, &keys, &sig).is_err());
        let eve = AgentName::new("eve").unwrap();
        assert!(verify_agent_keys(&relay.key(), &name, &eve, &keys, &sig).is_err());
        let swapped = PublicKeys {
            sealing: [3; 32],
            ..keys.clone()
        };
        assert!(verify_agent_keys(&relay.key(), &name, &bob, &swapped, &sig).is_err());
        let stranger = RelayIdentity::generate().key();
        assert!(verify_agent_keys(&stranger, &name, &bob, &keys, &sig).is_err());
        assert_ne!(
            relay_fingerprint(&relay.key()),
            relay_fingerprint(&stranger)
        );
    }
}
