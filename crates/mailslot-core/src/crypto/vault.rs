//! Bytes sealed under a passphrase: Argon2id stretches it into a key, XChaCha20-Poly1305
//! seals the bytes with caller-chosen associated data (a file's header), so a changed header
//! fails to open as surely as changed bytes. The owner key file and agent exports use it.

use argon2::{Algorithm, Argon2, Params, Version};
use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{XChaCha20Poly1305, XNonce};
use serde::{Deserialize, Serialize};
use zeroize::Zeroizing;

use super::passphrase::Passphrase;
use crate::protocol::b64;

/// Bounds on the stretching parameters a file may ask for, so a crafted file cannot make an
/// unlock take all memory or forever.
pub(super) const MAX_M_KIB: u32 = 1024 * 1024;
const MAX_T: u32 = 16;
const MAX_P: u32 = 8;

/// How a key was stretched from a passphrase, and the nonce it sealed with: what a sealed
/// file stores beside its ciphertext (none of it is secret).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lock {
    /// Always `argon2id`.
    pub kdf: String,
    /// Argon2 memory, KiB.
    pub m_kib: u32,
    /// Argon2 passes.
    pub t: u32,
    /// Argon2 lanes.
    pub p: u32,
    /// The salt, base64.
    pub salt: String,
    /// The XChaCha20 nonce, base64.
    pub nonce: String,
}

/// Why sealed bytes did not open.
#[derive(Debug, thiserror::Error)]
pub enum VaultError {
    /// The passphrase is wrong, or the bytes or their header were changed.
    #[error("the passphrase is wrong, or the file was changed")]
    WrongPassphrase,
    /// The lock's fields are not what this build writes or accepts.
    #[error("{0}")]
    Malformed(String),
}

impl Lock {
    /// A fresh lock: the default Argon2id cost, a random salt and nonce.
    pub fn new() -> Self {
        Self {
            kdf: "argon2id".into(),
            m_kib: Params::DEFAULT_M_COST,
            t: Params::DEFAULT_T_COST,
            p: Params::DEFAULT_P_COST,
            salt: b64::encode(&random::<16>()),
            nonce: b64::encode(&random::<24>()),
        }
    }

    /// Seals `plaintext` under `passphrase`, bound to `aad`.
    pub fn seal(&self, passphrase: &Passphrase, plaintext: &[u8], aad: &[u8]) -> Vec<u8> {
        let (key, nonce) = self.key(passphrase).expect("a fresh lock is valid");
        XChaCha20Poly1305::new(&(*key).into())
            .encrypt(
                &XNonce::from(nonce),
                Payload {
                    msg: plaintext,
                    aad,
                },
            )
            .expect("encryption of an in-memory buffer cannot fail")
    }

    /// Opens what [`Lock::seal`] sealed with the same passphrase and `aad`.
    pub fn open(
        &self,
        passphrase: &Passphrase,
        sealed: &[u8],
        aad: &[u8],
    ) -> Result<Zeroizing<Vec<u8>>, VaultError> {
        let (key, nonce) = self.key(passphrase)?;
        XChaCha20Poly1305::new(&(*key).into())
            .decrypt(&XNonce::from(nonce), Payload { msg: sealed, aad })
            .map(Zeroizing::new)
            .map_err(|_| VaultError::WrongPassphrase)
    }

    /// The stretched key and the nonce, after checking the lock's fields.
    fn key(&self, passphrase: &Passphrase) -> Result<(Zeroizing<[u8; 32]>, [u8; 24]), VaultError> {
        let malformed = VaultError::Malformed;
        if self.kdf != "argon2id" {
            return Err(malformed(format!("kdf is {:?}, not argon2id", self.kdf)));
        }
        if self.m_kib > MAX_M_KIB || self.t > MAX_T || self.p > MAX_P {
            return Err(malformed(format!(
                "asks for m_kib {}, t {}, p {}; at most {MAX_M_KIB}, {MAX_T}, {MAX_P}",
                self.m_kib, self.t, self.p
            )));
        }
        let salt = b64::decode(&self.salt).map_err(|_| malformed("salt is not base64".into()))?;
        let nonce: [u8; 24] = b64::decode(&self.nonce)
            .ok()
            .and_then(|n| n.try_into().ok())
            .ok_or_else(|| malformed("nonce is not 24 bytes of base64".into()))?;
        let params = Params::new(self.m_kib, self.t, self.p, Some(32))
            .map_err(|e| malformed(e.to_string()))?;
        let mut key = Zeroizing::new([0u8; 32]);
        Argon2::new(Algorithm::Argon2id, Version::V0x13, params)
            .hash_password_into(passphrase.expose().as_bytes(), &salt, key.as_mut())
            .map_err(|e| malformed(e.to_string()))?;
        Ok((key, nonce))
    }
}

impl Default for Lock {
    fn default() -> Self {
        Self::new()
    }
}

/// `N` bytes from the OS random number generator.
pub(super) fn random<const N: usize>() -> [u8; N] {
    let mut bytes = [0u8; N];
    getrandom::fill(&mut bytes).expect("the OS random number generator is unavailable");
    bytes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sealed_bytes_open_only_with_the_passphrase_and_the_same_header() {
        let pass = Passphrase::new("correct horse battery".into()).unwrap();
        let lock = Lock::new();
        let sealed = lock.seal(&pass, b"secret", b"header");
        assert_eq!(&*lock.open(&pass, &sealed, b"header").unwrap(), b"secret");
        let wrong = Passphrase::new("incorrect horse battery".into()).unwrap();
        assert!(matches!(
            lock.open(&wrong, &sealed, b"header"),
            Err(VaultError::WrongPassphrase)
        ));
        assert!(matches!(
            lock.open(&pass, &sealed, b"headex"),
            Err(VaultError::WrongPassphrase)
        ));
        let greedy = Lock {
            m_kib: MAX_M_KIB + 1,
            ..lock
        };
        assert!(matches!(
            greedy.open(&pass, &sealed, b"header"),
            Err(VaultError::Malformed(_))
        ));
    }
}
