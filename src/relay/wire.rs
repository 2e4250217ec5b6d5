//! Writing to one client: frames go through a queue to a writer task, so the session keeps
//! reading while a slow socket drains. A client that stops reading is disconnected, never
//! allowed to stall the relay or grow its memory without bound.

use std::fmt::Write;
use std::time::Duration;

use axum::extract::ws::{CloseFrame, Message, WebSocket};
use futures_util::SinkExt;
use futures_util::stream::SplitSink;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::protocol::{ErrorCode, Seq, ServerFrame};

/// WebSocket close codes (4000–4999 are for applications).
pub mod close {
    /// The relay is going away, or failed.
    pub const GOING_AWAY: u16 = 1001;
    /// The client broke the rules.
    pub const POLICY: u16 = 1008;
    /// A frame was too large.
    pub const TOO_BIG: u16 = 1009;
    /// Authentication failed.
    pub const AUTH: u16 = 4001;
    /// Another connection for the agent took over.
    pub const REPLACED: u16 = 4002;
}

/// How long a closing connection may take to flush its last frames.
const FLUSH: Duration = Duration::from_secs(5);

/// Why a session ends, with the frame to send first.
pub struct Ending {
    /// The error code sent before closing.
    pub code: ErrorCode,
    /// The sentence sent with it.
    pub message: String,
    /// The WebSocket close code.
    pub close: u16,
}

/// An error frame.
pub fn error_frame(
    reference: Option<String>,
    code: ErrorCode,
    message: impl Into<String>,
    retry: Option<Duration>,
) -> ServerFrame {
    ServerFrame::Error {
        reference,
        code,
        message: message.into(),
        retry_after_ms: retry.map(|d| d.as_millis() as u64),
    }
}

/// Writes a delivery without re-parsing the stored envelope: the relay never decodes mail.
pub fn deliver_frame(seq: Seq, envelope: &[u8]) -> Option<String> {
    let envelope = std::str::from_utf8(envelope).ok()?;
    // Sized once: one delivery is one allocation and one copy of the envelope.
    let mut frame = String::with_capacity(envelope.len() + 64);
    write!(frame, r#"{{"type":"deliver","seq":{seq},"envelope":"#).ok()?;
    frame.push_str(envelope);
    frame.push('}');
    Some(frame)
}

fn text(frame: &ServerFrame) -> Message {
    Message::Text(
        serde_json::to_string(frame)
            .expect("frames always serialize")
            .into(),
    )
}

/// The sending half of a connection.
pub struct Outgoing {
    queue: mpsc::Sender<Message>,
    writer: JoinHandle<()>,
}

impl Outgoing {
    /// Starts the writer task; at most `capacity` frames wait.
    pub fn spawn(mut sink: SplitSink<WebSocket, Message>, capacity: usize) -> Self {
        let (queue, mut frames) = mpsc::channel::<Message>(capacity);
        let writer = tokio::spawn(async move {
            // Everything already queued goes out in one write: on a busy connection that is
            // one system call for many frames instead of one each.
            while let Some(frame) = frames.recv().await {
                if sink.feed(frame).await.is_err() {
                    return;
                }
                while let Ok(frame) = frames.try_recv() {
                    if sink.feed(frame).await.is_err() {
                        return;
                    }
                }
                if sink.flush().await.is_err() {
                    return;
                }
            }
            let _ = sink.close().await;
        });
        Self { queue, writer }
    }

    /// Queues a frame; `false` when the client is gone or not reading.
    pub fn frame(&self, frame: &ServerFrame) -> bool {
        self.queue.try_send(text(frame)).is_ok()
    }

    /// Queues raw frame text.
    pub fn raw(&self, text: String) -> bool {
        self.queue.try_send(Message::Text(text.into())).is_ok()
    }

    /// Sends the ending (if any), closes, and waits briefly for the writer to flush.
    pub async fn finish(self, ending: Option<Ending>) {
        if let Some(ending) = ending {
            let frame = error_frame(None, ending.code, ending.message.clone(), None);
            let reason: String = ending.message.chars().take(120).collect();
            // Waiting here is fine: the session is over, and the flush is bounded below.
            let _ = self.queue.send(text(&frame)).await;
            let _ = self
                .queue
                .send(Message::Close(Some(CloseFrame {
                    code: ending.close,
                    reason: reason.into(),
                })))
                .await;
        }
        drop(self.queue);
        let mut writer = self.writer;
        if tokio::time::timeout(FLUSH, &mut writer).await.is_err() {
            writer.abort();
        }
    }
}

/// Sends an ending on a socket that was never split (before authentication).
pub async fn refuse(socket: &mut WebSocket, ending: Ending) {
    let _ = socket
        .send(text(&error_frame(
            None,
            ending.code,
            ending.message.clone(),
            None,
        )))
        .await;
    let reason: String = ending.message.chars().take(120).collect();
    let _ = socket
        .send(Message::Close(Some(CloseFrame {
            code: ending.close,
            reason: reason.into(),
        })))
        .await;
}

/// Whether a read failed because the client's frame was over the size limit.
pub fn is_too_large(e: axum::Error) -> bool {
    use tokio_tungstenite::tungstenite::Error;
    e.into_inner()
        .downcast_ref::<Error>()
        .is_some_and(|e| matches!(e, Error::Capacity(_)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spliced_deliveries_parse_as_frames() {
        let alice = crate::crypto::Identity::generate();
        let bob = crate::crypto::Identity::generate();
        let to = crate::protocol::Address::parse("bob").unwrap();
        let m = crate::protocol::Message::new(
            crate::protocol::Address::parse("alice").unwrap(),
            vec![to.clone()],
            "s",
            "b",
        );
        let env = crate::crypto::seal(
            &m,
            &alice,
            &[(to, bob.public().clone())],
            &Default::default(),
        )
        .unwrap()
        .remove(0);
        let text = deliver_frame(42, &env.to_bytes()).unwrap();
        assert_eq!(
            serde_json::from_str::<ServerFrame>(&text).unwrap(),
            ServerFrame::Deliver {
                seq: 42,
                envelope: env
            }
        );
    }
}
