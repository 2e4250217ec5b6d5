//! Writing to one client: frames go through a queue to a writer task, so the session keeps
//! reading while a slow socket drains. A client that stops reading is disconnected, never
//! allowed to stall the relay or grow its memory without bound: the bytes waiting for it are
//! bounded, deliveries pause while half of that waits, and a writer that makes no progress for
//! the write deadline ends the connection, whatever the client still sends (pings included).

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::extract::ws::{CloseFrame, Message, WebSocket};
use futures_util::stream::{SplitSink, SplitStream};
use futures_util::{SinkExt, StreamExt};
use tokio::sync::{Notify, mpsc};
use tokio::task::JoinHandle;
use tokio::time::{Instant, timeout, timeout_at};
use tokio_util::sync::CancellationToken;

use super::storage::StorageError;
use crate::protocol::{ErrorCode, ServerFrame};

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
    /// The client did not read what the relay sent it.
    pub const NOT_READING: u16 = 4003;
}

/// How long a closing connection may take to flush its last frames.
const FLUSH: Duration = Duration::from_secs(5);
/// How long a closed connection waits for the client's own close once everything is written.
const CLOSE_ANSWER: Duration = Duration::from_secs(1);

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

/// The answer to a request whose storage call failed: the failure, and to ask again in a
/// second.
pub fn storage_failed(reference: String, e: StorageError) -> ServerFrame {
    error_frame(
        Some(reference),
        ErrorCode::Internal,
        e.to_string(),
        Some(Duration::from_secs(1)),
    )
}

fn text(frame: &ServerFrame) -> Message {
    Message::Text(
        serde_json::to_string(frame)
            .expect("frames always serialize")
            .into(),
    )
}

/// How much waits for the client, shared by the session and its writer task.
struct Backlog {
    /// Bytes of queued frames not yet handed to the socket's writer.
    bytes: AtomicUsize,
    /// Told whenever the writer took frames off the queue.
    drained: Notify,
    /// Cancelled when the writer waited longer than the write deadline for the socket.
    stalled: CancellationToken,
}

/// What the writer task is given: a frame and the bytes it counts for.
type Queued = (Message, usize);

/// The sending half of a connection.
pub struct Outgoing {
    queue: mpsc::Sender<Queued>,
    writer: JoinHandle<()>,
    backlog: Arc<Backlog>,
    limit: usize,
}

/// How `Outgoing` bounds a connection.
#[derive(Debug, Clone, Copy)]
pub struct Bounds {
    /// Frames that may wait.
    pub frames: usize,
    /// Bytes that may wait; a frame beyond them ends the connection.
    pub bytes: usize,
    /// How long the socket may take to accept the next frame.
    pub write_timeout: Duration,
}

impl Outgoing {
    /// Starts the writer task.
    pub fn spawn(mut sink: SplitSink<WebSocket, Message>, bounds: Bounds) -> Self {
        let (queue, mut frames) = mpsc::channel::<Queued>(bounds.frames);
        let backlog = Arc::new(Backlog {
            bytes: AtomicUsize::new(0),
            drained: Notify::new(),
            stalled: CancellationToken::new(),
        });
        let writer = tokio::spawn({
            let backlog = backlog.clone();
            let limit = bounds.write_timeout;
            async move {
                // Everything already queued goes out in one write: on a busy connection that
                // is one system call for many frames instead of one each.
                while let Some(frame) = frames.recv().await {
                    if write(&mut sink, frame, &backlog, limit).await.is_err() {
                        return;
                    }
                    while let Ok(frame) = frames.try_recv() {
                        if write(&mut sink, frame, &backlog, limit).await.is_err() {
                            return;
                        }
                    }
                    if progress(limit, sink.flush(), &backlog.stalled)
                        .await
                        .is_err()
                    {
                        return;
                    }
                }
                let _ = sink.close().await;
            }
        });
        Self {
            queue,
            writer,
            backlog,
            limit: bounds.bytes,
        }
    }

    /// Queues a frame; `false` when the client is gone or not reading.
    pub fn frame(&self, frame: &ServerFrame) -> bool {
        self.queue_counted(text(frame))
    }

    /// Queues raw frame text.
    pub fn raw(&self, text: String) -> bool {
        self.queue_counted(Message::Text(text.into()))
    }

    fn queue_counted(&self, message: Message) -> bool {
        let bytes = match &message {
            Message::Text(t) => t.len(),
            _ => 0,
        };
        let before = self.backlog.bytes.fetch_add(bytes, Ordering::AcqRel);
        if before + bytes > self.limit || self.queue.try_send((message, bytes)).is_err() {
            self.backlog.bytes.fetch_sub(bytes, Ordering::AcqRel);
            return false;
        }
        true
    }

    /// Whether deliveries may be queued: less than half the byte bound waits, so the client's
    /// answers always have room.
    pub fn has_room(&self) -> bool {
        self.room() > 0
    }

    /// Bytes of deliveries that may still be queued now.
    pub fn room(&self) -> usize {
        (self.limit / 2).saturating_sub(self.backlog.bytes.load(Ordering::Acquire))
    }

    /// Resolves after the writer took frames off the queue (maybe making room).
    pub async fn drained(&self) {
        self.backlog.drained.notified().await
    }

    /// Resolves when the socket accepted nothing for the write deadline: the client does not
    /// read.
    pub async fn stalled(&self) {
        self.backlog.stalled.cancelled().await
    }

    /// The byte bound, for the message that ends a connection over it.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Sends the ending (if any), closes, and waits briefly for the writer to flush and the
    /// client to answer the close; a client that does not read is cut off when that time is
    /// up.
    pub async fn finish(self, ending: Option<Ending>, mut stream: SplitStream<WebSocket>) {
        let deadline = Instant::now() + FLUSH;
        if let Some(ending) = ending {
            if ending.code == ErrorCode::NotReading {
                self.backlog.stalled.cancel();
            }
            let frame = error_frame(None, ending.code, ending.message.clone(), None);
            let reason: String = ending.message.chars().take(120).collect();
            let close = Message::Close(Some(CloseFrame {
                code: ending.close,
                reason: reason.into(),
            }));
            for message in [text(&frame), close] {
                if timeout_at(deadline, self.queue.send((message, 0)))
                    .await
                    .is_err()
                {
                    break;
                }
            }
        }
        drop(self.queue);
        let mut writer = self.writer;
        // Reading on until the client's close: a socket closed with input unread is reset,
        // and the reset destroys the last frames on their way to the client.
        let drained = async {
            while let Some(Ok(message)) = stream.next().await {
                if matches!(message, Message::Close(_)) {
                    break;
                }
            }
        };
        tokio::pin!(drained);
        let written = timeout_at(deadline, async {
            tokio::select! {
                _ = &mut writer => false,
                () = &mut drained => {
                    let _ = (&mut writer).await;
                    true
                }
            }
        });
        match written.await {
            Err(_) => writer.abort(),
            Ok(true) => {}
            Ok(false) => {
                let answer = deadline.min(Instant::now() + CLOSE_ANSWER);
                let _ = timeout_at(answer, drained).await;
            }
        }
    }
}

/// Hands one frame to the socket's writer, whose buffer is bounded by its own size.
async fn write(
    sink: &mut SplitSink<WebSocket, Message>,
    (frame, bytes): Queued,
    backlog: &Backlog,
    limit: Duration,
) -> Result<(), axum::Error> {
    // A client cut off for not reading gets only its ending (not counted), which then
    // follows what its socket already holds instead of everything still queued.
    let fed = if bytes > 0 && backlog.stalled.is_cancelled() {
        Ok(())
    } else {
        progress(limit, sink.feed(frame), &backlog.stalled).await
    };
    backlog.bytes.fetch_sub(bytes, Ordering::AcqRel);
    backlog.drained.notify_one();
    fed
}

/// Awaits `write`, cancelling `stalled` if it takes longer than `limit` (and still finishing
/// it, so a client that reads late gets the rest).
async fn progress<F: Future>(limit: Duration, write: F, stalled: &CancellationToken) -> F::Output {
    tokio::pin!(write);
    match timeout(limit, &mut write).await {
        Ok(done) => done,
        Err(_) => {
            stalled.cancel();
            write.await
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
