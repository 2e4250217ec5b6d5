//! The queue's two writes on a message's way: a send's copies stored, and a recipient's
//! cumulative ack. Both run inside the writer's batch: each appends its records to the spool
//! and changes the index in step, under the index's lock until the batch is written.

use std::time::Instant;

use super::batch::Batch;
use super::clock::now_ms;
use super::index::{NameId, Row};
use super::rule::Rule;
use super::spool::StoredCopy;
use crate::protocol::{AgentName, MessageId, Policy, Seq};
use crate::storage::queue::is_relay_mailbox;
use crate::storage::{Accepted, AckOutcome, Committed, Epoch, QueuedCopy, Quota, StorageError};

/// A send, as the writer applies it.
pub(super) struct AcceptOp {
    pub(super) sender: AgentName,
    pub(super) id: MessageId,
    pub(super) copies: Vec<QueuedCopy>,
    pub(super) quota: Quota,
    pub(super) expires_at_ms: i64,
    pub(super) default: Policy,
}

/// Stores the copies of a send that are not stored yet, all or none (see
/// [`crate::storage::Queue::accept`]).
pub(super) fn accept(b: &mut Batch<'_, '_>, op: &AcceptOp) -> Result<Accepted, StorageError> {
    let sender = b.index.id(&op.sender);
    let mut fresh = Vec::with_capacity(op.copies.len());
    let mut skipped = Vec::new();
    for copy in &op.copies {
        let recipient = b.index.id(&copy.recipient);
        let key = (copy.id.unwrap_or(op.id), sender, recipient);
        // A copy acknowledged a while ago is indistinguishable from a new one; the client's
        // store deduplicates by id, so a late re-send is still shown once.
        if b.index.is_stored(&key) {
            continue;
        }
        // A relay mailbox takes mail from anyone: the relay it leads to applies its agents'
        // consent.
        let checked = copy.recipient != op.sender && !is_relay_mailbox(&copy.recipient);
        match &copy.group {
            Some(group) if checked => {
                let group_id = b.index.id(group);
                let joined = rule(b, (group_id, group), (recipient, &copy.recipient))?.joined();
                if !joined || rule(b, (sender, &op.sender), (recipient, &copy.recipient))?.blocked()
                {
                    skipped.push(copy.recipient.clone());
                    continue;
                }
            }
            None if checked
                && !rule(b, (sender, &op.sender), (recipient, &copy.recipient))?
                    .allows(op.default) =>
            {
                return Ok(Accepted::NotAllowed(copy.recipient.clone()));
            }
            _ => {}
        }
        if !b.index.fits(recipient, op.quota, copy.envelope.len()) {
            return Ok(Accepted::QuotaFull(copy.recipient.clone()));
        }
        fresh.push((copy, key));
    }
    let fanned = op.copies.iter().any(|c| c.group.is_some());
    if fresh.is_empty() && !fanned {
        return Ok(Accepted::Duplicate);
    }
    let now = now_ms();
    let mut recipients = Vec::with_capacity(fresh.len());
    for (copy, key) in fresh {
        let size = u32::try_from(copy.envelope.len())
            .map_err(|_| StorageError::Database("an envelope over 4 GiB".into()))?;
        let seq = b.index.last_seq() + 1;
        let at = b.spool.stored(&StoredCopy {
            seq,
            accepted_at_ms: now,
            expires_at_ms: op.expires_at_ms,
            id: key.0,
            recipient: &copy.recipient,
            sender: &op.sender,
            envelope: &copy.envelope,
        })?;
        b.index.add(Row {
            seq,
            size,
            expires_at_ms: op.expires_at_ms,
            key,
            at,
        });
        recipients.push(copy.recipient.clone());
        b.log.push(Committed {
            recipient: copy.recipient.clone(),
            seq,
            envelope: copy.envelope.clone(),
            accepted_at_ms: now,
            prev: None,
        });
    }
    Ok(if fanned {
        Accepted::Fanned {
            stored: recipients,
            skipped,
        }
    } else {
        Accepted::Stored(recipients)
    })
}

/// The consent rule for mail from `sender` to `recipient`, remembered from an earlier send or
/// read now.
fn rule(
    b: &mut Batch<'_, '_>,
    (sender, sender_name): (NameId, &AgentName),
    (recipient, recipient_name): (NameId, &AgentName),
) -> Result<Rule, StorageError> {
    if let Some(rule) = b.index.rule((sender, recipient)) {
        return Ok(rule);
    }
    let rule = Rule::read(b.tx, sender_name, recipient_name)?;
    b.index.remember_rule((sender, recipient), rule);
    Ok(rule)
}

/// Records a cumulative ack; returns how many copies it acknowledged.
pub(super) fn ack(
    b: &mut Batch<'_, '_>,
    agent: &AgentName,
    upto: Seq,
    epoch: Epoch,
) -> Result<AckOutcome, StorageError> {
    // Claims take the index lock, which the writer holds through the commit: an ack is
    // either committed before a later claim or checked against it.
    if b.index.fenced(agent, epoch) {
        return Ok(AckOutcome::Fenced);
    }
    let Some(recipient) = b.index.known(agent) else {
        return Ok(AckOutcome::Applied(0));
    };
    let (count, last) = b.index.ack(recipient, upto, Instant::now());
    if count > 0 {
        // The highest copy acknowledged, not `upto`: a number past every copy would hide
        // the next ones after a restart.
        let at = b.spool.acked(agent, last)?;
        b.index.note_ack(recipient, last, at.seg);
    }
    Ok(AckOutcome::Applied(count))
}
