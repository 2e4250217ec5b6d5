//! `send`, in two steps. [`check`] validates the envelope (sender, recipients, size, rate) and
//! queues its durable write in arrival order; [`answer`] turns the committed outcome into
//! `sent` or a refusal. In between, the session keeps reading, so one connection can have many
//! sends in one group commit. Consent is checked inside the write, atomically with it.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use serde::Deserialize;
use serde_json::value::RawValue;
use tracing::field::{Empty, debug, display};

use super::fanout;
use super::state::RelayState;
use super::storage::{Accepted, Groups, Queue, QueuedCopy, Quota, Registry, StorageError};
use super::wire::error_frame;
use crate::protocol::{
    Address, AgentName, ENVELOPE_VERSION, EnvelopeHead, ErrorCode, KeyWrapHead, Limits,
    MAX_GROUP_MEMBERS, MAX_REF_CHARS, MAX_STORED_NAME_BYTES, MessageId, ServerFrame,
};

/// A `send` frame with its envelope left as text, so that [`check`] reads only its head.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SendFrame<'a> {
    #[serde(rename = "type")]
    _type: SendTag,
    /// Echoed in the answer.
    #[serde(rename = "ref")]
    pub reference: String,
    /// The envelope's JSON text.
    #[serde(borrow)]
    pub envelope: &'a RawValue,
    /// The group on this relay the envelope is for.
    #[serde(default)]
    pub group: Option<AgentName>,
}

#[derive(Deserialize)]
#[serde(rename_all = "snake_case")]
enum SendTag {
    Send,
}

impl<'a> SendFrame<'a> {
    /// `text` as a send frame; `None` for every other frame, and for a malformed send frame,
    /// which the general frame parser then explains.
    pub fn read(text: &'a str) -> Option<Self> {
        serde_json::from_str(text).ok()
    }
}

/// A checked send whose write is queued: resolves to its reference, id and outcome.
pub type QueuedSend =
    Pin<Box<dyn Future<Output = (String, MessageId, Result<Accepted, StorageError>)> + Send>>;

/// Validates a send of `envelope` (its JSON text; to `group`'s roster when named) and queues
/// its write; a refusal comes back as the frame to answer with.
#[tracing::instrument(level = "debug", name = "request", skip_all, fields(kind = "send", %agent, r#ref = %reference, id = Empty, outcome = Empty))]
pub async fn check<S: Registry + Queue + Groups>(
    state: &RelayState<S>,
    agent: &AgentName,
    reference: String,
    (envelope, group): (&str, Option<AgentName>),
) -> Result<QueuedSend, Box<ServerFrame>> {
    if reference.chars().count() > MAX_REF_CHARS {
        return Err(Box::new(error_frame(
            None,
            ErrorCode::BadFrame,
            format!("ref is over {MAX_REF_CHARS} characters"),
            None,
        )));
    }
    let refuse = |code, message: String, retry| {
        Err(Box::new(error_frame(
            Some(reference.clone()),
            code,
            message,
            retry,
        )))
    };
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
    let envelope: EnvelopeHead<'_> = match serde_json::from_str(envelope) {
        Ok(head) => head,
        Err(e) => {
            return refuse(
                ErrorCode::InvalidEnvelope,
                format!("not a valid sealed envelope: {e}"),
                None,
            );
        }
    };
    let span = tracing::Span::current();
    span.record("id", display(envelope.id));
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
    // A group send is bounded by the group's bound, not the recipients of a plain send.
    let most = match group {
        Some(_) => MAX_GROUP_MEMBERS,
        None => limits.recipients,
    };
    if envelope.keys.is_empty() || envelope.keys.len() > most {
        let n = envelope.keys.len();
        return refuse(
            ErrorCode::InvalidEnvelope,
            format!("an envelope names 1 to {most} recipients, not {n}"),
            None,
        );
    }
    let targets: Vec<&KeyWrapHead<'_>> = match &group {
        None => envelope.keys.iter().collect(),
        Some(name) => match fanout::targets(state, agent, name, &envelope).await {
            Ok(targets) => targets,
            Err((code, message)) => return refuse(code, message, None),
        },
    };
    let mut copies = Vec::with_capacity(targets.len());
    let mut unknown = Vec::new();
    // Members a group send leaves out before the write: retired since they were added, or on
    // a relay this one does not deliver to (docs/decisions.md, "Groups").
    let mut left_out: Vec<AgentName> = Vec::new();
    // Recipients on other relays: each gets a copy of its own in its relay's mailbox here.
    let mut remote: Vec<&Address> = Vec::new();
    for key in targets {
        let Some(name) = state.local_name(&key.to) else {
            remote.push(&key.to);
            continue;
        };
        match state.is_registered(name).await {
            Ok(true) => {}
            Ok(false) if group.is_some() => {
                left_out.push(name.clone());
                continue;
            }
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
        if copies.iter().any(|c: &QueuedCopy| &c.recipient == name) {
            return refuse(
                ErrorCode::InvalidEnvelope,
                format!("{} is named twice", key.to),
                None,
            );
        }
        let copy = envelope
            .copy_for(&key.to)
            .expect("the key is in this envelope");
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
        copies.push(QueuedCopy {
            id: None,
            recipient: name.clone(),
            envelope: copy.into(),
            group: group.clone(),
        });
    }
    if !unknown.is_empty() {
        return refuse(
            ErrorCode::UnknownRecipient,
            format!("no agent named {} on this relay", unknown.join(", ")),
            None,
        );
    }
    if !remote.is_empty() && envelope.from.host() != Some(&state.name) {
        // The other relay takes mail from this one only for `name@<this relay>`.
        return refuse(
            ErrorCode::NotSender,
            format!(
                "mail to another relay's agents must be from {agent}@{}, not {}; seal it with the full address",
                state.name, envelope.from
            ),
            None,
        );
    }
    // A member's copy for another relay says which group it is of, as `team@<this relay>`.
    let group_address = group
        .as_ref()
        .map(|g| Address::remote(g.clone(), state.name.clone()));
    for to in remote {
        let relay = to.host().expect("only a remote address has no local name");
        let unreachable = !state.config.links_with(relay)
            || (super::link::names_private(relay) && !state.config.may_reach_private(relay));
        // A member this relay cannot deliver to is left out, not a refusal of the group send.
        if group.is_some() && unreachable {
            left_out.extend(AgentName::remote_agent(to));
            continue;
        }
        if !state.config.links_with(relay) {
            return refuse(
                ErrorCode::NotAllowed,
                format!("this relay does not deliver to {relay} (its operator denied it)"),
                None,
            );
        }
        if super::link::names_private(relay) && !state.config.may_reach_private(relay) {
            return refuse(
                ErrorCode::NotAllowed,
                super::link::private_refusal(relay),
                None,
            );
        }
        let Some(mailbox) = AgentName::relay_mailbox(relay) else {
            return refuse(
                ErrorCode::InvalidEnvelope,
                format!(
                    "the relay name {relay} is over {MAX_STORED_NAME_BYTES} bytes; no relay can be reached by it"
                ),
                None,
            );
        };
        let id = envelope.id.relay_copy(to);
        if copies.iter().any(|c: &QueuedCopy| c.id == Some(id)) {
            return refuse(
                ErrorCode::InvalidEnvelope,
                format!("{to} is named twice"),
                None,
            );
        }
        let copy = envelope
            .copy_for(to)
            .expect("every address came from this envelope's keys");
        // Every relay takes copies up to the protocol's default limit; a larger one could
        // never cross a link, so it is refused now rather than bounced later.
        let limit = limits.envelope_bytes.min(Limits::default().envelope_bytes);
        if copy.len() > limit {
            return refuse(
                ErrorCode::TooLarge,
                format!(
                    "the envelope is {} bytes, over the limit of {}",
                    copy.len(),
                    limit
                ),
                None,
            );
        }
        let envelope = match &group_address {
            Some(group) => crate::protocol::group_copy(group, &copy),
            None => copy,
        };
        copies.push(QueuedCopy {
            recipient: mailbox,
            id: Some(id),
            envelope: envelope.into(),
            // A relay mailbox applies no consent (the member's relay does); the group marks
            // the send as fanned out.
            group: group.clone(),
        });
    }
    let quota = Quota {
        count: state.config.quota_messages,
        bytes: state.config.quota_bytes,
    };
    let expires = jiff::Timestamp::now().as_millisecond() + (state.config.ttl_secs as i64) * 1000;
    let id = envelope.id;
    // A group send whose every member was left out stores nothing, and says so.
    let nobody = group.is_some() && copies.is_empty();
    let write = state.storage.accept(
        agent.clone(),
        id,
        copies,
        quota,
        expires,
        state.config.effective_default_policy(),
    );
    // The request's span lasts until the write is durable, and says how it went.
    Ok(Box::pin(async move {
        let mut outcome = write.await;
        span.record("outcome", debug(&outcome));
        match &mut outcome {
            Ok(Accepted::Fanned { skipped, .. }) => skipped.extend(left_out),
            Ok(Accepted::Duplicate) if nobody => {
                outcome = Ok(Accepted::Fanned {
                    stored: Vec::new(),
                    skipped: left_out,
                });
            }
            _ => {}
        }
        (reference, id, outcome)
    }))
}

/// The answer to a send once its write is done; wakes the recipients of stored mail.
pub fn answer<S>(
    state: &RelayState<S>,
    agent: &AgentName,
    reference: String,
    id: MessageId,
    outcome: Result<Accepted, StorageError>,
) -> ServerFrame {
    let refuse =
        |code, message: String, retry| error_frame(Some(reference.clone()), code, message, retry);
    match outcome {
        // Online recipients already have it: the commit listener pushed it to their sessions.
        Ok(Accepted::Stored(recipients)) => {
            state.metrics.accepted.inc_by(recipients.len() as u64);
            state.metrics.queued.inc_by(recipients.len() as i64);
            ServerFrame::Sent {
                reference,
                id,
                skipped: Vec::new(),
            }
        }
        Ok(Accepted::Fanned { stored, skipped }) => {
            state.metrics.accepted.inc_by(stored.len() as u64);
            state.metrics.queued.inc_by(stored.len() as i64);
            ServerFrame::Sent {
                reference,
                id,
                skipped: skipped.iter().map(AgentName::stored_address).collect(),
            }
        }
        Ok(Accepted::Duplicate) => ServerFrame::Sent {
            reference,
            id,
            skipped: Vec::new(),
        },
        Ok(Accepted::QuotaFull(r)) => refuse(
            ErrorCode::QuotaFull,
            format!(
                "{r}'s mailbox is full ({} messages or {} bytes waiting); nothing was stored",
                state.config.quota_messages, state.config.quota_bytes
            ),
            Some(Duration::from_secs(60)),
        ),
        Ok(Accepted::NotAllowed(r)) => refuse(
            ErrorCode::NotAllowed,
            format!(
                "{r} does not accept mail from {agent}; ask first with `mailslot --agent {agent} connect {r}`"
            ),
            None,
        ),
        Err(e) => refuse(
            ErrorCode::Internal,
            format!("not stored: {e}"),
            Some(Duration::from_secs(1)),
        ),
    }
}
