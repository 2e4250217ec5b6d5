//! Sending the outbox: seal each queued message to its recipients' pinned keys (looking up and
//! pinning keys not seen before), send every copy, and mark it sent only when all are stored.

use super::{ClientError, Connection, is_own_relay};
use crate::crypto::{Identity, PublicIdentity, seal};
use crate::protocol::{Address, Limits, Message, MessageId};
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

/// The result of one flush.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Flushed {
    /// Accepted by the relay.
    pub sent: Vec<MessageId>,
    /// Refused or not attempted.
    pub failed: Vec<SendFailure>,
}

/// Sends everything queued. Stops at the first temporary failure (the rest waits for the next
/// flush); permanent failures are marked and skipped.
pub async fn flush(
    conn: &mut Connection,
    store: &StoreHandle,
    identity: &Identity,
) -> Result<Flushed, ClientError> {
    let mut report = Flushed::default();
    loop {
        let items = store.call(|s| s.outbox(BATCH)).await?;
        if items.is_empty() {
            return Ok(report);
        }
        for item in items {
            let id = item.message.id;
            match send_one(conn, store, identity, &item.message).await {
                Ok(()) => {
                    let relay = conn.relay_id().to_owned();
                    store.call(move |s| s.outbox_done(&id, &relay)).await?;
                    report.sent.push(id);
                }
                Err(e) => {
                    let will_retry = e.is_temporary();
                    let reason = e.to_string();
                    let stored = reason.clone();
                    store
                        .call(move |s| s.outbox_failed(&id, &stored, !will_retry))
                        .await?;
                    report.failed.push(SendFailure {
                        id,
                        reason,
                        will_retry,
                    });
                    if will_retry {
                        return Ok(report);
                    }
                }
            }
        }
    }
}

async fn send_one(
    conn: &mut Connection,
    store: &StoreHandle,
    identity: &Identity,
    message: &Message,
) -> Result<(), ClientError> {
    // Refused before any key is looked up, so nothing is pinned for a remote address.
    for to in message.recipients() {
        if let Some(relay) = to.host()
            && !is_own_relay(conn.url(), relay).await?
        {
            return Err(ClientError::OtherRelay {
                to: to.clone(),
                relay: relay.clone(),
            });
        }
    }
    let mut keys: Vec<(Address, PublicIdentity)> = Vec::new();
    for to in message.recipients() {
        keys.push((to.clone(), recipient_keys(conn, store, to).await?));
    }
    let envelopes =
        seal(message, identity, &keys, &Limits::default()).map_err(|e| ClientError::Refused {
            code: crate::protocol::ErrorCode::InvalidEnvelope,
            message: e.to_string(),
            retry_after_ms: None,
        })?;
    for envelope in envelopes {
        conn.send_envelope(envelope).await?;
    }
    Ok(())
}

/// The pinned keys for `to`, or the relay's, pinned now. Mail is sealed to pinned keys only,
/// so an impostor who registered new keys under the name cannot read it. `to` is on the
/// agent's own relay (`send_one` checked).
async fn recipient_keys(
    conn: &mut Connection,
    store: &StoreHandle,
    to: &Address,
) -> Result<PublicIdentity, ClientError> {
    // Only local recipients get here (others were refused): one pin per agent, however its
    // address is spelt.
    let pinned_as = Address::local(to.name().clone());
    let addr = pinned_as.clone();
    if let Some(keys) = store.call(move |s| s.pinned_keys(&addr)).await? {
        return Ok(keys);
    }
    let raw = conn.lookup(to.name()).await?;
    let keys = PublicIdentity::try_from(raw)
        .map_err(|e| ClientError::Protocol(format!("the relay returned invalid keys: {e}")))?;
    let pin = keys.clone();
    store
        .call(move |s| s.check_and_pin(&pinned_as, &pin))
        .await?;
    Ok(keys)
}
