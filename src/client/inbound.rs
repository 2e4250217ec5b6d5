//! Receiving one delivery: find the sender's keys (pinned, else from its relay — the agent's
//! own for a local sender, the sender's for a remote one — then pinned), open and verify, and
//! commit to the store. Only after this returns may the caller ack.

use super::discovery::remote_keys;
use super::{ClientError, Connection};
use crate::crypto::{Identity, OpenError, PublicIdentity, follows, open, open_as_member};
use crate::protocol::now_millis;
use crate::protocol::{
    Address, AgentName, Fingerprint, Limits, MessageId, RelayName, SealedEnvelope,
};
use crate::store::{
    Direction, MAX_PARKED, PARKED_FOR, Parking, ReceiptOutcome, ReceiptRecord, StoreHandle, Trust,
};

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
    /// From another relay's agent whose relay did not answer for its keys: kept sealed and
    /// opened when that relay answers ([`open_parked`]), so the delivery can be acknowledged.
    Parked {
        /// The claimed sender.
        from: Address,
        /// The message id as the envelope states it.
        id: MessageId,
        /// Why its relay could not be asked.
        reason: String,
    },
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

/// Why a delivery could not be settled now.
enum Trouble {
    /// The agent's own side (its store, its relay connection): the delivery is not
    /// acknowledged and comes again after the session's backoff.
    Own(ClientError),
    /// The sender's relay, another one, did not answer for the sender's keys: the letter is
    /// kept sealed ([`crate::store::ParkedLetter`]) and acknowledged, so mail behind it flows.
    SendersRelay(ClientError),
}

impl<E: Into<ClientError>> From<E> for Trouble {
    fn from(e: E) -> Self {
        Self::Own(e.into())
    }
}

/// What a failure to get a sender's keys (or to tell where the sender lives) means for the
/// delivery: the one place that decides. Trouble that passes (a relay unreachable, timing out,
/// answering 5xx or "retry later") is retried: by not acknowledging the delivery when it is
/// this agent's own relay, by keeping the letter when it is the sender's (`origin` remote);
/// acknowledging it as unreadable would lose it. A permanent answer (the agent does not exist
/// there, the relay's key changed, keys that are invalid or not signed by the relay) makes it
/// unreadable.
fn settle(
    e: ClientError,
    origin: Option<&Origin>,
    unreadable: impl FnOnce(String) -> Received,
) -> Result<Received, Trouble> {
    match (e.is_temporary(), origin) {
        (false, _) => Ok(unreadable(e.to_string())),
        (true, Some(Origin::Remote(_))) => Err(Trouble::SendersRelay(e)),
        (true, _) => Err(Trouble::Own(e)),
    }
}

/// Pins `current`, the keys that opened the mail, for `pinned_as`: silently when a rotation
/// signed by the pinned keys leads to them (`signed`), else recorded as a change for the owner
/// to settle (the pin stays).
async fn repin(
    store: &StoreHandle,
    pinned_as: Address,
    current: PublicIdentity,
    signed: bool,
) -> Result<Trust, ClientError> {
    if signed {
        store.call(move |s| s.repin(&pinned_as, &current)).await?;
        Ok(Trust::Verified)
    } else {
        store
            .call(move |s| s.check_and_pin(&pinned_as, &current))
            .await?;
        Ok(Trust::KeyChanged)
    }
}

/// Where the sender's keys come from: the agent's own relay, or the other relay it names.
enum Origin {
    Local,
    Remote(RelayName),
}

/// The sender's keys as its relay vouches for them now (nothing pinned): the agent's own relay
/// over `conn` for a local sender, the sender's relay over HTTP(S) for a remote one.
async fn current_keys(
    conn: &mut Connection,
    store: &StoreHandle,
    trusted: &[RelayName],
    origin: &Origin,
    from: &Address,
) -> Result<PublicIdentity, ClientError> {
    match origin {
        Origin::Local => keys_from(conn.lookup(from.name()).await?),
        Origin::Remote(host) => Ok(remote_keys(store, trusted, host, from).await?.0),
    }
}

/// Opens `envelope` for `me` with the sender's `keys`: as mail to `me`, else as mail to a
/// group this agent joined (group mail names the group, never its members). A local group
/// may be spelt with this relay's name, in mail sealed for members on other relays too.
async fn open_mail(
    conn: &mut Connection,
    store: &StoreHandle,
    envelope: &SealedEnvelope,
    (me, identity): (&Address, &Identity),
    keys: &PublicIdentity,
) -> Result<Result<crate::protocol::Message, OpenError>, ClientError> {
    let limits = Limits::default();
    let refused = match open(envelope, me, identity, keys, &limits) {
        Err(e @ OpenError::NotAddressed(_)) => e,
        other => return Ok(other),
    };
    let joined = store.call(|s| s.joined_groups()).await?;
    if joined.is_empty() {
        return Ok(Err(refused));
    }
    let own = conn.relay_name().await?;
    let spellings: Vec<Address> = joined
        .into_iter()
        .flat_map(|g| {
            let full = g
                .host()
                .is_none()
                .then(|| Address::remote(g.name().clone(), own.clone()));
            std::iter::once(g).chain(full)
        })
        .collect();
    Ok(open_as_member(
        envelope,
        (me, &spellings),
        identity,
        keys,
        &limits,
    ))
}

/// Which spelling of this agent the envelope's key wrap uses: bare (mail from its own relay),
/// or its full address (mail from another relay, or written so). Only this agent's own: a wrap
/// for the same name at another relay is not for it.
async fn addressed_as(
    conn: &mut Connection,
    me: &AgentName,
    envelope: &SealedEnvelope,
) -> Result<Address, ClientError> {
    let bare = Address::local(me.clone());
    if envelope.keys.iter().any(|k| k.to == bare) {
        return Ok(bare);
    }
    let full = conn.full_address().await?;
    Ok(match envelope.keys.iter().any(|k| k.to == full) {
        true => full,
        false => bare,
    })
}

/// Opens `envelope` for the agent `me` and commits it. Errors are only for trouble on the
/// agent's own side that retrying can fix (store, connection): the caller must not
/// acknowledge then. A letter whose sender's relay is out of reach is kept
/// ([`Received::Parked`], opened later by [`open_parked`]); a bad envelope is
/// [`Received::Unreadable`]. Other relays are reached over TLS unless loopback or in
/// `trusted`.
pub async fn receive(
    conn: &mut Connection,
    store: &StoreHandle,
    trusted: &[RelayName],
    me: &AgentName,
    identity: &Identity,
    envelope: SealedEnvelope,
) -> Result<Received, ClientError> {
    match open_delivery(conn, store, trusted, me, identity, &envelope).await {
        Ok(received) => Ok(received),
        Err(Trouble::Own(e)) => Err(e),
        Err(Trouble::SendersRelay(e)) => park(store, envelope, e).await,
    }
}

/// Keeps a letter whose sender's relay did not answer.
async fn park(
    store: &StoreHandle,
    envelope: SealedEnvelope,
    e: ClientError,
) -> Result<Received, ClientError> {
    let (from, id, reason) = (envelope.from.clone(), envelope.id, e.to_string());
    let why = reason.clone();
    let kept = store
        .call(move |s| s.park(&envelope, &why, now_millis()))
        .await?;
    Ok(match kept {
        Parking::Kept => {
            tracing::warn!(%from, %id, %reason, "kept a letter until its sender's relay answers");
            Received::Parked { from, id, reason }
        }
        Parking::Full => {
            let reason = format!(
                "{MAX_PARKED} letters already wait for their senders' relays, and this one's is out of reach too: {reason}"
            );
            tracing::warn!(%from, %id, %reason, "refused an unreadable delivery");
            Received::Unreadable { from, id, reason }
        }
    })
}

/// Tries again to open letters kept for their senders' relays: those due now, or all of them
/// (`all`, when the owner asks by syncing). A letter opened is stored as if it had just
/// arrived; one whose relay still does not answer waits longer, and is given up (unreadable)
/// once it has waited [`PARKED_FOR`]. After one failure, the other letters from that relay
/// wait too, without asking it again this round.
pub async fn open_parked(
    conn: &mut Connection,
    store: &StoreHandle,
    trusted: &[RelayName],
    me: &AgentName,
    identity: &Identity,
    all: bool,
) -> Result<Vec<Received>, ClientError> {
    const ROUND: usize = 64;
    let now = now_millis();
    let due = store
        .call(move |s| s.parked_due((!all).then_some(now), ROUND))
        .await?;
    let mut out = Vec::new();
    let mut down: Vec<Option<RelayName>> = Vec::new();
    for letter in due {
        let (id, from) = (letter.envelope.id, letter.envelope.from.clone());
        let host = from.host().cloned();
        let failed = if down.contains(&host) {
            letter.last_error.clone()
        } else {
            match open_delivery(conn, store, trusted, me, identity, &letter.envelope).await {
                Ok(received) => {
                    store.call(move |s| s.unpark(&id)).await?;
                    out.push(received);
                    continue;
                }
                Err(Trouble::Own(e)) => return Err(e),
                Err(Trouble::SendersRelay(e)) => {
                    down.push(host);
                    e.to_string()
                }
            }
        };
        let waited = now.duration_since(letter.parked_at).unsigned_abs();
        if waited >= PARKED_FOR {
            store.call(move |s| s.unpark(&id)).await?;
            let reason = format!(
                "its sender's relay did not answer for {} days: {failed}",
                PARKED_FOR.as_secs() / 86_400
            );
            tracing::warn!(%from, %id, %reason, "gave up a letter");
            out.push(Received::Unreadable { from, id, reason });
        } else {
            store.call(move |s| s.park_again(&id, &failed, now)).await?;
        }
    }
    Ok(out)
}

async fn open_delivery(
    conn: &mut Connection,
    store: &StoreHandle,
    trusted: &[RelayName],
    me: &AgentName,
    identity: &Identity,
    envelope: &SealedEnvelope,
) -> Result<Received, Trouble> {
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
    // A sender on another relay is known by its full address, with keys from that relay only,
    // so a local namesake is never pinned for it. `alice` and `alice@<this relay>` are one
    // agent: one pin, so a key change under either spelling is seen.
    let origin = match from.host() {
        None => Origin::Local,
        Some(host) => match conn.is_own_relay(host).await {
            Ok(true) => Origin::Local,
            Ok(false) => Origin::Remote(host.clone()),
            Err(e) => {
                return settle(e, None, |why| {
                    unreadable(format!("cannot tell whether {host} is this relay: {why}"))
                });
            }
        },
    };
    let pinned_as = match origin {
        Origin::Local => Address::local(from.name().clone()),
        Origin::Remote(_) => from.clone(),
    };
    let me = match addressed_as(conn, me, envelope).await {
        Ok(me) => me,
        Err(e) => return settle(e, None, unreadable),
    };
    let pinned = {
        let pinned_as = pinned_as.clone();
        store.call(move |s| s.pinned_keys(&pinned_as)).await?
    };
    let (keys, pinned_now) = match pinned {
        Some(k) => (k, false),
        None => match current_keys(conn, store, trusted, &origin, &from).await {
            Ok(keys) => (keys, true),
            Err(ClientError::Refused { message, .. }) if matches!(origin, Origin::Local) => {
                return Ok(unreadable(format!(
                    "the sender is unknown to the relay: {message}"
                )));
            }
            Err(e) => return settle(e, Some(&origin), unreadable),
        },
    };
    let (message, trust) = match open_mail(conn, store, envelope, (&me, identity), &keys).await? {
        Ok(message) => (message, Trust::Verified),
        // The pinned key no longer verifies: the sender may have new keys. They are pinned
        // only when a rotation signed by the pinned keys leads to them; any other change is
        // recorded, the mail marked, and the pin stays until the owner settles it.
        // A remote sender's chain is not published across relays: only the statement its
        // announcement carries is followed; other new keys are a change for the owner.
        Err(OpenError::Signature(_)) if !pinned_now && matches!(origin, Origin::Remote(_)) => {
            let current = match current_keys(conn, store, trusted, &origin, &from).await {
                Ok(current) => current,
                Err(e) => return settle(e, Some(&origin), unreadable),
            };
            if current == keys {
                return Ok(unreadable(
                    "the signature does not match the sender's key".into(),
                ));
            }
            match open_mail(conn, store, envelope, (&me, identity), &current).await? {
                Ok(message) => {
                    let chain: Vec<_> = message.rotation.clone().into_iter().collect();
                    let signed = follows(from.name(), &keys.to_keys(), &current.to_keys(), &chain);
                    let trust = repin(store, pinned_as.clone(), current, signed).await?;
                    (message, trust)
                }
                Err(e) => return Ok(unreadable(e.to_string())),
            }
        }
        Err(OpenError::Signature(_)) if !pinned_now => {
            let (raw, mut chain) = match conn.lookup_with_rotations(from.name()).await {
                Ok(found) => found,
                Err(e) => return settle(e, None, unreadable),
            };
            let current = keys_from(raw.clone())?;
            if current == keys {
                return Ok(unreadable(
                    "the signature does not match the sender's key".into(),
                ));
            }
            match open_mail(conn, store, envelope, (&me, identity), &current).await? {
                Ok(message) => {
                    chain.extend(message.rotation.clone());
                    let signed = follows(from.name(), &keys.to_keys(), &raw, &chain);
                    let trust = repin(store, pinned_as.clone(), current, signed).await?;
                    (message, trust)
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
        let at = message.sent_at;
        let of = receipt.of;
        let Some(recipients) = store.call(move |s| s.sent_recipients(&of)).await? else {
            return Ok(unreadable(format!(
                "a receipt for message {of}, which this agent never sent, is ignored"
            )));
        };
        let giver = match giver_among(conn, &origin, &from, recipients).await {
            Ok(Some(giver)) => giver,
            Ok(None) => {
                return Ok(unreadable(format!(
                    "a receipt for message {of} from {from}, who is not one of its recipients, is ignored"
                )));
            }
            Err(e) => return settle(e, None, unreadable),
        };
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

/// The recipient of a sent message that a receipt from `from` (of `origin`) stands for: the
/// same name on the same relay, however the address was written (`bob`, `bob@<this relay>`).
/// `bob@other` and a local `bob` are different agents, so neither answers for the other.
async fn giver_among(
    conn: &mut Connection,
    origin: &Origin,
    from: &Address,
    recipients: Vec<Address>,
) -> Result<Option<Address>, ClientError> {
    for to in recipients {
        if to.name() != from.name() {
            continue;
        }
        let same = match origin {
            Origin::Local => conn.is_local(&to).await?,
            Origin::Remote(host) => to.host() == Some(host),
        };
        if same {
            return Ok(Some(to));
        }
    }
    Ok(None)
}
