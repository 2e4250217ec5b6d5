//! Ed25519 signatures over exact bytes, with a domain prefix so a signature made for one
//! purpose can never be replayed as another.

use ed25519_dalek::{Signature, Signer};

use super::{Identity, PublicIdentity};

/// Length of the signature that [`sign`] puts in front of the signed bytes.
pub const SIGNATURE_LEN: usize = 64;

/// What a signature is for; each has its own prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Domain {
    /// The content of a sealed message.
    Letter,
}

impl Domain {
    fn prefix(self) -> &'static [u8] {
        match self {
            Domain::Letter => b"mailslot/v1/letter\0",
        }
    }
}

/// The signature did not verify.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "the signature does not match the sender's key: the message was altered or not written by its claimed sender"
)]
pub struct VerifyError;

fn domain_bytes(domain: Domain, bytes: &[u8]) -> Vec<u8> {
    let prefix = domain.prefix();
    let mut buf = Vec::with_capacity(prefix.len() + bytes.len());
    buf.extend_from_slice(prefix);
    buf.extend_from_slice(bytes);
    buf
}

/// Signs `bytes` and returns `signature ‖ bytes`.
pub fn sign(identity: &Identity, domain: Domain, bytes: &[u8]) -> Vec<u8> {
    let signature = identity.signing_key().sign(&domain_bytes(domain, bytes));
    let mut signed = Vec::with_capacity(SIGNATURE_LEN + bytes.len());
    signed.extend_from_slice(&signature.to_bytes());
    signed.extend_from_slice(bytes);
    signed
}

/// Verifies `signature ‖ bytes` and returns the bytes, which are safe to parse only now.
pub fn verify<'a>(
    key: &PublicIdentity,
    domain: Domain,
    signed: &'a [u8],
) -> Result<&'a [u8], VerifyError> {
    if signed.len() < SIGNATURE_LEN {
        return Err(VerifyError);
    }
    let (sig, bytes) = signed.split_at(SIGNATURE_LEN);
    let sig = Signature::from_slice(sig).map_err(|_| VerifyError)?;
    key.verifying_key()
        .verify_strict(&domain_bytes(domain, bytes), &sig)
        .map_err(|_| VerifyError)?;
    Ok(bytes)
}
