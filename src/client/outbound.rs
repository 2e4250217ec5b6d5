//! Sending the outbox: seal each queued message to its recipients' pinned keys (looking up and
//! pinning keys not seen before: a local agent's on the agent's relay, a remote one's on its
//! own relay), send every copy, and mark it sent only when all are stored. A message to a
//! group alone is sealed once for the group's roster, read from its relay (`groups.rs`).

use std::borrow::Cow;

use super::groups;
use super::{ClientError, Connection, resolve_keys};
use crate::crypto::{Identity, PublicIdentity, seal, seal_for_group};
use crate::protocol::{Address, ErrorCode, GroupView, Limits, Message, MessageId, RelayName};
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
                Ok(copies) => {
                    let relay = conn.relay_id().to_owned();
                    store
                        .call(move |s| s.outbox_done(&id, &relay, copies.as_deref()))
                        .await?;
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

/// Sends `message`; for a group send, the members that got copies.
async fn send_one(
    conn: &mut Connection,
    store: &StoreHandle,
    trusted: &[RelayName],
    identity: &Identity,
    message: &Message,
) -> Result<Option<Vec<Address>>, ClientError> {
    if let Some(group) = group_of(conn, store, message).await? {
        return send_to_group(conn, (store, trusted), identity, message, group)
            .await
            .map(Some);
    }
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
    Ok(None)
}

/// The group `message` is for: its one recipient, when that is a group on the agent's relay
/// (a name nothing pinned keys for, which its relay answers as a group).
async fn group_of(
    conn: &mut Connection,
    store: &StoreHandle,
    message: &Message,
) -> Result<Option<GroupView>, ClientError> {
    let [to] = message.to.as_slice() else {
        return Ok(None);
    };
    if !message.cc.is_empty() || !message.bcc.is_empty() || !conn.is_local(to).await? {
        return Ok(None);
    }
    let pinned_as = Address::local(to.name().clone());
    if store
        .call(move |s| s.pinned_keys(&pinned_as))
        .await?
        .is_some()
    {
        return Ok(None);
    }
    match groups::roster(conn, to.name()).await {
        Ok(group) => Ok(Some(group)),
        // An agent, or nobody: the ordinary path looks it up and says so.
        Err(ClientError::Refused {
            code: ErrorCode::UnknownRecipient | ErrorCode::UnknownAgent,
            ..
        }) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Seals `message` once for `group`'s roster but the sender and sends it with the group's
/// name; when the roster changed since it was read, reads it and seals again, once. The
/// members that got copies (the relay skips those who have not joined).
async fn send_to_group(
    conn: &mut Connection,
    (store, trusted): (&StoreHandle, &[RelayName]),
    identity: &Identity,
    message: &Message,
    mut group: GroupView,
) -> Result<Vec<Address>, ClientError> {
    let mut tries = 0;
    loop {
        tries += 1;
        let me = Address::local(conn.agent().clone());
        let mut keys: Vec<(Address, PublicIdentity)> = Vec::new();
        let mut remote = false;
        for member in group.members.iter().filter(|m| **m != me) {
            let (found, elsewhere) = recipient_keys(conn, store, trusted, member).await?;
            remote |= elsewhere;
            keys.push((member.clone(), found));
        }
        if keys.is_empty() {
            return Err(ClientError::Refused {
                code: ErrorCode::InvalidEnvelope,
                message: format!(
                    "{} has no members but the sender; nobody would get it",
                    group.name
                ),
                retry_after_ms: None,
            });
        }
        // Mail that crosses relays names the sender and the group by their full addresses,
        // so a member elsewhere replies to both where they are.
        let mut sealed = letter(message, None);
        if remote {
            let full = conn.full_address().await?;
            let relay = full.host().expect("a full address has a host").clone();
            let sealed = sealed.to_mut();
            sealed.from = full;
            sealed.to = vec![Address::remote(group.name.clone(), relay)];
        }
        let envelope =
            seal_for_group(&sealed, identity, &keys, &Limits::default()).map_err(|e| {
                ClientError::Refused {
                    code: ErrorCode::InvalidEnvelope,
                    message: e.to_string(),
                    retry_after_ms: None,
                }
            })?;
        match conn.send_to(envelope, Some(group.name.clone())).await {
            Ok((_, skipped)) => {
                return Ok(keys
                    .into_iter()
                    .map(|(member, _)| member)
                    .filter(|m| !skipped.contains(m))
                    .collect());
            }
            Err(ClientError::Refused {
                code: ErrorCode::GroupChanged,
                ..
            }) if tries == 1 => group = groups::roster(conn, &group.name).await?,
            Err(e) => return Err(e),
        }
    }
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
