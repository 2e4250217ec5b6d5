//! One round with the relay: send the outbox, take delivery of everything waiting, commit,
//! acknowledge, and close. `mailslot sync` and `mailslot send` use it.

use serde::Serialize;

use super::bounces;
use super::deliveries;
use super::denials;
use super::inbound::{Received, open_parked, receive};
use super::outbound::flush;
use super::{ClientError, Connection, RelayUrl, refusal};
use crate::crypto::Identity;
use crate::protocol::{
    Address, AgentName, Bounce, ConsentEvent, MessageId, OwnerKey, RelayName, ServerFrame,
};
use crate::store::{Delivery, StoreHandle};

/// What one sync did.
#[derive(Debug, Clone, Default, Serialize)]
pub struct SyncReport {
    /// Messages the relay accepted.
    pub sent: Vec<MessageId>,
    /// Messages not sent, and why.
    pub not_sent: Vec<(MessageId, String, bool)>,
    /// New messages stored.
    pub received: Vec<MessageId>,
    /// Sent messages a recipient's receipt (read, acknowledged) was recorded for now.
    pub receipts: Vec<MessageId>,
    /// Peers that announced new keys, and whether they are pinned now (see
    /// [`super::Received::Rotated`]).
    pub rotated: Vec<(Address, bool)>,
    /// Redeliveries of messages already stored.
    pub duplicates: u32,
    /// Deliveries refused as unreadable, with the sender and reason.
    pub unreadable: Vec<(Address, MessageId, String)>,
    /// Letters kept now because their sender's relay did not answer for its keys, with the
    /// sender and reason: acknowledged, and opened once that relay answers.
    pub parked: Vec<(Address, MessageId, String)>,
    /// Letters still waiting for their senders' relays after this sync, these included.
    pub waiting: u64,
    /// Consent news that arrived during the sync.
    pub events: Vec<ConsentEvent>,
    /// Copies of sent messages that expired on the relay undelivered, recorded now.
    pub bounced: Vec<Bounce>,
    /// Copies of sent messages their recipients took, as the relay said, recorded now.
    pub delivered: Vec<Delivery>,
}

impl SyncReport {
    /// Counts what became of one delivery (or of a kept letter tried again).
    fn tally(&mut self, received: Received) {
        match received {
            Received::New { id, .. } => self.received.push(id),
            Received::Receipt { of, .. } => self.receipts.push(of),
            Received::Rotated { from, accepted, .. } => self.rotated.push((from, accepted)),
            Received::Duplicate(_) => self.duplicates += 1,
            Received::Unreadable { from, id, reason } => self.unreadable.push((from, id, reason)),
            Received::Parked { from, id, reason } => self.parked.push((from, id, reason)),
        }
    }
}

/// Connects as `agent`, sends the outbox, receives until caught up, acks, closes. Other relays
/// (of remote recipients and senders) are reached over TLS unless loopback.
pub async fn sync(
    url: &RelayUrl,
    agent: &AgentName,
    identity: &Identity,
    owner: Option<OwnerKey>,
    store: &StoreHandle,
) -> Result<SyncReport, ClientError> {
    sync_with_progress(url, agent, identity, owner, store, &[], &mut |_, _| {}).await
}

/// [`sync`], reaching the relays in `trusted` over plain HTTP too, and calling
/// `progress(received, waiting)` as deliveries arrive (`waiting`: what the relay said was
/// waiting when the connection opened).
pub async fn sync_with_progress(
    url: &RelayUrl,
    agent: &AgentName,
    identity: &Identity,
    owner: Option<OwnerKey>,
    store: &StoreHandle,
    trusted: &[RelayName],
    progress: &mut (dyn FnMut(u64, u64) + Send),
) -> Result<SyncReport, ClientError> {
    let mut conn = Connection::connect(url, agent, identity, owner).await?;
    let waiting = conn.waiting();
    let mut delivered = 0;
    let mut report = SyncReport::default();
    flush(
        &mut conn,
        store,
        trusted,
        identity,
        &mut |answered| match answered {
            Ok(id) => report.sent.push(id),
            Err(f) => report.not_sent.push((f.id, f.reason.clone(), f.will_retry)),
        },
    )
    .await?;
    loop {
        match refusal(conn.recv().await?)? {
            ServerFrame::Deliver { seq, envelope } => {
                let received =
                    receive(&mut conn, store, trusted, agent, identity, envelope).await?;
                report.tally(received);
                conn.committed(seq).await?;
                delivered += 1;
                progress(delivered, waiting.max(delivered));
            }
            ServerFrame::CaughtUp {} => break,
            ServerFrame::Event { event } => {
                let news = denials::keep(store, &event).await?;
                if news {
                    report.events.push(event);
                }
            }
            _ => {}
        }
    }
    conn.ack_committed().await?;
    // Letters kept for their senders' relays: asked now, whatever their backoff says.
    for received in open_parked(&mut conn, store, trusted, agent, identity, true).await? {
        report.tally(received);
    }
    report.waiting = store.call(|s| s.parked_summary()).await?.0;
    report.bounced = bounces::collect(&mut conn, store).await?;
    let checked = deliveries::check(&mut conn, store, &mut None).await?;
    report.delivered = checked.delivered;
    if checked.bounced {
        report
            .bounced
            .extend(bounces::collect(&mut conn, store).await?);
    }
    conn.close().await;
    Ok(report)
}
