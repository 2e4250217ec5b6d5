//! The owner's key on the wire, and the exact bytes an owner signs to change an agent's
//! consent. The owner key is a person's, not the agent's: the agent never holds it unlocked,
//! so consent signed by it cannot come from the agent.

use std::fmt;

use serde::{Deserialize, Serialize};

use super::{Address, AgentName, Peer, Policy, RequestCode, ValidationError, b64};

/// An owner's Ed25519 public key.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct OwnerKey([u8; 32]);

impl OwnerKey {
    /// Wraps the 32 bytes of an Ed25519 public key (crypto checks that they are one).
    pub fn from_bytes(bytes: [u8; 32]) -> Self {
        Self(bytes)
    }

    /// The key's bytes.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }
}

impl TryFrom<String> for OwnerKey {
    type Error = ValidationError;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        let bytes = b64::decode(&s)
            .map_err(|_| ValidationError::new("owner", "is not base64 (standard, padded)"))?;
        let len = bytes.len();
        bytes.try_into().map(Self).map_err(|_| {
            ValidationError::new("owner", format!("is {len} bytes; an owner key is 32 bytes"))
        })
    }
}

impl From<OwnerKey> for String {
    fn from(k: OwnerKey) -> Self {
        b64::encode(&k.0)
    }
}

impl fmt::Debug for OwnerKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "OwnerKey({})", b64::encode(&self.0))
    }
}

/// A change only the agent's owner may make, as the owner signs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OwnerAct<'a> {
    /// Approve `from`'s request with its code.
    Approve {
        /// The requester.
        from: &'a Address,
        /// The code the requester's owner passed on.
        code: &'a RequestCode,
    },
    /// Deny a request.
    Deny(&'a Address),
    /// Block an agent.
    Block(&'a Peer),
    /// Lift a block.
    Unblock(&'a Peer),
    /// End a contact.
    Remove(&'a Address),
    /// Set the agent's policy.
    SetPolicy(Policy),
    /// Replace the owner key (signed by the current one).
    SetOwner(&'a OwnerKey),
    /// Put `member` on the roster of `group` (signed by the group's owner key).
    GroupAdd {
        /// The group, on the connection's relay.
        group: &'a AgentName,
        /// The member.
        member: &'a Address,
    },
    /// Take `member` off the roster of `group` (signed by the group's owner key).
    GroupRemove {
        /// The group, on the connection's relay.
        group: &'a AgentName,
        /// The member.
        member: &'a Address,
    },
    /// Accept mail from the group at this address: the agent joins it.
    Join(&'a Address),
}

impl OwnerAct<'_> {
    /// The act in words, one line, as it is signed (names, codes and policies hold no spaces).
    fn words(&self) -> String {
        match self {
            OwnerAct::Approve { from, code } => format!("approve {from} {}", code.as_str()),
            OwnerAct::Deny(a) => format!("deny {a}"),
            OwnerAct::Block(a) => format!("block {a}"),
            OwnerAct::Unblock(a) => format!("unblock {a}"),
            OwnerAct::Remove(a) => format!("remove {a}"),
            OwnerAct::SetPolicy(p) => format!("set_policy {p}"),
            OwnerAct::SetOwner(k) => format!("set_owner {}", b64::encode(k.as_bytes())),
            OwnerAct::GroupAdd { group, member } => format!("group_add {group} {member}"),
            OwnerAct::GroupRemove { group, member } => format!("group_remove {group} {member}"),
            OwnerAct::Join(g) => format!("join {g}"),
        }
    }
}

/// The bytes an owner signs for `act` on `agent`: the relay id and the connection's nonce
/// (so a signature is good on this one connection only), the agent, the act.
pub fn owner_payload(relay: &str, nonce: &[u8], agent: &AgentName, act: &OwnerAct<'_>) -> Vec<u8> {
    let words = act.words();
    let mut bytes = Vec::with_capacity(relay.len() + nonce.len() + words.len() + 40);
    bytes.extend_from_slice(relay.as_bytes());
    bytes.push(0);
    bytes.extend_from_slice(nonce);
    bytes.push(0);
    bytes.extend_from_slice(agent.as_str().as_bytes());
    bytes.push(0);
    bytes.extend_from_slice(words.as_bytes());
    bytes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owner_keys_are_32_bytes_of_base64() {
        let key = OwnerKey::from_bytes([7; 32]);
        let text = serde_json::to_string(&key).unwrap();
        assert_eq!(serde_json::from_str::<OwnerKey>(&text).unwrap(), key);
        let short = serde_json::from_str::<OwnerKey>(&format!("\"{}\"", b64::encode(&[1; 31])));
        assert!(short.unwrap_err().to_string().contains("31 bytes"));
    }

    #[test]
    fn each_act_signs_different_bytes() {
        let alice = Address::parse("alice").unwrap();
        let (bob, remote_bob) = (
            AgentName::new("bob").unwrap(),
            Address::parse("bob@relay-b.example").unwrap(),
        );
        let peer = |a: &Address| Peer::Agent(a.clone());
        let (alice_peer, local_bob, remote_bob, relay_b) = (
            peer(&alice),
            Peer::Agent(Address::local(bob.clone())),
            peer(&remote_bob),
            Peer::parse("*@relay-b.example").unwrap(),
        );
        let acts = [
            OwnerAct::Block(&alice_peer),
            OwnerAct::Block(&local_bob),
            OwnerAct::Block(&remote_bob),
            OwnerAct::Block(&relay_b),
            OwnerAct::Unblock(&alice_peer),
            OwnerAct::Remove(&alice),
            OwnerAct::Deny(&alice),
            OwnerAct::SetPolicy(Policy::Open),
            OwnerAct::GroupAdd {
                group: &bob,
                member: &alice,
            },
            OwnerAct::GroupRemove {
                group: &bob,
                member: &alice,
            },
            OwnerAct::Join(&alice),
        ];
        let payloads: std::collections::HashSet<Vec<u8>> = acts
            .iter()
            .map(|a| owner_payload("relay-1", &[1; 32], &bob, a))
            .collect();
        assert_eq!(payloads.len(), acts.len());
        assert_ne!(
            owner_payload("relay-1", &[1; 32], &bob, &acts[0]),
            owner_payload("relay-1", &[2; 32], &bob, &acts[0]),
            "another connection's nonce"
        );
    }
}
