//! Sending the outbox: seal each queued message to its recipients' pinned keys (looking up and
//! pinning keys not seen before: a local agent's on the agent's relay, a remote one's on its
//! own relay), send every copy, and mark it sent only when all are stored.

use std::borrow::Cow;

use super::{ClientError, Connection, resolve_keys};
use crate::crypto::{Identity, PublicIdentity, seal};
use crate::protocol::{Address, Limits, Message, MessageId, RelayName};
use crate::store::StoreHandle;

/// Messages taken from the outbox per round.
const BATCH: usize = 256;

/// A message that could not be sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SendFailure {
    /// The message.
    pub id: MessageId,
    /// Why.
    pub reason: String,
    /// Whether it will be retried.
    pub will_retry: bool,
}

/// What became of one queued message in a flush, told as soon as the store has it.
pub type Answered<'a> = Result<MessageId, &'a SendFailure>;

/// Sends everything queued (other relays reached over TLS unless loopback or in `trusted`).
/// Stops at the first temporary failure (the rest waits for the next flush); permanent
/// failures are marked and skipped. `answered` hears each message's outcome once it is
/// recorded, so a caller waiting for one message never waits for the rest of the outbox.
pub async fn flush(
    conn: &mut Connection,
    store: &StoreHandle,
    trusted: &[RelayName],
    identity: &Identity,
    answered: &mut (dyn FnMut(Answered<'_>) + Send),
) -> Result<(), ClientError> {
    loop {
        let items = store.call(|s| s.outbox(BATCH)).await?;
        if items.is_empty() {
            return Ok(());
        }
        for item in items {
            let id = item.message.id;
            match send_one(conn, store, trusted, identity, &item.message).await {
                Ok(()) => {
                    let relay = conn.relay_id().to_owned();
                    store.call(move |s| s.outbox_done(&id, &relay)).await?;
                    answered(Ok(id));
                }
                Err(e) => {
                    let will_retry = e.is_temporary();
                    let failure = SendFailure {
                        id,
                        reason: e.to_string(),
                        will_retry,
                    };
                    let stored = failure.reason.clone();
                    store
                        .call(move |s| s.outbox_failed(&id, &stored, !will_retry))
                        .await?;
                    answered(Err(&failure));
                    if will_retry {
                        return Ok(());
                    }
                }
            }
        }
    }
}

async fn send_one(
    conn: &mut Connection,
    store: &StoreHandle,
    trusted: &[RelayName],
    identity: &Identity,
    message: &Message,
) -> Result<(), ClientError> {
    let mut keys: Vec<(Address, PublicIdentity)> = Vec::new();
    let mut remote = false;
    for to in message.recipients() {
        let (found, elsewhere) = recipient_keys(conn, store, trusted, to).await?;
        remote |= elsewhere;
        keys.push((to.clone(), found));
    }
    let from = match remote {
        true => Some(conn.full_address().await?),
        false => None,
    };
    let envelopes =
        seal(&letter(message, from), identity, &keys, &Limits::default()).map_err(|e| {
            ClientError::Refused {
                code: crate::protocol::ErrorCode::InvalidEnvelope,
                message: e.to_string(),
                retry_after_ms: None,
            }
        })?;
    for envelope in envelopes {
        conn.send_envelope(envelope).await?;
    }
    Ok(())
}

/// The letter as sealed: from the sender's full address (`from`) when a recipient is on
/// another relay, which knows the sender only by it (and whose relay refuses any other `from`);
/// otherwise as queued, so mail between agents of one relay is unchanged.
fn letter(message: &Message, from: Option<Address>) -> Cow<'_, Message> {
    match from {
        Some(from) => {
            let mut letter = message.clone();
            letter.from = from;
            Cow::Owned(letter)
        }
        None => Cow::Borrowed(message),
    }
}

/// The pinned keys for `to`, or those its relay vouches for, pinned now; and whether `to` is
/// on another relay. Mail is sealed to pinned keys only, so an impostor who registered new
/// keys under the name cannot read it. A local agent has one pin however its address is spelt;
/// an agent on another relay is pinned under its full address with keys from that relay only,
/// so a local namesake is never taken for it.
async fn recipient_keys(
    conn: &mut Connection,
    store: &StoreHandle,
    trusted: &[RelayName],
    to: &Address,
) -> Result<(PublicIdentity, bool), ClientError> {
    let remote = !conn.is_local(to).await?;
    let pinned_as = match remote {
        true => to.clone(),
        false => Address::local(to.name().clone()),
    };
    if let Some(keys) = store.call(move |s| s.pinned_keys(&pinned_as)).await? {
        return Ok((keys, remote));
    }
    let found = resolve_keys(conn, store, trusted, to).await?;
    Ok((found.keys, remote))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crypto::open;

    fn addr(s: &str) -> Address {
        Address::parse(s).unwrap()
    }

    #[test]
    fn mail_to_another_relay_is_sealed_from_the_full_address_to_the_full_address() {
        let (alice, bob, carol) = (
            Identity::generate(),
            Identity::generate(),
            Identity::generate(),
        );
        let queued = Message::new(
            addr("alice"),
            vec![addr("bob@relay-b.example"), addr("carol")],
            "plan",
            "across relays",
        );
        let full = addr("alice@relay-a.example");
        let keys = [
            (addr("bob@relay-b.example"), bob.public().clone()),
            (addr("carol"), carol.public().clone()),
        ];
        let limits = Limits::default();
        let sealed = seal(&letter(&queued, Some(full.clone())), &alice, &keys, &limits).unwrap();
        assert_eq!(sealed.len(), 1);
        let envelope = &sealed[0];
        assert_eq!(envelope.from, full, "the head names the full address");
        let wraps: Vec<&Address> = envelope.keys.iter().map(|k| &k.to).collect();
        assert_eq!(wraps, [&addr("bob@relay-b.example"), &addr("carol")]);
        // The signed letter agrees with the head (open checks it) and names the full address.
        let opened = open(
            envelope,
            &addr("bob@relay-b.example"),
            &bob,
            alice.public(),
            &limits,
        )
        .unwrap();
        assert_eq!(opened.from, full);

        // Only local recipients: the letter is as queued, from the bare name.
        assert!(matches!(letter(&queued, None), Cow::Borrowed(m) if m.from == addr("alice")));
    }
}
