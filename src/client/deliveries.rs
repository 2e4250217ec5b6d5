//! Deliveries: the sender asks the relay where its open copies stand (`copies`) and records
//! what it says. The relay keeps nothing for this (see `relay/copies.rs`): a copy that is
//! neither queued nor bounced was taken by its recipient, so "delivered" carries the time of
//! the check that found it gone (the recipient took it no later). Only the relay that took a
//! message is asked about it: another relay has never held it, and its "gone" would be false.

use jiff::Timestamp;

use super::{ClientError, Connection};
use crate::protocol::{ClientFrame, CopyFate, CopyState, ErrorCode, MAX_COPY_CHECKS, ServerFrame};
use crate::store::{Delivery, OpenCopy, StoreHandle};

/// Requests one check makes at most; the next check goes on from where this one stopped.
pub const MAX_REQUESTS_PER_CHECK: usize = 10;

/// What one check found.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Checked {
    /// Copies recorded as delivered now.
    pub delivered: Vec<Delivery>,
    /// A copy bounced since its message was sent: the bounces are worth collecting.
    pub bounced: bool,
    /// Copies are still open at this relay (waiting, bounced, or not reached by this check).
    pub open: bool,
    /// The relay does not answer `copies` (it predates it): asking again will not help.
    pub unsupported: bool,
}

/// Asks the relay about this agent's open copies at it, at most [`MAX_REQUESTS_PER_CHECK`]
/// requests of [`MAX_COPY_CHECKS`], starting after `cursor` (where the last check stopped;
/// kept by the caller) and going round once at most.
pub async fn check(
    conn: &mut Connection,
    store: &StoreHandle,
    cursor: &mut Option<OpenCopy>,
) -> Result<Checked, ClientError> {
    let relay = conn.relay_id().to_owned();
    let mut checked = Checked::default();
    // Where this round began: after going round to the start, it ends there.
    let began = cursor.as_ref().map(position);
    let mut round_done = began.is_none();
    for _ in 0..MAX_REQUESTS_PER_CHECK {
        let (after, relay_for) = (cursor.clone(), relay.clone());
        let mut open = store
            .call(move |s| s.open_copies(&relay_for, after.as_ref(), MAX_COPY_CHECKS))
            .await?;
        if round_done && let Some(began) = &began {
            open.retain(|o| position(o) <= *began);
        }
        if open.is_empty() {
            *cursor = None;
            if round_done {
                break;
            }
            round_done = true;
            continue;
        }
        let keys: Vec<_> = open.iter().map(|o| o.key.clone()).collect();
        let answer = match conn
            .call(|reference| ClientFrame::Copies {
                reference,
                copies: keys.clone(),
            })
            .await
        {
            Err(ClientError::Refused {
                code: ErrorCode::BadFrame | ErrorCode::UnexpectedFrame,
                ..
            }) => {
                tracing::debug!("the relay does not say where copies stand");
                checked.unsupported = true;
                return Ok(checked);
            }
            other => other?,
        };
        let states = match answer {
            ServerFrame::CopyStates { copies, .. } if answers(&keys, &copies) => copies,
            other => {
                return Err(ClientError::Protocol(format!(
                    "expected a copy_states for the {} copies asked about, in order, got {other:?}",
                    keys.len()
                )));
            }
        };
        *cursor = open.last().cloned();
        let now = Timestamp::now();
        checked.bounced |= states.iter().any(|s| s.state == CopyFate::Bounced);
        checked.delivered.extend(
            store
                .call(move |s| s.record_copy_states(&states, now))
                .await?,
        );
        // A short page is the end of the open copies (or of the round).
        if open.len() < MAX_COPY_CHECKS {
            *cursor = None;
            if round_done {
                break;
            }
            round_done = true;
        }
    }
    checked.open = !store
        .call(move |s| s.open_copies(&relay, None, 1))
        .await?
        .is_empty();
    Ok(checked)
}

/// Where a copy comes in the order copies are asked about.
fn position(o: &OpenCopy) -> (i64, String, String) {
    (o.taken_at, o.key.id.to_string(), o.key.to.to_string())
}

/// Whether `states` answers exactly `keys`, in order.
fn answers(keys: &[crate::protocol::CopyKey], states: &[CopyState]) -> bool {
    keys.len() == states.len()
        && keys
            .iter()
            .zip(states)
            .all(|(k, s)| k.id == s.id && k.to == s.to)
}
