//! Keys, fingerprints, signatures and sealing. Pure computation over `protocol` types: no
//! file, no network, no store. The key files' contents are made and parsed here; `keys/`
//! reads and writes them.

mod identity;
pub mod owner;
mod passphrase;
mod relay;
mod rotation;
mod seal;
pub mod sign;
pub mod vault;

pub use identity::{Identity, KeyFileError, PublicIdentity};
pub use owner::{Owner, OwnerKeyError};
pub use passphrase::{MIN_PASSPHRASE_CHARS, Passphrase};
pub use relay::{RelayIdentity, relay_fingerprint, verify_agent_keys, verify_link};
pub use rotation::{RotationError, follows, sign_rotation, verify_rotation};
pub use seal::{OpenError, SealError, open, open_as_member, seal, seal_for_group};

/// The SHA-256 of `bytes`: what a relay keeps of a secret it must recognise but not hold (an
/// invite token).
pub fn digest(bytes: &[u8]) -> [u8; 32] {
    use sha2::Digest;
    sha2::Sha256::digest(bytes).into()
}

/// A fingerprint: the first bytes of SHA-256 over a domain (so an agent's, an owner's and a
/// relay's never collide) and the public key parts, in order.
pub(crate) fn fingerprint_of(domain: &[u8], parts: &[&[u8]]) -> crate::protocol::Fingerprint {
    use crate::protocol::FINGERPRINT_BYTES;
    use sha2::Digest;
    let mut hash = sha2::Sha256::new();
    hash.update(domain);
    for part in parts {
        hash.update(part);
    }
    let digest = hash.finalize();
    let mut short = [0u8; FINGERPRINT_BYTES];
    short.copy_from_slice(&digest[..FINGERPRINT_BYTES]);
    crate::protocol::Fingerprint::from_digest(&short)
}
