//! The handshake: the relay challenges, the client answers by signing the relay id and a
//! fresh nonce with its Ed25519 key (optionally registering the name with its keys in the same
//! hello), and the relay welcomes it once the session may deliver.

use std::net::IpAddr;

use axum::extract::ws::{Message, WebSocket};
use tokio::time::timeout;

use super::super::state::RelayState;
use super::super::storage::{Queue, Registration, Registry, StorageError};
use super::super::wire::{Ending, close, refuse};
use crate::crypto::sign::{self, Domain};
use crate::crypto::{self, PublicIdentity};
use crate::protocol::{
    AgentName, ClientFrame, ErrorCode, PROTOCOL_VERSION, ServerFrame, hello_payload,
};

/// An authenticated client.
pub(super) struct Hello {
    /// Who it is.
    pub agent: AgentName,
    /// A control connection: requests only.
    pub control: bool,
    /// The nonce it signed, which owner-signed requests on this connection sign too.
    pub nonce: Vec<u8>,
}

async fn send(socket: &mut WebSocket, frame: &ServerFrame) -> bool {
    let text = serde_json::to_string(frame).expect("frames always serialize");
    socket.send(Message::Text(text.into())).await.is_ok()
}

/// Challenges the client and checks its hello; a refusal is sent here (`None`).
pub(super) async fn greet<S: Registry>(
    state: &RelayState<S>,
    socket: &mut WebSocket,
    ip: IpAddr,
) -> Option<Hello> {
    let mut nonce = vec![0u8; 32];
    if getrandom::fill(&mut nonce).is_err() {
        let ending = Ending {
            code: ErrorCode::Internal,
            message: "no randomness".into(),
            close: close::GOING_AWAY,
        };
        refuse(socket, ending).await;
        return None;
    }
    let challenge = ServerFrame::Challenge {
        v: PROTOCOL_VERSION,
        relay: state.relay_id.clone(),
        nonce: nonce.clone(),
    };
    if !send(socket, &challenge).await {
        return None;
    }
    match authenticate(state, socket, &nonce, ip).await {
        Ok((agent, control)) => Some(Hello {
            agent,
            control,
            nonce,
        }),
        Err(ending) => {
            state.metrics.reject(ending.code);
            tracing::info!(%ip, code = %ending.code, "authentication refused");
            refuse(socket, ending).await;
            None
        }
    }
}

/// Reads the hello within the deadline and verifies it (registering a new name).
async fn authenticate<S: Registry>(
    state: &RelayState<S>,
    socket: &mut WebSocket,
    nonce: &[u8],
    ip: IpAddr,
) -> Result<(AgentName, bool), Ending> {
    let auth = |code, message: String| Ending {
        code,
        message,
        close: close::AUTH,
    };
    let deadline = state.config.auth_timeout();
    let text = match timeout(deadline, socket.recv()).await {
        Err(_) => {
            return Err(auth(
                ErrorCode::AuthTimeout,
                format!("no hello within {} s of the challenge", deadline.as_secs()),
            ));
        }
        Ok(Some(Ok(Message::Text(t)))) => t,
        Ok(_) => {
            return Err(auth(
                ErrorCode::BadFrame,
                "expected a hello text frame".into(),
            ));
        }
    };
    let Ok(ClientFrame::Hello {
        agent,
        signature,
        register,
        control,
        owner,
        invite,
    }) = serde_json::from_str::<ClientFrame>(&text)
    else {
        return Err(auth(
            ErrorCode::UnexpectedFrame,
            "the first frame must be a valid hello".into(),
        ));
    };
    let internal = |e: StorageError| Ending {
        code: ErrorCode::Internal,
        message: e.to_string(),
        close: close::GOING_AWAY,
    };
    // The keys to check the signature against: the registered ones, or — for a new name —
    // the ones offered, which the signature then proves the client holds.
    let taken = || {
        auth(
            ErrorCode::NameTaken,
            format!("{agent} is registered on this relay with other keys; choose another name"),
        )
    };
    let registered = state.storage.keys(agent.clone()).await.map_err(internal)?;
    let (keys, new) = match (registered, register) {
        (Some(known), Some(offered)) if known != offered => return Err(taken()),
        (Some(known), _) => (known, false),
        (None, Some(offered)) => (offered, true),
        (None, None) => {
            let unknown = format!(
                "no agent named {agent} on this relay; register it by sending your keys in the hello"
            );
            return Err(auth(ErrorCode::UnknownAgent, unknown));
        }
    };
    let identity = PublicIdentity::try_from(keys.clone()).map_err(|e| {
        auth(
            ErrorCode::AuthFailed,
            format!("the keys are not valid public keys: {e}"),
        )
    })?;
    if sign::verify_detached(
        &identity,
        Domain::Hello,
        &hello_payload(&state.relay_id, nonce),
        &signature,
    )
    .is_err()
    {
        return Err(auth(
            ErrorCode::AuthFailed,
            format!("the hello signature does not match {agent}'s key"),
        ));
    }
    if new {
        let invite = super::super::registration::admit(state, ip, &agent, invite.as_ref())
            .map_err(|r| auth(r.code, r.message))?;
        match state
            .storage
            .register(agent.clone(), keys, invite)
            .await
            .map_err(internal)?
        {
            // Someone else registered the name between the check and now.
            Registration::NameTaken => return Err(taken()),
            Registration::Retired(until) => return Err(retired(&agent, until)),
            Registration::BadInvite => {
                state.metrics.refuse_registration("invite");
                let message = super::super::registration::BAD_INVITE.into();
                return Err(auth(ErrorCode::BadInvite, message));
            }
            Registration::Created => tracing::info!(%agent, "registered"),
            Registration::Unchanged => {}
        }
    }
    state.remember_registered(&agent);
    if let Some(owner) = owner {
        if !crypto::owner::is_valid(&owner) {
            return Err(auth(
                ErrorCode::AuthFailed,
                "the owner key is not a valid Ed25519 public key".into(),
            ));
        }
        // First come: a key registered before stays; only it can sign its replacement.
        if state
            .storage
            .set_owner(agent.clone(), owner, None)
            .await
            .map_err(internal)?
        {
            tracing::info!(%agent, "owner key registered");
        }
    }
    Ok((agent, control))
}

fn retired(agent: &AgentName, until_ms: i64) -> Ending {
    Ending {
        code: ErrorCode::NameRetired,
        message: super::super::retire::held_until(agent, until_ms),
        close: close::AUTH,
    }
}

/// Sends the welcome with the number of messages waiting and the agent's owner key. Called once the session has its
/// turn, so the count already reflects every ack of the agent's previous session.
pub(super) async fn welcome<S: Registry + Queue>(
    state: &RelayState<S>,
    socket: &mut WebSocket,
    agent: &AgentName,
) -> Result<(), Ending> {
    let internal = |e: StorageError| Ending {
        code: ErrorCode::Internal,
        message: e.to_string(),
        close: close::GOING_AWAY,
    };
    let waiting = state
        .storage
        .waiting(agent.clone())
        .await
        .map_err(internal)?;
    let owner = state.storage.owner(agent.clone()).await.map_err(internal)?;
    if !send(
        socket,
        &ServerFrame::Welcome {
            agent: agent.clone(),
            waiting,
            owner,
        },
    )
    .await
    {
        return Err(Ending {
            code: ErrorCode::Internal,
            message: "the connection dropped".into(),
            close: close::AUTH,
        });
    }
    Ok(())
}
