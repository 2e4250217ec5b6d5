//! Claude Code's session inbox socket (cross-session messaging): newline-delimited JSON, an
//! optional auth line with the session's token, then `{"type":"user","message":…}`, which
//! Claude Code queues as the session's next prompt. The bell (`doorbell::bell`) decides what to
//! write and when.

use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::net::UnixStream;

use super::InboxSocket;
use crate::doorbell::bell::RingError;

/// How long one connect and write may take.
const WRITE_TIMEOUT: Duration = Duration::from_secs(2);

impl InboxSocket {
    /// Writes `text` as one user message on the socket: the auth line (when Claude Code gave a
    /// token), then the message, then closes.
    pub async fn write(&self, text: &str) -> Result<(), RingError> {
        let socket = self;
        let fail = |source| RingError::Socket {
            path: socket.path.display().to_string(),
            source,
        };
        let mut lines = String::new();
        if let Some(token) = socket.token() {
            lines.push_str(&serde_json::json!({ "type": "auth", "token": token }).to_string());
            lines.push('\n');
        }
        lines.push_str(
            &serde_json::json!({ "type": "user", "message": { "role": "user", "content": text } })
                .to_string(),
        );
        lines.push('\n');
        let lines = zeroize::Zeroizing::new(lines);
        let mut stream = tokio::time::timeout(WRITE_TIMEOUT, async {
            let mut stream = UnixStream::connect(&socket.path).await?;
            stream.write_all(lines.as_bytes()).await?;
            Ok(stream)
        })
        .await
        .map_err(|_| fail(std::io::Error::from(std::io::ErrorKind::TimedOut)))?
        .map_err(fail)?;
        // Written whole: Claude Code has the lines, whatever closing says (it may close first).
        if let Err(e) = stream.shutdown().await {
            tracing::debug!(error = %e, "closing the inbox socket after a complete write");
        }
        Ok(())
    }
}
