//! Making and checking key rotations, and following a chain of them from a pinned key to the
//! one an agent holds now.

use super::sign::{self, Domain};
use super::{Identity, PublicIdentity};
use crate::protocol::{AgentName, KeyRotation, PublicKeys, now_millis, rotation_payload};

/// Why a rotation statement was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RotationError {
    /// One of its keys is not a valid public key.
    #[error("the rotation's {which} keys are not valid public keys")]
    BadKeys {
        /// `old` or `new`.
        which: &'static str,
    },
    /// A signature does not verify.
    #[error(
        "the rotation's {which} signature does not verify: it was altered or not made by those keys"
    )]
    Signature {
        /// `old_signature` or `new_signature`.
        which: &'static str,
    },
    /// Old and new are the same keys.
    #[error("the rotation's old and new keys are the same")]
    Unchanged,
}

/// The statement that `agent` moves from `old` to `new`, signed by both, dated now.
pub fn sign_rotation(agent: &AgentName, old: &Identity, new: &Identity) -> KeyRotation {
    let (old_keys, new_keys) = (old.public().to_keys(), new.public().to_keys());
    let at_ms = now_millis().as_millisecond();
    let payload = rotation_payload(agent, &old_keys, &new_keys, at_ms);
    KeyRotation {
        agent: agent.clone(),
        old_signature: sign::signature(old, Domain::Rotation, &payload).to_vec(),
        new_signature: sign::signature(new, Domain::Rotation, &payload).to_vec(),
        old: old_keys,
        new: new_keys,
        at_ms,
    }
}

/// Checks both signatures of `rotation`.
pub fn verify_rotation(rotation: &KeyRotation) -> Result<(), RotationError> {
    if rotation.old == rotation.new {
        return Err(RotationError::Unchanged);
    }
    let keys = |k: &PublicKeys, which| {
        PublicIdentity::try_from(k.clone()).map_err(|_| RotationError::BadKeys { which })
    };
    let (old, new) = (keys(&rotation.old, "old")?, keys(&rotation.new, "new")?);
    let payload = rotation_payload(
        &rotation.agent,
        &rotation.old,
        &rotation.new,
        rotation.at_ms,
    );
    sign::verify_detached(&old, Domain::Rotation, &payload, &rotation.old_signature).map_err(
        |_| RotationError::Signature {
            which: "old_signature",
        },
    )?;
    sign::verify_detached(&new, Domain::Rotation, &payload, &rotation.new_signature).map_err(
        |_| RotationError::Signature {
            which: "new_signature",
        },
    )?;
    Ok(())
}

/// Whether `chain` leads, by valid signed steps for `agent`, from `pinned` to `current`.
/// The steps may come in any order and include others; a broken or foreign step is skipped.
pub fn follows(
    agent: &AgentName,
    pinned: &PublicKeys,
    current: &PublicKeys,
    chain: &[KeyRotation],
) -> bool {
    let mut at = pinned.clone();
    // Each pass takes one step; a chain cannot be longer than its statements.
    for _ in 0..chain.len() {
        if &at == current {
            return true;
        }
        let Some(step) = chain
            .iter()
            .find(|r| &r.agent == agent && r.old == at && verify_rotation(r).is_ok())
        else {
            return false;
        };
        at = step.new.clone();
    }
    &at == current
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(s: &str) -> AgentName {
        AgentName::new(s).unwrap()
    }

    #[test]
    fn a_signed_rotation_verifies_and_an_altered_one_does_not() {
        let (k0, k1) = (Identity::generate(), Identity::generate());
        let r = sign_rotation(&name("bob"), &k0, &k1);
        verify_rotation(&r).unwrap();
        let mut other = r.clone();
        other.new = Identity::generate().public().to_keys();
        assert_eq!(
            verify_rotation(&other),
            Err(RotationError::Signature {
                which: "old_signature"
            })
        );
        let mut renamed = r.clone();
        renamed.agent = name("mallory");
        assert!(verify_rotation(&renamed).is_err());
        // Made by someone who holds only the new key: the old signature is theirs, not the
        // old key's.
        let forged = sign_rotation(&name("bob"), &k1, &k1);
        assert_eq!(verify_rotation(&forged), Err(RotationError::Unchanged));
        let mallory = Identity::generate();
        let mut stolen = sign_rotation(&name("bob"), &mallory, &k1);
        stolen.old = k0.public().to_keys();
        assert!(verify_rotation(&stolen).is_err());
    }

    #[test]
    fn rotated_keys_still_open_mail_sealed_to_the_old_ones_and_keep_them_in_their_file() {
        use crate::protocol::{Address, Limits, Message};
        let alice = Identity::generate();
        let bob = Identity::generate();
        let to = Address::parse("bob").unwrap();
        let message = Message::new(Address::parse("alice").unwrap(), vec![to.clone()], "s", "b");
        let sealed = crate::crypto::seal(
            &message,
            &alice,
            &[(to.clone(), bob.public().clone())],
            &Limits::default(),
        )
        .unwrap()
        .remove(0);
        let file = bob.rotated().to_key_file();
        let rotated = Identity::from_key_file(&file, std::path::Path::new("k")).unwrap();
        assert_ne!(rotated.public(), bob.public());
        let opened =
            crate::crypto::open(&sealed, &to, &rotated, alice.public(), &Limits::default())
                .unwrap();
        assert_eq!(opened.id, message.id);
        // A stranger's keys open nothing.
        assert!(
            crate::crypto::open(
                &sealed,
                &to,
                &Identity::generate(),
                alice.public(),
                &Limits::default()
            )
            .is_err()
        );
    }

    #[test]
    fn a_chain_is_followed_only_through_valid_steps_of_the_same_agent() {
        let ids: Vec<Identity> = (0..3).map(|_| Identity::generate()).collect();
        let keys: Vec<PublicKeys> = ids.iter().map(|i| i.public().to_keys()).collect();
        let bob = name("bob");
        let r01 = sign_rotation(&bob, &ids[0], &ids[1]);
        let r12 = sign_rotation(&bob, &ids[1], &ids[2]);
        assert!(follows(
            &bob,
            &keys[0],
            &keys[2],
            &[r12.clone(), r01.clone()]
        ));
        assert!(follows(
            &bob,
            &keys[1],
            &keys[2],
            &[r01.clone(), r12.clone()]
        ));
        assert!(!follows(
            &bob,
            &keys[0],
            &keys[2],
            std::slice::from_ref(&r12)
        ));
        assert!(!follows(
            &bob,
            &keys[2],
            &keys[0],
            &[r01.clone(), r12.clone()]
        ));
        assert!(!follows(
            &name("carol"),
            &keys[0],
            &keys[1],
            std::slice::from_ref(&r01)
        ));
        let mut broken = r01;
        broken.old_signature[0] ^= 1;
        assert!(!follows(&bob, &keys[0], &keys[2], &[broken, r12]));
    }
}
