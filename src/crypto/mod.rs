//! Keys, fingerprints, signatures and sealing. Pure computation over `protocol` types plus
//! reading and writing the key file; no network, no store.

mod identity;
mod seal;
pub mod sign;

pub use identity::{Identity, KeyFileError, PublicIdentity};
pub use seal::{OpenError, SealError, open, seal};
