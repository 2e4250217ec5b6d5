//! The held relay session, asked like a connection: the typed calls in `client` (consent,
//! directory, presence, whois) run over it as they run over the CLI's control connection.

use std::sync::Arc;

use super::{Mailbox, MailboxError};
use crate::client::{Ask, ClientError, MakeFrame, RelayUrl, SessionHandle};
use crate::protocol::ServerFrame;

/// The held session, asked like a connection.
pub(super) struct Session {
    handle: Arc<SessionHandle>,
    relay: RelayUrl,
}

impl Ask for Session {
    async fn ask(&mut self, make: MakeFrame) -> Result<ServerFrame, ClientError> {
        self.handle.call(make).await
    }

    fn relay_url(&self) -> &RelayUrl {
        &self.relay
    }
}

impl Mailbox {
    /// The held session, or why there is none here: only the process that holds the
    /// agent's relay connection can ask the relay.
    pub(super) async fn asking(&self) -> Result<Session, MailboxError> {
        match self.session().await {
            Some(handle) => Ok(Session {
                handle,
                relay: self.0.relay.clone(),
            }),
            None => Err(MailboxError::ConnectionElsewhere {
                pid: self.0.lock.holder(),
            }),
        }
    }
}
