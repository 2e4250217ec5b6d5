//! The owner's voice in this home: a message the owner writes to one of their agents, signed
//! with the owner key (`protocol::voice_payload` says over what), and the check each read of
//! the agent's store applies to it: against this home's confirmed owner key
//! (`keys::read_owner_public`), never against a key found in the message or the store.

use std::sync::Arc;

use crate::crypto::{Owner, owner};
use crate::protocol::{AgentName, Message, OwnerKey, ValidationError, owner_message};
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

/// The check the store applies to owner messages of `agent`: verified only by `confirmed`,
/// the home's confirmed owner key (none: nothing verifies).
pub fn owner_check(agent: &AgentName, confirmed: Option<OwnerKey>) -> OwnerCheck {
    let agent = agent.clone();
    Arc::new(move |message: &Message, signature: &[u8]| {
        let key = confirmed.as_ref()?;
        owner::verify_voice(key, &agent, message, signature)
            .ok()
            .map(|()| owner::fingerprint(key))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_confirmed_key_of_the_same_agent_verifies() {
        let signer = Owner::generate();
        let bob = AgentName::new("bob").unwrap();
        let (m, sig) = compose(&signer, &bob, None, "Pause the migration.").unwrap();
        let fp = owner::fingerprint(&signer.public());
        assert_eq!(owner_check(&bob, Some(signer.public()))(&m, &sig), Some(fp));
        assert_eq!(owner_check(&bob, None)(&m, &sig), None);
        let other = Owner::generate().public();
        assert_eq!(owner_check(&bob, Some(other))(&m, &sig), None);
        let eve = AgentName::new("eve").unwrap();
        assert_eq!(owner_check(&eve, Some(signer.public()))(&m, &sig), None);
    }
}
