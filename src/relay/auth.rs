//! Authentication: the client answers the challenge by signing the relay id and a fresh nonce
//! with its Ed25519 key, optionally registering the name with its keys in the same hello.

use axum::extract::ws::{Message, WebSocket};
use tokio::time::timeout;

use super::state::RelayState;
use super::storage::{Registration, Storage};
use super::wire::{Ending, close};
use crate::crypto::PublicIdentity;
use crate::crypto::sign::{self, Domain};
use crate::protocol::{AgentName, ClientFrame, ErrorCode, ServerFrame, hello_payload};

async fn send(socket: &mut WebSocket, frame: &ServerFrame) -> bool {
    let text = serde_json::to_string(frame).expect("frames always serialize");
    socket.send(Message::Text(text.into())).await.is_ok()
}

/// Reads the hello within the deadline, verifies it, and sends the welcome.
pub async fn authenticate<S: Storage>(
    state: &RelayState<S>,
    socket: &mut WebSocket,
    relay: &str,
    nonce: &[u8],
) -> Result<AgentName, Ending> {
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
    }) = serde_json::from_str::<ClientFrame>(&text)
    else {
        return Err(auth(
            ErrorCode::UnexpectedFrame,
            "the first frame must be a valid hello".into(),
        ));
    };
    let internal = |e: super::storage::StorageError| Ending {
        code: ErrorCode::Internal,
        message: e.to_string(),
        close: close::GOING_AWAY,
    };
    if let Some(keys) = register {
        let candidate = PublicIdentity::try_from(keys.clone()).map_err(|e| {
            auth(
                ErrorCode::AuthFailed,
                format!("the keys to register are invalid: {e}"),
            )
        })?;
        // Signing the nonce with the key being registered proves the registrant holds it.
        if sign::verify_detached(
            &candidate,
            Domain::Hello,
            &hello_payload(relay, nonce),
            &signature,
        )
        .is_err()
        {
            return Err(auth(
                ErrorCode::AuthFailed,
                "the hello signature does not match the keys to register".into(),
            ));
        }
        let known = state.storage.keys(agent.clone()).await.map_err(internal)?;
        let outcome = if known.as_ref() == Some(&keys) {
            Registration::Unchanged
        } else {
            state
                .storage
                .register(agent.clone(), keys)
                .await
                .map_err(internal)?
        };
        match outcome {
            Registration::NameTaken => {
                return Err(auth(
                    ErrorCode::NameTaken,
                    format!(
                        "{agent} is registered on this relay with other keys; choose another name"
                    ),
                ));
            }
            Registration::Created => tracing::info!(%agent, "registered"),
            Registration::Unchanged => {}
        }
        state.remember_registered(&agent);
    }
    let Some(keys) = state.storage.keys(agent.clone()).await.map_err(internal)? else {
        return Err(auth(
            ErrorCode::UnknownAgent,
            format!(
                "no agent named {agent} on this relay; register it by sending your keys in the hello"
            ),
        ));
    };
    let keys = PublicIdentity::try_from(keys)
        .map_err(|e| internal(super::storage::StorageError::Database(e.to_string())))?;
    if sign::verify_detached(
        &keys,
        Domain::Hello,
        &hello_payload(relay, nonce),
        &signature,
    )
    .is_err()
    {
        return Err(auth(
            ErrorCode::AuthFailed,
            format!("the hello signature does not match {agent}'s registered key"),
        ));
    }
    let waiting = state
        .storage
        .waiting(agent.clone())
        .await
        .map_err(internal)?;
    if !send(
        socket,
        &ServerFrame::Welcome {
            agent: agent.clone(),
            waiting,
        },
    )
    .await
    {
        return Err(auth(ErrorCode::Internal, "the connection dropped".into()));
    }
    Ok(agent)
}
