//! Receiving one delivery: find the sender's keys (pinned, else from the relay, then pinned),
//! open and verify, and commit to the store. Only after this returns may the caller ack.

use super::{ClientError, Connection};
use crate::crypto::{Identity, OpenError, PublicIdentity, follows, open};
use crate::protocol::{Address, Fingerprint, Limits, MessageId, SealedEnvelope};
use crate::store::{Direction, ReceiptOutcome, ReceiptRecord, StoreHandle, Trust};

/// What became of a delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Received {
    /// Stored as new mail.
    New {
        /// The message.
        id: MessageId,
        /// Its verified sender.
        from: Address,
        /// How far the sender is vouched for.
        trust: Trust,
    },
    /// A receipt for mail this agent sent, recorded now (never stored as mail).
    Receipt {
        /// The sent message it is about.
        of: MessageId,
        /// What was recorded.
        record: ReceiptRecord,
    },
    /// The sender announced new keys: re-pinned when a statement signed by the pinned keys
    /// leads to them (`accepted`), else recorded as a change for the owner to settle.
    Rotated {
        /// The sender.
        from: Address,
        /// The keys it announced.
        fingerprint: Fingerprint,
        /// Whether they are pinned now.
        accepted: bool,
    },
    /// Already stored (a redelivery, or a receipt already recorded); nothing changed.
    Duplicate(MessageId),
    /// Could not be opened or verified; not stored. The reason is for the owner's log.
    Unreadable {
        /// The claimed sender.
        from: Address,
        /// The message id as the envelope states it.
        id: MessageId,
        /// Why it was refused.
        reason: String,
    },
}

fn keys_from(raw: crate::protocol::PublicKeys) -> Result<PublicIdentity, ClientError> {
    PublicIdentity::try_from(raw)
        .map_err(|e| ClientError::Protocol(format!("the relay returned invalid keys: {e}")))
}

/// Opens `envelope` for `me` and commits it. Errors are only for trouble that retrying can fix
/// (store, connection); a bad envelope is [`Received::Unreadable`].
pub async fn receive(
    conn: &mut Connection,
    store: &StoreHandle,
    me: &Address,
    identity: &Identity,
    envelope: SealedEnvelope,
) -> Result<Received, ClientError> {
    let from = envelope.from.clone();
    let id = envelope.id;
    let unreadable = |reason: String| {
        tracing::warn!(%from, %id, %reason, "refused an unreadable delivery");
        Received::Unreadable {
            from: from.clone(),
            id,
            reason,
        }
    };
    // The relay vouches only for its own agents: a sender's keys are looked up there only
    // when the sender is local, so a local namesake is never pinned for a remote address.
    if let Some(relay) = from.host() {
        match super::is_own_relay(conn.url(), relay).await {
            Ok(true) => {}
            Ok(false) => {
                return Ok(unreadable(format!(
                    "the sender is on another relay ({relay}), and this version takes mail from its own relay's agents only"
                )));
            }
            // Refused, not retried: a retry would meet the same answer and hold up every
            // message behind this one.
            Err(e) => {
                return Ok(unreadable(format!(
                    "cannot tell whether {relay} is this relay: {e}"
                )));
            }
        }
    }
    // `alice` and `alice@<this relay>` are one agent: one pin, so a key change under either
    // spelling is seen.
    let pinned_as = Address::local(from.name().clone());
    let pinned = {
        let pinned_as = pinned_as.clone();
        store.call(move |s| s.pinned_keys(&pinned_as)).await?
    };
    let (keys, pinned_now) = match pinned {
        Some(k) => (k, false),
        None => match conn.lookup(from.name()).await {
            Ok(raw) => (keys_from(raw)?, true),
            Err(ClientError::Refused { message, .. }) => {
                return Ok(unreadable(format!(
                    "the sender is unknown to the relay: {message}"
                )));
            }
            Err(e) => return Err(e),
        },
    };
    let limits = Limits::default();
    let (message, trust) = match open(&envelope, me, identity, &keys, &limits) {
        Ok(message) => (message, Trust::Verified),
        // The pinned key no longer verifies: the sender may have new keys. They are pinned
        // only when a rotation signed by the pinned keys leads to them; any other change is
        // recorded, the mail marked, and the pin stays until the owner settles it.
        Err(OpenError::Signature(_)) if !pinned_now => {
            let (raw, mut chain) = match conn.lookup_with_rotations(from.name()).await {
                Ok(found) => found,
                Err(ClientError::Refused { message, .. }) => return Ok(unreadable(message)),
                Err(e) => return Err(e),
            };
            let current = keys_from(raw.clone())?;
            if current == keys {
                return Ok(unreadable(
                    "the signature does not match the sender's key".into(),
                ));
            }
            match open(&envelope, me, identity, &current, &limits) {
                Ok(message) => {
                    chain.extend(message.rotation.clone());
                    let (pinned_as, current) = (pinned_as.clone(), current.clone());
                    if follows(from.name(), &keys.to_keys(), &raw, &chain) {
                        store.call(move |s| s.repin(&pinned_as, &current)).await?;
                        (message, Trust::Verified)
                    } else {
                        store
                            .call(move |s| s.check_and_pin(&pinned_as, &current))
                            .await?;
                        (message, Trust::KeyChanged)
                    }
                }
                Err(e) => return Ok(unreadable(e.to_string())),
            }
        }
        Err(e) => return Ok(unreadable(e.to_string())),
    };
    if pinned_now {
        let keys = keys.clone();
        store
            .call(move |s| s.check_and_pin(&pinned_as, &keys))
            .await?;
    }
    if let Some(rotation) = &message.rotation {
        // The announcement itself: what it changed happened above.
        let fingerprint = PublicIdentity::try_from(rotation.new.clone())
            .map_err(|e| {
                ClientError::Protocol(format!("a rotation with invalid keys opened: {e}"))
            })?
            .fingerprint();
        return Ok(Received::Rotated {
            from,
            fingerprint,
            accepted: trust == Trust::Verified,
        });
    }
    if let Some(receipt) = message.receipt.clone() {
        // A receipt changes what the sender's store says about its mail: only a verified
        // recipient of a message this agent really sent may give one.
        if trust != Trust::Verified {
            return Ok(unreadable(format!(
                "a receipt signed by a key other than the one pinned for {from} is ignored"
            )));
        }
        let (giver, at) = (message.from.clone(), message.sent_at);
        let of = receipt.of;
        let outcome = store
            .call(move |s| s.record_receipt(&giver, &receipt, at))
            .await?;
        return Ok(match outcome {
            ReceiptOutcome::Recorded(record) => Received::Receipt { of, record },
            ReceiptOutcome::Duplicate => Received::Duplicate(id),
            ReceiptOutcome::NotSent => unreadable(format!(
                "a receipt for message {of}, which this agent never sent, is ignored"
            )),
            ReceiptOutcome::NotRecipient => unreadable(format!(
                "a receipt for message {of} from {from}, who is not one of its recipients, is ignored"
            )),
        });
    }
    let new = store
        .call(move |s| s.insert_message(&message, Direction::In, trust))
        .await?;
    Ok(if new {
        Received::New { id, from, trust }
    } else {
        Received::Duplicate(id)
    })
}
