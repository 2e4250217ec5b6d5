//! Key rotation: new keys, signed by the old ones, registered at the relay, then announced to
//! every pinned peer, who re-pins on the signature. Only while no session uses the keys (the
//! connection lock is free); resumable at every step, because the new keys are on disk before
//! the relay hears of them.

use super::{ConnectionLock, Mailbox, MailboxError, SendOutcome};
use crate::agent::Agent;
use crate::client::{ClientError, Connection, RelayUrl};
use crate::crypto::{Identity, sign_rotation};
use crate::protocol::{
    Address, ErrorCode, Fingerprint, KeyRotation, Message, RelayName, ValidationError,
};

/// What [`rotate_keys`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rotated {
    /// The keys given up.
    pub old: Fingerprint,
    /// The keys the agent has now.
    pub new: Fingerprint,
    /// Peers told, and what became of each announcement.
    pub announced: Vec<(Address, Result<SendOutcome, String>)>,
}

/// Rotates `agent`'s keys at `relay` and announces the new ones to its pinned peers.
pub async fn rotate_keys(
    mut agent: Agent,
    relay: RelayUrl,
    trusted: Vec<RelayName>,
) -> Result<Rotated, MailboxError> {
    let lock = ConnectionLock::for_agent(&agent.dir);
    let held = lock.try_take()?;
    if held.is_none() {
        return Err(MailboxError::KeysInUse { pid: lock.holder() });
    }
    let old = agent.identity.fingerprint();
    let next = agent.next_identity()?;
    let rotation = register(&agent, &next, &relay).await?;
    agent.commit_next_identity(next)?;
    drop(held);
    let new = agent.identity.fingerprint();
    // Peers on other relays are told too, over TLS unless trusted.
    let mailbox = Mailbox::open_trusting(agent, relay, trusted).await?;
    let announced = mailbox.announce(rotation).await;
    mailbox.close().await;
    Ok(Rotated {
        old,
        new,
        announced,
    })
}

/// Has the relay move the agent to `next`, or finds that it already did (an interrupted
/// rotation); the statement either way.
async fn register(
    agent: &Agent,
    next: &Identity,
    relay: &RelayUrl,
) -> Result<KeyRotation, MailboxError> {
    match Connection::connect_control(relay, &agent.name, &agent.identity, None).await {
        Ok(mut conn) => {
            let rotation = sign_rotation(&agent.name, &agent.identity, next);
            let answer = conn.rotate_keys(rotation.clone()).await;
            conn.close().await;
            answer?;
            Ok(rotation)
        }
        // The relay no longer takes the old keys: a rotation before this one got as far as
        // the relay. Its statement is the one whose new keys are `next`.
        Err(ClientError::Refused {
            code: ErrorCode::AuthFailed,
            ..
        }) => {
            let mut conn = Connection::connect_control(relay, &agent.name, next, None).await?;
            let found = conn.lookup_with_rotations(&agent.name).await;
            conn.close().await;
            let next_keys = next.public().to_keys();
            found?
                .1
                .into_iter()
                .rev()
                .find(|r| r.new == next_keys)
                .ok_or_else(|| {
                    MailboxError::NotSent(
                        "the relay holds the new keys but not the statement that leads to them; peers will see an unsigned change".into(),
                    )
                })
        }
        Err(e) => Err(e.into()),
    }
}

impl Mailbox {
    /// Tells every pinned peer about `rotation`, one sealed notice each (signed by the new
    /// keys, carrying the statement signed by the old ones).
    async fn announce(&self, rotation: KeyRotation) -> Vec<(Address, Result<SendOutcome, String>)> {
        let me = self.address().clone();
        let peers = match self.0.store.call(|s| s.contacts()).await {
            Ok(contacts) => contacts,
            Err(e) => return vec![(me, Err(format!("the pinned peers could not be read: {e}")))],
        };
        let mut told = Vec::new();
        for peer in peers.into_iter().map(|c| c.address) {
            if peer.name() == me.name() && peer.host().is_none() {
                continue;
            }
            let notice = Message::rotation(me.clone(), peer.clone(), rotation.clone());
            let outcome = self.send(notice).await.map_err(|e| e.to_string());
            told.push((peer, outcome));
        }
        told
    }
}

/// Pins the keys `address` presented with `fingerprint`, on its owner's word (the caller
/// unlocked the owner key); the fingerprint pinned before. Refused, naming the fingerprints
/// that were presented, when none was this one.
pub fn trust_presented_key(
    agent: &mut Agent,
    address: &Address,
    fingerprint: &Fingerprint,
) -> Result<Fingerprint, MailboxError> {
    if let Some(before) = agent.store.trust_presented(address, fingerprint)? {
        return Ok(before);
    }
    let seen = agent.store.presented_changes(address)?;
    let seen = if seen.is_empty() {
        "none".to_owned()
    } else {
        seen.iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    };
    Err(ValidationError::new(
        "fingerprint",
        format!(
            "{address} never presented the keys {fingerprint}; the changes seen are: {seen}. Check the fingerprint with {address}'s owner"
        ),
    )
    .into())
}
