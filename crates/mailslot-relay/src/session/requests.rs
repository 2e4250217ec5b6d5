//! What an authenticated client asks: one `match` over its frames, each arm calling the
//! handler of that request, which is bounded by the storage roles it uses. Acks go to the
//! delivery; sends are answered when their write completes.

use futures_util::stream::FuturesUnordered;

use super::super::accept::{self, QueuedSend, SendFrame};
use super::super::groups::{self, RosterAct};
use super::super::inbound::Share;
use super::super::state::RelayState;
use super::super::storage::{Groups, Queue, Registry, Storage};
use super::super::wire::error_frame;
use super::super::{
    bounce, consent, copies, directory, lookup, online, reservations, retire, rotate,
};
use super::delivery::Delivery;
use crate::protocol::{AgentName, ClientFrame, ErrorCode, ReservationRequest, ServerFrame};

/// Sends whose writes are pending, answered as each completes.
pub(super) type Sends = FuturesUnordered<QueuedSend>;

/// Answers one frame from `agent` on the connection challenged with `nonce` (`None`: a binary
/// frame); `None` when nothing is to be answered now.
pub(super) async fn answer<S: Storage>(
    state: &RelayState<S>,
    (agent, nonce): (&AgentName, &[u8]),
    delivery: &mut Delivery,
    (sends, share): (&mut Sends, Option<Share>),
    text: Option<&str>,
) -> Option<ServerFrame> {
    let Some(text) = text else {
        let message = "send JSON text frames, not binary";
        return Some(error_frame(None, ErrorCode::BadFrame, message, None));
    };
    // Sends are most frames: read them without parsing the envelope's bulk.
    if let Some(send) = SendFrame::read(text) {
        let envelope = send.envelope.get();
        let group = send.group;
        return queue_send(
            state,
            agent,
            sends,
            (send.reference, share),
            (envelope, group),
        )
        .await;
    }
    let frame = match serde_json::from_str::<ClientFrame>(text) {
        Ok(frame) => frame,
        Err(e) => {
            let message = format!("not a valid frame: {e}");
            return Some(error_frame(None, ErrorCode::BadFrame, message, None));
        }
    };
    match frame {
        ClientFrame::Ping {} => Some(ServerFrame::Pong {}),
        ClientFrame::Ack { seq } => delivery.ack(state, agent, seq).await,
        // `SendFrame::read` takes every valid send frame first; this is its general twin.
        ClientFrame::Send {
            reference,
            envelope,
            group,
        } => {
            let text = String::from_utf8(envelope.to_bytes()).expect("JSON is UTF-8");
            queue_send(state, agent, sends, (reference, share), (&text, group)).await
        }
        // The other requests are rare, and their futures large (a consent change's is several
        // KiB): boxed, each is paid for when made instead of by every connection's task.
        frame => Some(Box::pin(request(state, (agent, nonce), frame)).await),
    }
}

/// Answers a request other than a send, an ack or a ping.
async fn request<S: Storage>(
    state: &RelayState<S>,
    (agent, nonce): (&AgentName, &[u8]),
    frame: ClientFrame,
) -> ServerFrame {
    // The frames only the agent's owner may send are checked against its owner key first.
    let owner = match consent::signed_by_owner(state, (agent, nonce), &frame).await {
        Ok(owner) => owner,
        Err(refusal) => return refusal,
    };
    match frame {
        ClientFrame::Ping {} | ClientFrame::Ack { .. } | ClientFrame::Send { .. } => {
            unreachable!("answered by `answer`")
        }
        ClientFrame::Hello { .. } => error_frame(
            None,
            ErrorCode::UnexpectedFrame,
            "already authenticated",
            None,
        ),
        ClientFrame::Lookup {
            reference,
            agent: wanted,
        } => lookup::keys(state, agent, reference, wanted).await,
        ClientFrame::RotateKeys {
            reference,
            rotation,
        } => rotate::rotate_keys(state, agent, reference, rotation).await,
        ClientFrame::Connect {
            reference,
            to,
            note,
        } => consent::connect(state, agent, reference, to, note).await,
        ClientFrame::Approve {
            reference,
            from,
            code,
            dry_run: true,
            ..
        } => consent::check_code(state, agent, reference, from, code).await,
        ClientFrame::Approve {
            reference,
            from,
            code,
            ..
        } => consent::approve(state, agent, reference, from, code).await,
        ClientFrame::Deny {
            reference,
            agent: requester,
            ..
        } => consent::deny(state, agent, reference, requester).await,
        ClientFrame::Block {
            reference,
            agent: peer,
            ..
        } => consent::block(state, agent, reference, peer).await,
        ClientFrame::Unblock {
            reference,
            agent: peer,
            ..
        } => consent::unblock(state, agent, reference, peer).await,
        ClientFrame::Remove {
            reference,
            agent: peer,
            ..
        } => consent::remove(state, agent, reference, peer).await,
        ClientFrame::SetPolicy {
            reference, policy, ..
        } => consent::set_policy(state, agent, reference, policy).await,
        ClientFrame::SetOwner {
            reference,
            owner: new,
            ..
        } => consent::set_owner(state, agent, reference, (owner, new)).await,
        ClientFrame::Consent { reference } => consent::state_of(state, agent, reference).await,
        ClientFrame::SetListing {
            reference,
            description,
        } => directory::set_listing(state, agent, reference, description).await,
        ClientFrame::Directory { reference } => directory::list(state, agent, reference).await,
        ClientFrame::Presence { reference, agents } => {
            online::presence(state, agent, reference, agents).await
        }
        ClientFrame::Retire {
            reference,
            signature,
        } => retire::retire(state, (agent, nonce), reference, signature).await,
        ClientFrame::Bounces { reference } => bounce::list(state, agent, reference).await,
        ClientFrame::AckBounces { reference, bounces } => {
            bounce::forget(state, agent, reference, bounces).await
        }
        ClientFrame::Copies { reference, copies } => {
            copies::states(state, agent, reference, copies).await
        }
        ClientFrame::Reserve {
            reference,
            project,
            patterns,
            mode,
            reason,
            ttl,
        } => {
            let wanted = ReservationRequest {
                project,
                patterns,
                mode,
                reason,
                ttl,
            };
            reservations::reserve(state, agent, reference, wanted).await
        }
        ClientFrame::Release {
            reference,
            project,
            ids,
            patterns,
            all,
        } => reservations::release(state, agent, reference, project, (ids, patterns, all)).await,
        ClientFrame::Renew {
            reference,
            project,
            ids,
            ttl,
        } => reservations::renew(state, agent, reference, project, (ids, ttl)).await,
        ClientFrame::Reservations { reference, project } => {
            reservations::list(state, agent, reference, project).await
        }
        ClientFrame::CreateGroup {
            reference,
            group,
            policy,
        } => groups::create(state, agent, reference, group, policy).await,
        ClientFrame::GroupAdd {
            reference,
            group,
            member,
            owner_signature,
        } => {
            let act = RosterAct {
                group,
                member,
                add: true,
                signature: owner_signature,
            };
            groups::change_roster(state, (agent, nonce), reference, act).await
        }
        ClientFrame::GroupRemove {
            reference,
            group,
            member,
            owner_signature,
        } => {
            let act = RosterAct {
                group,
                member,
                add: false,
                signature: owner_signature,
            };
            groups::change_roster(state, (agent, nonce), reference, act).await
        }
        ClientFrame::Join {
            reference, group, ..
        } => groups::join(state, agent, reference, group).await,
        ClientFrame::Leave { reference, group } => {
            groups::leave(state, agent, reference, group).await
        }
        ClientFrame::Groups { reference } => groups::list(state, agent, reference).await,
    }
}

/// Checks a send and queues its write; `Some` is the refusal.
async fn queue_send<S: Registry + Queue + Groups>(
    state: &RelayState<S>,
    agent: &AgentName,
    sends: &mut Sends,
    (reference, share): (String, Option<Share>),
    (envelope, group): (&str, Option<AgentName>),
) -> Option<ServerFrame> {
    match accept::check(state, agent, reference, (envelope, group)).await {
        // The frame's share of the receive budget is held until its write is done.
        Ok(queued) => {
            sends.push(Box::pin(async move {
                let written = queued.await;
                drop(share);
                written
            }));
            None
        }
        Err(refusal) => Some(*refusal),
    }
}
