//! The relay client: connect (over TLS for `wss://`) and authenticate, send the outbox, receive
//! mail into the store, acknowledge only what is committed. Store work goes through
//! [`crate::store::StoreHandle`].

mod ask;
mod bounces;
mod connection;
pub mod consent;
mod deliveries;
mod denials;
pub mod directory;
mod discovery;
pub mod groups;
mod inbound;
mod outbound;
pub mod presence;
pub mod reservations;
mod session;
mod sync;
mod tls;
mod url;
pub mod whois;

pub use ask::Ask;
pub use connection::Connection;
pub use discovery::{
    Resolved, discover, is_own_relay, own_relay_name, peek_remote_keys, relay_key,
    remote_fingerprint, resolve_keys,
};
pub use inbound::{Received, open_parked, receive};
pub use session::{
    ClientEvent, Listener, MakeFrame, RelayNews, SendAnswer, SessionConfig, SessionHandle,
    WaitingSend, spawn as spawn_session,
};
pub use sync::{SyncReport, sync, sync_with_progress};
pub use tls::{RelaySocket, open_socket};
pub use url::RelayUrl;

use crate::protocol::{ErrorCode, Fingerprint, RelayName, ServerFrame};
use crate::store::StoreError;

/// What went wrong talking to a relay.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The relay could not be reached.
    #[error("cannot reach the relay at {url}: {reason}")]
    Unreachable {
        /// The relay URL.
        url: String,
        /// Why.
        reason: String,
    },
    /// Something answered at the relay's URL, but not as a mailslot relay (a web server, a
    /// proxy with no relay behind it).
    #[error(
        "the server at {url} answered {answered}: it is not a mailslot relay (check the relay URL: --relay, MAILSLOT_RELAY or relay in the config; behind a proxy, check that the relay runs and that the proxy passes WebSocket upgrades to it)"
    )]
    NotARelay {
        /// The relay URL.
        url: String,
        /// What it answered, like "HTTP 404 Not Found".
        answered: String,
    },
    /// The relay refused a request.
    #[error("the relay refused: {message} ({code})")]
    Refused {
        /// Its stable code.
        code: ErrorCode,
        /// Its sentence.
        message: String,
        /// When to retry, if it said.
        retry_after_ms: Option<u64>,
    },
    /// The relay broke the protocol.
    #[error("the relay broke the protocol: {0}")]
    Protocol(String),
    /// The connection closed.
    #[error("the relay closed the connection: {0}")]
    Closed(String),
    /// The local store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Another relay presented a key other than the one pinned for it on first contact.
    #[error(
        "RELAY KEY CHANGED: {relay} presents the key {presented}, but {pinned} was pinned for it on first contact; nothing it vouches for was accepted or pinned. Someone may be impersonating {relay}. Ask its operator, by another channel, for the fingerprint of its key; only if it is {presented}, have the owner run `mailslot trust-relay {relay} --fingerprint FINGERPRINT` with the fingerprint the operator gave"
    )]
    RelayKeyChanged {
        /// The relay.
        relay: RelayName,
        /// The fingerprint pinned for it.
        pinned: Fingerprint,
        /// The fingerprint it presented now.
        presented: Fingerprint,
    },
}

/// Turns an error frame into [`ClientError::Refused`]; any other frame passes through.
fn refusal(frame: ServerFrame) -> Result<ServerFrame, ClientError> {
    match frame {
        ServerFrame::Error {
            code,
            message,
            retry_after_ms,
            ..
        } => Err(ClientError::Refused {
            code,
            message,
            retry_after_ms,
        }),
        other => Ok(other),
    }
}
