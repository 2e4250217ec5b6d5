//! The sessions of `mailslot mcp --http`, bounded: rmcp's `LocalSessionManager` (which ends a
//! session after `idle` without a message either way) under a cap on how many live at once.
//! One client opening sessions in a loop gets a clear refusal at the cap instead of the
//! server's memory; idle ones end and free their place.

use std::collections::HashSet;
use std::sync::Mutex;
use std::time::Duration;

use futures_util::Stream;
use rmcp::model::{ClientJsonRpcMessage, ServerJsonRpcMessage};
use rmcp::transport::streamable_http_server::session::local::{
    LocalSessionManager, LocalSessionManagerError, SessionConfig,
};
use rmcp::transport::streamable_http_server::session::{
    EventStore, RestoreOutcome, ServerSseMessage, SessionId, SessionManager,
};

/// How many sessions may live at once, and how long one may sit idle.
#[derive(Debug, Clone, Copy)]
pub struct SessionLimits {
    /// The most live sessions.
    pub max: usize,
    /// A session without a request or a message for this long ends.
    pub idle: Duration,
}

impl SessionLimits {
    /// The defaults: 64 sessions, 10 minutes.
    pub const DEFAULT: Self = Self {
        max: 64,
        idle: Duration::from_secs(600),
    };
}

/// Why a session could not be made or used.
#[derive(Debug, thiserror::Error)]
pub enum SessionsError {
    /// The cap is reached.
    #[error(
        "mailslot mcp --http already serves {max} sessions, its limit (--max-sessions); close a client or let an idle session end (after {idle_secs} s without a message), then connect again"
    )]
    Full {
        /// The cap.
        max: usize,
        /// The idle time, in seconds.
        idle_secs: u64,
    },
    /// rmcp's session manager failed.
    #[error(transparent)]
    Local(#[from] LocalSessionManagerError),
}

/// rmcp's local sessions under a cap.
pub struct BoundedSessions {
    inner: LocalSessionManager,
    limits: SessionLimits,
    /// The live sessions, and the places taken by sessions being made.
    live: Mutex<Live>,
}

#[derive(Default)]
struct Live {
    ids: HashSet<SessionId>,
    making: usize,
}

impl BoundedSessions {
    /// No sessions yet.
    pub fn new(limits: SessionLimits) -> Self {
        let mut inner = LocalSessionManager::default();
        inner.session_config = {
            let mut config = SessionConfig::default();
            config.keep_alive = Some(limits.idle);
            config
        };
        Self {
            inner,
            limits,
            live: Mutex::new(Live::default()),
        }
    }

    /// Whether a new session would be refused now.
    pub fn full(&self) -> bool {
        let live = self.live.lock().expect("never poisoned");
        live.ids.len() + live.making >= self.limits.max
    }

    /// The refusal at the cap.
    pub fn full_error(&self) -> SessionsError {
        SessionsError::Full {
            max: self.limits.max,
            idle_secs: self.limits.idle.as_secs(),
        }
    }

    /// Takes a place for a session being made, if one is free.
    fn reserve(&self) -> Result<(), SessionsError> {
        let mut live = self.live.lock().expect("never poisoned");
        if live.ids.len() + live.making >= self.limits.max {
            return Err(self.full_error());
        }
        live.making += 1;
        Ok(())
    }

    /// The session being made is `id` (or failed, with `None`).
    fn made(&self, id: Option<&SessionId>) {
        let mut live = self.live.lock().expect("never poisoned");
        live.making -= 1;
        if let Some(id) = id {
            live.ids.insert(id.clone());
        }
    }
}

impl SessionManager for BoundedSessions {
    type Error = SessionsError;
    type Transport = <LocalSessionManager as SessionManager>::Transport;

    async fn create_session(&self) -> Result<(SessionId, Self::Transport), Self::Error> {
        self.reserve()?;
        let made = self.inner.create_session().await;
        self.made(made.as_ref().ok().map(|(id, _)| id));
        Ok(made?)
    }

    async fn initialize_session(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<ServerJsonRpcMessage, Self::Error> {
        Ok(self.inner.initialize_session(id, message).await?)
    }

    async fn has_session(&self, id: &SessionId) -> Result<bool, Self::Error> {
        Ok(self.inner.has_session(id).await?)
    }

    async fn close_session(&self, id: &SessionId) -> Result<(), Self::Error> {
        let ended = self.live.lock().expect("never poisoned").ids.remove(id);
        if ended {
            tracing::info!(session = %id, "MCP session ended");
        }
        Ok(self.inner.close_session(id).await?)
    }

    async fn create_stream(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        Ok(self.inner.create_stream(id, message).await?)
    }

    async fn accept_message(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<(), Self::Error> {
        Ok(self.inner.accept_message(id, message).await?)
    }

    async fn create_standalone_stream(
        &self,
        id: &SessionId,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        Ok(self.inner.create_standalone_stream(id).await?)
    }

    async fn resume(
        &self,
        id: &SessionId,
        last_event_id: String,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        Ok(self.inner.resume(id, last_event_id).await?)
    }

    async fn restore_session(
        &self,
        id: SessionId,
    ) -> Result<RestoreOutcome<Self::Transport>, Self::Error> {
        self.reserve()?;
        let restored = self.inner.restore_session(id.clone()).await;
        let counted = matches!(restored, Ok(RestoreOutcome::Restored(_)));
        self.made(counted.then_some(&id));
        Ok(restored?)
    }

    fn event_store(&self) -> Option<std::sync::Arc<dyn EventStore>> {
        self.inner.event_store()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_cap_refuses_and_an_ended_session_frees_its_place() {
        let sessions = BoundedSessions::new(SessionLimits {
            max: 2,
            idle: Duration::from_secs(60),
        });
        let (a, _ta) = sessions.create_session().await.unwrap();
        let (_b, _tb) = sessions.create_session().await.unwrap();
        assert!(sessions.full());
        let refused = sessions.create_session().await.err().unwrap();
        assert!(refused.to_string().contains("--max-sessions"), "{refused}");
        sessions.close_session(&a).await.unwrap();
        sessions.close_session(&a).await.unwrap();
        assert!(!sessions.full(), "a second close frees nothing more");
        sessions.create_session().await.unwrap();
        assert!(sessions.full());
    }
}
