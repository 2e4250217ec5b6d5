//! Keys, fingerprints, signatures and sealing. Pure computation over `protocol` types plus
//! reading and writing the key files; no network, no store.

mod identity;
mod keyfile;
pub mod owner;
mod seal;
pub mod sign;

pub use identity::{Identity, KeyFileError, PublicIdentity};
pub use owner::{Owner, OwnerKeyError, Passphrase};
pub use seal::{OpenError, SealError, open, seal};
