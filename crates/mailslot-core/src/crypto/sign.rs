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
    /// A relay hello: the relay id and the connection's nonce.
    Hello,
    /// A registration over HTTP: the name and the keys.
    Register,
    /// A consent change signed by the agent's owner key.
    Owner,
    /// An agent giving up its name.
    Retire,
    /// A relay vouching for one of its agents' keys.
    AgentKeys,
    /// An agent moving from one key pair to another (signed by both).
    Rotation,
    /// A relay dialing another over a link: its half of the exchange.
    LinkHello,
    /// A relay answering a link: its half of the exchange.
    LinkWelcome,
    /// A message an owner writes to their own agent, signed by the owner key.
    OwnerVoice,
}

impl Domain {
    fn prefix(self) -> &'static [u8] {
        match self {
            Domain::Letter => b"mailslot/v1/letter\0",
            Domain::Hello => b"mailslot/v1/hello\0",
            Domain::Register => b"mailslot/v1/register\0",
            Domain::Owner => b"mailslot/v1/owner\0",
            Domain::Retire => b"mailslot/v1/retire\0",
            Domain::AgentKeys => b"mailslot/v1/agent-keys\0",
            Domain::Rotation => b"mailslot/v1/key-rotation\0",
            Domain::LinkHello => b"mailslot/v1/link-hello\0",
            Domain::LinkWelcome => b"mailslot/v1/link-welcome\0",
            Domain::OwnerVoice => b"mailslot/v1/owner-voice\0",
        }
    }
}

/// The signature did not verify.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "the signature does not match the sender's key: the message was altered or not written by its claimed sender"
)]
pub struct VerifyError;

pub(super) fn domain_bytes(domain: Domain, bytes: &[u8]) -> Vec<u8> {
    let prefix = domain.prefix();
    let mut buf = Vec::with_capacity(prefix.len() + bytes.len());
    buf.extend_from_slice(prefix);
    buf.extend_from_slice(bytes);
    buf
}

/// The signature over `bytes`, kept apart from them.
pub fn signature(identity: &Identity, domain: Domain, bytes: &[u8]) -> [u8; SIGNATURE_LEN] {
    identity
        .signing_key()
        .sign(&domain_bytes(domain, bytes))
        .to_bytes()
}

/// Verifies a signature kept apart from its bytes.
pub fn verify_detached(
    key: &PublicIdentity,
    domain: Domain,
    bytes: &[u8],
    signature: &[u8],
) -> Result<(), VerifyError> {
    let sig = Signature::from_slice(signature).map_err(|_| VerifyError)?;
    key.verifying_key()
        .verify_strict(&domain_bytes(domain, bytes), &sig)
        .map_err(|_| VerifyError)
}

/// Signs `bytes` and returns `signature ‖ bytes`.
pub fn sign(identity: &Identity, domain: Domain, bytes: &[u8]) -> Vec<u8> {
    let mut signed = Vec::with_capacity(SIGNATURE_LEN + bytes.len());
    signed.extend_from_slice(&signature(identity, domain, bytes));
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
    verify_detached(key, domain, bytes, sig)?;
    Ok(bytes)
}
