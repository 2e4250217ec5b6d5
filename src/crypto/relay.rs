//! A relay's own key: Ed25519, made at the relay's first start and kept in a 0600 file. It
//! signs the agents' keys the relay vouches for, so other relays and remote clients can check
//! them against the key they pinned for the relay.

use std::fmt;
use std::path::Path;

use ed25519_dalek::{Signature, Signer, SigningKey, VerifyingKey};
use serde::{Deserialize, Serialize};
use zeroize::{Zeroize, Zeroizing};

use super::sign::{Domain, VerifyError, domain_bytes};
use super::{KeyFileError, keyfile};
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
    /// Reads the key file at `path`, or makes a new key there when there is none. The flag
    /// says whether it was made now.
    pub fn load_or_create(path: &Path) -> Result<(Self, bool), KeyFileError> {
        match Self::load(path) {
            Ok(identity) => Ok((identity, false)),
            Err(KeyFileError::Io { source, .. })
                if source.kind() == std::io::ErrorKind::NotFound =>
            {
                let identity = Self::generate();
                match identity.save_new(path) {
                    Ok(()) => Ok((identity, true)),
                    // Another process made it first: use theirs.
                    Err(KeyFileError::Exists { .. }) => Ok((Self::load(path)?, false)),
                    Err(e) => Err(e),
                }
            }
            Err(e) => Err(e),
        }
    }

    /// A fresh key from the OS random number generator.
    pub fn generate() -> Self {
        let mut seed = Zeroizing::new([0u8; 32]);
        getrandom::fill(seed.as_mut()).expect("the OS random number generator is unavailable");
        Self {
            signing: SigningKey::from_bytes(&seed),
        }
    }

    /// Writes a new key file with mode 0600; refuses to overwrite one.
    pub fn save_new(&self, path: &Path) -> Result<(), KeyFileError> {
        let mut file = RelayKeyFile {
            v: FILE_VERSION,
            relay_key: b64::encode(self.signing.as_bytes()),
        };
        let text = Zeroizing::new(serde_json::to_vec(&file).expect("a key file always serializes"));
        file.relay_key.zeroize();
        keyfile::write_new(path, &text)
    }

    /// Reads a key file, refusing one that other users can read.
    pub fn load(path: &Path) -> Result<Self, KeyFileError> {
        let malformed = |problem: &str| KeyFileError::Malformed {
            path: path.to_owned(),
            problem: problem.to_owned(),
        };
        let text = keyfile::read(path)?;
        let mut file: RelayKeyFile =
            serde_json::from_slice(&text).map_err(|e| malformed(&e.to_string()))?;
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

#[cfg(test)]
mod tests {
    use std::fs;
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    #[test]
    fn made_once_with_mode_0600_then_loaded() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("relay.db.key");
        let (made, created) = RelayIdentity::load_or_create(&path).unwrap();
        assert!(created);
        assert_eq!(
            fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
        let (again, created) = RelayIdentity::load_or_create(&path).unwrap();
        assert!(!created);
        assert_eq!(again.key(), made.key());
        fs::set_permissions(&path, fs::Permissions::from_mode(0o640)).unwrap();
        let err = RelayIdentity::load_or_create(&path).unwrap_err();
        assert!(err.to_string().contains("chmod 600"), "{err}");
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
