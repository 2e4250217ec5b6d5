//! An agent's keys: Ed25519 for signing, X25519 for receiving sealed mail.

use std::fmt;
use std::path::{Path, PathBuf};

use ed25519_dalek::{SigningKey, VerifyingKey};
use hpke::kem::X25519HkdfSha256;
use hpke::{Deserializable, Kem, Serializable};
use serde::{Deserialize, Serialize};
use zeroize::{Zeroize, Zeroizing};

use crate::protocol::{Fingerprint, MAX_ROTATIONS, PublicKeys, ValidationError, b64};

type SealSecret = <X25519HkdfSha256 as Kem>::PrivateKey;
pub(crate) type SealPublic = <X25519HkdfSha256 as Kem>::PublicKey;

const FINGERPRINT_DOMAIN: &[u8] = b"mailslot/v1/fingerprint\0";
const KEY_FILE_VERSION: u8 = 1;

/// Why a key file could not be read or written (`keys/` reads and writes them; the type
/// lives here because parsing one can fail too).
#[derive(Debug, thiserror::Error)]
pub enum KeyFileError {
    /// The file system refused.
    #[error("{path}: {source}")]
    Io {
        /// The key file.
        path: PathBuf,
        /// What the OS said.
        source: std::io::Error,
    },
    /// Others can read the private keys.
    #[error("{path} is readable by other users (mode {mode:o}); run `chmod 600 {path}`")]
    Permissions {
        /// The key file.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// The file is not a mailslot key file.
    #[error("{path} is not a valid mailslot key file: {problem}")]
    Malformed {
        /// The key file.
        path: PathBuf,
        /// What is wrong.
        problem: String,
    },
    /// `init` would overwrite existing keys.
    #[error("{path} already exists; mailslot never overwrites keys")]
    Exists {
        /// The key file.
        path: PathBuf,
    },
}

/// The private half. Never printed: `Debug` shows only the fingerprint.
pub struct Identity {
    signing: SigningKey,
    sealing: SealSecret,
    public: PublicIdentity,
    /// Sealing keys given up by rotations, newest first: mail sealed to them before peers
    /// re-pinned still opens.
    retired_sealing: Vec<SealSecret>,
}

/// The public half, which relays and contacts hold.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "PublicKeys", into = "PublicKeys")]
pub struct PublicIdentity {
    signing: VerifyingKey,
    sealing: SealPublic,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct KeyFile {
    v: u8,
    signing_key: String,
    sealing_key: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    retired_sealing_keys: Vec<String>,
}

fn random_32() -> Zeroizing<[u8; 32]> {
    let mut seed = Zeroizing::new([0u8; 32]);
    getrandom::fill(seed.as_mut()).expect("the OS random number generator is unavailable");
    seed
}

impl Identity {
    /// Fresh keys from the OS random number generator.
    pub fn generate() -> Self {
        let signing = SigningKey::from_bytes(&random_32());
        let (sealing, _) = X25519HkdfSha256::derive_keypair(random_32().as_ref());
        Self::from_parts(signing, sealing)
    }

    fn from_parts(signing: SigningKey, sealing: SealSecret) -> Self {
        let public = PublicIdentity {
            signing: signing.verifying_key(),
            sealing: X25519HkdfSha256::sk_to_pk(&sealing),
        };
        Self {
            signing,
            sealing,
            public,
            retired_sealing: Vec::new(),
        }
    }

    /// Fresh keys that replace these: the new identity keeps this one's sealing key (and the
    /// ones it kept, up to [`MAX_ROTATIONS`]) to open mail sealed to them.
    pub fn rotated(&self) -> Self {
        let mut next = Self::generate();
        next.retired_sealing = std::iter::once(&self.sealing)
            .chain(&self.retired_sealing)
            .take(MAX_ROTATIONS)
            .cloned()
            .collect();
        next
    }

    /// The sealing keys to try on mail, current first.
    pub(crate) fn sealing_keys(&self) -> impl Iterator<Item = &SealSecret> {
        std::iter::once(&self.sealing).chain(&self.retired_sealing)
    }

    /// The public keys.
    pub fn public(&self) -> &PublicIdentity {
        &self.public
    }

    /// The fingerprint of the public keys.
    pub fn fingerprint(&self) -> Fingerprint {
        self.public.fingerprint()
    }

    pub(crate) fn signing_key(&self) -> &SigningKey {
        &self.signing
    }

    /// What a key file holds (the private keys): written by `keys/`, and sealed under a
    /// passphrase in an export.
    pub fn to_key_file(&self) -> Zeroizing<Vec<u8>> {
        let mut file = KeyFile {
            v: KEY_FILE_VERSION,
            signing_key: b64::encode(self.signing.as_bytes()),
            sealing_key: b64::encode(&self.sealing.to_bytes()),
            retired_sealing_keys: self
                .retired_sealing
                .iter()
                .map(|k| b64::encode(&k.to_bytes()))
                .collect(),
        };
        let text = Zeroizing::new(serde_json::to_vec(&file).expect("a key file always serializes"));
        file.signing_key.zeroize();
        file.sealing_key.zeroize();
        file.retired_sealing_keys
            .iter_mut()
            .for_each(Zeroize::zeroize);
        text
    }

    /// Parses what [`Identity::to_key_file`] wrote; `origin` names where it came from, for
    /// errors (it is not read here).
    pub fn from_key_file(text: &[u8], origin: &Path) -> Result<Self, KeyFileError> {
        let malformed = |problem: &str| KeyFileError::Malformed {
            path: origin.to_owned(),
            problem: problem.to_owned(),
        };
        let mut file: KeyFile =
            serde_json::from_slice(text).map_err(|e| malformed(&e.to_string()))?;
        if file.v != KEY_FILE_VERSION {
            return Err(malformed(&format!(
                "version {} is not {KEY_FILE_VERSION}",
                file.v
            )));
        }
        let signing = Zeroizing::new(
            b64::decode(&file.signing_key).map_err(|_| malformed("signing_key is not base64"))?,
        );
        let sealing = Zeroizing::new(
            b64::decode(&file.sealing_key).map_err(|_| malformed("sealing_key is not base64"))?,
        );
        let retired = file
            .retired_sealing_keys
            .iter()
            .take(MAX_ROTATIONS)
            .map(|k| {
                let bytes = Zeroizing::new(
                    b64::decode(k).map_err(|_| malformed("retired_sealing_keys is not base64"))?,
                );
                SealSecret::from_bytes(&bytes)
                    .map_err(|_| malformed("retired_sealing_keys holds a key that is not X25519"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        file.signing_key.zeroize();
        file.sealing_key.zeroize();
        file.retired_sealing_keys
            .iter_mut()
            .for_each(Zeroize::zeroize);
        let signing: &[u8; 32] = signing
            .as_slice()
            .try_into()
            .map_err(|_| malformed("signing_key is not 32 bytes"))?;
        let sealing = SealSecret::from_bytes(&sealing)
            .map_err(|_| malformed("sealing_key is not an X25519 key"))?;
        let mut identity = Self::from_parts(SigningKey::from_bytes(signing), sealing);
        identity.retired_sealing = retired;
        Ok(identity)
    }
}

impl fmt::Debug for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Identity")
            .field("fingerprint", &self.fingerprint())
            .finish_non_exhaustive()
    }
}

impl PublicIdentity {
    /// The human-comparable digest of both public keys.
    pub fn fingerprint(&self) -> Fingerprint {
        super::fingerprint_of(
            FINGERPRINT_DOMAIN,
            &[self.signing.as_bytes(), &self.sealing.to_bytes()],
        )
    }

    pub(crate) fn verifying_key(&self) -> &VerifyingKey {
        &self.signing
    }

    pub(crate) fn sealing_key(&self) -> &SealPublic {
        &self.sealing
    }
}

impl fmt::Debug for PublicIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PublicIdentity({})", self.fingerprint())
    }
}

impl TryFrom<PublicKeys> for PublicIdentity {
    type Error = ValidationError;
    fn try_from(k: PublicKeys) -> Result<Self, Self::Error> {
        let signing = VerifyingKey::from_bytes(&k.signing)
            .map_err(|_| ValidationError::new("keys.signing", "is not an Ed25519 public key"))?;
        let sealing = SealPublic::from_bytes(&k.sealing)
            .map_err(|_| ValidationError::new("keys.sealing", "is not an X25519 public key"))?;
        Ok(Self { signing, sealing })
    }
}

impl From<PublicIdentity> for PublicKeys {
    fn from(p: PublicIdentity) -> Self {
        p.to_keys()
    }
}

impl PublicIdentity {
    /// The wire form.
    pub fn to_keys(&self) -> PublicKeys {
        let mut sealing = [0u8; 32];
        sealing.copy_from_slice(&self.sealing.to_bytes());
        PublicKeys {
            signing: self.signing.to_bytes(),
            sealing,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_never_shows_secrets() {
        let id = Identity::generate();
        let shown = format!("{id:?}");
        assert!(!shown.contains(&b64::encode(id.signing.as_bytes())));
        assert!(shown.contains(id.fingerprint().as_str()));
    }

    #[test]
    fn public_identity_serde_round_trip() {
        let id = Identity::generate();
        let json = serde_json::to_string(id.public()).unwrap();
        let back: PublicIdentity = serde_json::from_str(&json).unwrap();
        assert_eq!(&back, id.public());
        assert_eq!(back.fingerprint(), id.fingerprint());
    }
}
