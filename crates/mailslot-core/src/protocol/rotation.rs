//! Key rotation: an agent's statement that its keys changed from `old` to `new`, signed by
//! both (the old key says who may follow it; the new key proves it is held). The relay keeps
//! the last few for each agent and hands them out with its keys, so a peer that pinned `old`
//! can follow the chain to the keys the relay has now without asking its owner.

use serde::{Deserialize, Serialize};

use super::{AgentName, PublicKeys, b64};

/// Rotations a relay keeps (and hands out) per agent; a peer pinned further back than this
/// sees an unsigned change and asks its owner.
pub const MAX_ROTATIONS: usize = 8;

/// A signed change of keys.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeyRotation {
    /// The agent, as its relay knows it.
    pub agent: AgentName,
    /// The keys given up.
    pub old: PublicKeys,
    /// The keys that replace them.
    pub new: PublicKeys,
    /// When the agent made the statement (Unix ms).
    pub at_ms: i64,
    /// The old signing key's signature over [`rotation_payload`].
    #[serde(with = "b64")]
    pub old_signature: Vec<u8>,
    /// The new signing key's signature over the same bytes.
    #[serde(with = "b64")]
    pub new_signature: Vec<u8>,
}

/// The bytes both keys sign: the name, both key pairs and the time.
pub fn rotation_payload(
    agent: &AgentName,
    old: &PublicKeys,
    new: &PublicKeys,
    at_ms: i64,
) -> Vec<u8> {
    let mut bytes = agent.as_str().as_bytes().to_vec();
    bytes.push(0);
    for key in [&old.signing, &old.sealing, &new.signing, &new.sealing] {
        bytes.extend_from_slice(key);
    }
    bytes.extend_from_slice(&at_ms.to_be_bytes());
    bytes
}
