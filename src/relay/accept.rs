//! `send`: checks an envelope (sender, recipients, consent, size, rate) and stores one copy
//! per recipient durably before answering `sent`. The relay reads only routing fields.

use std::time::Duration;

use super::state::RelayState;
use super::storage::{Accepted, Copy, Quota, Storage};
use super::wire::error_frame;
use crate::protocol::{
    AgentName, ENVELOPE_VERSION, ErrorCode, MAX_REF_CHARS, SealedEnvelope, ServerFrame,
};

/// Answers one `send`.
pub async fn accept<S: Storage>(
    state: &RelayState<S>,
    agent: &AgentName,
    reference: String,
    envelope: SealedEnvelope,
) -> ServerFrame {
    if reference.chars().count() > MAX_REF_CHARS {
        return error_frame(
            None,
            ErrorCode::BadFrame,
            format!("ref is over {MAX_REF_CHARS} characters"),
            None,
        );
    }
    let refuse =
        |code, message: String, retry| error_frame(Some(reference.clone()), code, message, retry);
    if let Err(wait) = state.send_rate.take(agent) {
        return refuse(
            ErrorCode::RateLimited,
            format!(
                "{agent} is sending faster than {}/s",
                state.config.send_rate
            ),
            Some(wait),
        );
    }
    if envelope.v != ENVELOPE_VERSION {
        return refuse(
            ErrorCode::InvalidEnvelope,
            format!("envelope version {} is not {ENVELOPE_VERSION}", envelope.v),
            None,
        );
    }
    if state.local_name(&envelope.from) != Some(agent) {
        return refuse(
            ErrorCode::NotSender,
            format!(
                "the envelope is from {}, but this connection is {agent}",
                envelope.from
            ),
            None,
        );
    }
    let limits = &state.config.limits;
    if envelope.keys.is_empty() || envelope.keys.len() > limits.recipients {
        return refuse(
            ErrorCode::InvalidEnvelope,
            format!(
                "an envelope names 1 to {} recipients, not {}",
                limits.recipients,
                envelope.keys.len()
            ),
            None,
        );
    }
    let mut copies = Vec::with_capacity(envelope.keys.len());
    let mut unknown = Vec::new();
    for key in &envelope.keys {
        let Some(name) = state.local_name(&key.to) else {
            unknown.push(key.to.to_string());
            continue;
        };
        match state.is_registered(name).await {
            Ok(true) => {}
            Ok(false) => {
                unknown.push(key.to.to_string());
                continue;
            }
            Err(e) => {
                return refuse(
                    ErrorCode::Internal,
                    e.to_string(),
                    Some(Duration::from_secs(1)),
                );
            }
        }
        if name != agent {
            match state
                .storage
                .allows(
                    agent.clone(),
                    name.clone(),
                    state.config.effective_default_policy(),
                )
                .await
            {
                Ok(true) => {}
                Ok(false) => {
                    return refuse(
                        ErrorCode::NotAllowed,
                        format!(
                            "{name} does not accept mail from {agent}; ask first with `mailslot connect {name}`"
                        ),
                        None,
                    );
                }
                Err(e) => {
                    return refuse(
                        ErrorCode::Internal,
                        e.to_string(),
                        Some(Duration::from_secs(1)),
                    );
                }
            }
        }
        if copies.iter().any(|c: &Copy| &c.recipient == name) {
            return refuse(
                ErrorCode::InvalidEnvelope,
                format!("{} is named twice", key.to),
                None,
            );
        }
        let copy = envelope
            .for_recipient(&key.to)
            .expect("the key is in this envelope")
            .to_bytes();
        if copy.len() > limits.envelope_bytes {
            return refuse(
                ErrorCode::TooLarge,
                format!(
                    "the envelope is {} bytes, over the limit of {}",
                    copy.len(),
                    limits.envelope_bytes
                ),
                None,
            );
        }
        copies.push(Copy {
            recipient: name.clone(),
            envelope: copy,
        });
    }
    if !unknown.is_empty() {
        return refuse(
            ErrorCode::UnknownRecipient,
            format!("no agent named {} on this relay", unknown.join(", ")),
            None,
        );
    }
    let quota = Quota {
        count: state.config.quota_messages,
        bytes: state.config.quota_bytes,
    };
    let expires = jiff::Timestamp::now().as_millisecond() + (state.config.ttl_secs as i64) * 1000;
    match state
        .storage
        .accept(agent.clone(), envelope.id, copies, quota, expires)
        .await
    {
        Ok(Accepted::Stored(recipients)) => {
            state.metrics.accepted.inc_by(recipients.len() as u64);
            state.metrics.queued.inc_by(recipients.len() as i64);
            for r in &recipients {
                state.hub.wake(r);
            }
            ServerFrame::Sent {
                reference,
                id: envelope.id,
            }
        }
        Ok(Accepted::Duplicate) => ServerFrame::Sent {
            reference,
            id: envelope.id,
        },
        Ok(Accepted::QuotaFull(r)) => refuse(
            ErrorCode::QuotaFull,
            format!(
                "{r}'s mailbox is full ({} messages or {} bytes waiting); nothing was stored",
                quota.count, quota.bytes
            ),
            Some(Duration::from_secs(60)),
        ),
        Err(e) => refuse(
            ErrorCode::Internal,
            format!("not stored: {e}"),
            Some(Duration::from_secs(1)),
        ),
    }
}
