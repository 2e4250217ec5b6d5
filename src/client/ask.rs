//! One request to the relay and its answer, over whichever connection a caller holds: its
//! own control [`Connection`] (the CLI) or the running session's (the mailbox). The typed
//! calls (`directory`, `presence`, `whois`) are written once against [`Ask`].

use std::future::Future;

use super::{ClientError, Connection, MakeFrame, RelayUrl};
use crate::protocol::ServerFrame;

/// A connection that answers requests.
pub trait Ask: Send {
    /// Sends the frame `make` builds around a fresh reference; its answer (refusals are
    /// errors).
    fn ask(
        &mut self,
        make: MakeFrame,
    ) -> impl Future<Output = Result<ServerFrame, ClientError>> + Send;

    /// The relay it talks to.
    fn relay_url(&self) -> &RelayUrl;
}

impl Ask for Connection {
    fn ask(
        &mut self,
        make: MakeFrame,
    ) -> impl Future<Output = Result<ServerFrame, ClientError>> + Send {
        self.call(make)
    }

    fn relay_url(&self) -> &RelayUrl {
        self.url()
    }
}
