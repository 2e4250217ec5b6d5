//! Keys, fingerprints, signatures and sealing. Pure computation over `protocol` types plus
//! reading and writing the key files; no network, no store.

mod identity;
mod keyfile;
pub mod owner;
mod relay;
mod seal;
pub mod sign;
pub mod vault;

pub use identity::{Identity, KeyFileError, PublicIdentity};
pub use owner::{Owner, OwnerKeyError, Passphrase};
pub use relay::{RelayIdentity, relay_fingerprint, verify_agent_keys};
pub use seal::{OpenError, SealError, open, seal};

/// The SHA-256 of `bytes`: what a relay keeps of a secret it must recognise but not hold (an
/// invite token).
pub fn digest(bytes: &[u8]) -> [u8; 32] {
    use sha2::Digest;
    sha2::Sha256::digest(bytes).into()
}
