//! The owner key: an Ed25519 key a person holds for their agents, kept on disk (by `keys/`)
//! sealed under a passphrase (Argon2id stretches it, XChaCha20-Poly1305 seals the key). Consent changes are
//! signed with it, so an agent that can read every file of its owner still cannot approve:
//! the file is useless without the passphrase, which only the owner types.

use std::fmt;
use std::path::Path;

use ed25519_dalek::{Signature, Signer, SigningKey, VerifyingKey};
use serde::{Deserialize, Serialize};
use zeroize::Zeroizing;

use super::KeyFileError;
use super::passphrase::Passphrase;
use super::sign::{Domain, VerifyError, domain_bytes};
use super::vault::{self, Lock, VaultError};
use crate::protocol::{
    AgentName, Fingerprint, Message, OwnerAct, OwnerKey, b64, owner_payload, voice_payload,
};

const FILE_VERSION: u8 = 1;
const FILE_DOMAIN: &[u8] = b"mailslot/v1/owner-key\0";
const FINGERPRINT_DOMAIN: &[u8] = b"mailslot/v1/owner-fingerprint\0";
/// Why the owner key could not be unlocked.
#[derive(Debug, thiserror::Error)]
pub enum OwnerKeyError {
    /// The file could not be read, or is not an owner key file.
    #[error(transparent)]
    File(#[from] KeyFileError),
    /// The passphrase is not the one the key was sealed with (or the file was altered).
    #[error("the passphrase does not unlock {path}: check it and try again")]
    WrongPassphrase {
        /// The owner key file.
        path: std::path::PathBuf,
    },
}

/// The unlocked owner key. Never printed: `Debug` shows only the fingerprint.
pub struct Owner {
    signing: SigningKey,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct OwnerFile {
    v: u8,
    public: OwnerKey,
    kdf: String,
    m_kib: u32,
    t: u32,
    p: u32,
    salt: String,
    nonce: String,
    sealed: String,
}

impl OwnerFile {
    /// How its key was sealed.
    fn lock(&self) -> Lock {
        Lock {
            kdf: self.kdf.clone(),
            m_kib: self.m_kib,
            t: self.t,
            p: self.p,
            salt: self.salt.clone(),
            nonce: self.nonce.clone(),
        }
    }

    /// What the sealed key is bound to: the public key and the stretching parameters.
    fn aad(&self) -> Vec<u8> {
        let mut aad = FILE_DOMAIN.to_vec();
        aad.extend_from_slice(self.public.as_bytes());
        for n in [self.m_kib, self.t, self.p] {
            aad.extend_from_slice(&n.to_le_bytes());
        }
        aad
    }
}

impl Owner {
    /// A fresh key from the OS random number generator.
    pub fn generate() -> Self {
        let seed = Zeroizing::new(vault::random::<32>());
        Self {
            signing: SigningKey::from_bytes(&seed),
        }
    }

    /// The public key the relay checks consent changes against.
    pub fn public(&self) -> OwnerKey {
        OwnerKey::from_bytes(self.signing.verifying_key().to_bytes())
    }

    /// Signs `act` on `agent` for the connection with this relay id and nonce.
    pub fn sign(
        &self,
        relay: &str,
        nonce: &[u8],
        agent: &AgentName,
        act: &OwnerAct<'_>,
    ) -> [u8; 64] {
        let payload = owner_payload(relay, nonce, agent, act);
        self.signing
            .sign(&domain_bytes(Domain::Owner, &payload))
            .to_bytes()
    }

    /// Signs `message` as this owner's words to `agent` (see `protocol::voice_payload`);
    /// `None` when the message is not of the owner's shape.
    pub fn sign_voice(&self, agent: &AgentName, message: &Message) -> Option<[u8; 64]> {
        let payload = voice_payload(agent, message)?;
        Some(
            self.signing
                .sign(&domain_bytes(Domain::OwnerVoice, &payload))
                .to_bytes(),
        )
    }

    /// What the owner key file holds: the key sealed under `passphrase` (written by `keys/`).
    pub fn to_key_file(&self, passphrase: &Passphrase) -> Zeroizing<Vec<u8>> {
        let lock = Lock::new();
        let mut file = OwnerFile {
            v: FILE_VERSION,
            public: self.public(),
            kdf: lock.kdf.clone(),
            m_kib: lock.m_kib,
            t: lock.t,
            p: lock.p,
            salt: lock.salt.clone(),
            nonce: lock.nonce.clone(),
            sealed: String::new(),
        };
        let sealed = lock.seal(passphrase, self.signing.as_bytes(), &file.aad());
        file.sealed = b64::encode(&sealed);
        Zeroizing::new(serde_json::to_vec_pretty(&file).expect("an owner file always serializes"))
    }

    /// Unlocks what [`Owner::to_key_file`] wrote with `passphrase`; `origin` names where it
    /// came from, for errors (it is not read here).
    pub fn from_key_file(
        text: &[u8],
        origin: &Path,
        passphrase: &Passphrase,
    ) -> Result<Self, OwnerKeyError> {
        let file = parse_file(text, origin)?;
        let malformed = |problem: String| KeyFileError::Malformed {
            path: origin.to_owned(),
            problem,
        };
        let sealed =
            b64::decode(&file.sealed).map_err(|_| malformed("sealed is not base64".into()))?;
        let secret = file
            .lock()
            .open(passphrase, &sealed, &file.aad())
            .map_err(|e| match e {
                VaultError::WrongPassphrase => OwnerKeyError::WrongPassphrase {
                    path: origin.to_owned(),
                },
                VaultError::Malformed(problem) => malformed(problem).into(),
            })?;
        let seed: &[u8; 32] = secret
            .as_slice()
            .try_into()
            .map_err(|_| malformed("the sealed key is not 32 bytes".into()))?;
        let owner = Self {
            signing: SigningKey::from_bytes(seed),
        };
        if owner.public() != file.public {
            return Err(malformed("the sealed key does not match its public key".into()).into());
        }
        Ok(owner)
    }
}

impl fmt::Debug for Owner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Owner")
            .field("fingerprint", &fingerprint(&self.public()))
            .finish_non_exhaustive()
    }
}

fn parse_file(text: &[u8], origin: &Path) -> Result<OwnerFile, KeyFileError> {
    let malformed = |problem: String| KeyFileError::Malformed {
        path: origin.to_owned(),
        problem,
    };
    let file: OwnerFile = serde_json::from_slice(text).map_err(|e| malformed(e.to_string()))?;
    if file.v != FILE_VERSION || file.kdf != "argon2id" {
        return Err(malformed(format!(
            "version {} with {} is not version {FILE_VERSION} with argon2id",
            file.v, file.kdf
        )));
    }
    Ok(file)
}

/// The public key in what [`Owner::to_key_file`] wrote, read without the passphrase.
pub fn public_in_key_file(text: &[u8], origin: &Path) -> Result<OwnerKey, KeyFileError> {
    parse_file(text, origin).map(|f| f.public)
}

/// Checks that `signature` is `key`'s over `act` on `agent` for this relay and connection.
pub fn verify(
    key: &OwnerKey,
    relay: &str,
    nonce: &[u8],
    agent: &AgentName,
    act: &OwnerAct<'_>,
    signature: &[u8],
) -> Result<(), VerifyError> {
    let key = VerifyingKey::from_bytes(key.as_bytes()).map_err(|_| VerifyError)?;
    let sig = Signature::from_slice(signature).map_err(|_| VerifyError)?;
    let payload = owner_payload(relay, nonce, agent, act);
    key.verify_strict(&domain_bytes(Domain::Owner, &payload), &sig)
        .map_err(|_| VerifyError)
}

/// Checks that `signature` is `key`'s over `message` as the owner's words to `agent`; a
/// message not of the owner's shape never verifies.
pub fn verify_voice(
    key: &OwnerKey,
    agent: &AgentName,
    message: &Message,
    signature: &[u8],
) -> Result<(), VerifyError> {
    let payload = voice_payload(agent, message).ok_or(VerifyError)?;
    let key = VerifyingKey::from_bytes(key.as_bytes()).map_err(|_| VerifyError)?;
    let sig = Signature::from_slice(signature).map_err(|_| VerifyError)?;
    key.verify_strict(&domain_bytes(Domain::OwnerVoice, &payload), &sig)
        .map_err(|_| VerifyError)
}

/// Whether `key` is a valid Ed25519 public key.
pub fn is_valid(key: &OwnerKey) -> bool {
    VerifyingKey::from_bytes(key.as_bytes()).is_ok()
}

/// The human-comparable digest of an owner key.
pub fn fingerprint(key: &OwnerKey) -> Fingerprint {
    super::fingerprint_of(FINGERPRINT_DOMAIN, &[key.as_bytes()])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::Policy;

    fn pass(s: &str) -> Passphrase {
        Passphrase::new(s.to_owned()).unwrap()
    }

    #[test]
    fn the_file_opens_only_with_its_passphrase() {
        let origin = Path::new("owner.key");
        let owner = Owner::generate();
        let text = owner.to_key_file(&pass("correct horse battery"));
        assert_eq!(public_in_key_file(&text, origin).unwrap(), owner.public());
        assert!(!String::from_utf8_lossy(&text).contains(&b64::encode(owner.signing.as_bytes())));
        assert!(matches!(
            Owner::from_key_file(&text, origin, &pass("wrong horse battery")),
            Err(OwnerKeyError::WrongPassphrase { .. })
        ));
        let unlocked = Owner::from_key_file(&text, origin, &pass("correct horse battery")).unwrap();
        assert_eq!(unlocked.public(), owner.public());
    }

    #[test]
    fn an_altered_file_does_not_unlock() {
        let origin = Path::new("owner.key");
        let text = Owner::generate().to_key_file(&pass("correct horse battery"));
        let mut file: OwnerFile = serde_json::from_slice(&text).unwrap();
        // Swapping in another public key (to make the relay trust it) breaks the seal.
        file.public = Owner::generate().public();
        let altered = serde_json::to_vec(&file).unwrap();
        assert!(matches!(
            Owner::from_key_file(&altered, origin, &pass("correct horse battery")),
            Err(OwnerKeyError::WrongPassphrase { .. })
        ));
        file.m_kib = super::vault::MAX_M_KIB + 1;
        let altered = serde_json::to_vec(&file).unwrap();
        let err =
            Owner::from_key_file(&altered, origin, &pass("correct horse battery")).unwrap_err();
        assert!(err.to_string().contains("m_kib"), "{err}");
    }

    #[test]
    fn short_passphrases_are_refused_with_the_limit() {
        let err = Passphrase::new("hunter2".into()).unwrap_err();
        assert!(err.to_string().contains("at least 10"), "{err}");
    }

    #[test]
    fn the_owners_voice_verifies_for_its_agent_and_words_only() {
        let owner = Owner::generate();
        let bob = AgentName::new("bob").unwrap();
        let eve = AgentName::new("eve").unwrap();
        let m = crate::protocol::owner_message(&bob, None, "Stop the deploy.").unwrap();
        let sig = owner.sign_voice(&bob, &m).unwrap();
        let key = owner.public();
        assert!(verify_voice(&key, &bob, &m, &sig).is_ok());
        assert!(verify_voice(&key, &eve, &m, &sig).is_err());
        assert!(verify_voice(&Owner::generate().public(), &bob, &m, &sig).is_err());
        let mut altered = m.clone();
        altered.body.push_str(" Now.");
        assert!(verify_voice(&key, &bob, &altered, &sig).is_err());
        // The same key's consent signature over the same bytes is no voice signature.
        let payload = voice_payload(&bob, &m).unwrap();
        let consent = owner
            .signing
            .sign(&domain_bytes(Domain::Owner, &payload))
            .to_bytes();
        assert!(verify_voice(&key, &bob, &m, &consent).is_err());
        assert!(verify_voice(&key, &bob, &m, &sig[..63]).is_err());
    }

    #[test]
    fn a_signature_holds_for_its_act_agent_and_connection_only() {
        let owner = Owner::generate();
        let bob = AgentName::new("bob").unwrap();
        let eve = AgentName::new("eve").unwrap();
        let act = OwnerAct::SetPolicy(Policy::Open);
        let sig = owner.sign("relay-1", &[1; 32], &bob, &act);
        let key = owner.public();
        assert!(verify(&key, "relay-1", &[1; 32], &bob, &act, &sig).is_ok());
        assert!(verify(&key, "relay-1", &[2; 32], &bob, &act, &sig).is_err());
        assert!(verify(&key, "relay-1", &[1; 32], &eve, &act, &sig).is_err());
        let other = OwnerAct::SetPolicy(Policy::Closed);
        assert!(verify(&key, "relay-1", &[1; 32], &bob, &other, &sig).is_err());
        assert!(
            verify(
                &Owner::generate().public(),
                "relay-1",
                &[1; 32],
                &bob,
                &act,
                &sig
            )
            .is_err()
        );
        assert!(!format!("{owner:?}").contains(&b64::encode(owner.signing.as_bytes())));
    }
}
