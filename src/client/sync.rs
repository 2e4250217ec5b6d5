//! One round with the relay: send the outbox, take delivery of everything waiting, commit,
//! acknowledge, and close. `mailslot sync` and `mailslot send` use it.

use serde::Serialize;

use super::inbound::{Received, receive};
use super::outbound::{SendFailure, flush};
use super::{ClientError, Connection, RelayUrl};
use crate::crypto::Identity;
use crate::protocol::{Address, AgentName, ConsentEvent, MessageId, ServerFrame};
use crate::store::StoreHandle;

/// Acknowledge at least this often while draining a backlog.
const ACK_EVERY: usize = 256;

/// What one sync did.
#[derive(Debug, Clone, Default, Serialize)]
pub struct SyncReport {
    /// Messages the relay accepted.
    pub sent: Vec<MessageId>,
    /// Messages not sent, and why.
    pub not_sent: Vec<(MessageId, String, bool)>,
    /// New messages stored.
    pub received: Vec<MessageId>,
    /// Redeliveries of messages already stored.
    pub duplicates: u32,
    /// Deliveries refused as unreadable, with the sender and reason.
    pub unreadable: Vec<(Address, MessageId, String)>,
    /// Consent news that arrived during the sync.
    pub events: Vec<ConsentEvent>,
}

/// Connects as `agent`, sends the outbox, receives until caught up, acks, closes.
pub async fn sync(
    url: &RelayUrl,
    agent: &AgentName,
    identity: &Identity,
    store: &StoreHandle,
) -> Result<SyncReport, ClientError> {
    let mut conn = Connection::connect(url, agent, identity).await?;
    let me = Address::local(agent.clone());
    let mut report = SyncReport::default();
    let flushed = flush(&mut conn, store, identity).await?;
    report.sent = flushed.sent;
    report.not_sent = flushed
        .failed
        .into_iter()
        .map(
            |SendFailure {
                 id,
                 reason,
                 will_retry,
             }| (id, reason, will_retry),
        )
        .collect();
    let mut last_seq = None;
    let mut unacked = 0;
    loop {
        match conn.recv().await? {
            ServerFrame::Deliver { seq, envelope } => {
                match receive(&mut conn, store, &me, identity, envelope).await? {
                    Received::New { id, .. } => report.received.push(id),
                    Received::Duplicate(_) => report.duplicates += 1,
                    Received::Unreadable { from, id, reason } => {
                        tracing::warn!(%from, %id, %reason, "refused an unreadable delivery");
                        report.unreadable.push((from, id, reason));
                    }
                }
                last_seq = Some(seq);
                unacked += 1;
                if unacked >= ACK_EVERY {
                    conn.ack(seq).await?;
                    unacked = 0;
                }
            }
            ServerFrame::CaughtUp => break,
            ServerFrame::Event { event } => report.events.push(event),
            ServerFrame::Error {
                code,
                message,
                retry_after_ms,
                ..
            } => {
                return Err(ClientError::Refused {
                    code,
                    message,
                    retry_after_ms,
                });
            }
            _ => {}
        }
    }
    if let Some(seq) = last_seq {
        conn.ack(seq).await?;
    }
    conn.close().await;
    Ok(report)
}
