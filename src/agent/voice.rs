//! The owner's voice in this home: a message the owner writes to one of their agents, signed
//! with the owner key (`protocol::voice_payload` says over what), and the check each read of
//! the agent's store applies to it: against this home's confirmed owner key
//! (`keys::read_owner_public`), never against a key found in the message or the store.

use std::path::PathBuf;
use std::sync::Arc;

use crate::crypto::{Owner, owner};
use crate::keys::read_owner_public;
use crate::protocol::{AgentName, Fingerprint, Message, OwnerKey, ValidationError, owner_message};
use crate::store::OwnerCheck;

/// The owner's message to `agent`, sent now, and the owner key's signature over it.
pub fn compose(
    signer: &Owner,
    agent: &AgentName,
    subject: Option<&str>,
    body: &str,
) -> Result<(Message, [u8; 64]), ValidationError> {
    let message = owner_message(agent, subject, body)?;
    let signature = signer
        .sign_voice(agent, &message)
        .expect("owner_message makes the owner's shape");
    Ok((message, signature))
}

/// The check the store applies to owner messages of `agent`: verified only by the home's
/// confirmed owner key, read from `owner_key` (the home's `owner.key` and its pin) at each
/// check, so a key made or changed while a session runs counts at once. No confirmed key:
/// nothing verifies.
pub fn owner_check(agent: &AgentName, owner_key: PathBuf) -> OwnerCheck {
    let agent = agent.clone();
    Arc::new(move |message: &Message, signature: &[u8]| {
        let key = read_owner_public(&owner_key).unwrap_or_else(|e| e.confirmed())?;
        verifies(&key, &agent, message, signature)
    })
}

/// The fingerprint of `key` when `signature` is its over `message` to `agent`.
fn verifies(
    key: &OwnerKey,
    agent: &AgentName,
    message: &Message,
    signature: &[u8],
) -> Option<Fingerprint> {
    owner::verify_voice(key, agent, message, signature)
        .ok()
        .map(|()| owner::fingerprint(key))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_confirmed_key_of_the_same_agent_verifies() {
        let signer = Owner::generate();
        let bob = AgentName::new("bob").unwrap();
        let (m, sig) = compose(&signer, &bob, None, "Pause the migration.").unwrap();
        let key = signer.public();
        let fp = owner::fingerprint(&key);
        assert_eq!(verifies(&key, &bob, &m, &sig), Some(fp));
        let other = Owner::generate().public();
        assert_eq!(verifies(&other, &bob, &m, &sig), None);
        let eve = AgentName::new("eve").unwrap();
        assert_eq!(verifies(&key, &eve, &m, &sig), None);
        let home = tempfile::tempdir().unwrap();
        let none = owner_check(&bob, home.path().join("owner.key"));
        assert_eq!(
            none(&m, &sig),
            None,
            "a home without an owner key verifies nothing"
        );
    }
}
