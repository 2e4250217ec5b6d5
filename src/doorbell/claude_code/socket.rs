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
        let fail = |source| RingError::Socket {
            path: self.path.display().to_string(),
            source,
        };
        // Built in a buffer that is wiped after the write: it holds the token. The token is
        // letters, digits, '.', '_' and '-' (checked when read), so it needs no escaping.
        let mut lines = zeroize::Zeroizing::new(String::new());
        if let Some(token) = self.token() {
            lines.push_str(r#"{"type":"auth","token":""#);
            lines.push_str(token);
            lines.push_str("\"}\n");
        }
        lines.push_str(
            &serde_json::json!({ "type": "user", "message": { "role": "user", "content": text } })
                .to_string(),
        );
        lines.push('\n');
        let mut stream = tokio::time::timeout(WRITE_TIMEOUT, async {
            let mut stream = UnixStream::connect(&self.path).await?;
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

#[cfg(test)]
mod tests {
    use tokio::io::AsyncBufReadExt;

    use super::*;

    #[tokio::test]
    async fn writes_the_auth_line_then_one_user_message() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("inbox.sock");
        let listener = tokio::net::UnixListener::bind(&path).unwrap();
        let socket = InboxSocket::new(path.clone(), Some("0123abcd".into()));
        assert!(
            !format!("{socket:?}").contains("0123abcd"),
            "the token is redacted"
        );
        let (written, accepted) = tokio::join!(
            socket.write("[mailslot] line one\nline \"two\""),
            listener.accept()
        );
        written.unwrap();
        let mut lines = tokio::io::BufReader::new(accepted.unwrap().0).lines();
        let auth: serde_json::Value =
            serde_json::from_str(&lines.next_line().await.unwrap().unwrap()).unwrap();
        assert_eq!(
            auth,
            serde_json::json!({ "type": "auth", "token": "0123abcd" })
        );
        let user: serde_json::Value =
            serde_json::from_str(&lines.next_line().await.unwrap().unwrap()).unwrap();
        assert_eq!(user["type"], "user");
        assert_eq!(
            user["message"]["content"],
            "[mailslot] line one\nline \"two\""
        );
        assert!(lines.next_line().await.unwrap().is_none(), "then it closes");

        // Nobody listening: an error that names the socket.
        drop(listener);
        std::fs::remove_file(&path).unwrap();
        let e = socket.write("x").await.unwrap_err();
        assert!(e.to_string().contains("inbox.sock"), "{e}");
    }
}
