//! One MCP message on stdio is one line, and rmcp drops a line over its limit without a word:
//! the client would wait forever for the answer. [`LineWatch`] watches the bytes on their way
//! to rmcp (changing none) and notes each line over [`MAX_LINE_BYTES`] with the request's `id`
//! and `method` when they stand near its start; [`Answering`] answers each with a JSON-RPC
//! error that names the limit, the field and the fix, through rmcp's own writer (so it never
//! splits another message), and keeps serving.

use std::pin::Pin;
use std::task::{Context, Poll};

use rmcp::RoleServer;
use rmcp::model::{ErrorCode, ErrorData, RequestId, ServerJsonRpcMessage};
use rmcp::service::{RxJsonRpcMessage, TxJsonRpcMessage};
use rmcp::transport::Transport;
use rmcp::transport::async_rw::AsyncRwTransport;
use serde::de::IgnoredAny;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::mpsc;

/// The longest line (one JSON-RPC message, its newline included) read from the client: rmcp's
/// own default, set explicitly so that this watch and rmcp's cut agree.
pub const MAX_LINE_BYTES: usize = rmcp::transport::async_rw::DEFAULT_MAX_LINE_LENGTH;

/// How much of each line is kept to find its `id` and `method`.
const HEAD_BYTES: usize = 4096;

/// A line that was too long: what its start said.
#[derive(Debug, Clone, PartialEq)]
pub struct Oversized {
    /// Its length in bytes, the newline included.
    pub bytes: usize,
    /// The request's id, when it came before the large part.
    pub id: Option<RequestId>,
    /// The request's method, likewise.
    pub method: Option<String>,
}

impl Oversized {
    /// The error that answers it.
    fn answer(&self) -> ServerJsonRpcMessage {
        let mib = MAX_LINE_BYTES / (1024 * 1024);
        let (what, field, fix) = match self.method.as_deref() {
            Some("tools/call") => (
                "this tools/call",
                "params.arguments",
                "send large content as files (attachments with {\"path\": FILE}, at most 8 MiB each) or in several smaller calls",
            ),
            Some(method) => (method, "params", "send it in smaller parts"),
            None => ("this message", "params", "send it in smaller parts"),
        };
        let message = format!(
            "{what} is {} bytes, over the limit of {mib} MiB ({MAX_LINE_BYTES} bytes) for one MCP message on stdio; its {field} are too large: {fix}",
            self.bytes
        );
        let data = serde_json::json!({
            "limit_bytes": MAX_LINE_BYTES,
            "bytes": self.bytes,
            "field": field,
        });
        ServerJsonRpcMessage::error(
            ErrorData::new(ErrorCode::INVALID_REQUEST, message, Some(data)),
            self.id.clone(),
        )
    }
}

/// Passes a reader's bytes through unchanged, noting every line longer than
/// [`MAX_LINE_BYTES`] when its newline arrives.
pub struct LineWatch<R> {
    inner: R,
    /// Bytes of the current line so far.
    line: usize,
    /// Its first [`HEAD_BYTES`].
    head: Vec<u8>,
    notes: mpsc::UnboundedSender<Oversized>,
}

impl<R> LineWatch<R> {
    /// Watches `inner`; notes go to `notes`.
    pub fn new(inner: R, notes: mpsc::UnboundedSender<Oversized>) -> Self {
        Self {
            inner,
            line: 0,
            head: Vec::with_capacity(HEAD_BYTES),
            notes,
        }
    }

    fn watch(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            let end = bytes.iter().position(|b| *b == b'\n');
            let take = end.map_or(bytes.len(), |i| i + 1);
            let room = HEAD_BYTES - self.head.len();
            self.head.extend_from_slice(&bytes[..take.min(room)]);
            self.line = self.line.saturating_add(take);
            if end.is_some() {
                if self.line > MAX_LINE_BYTES {
                    let (id, method) = head_fields(&self.head);
                    let _ = self.notes.send(Oversized {
                        bytes: self.line,
                        id,
                        method,
                    });
                }
                self.line = 0;
                self.head.clear();
            }
            bytes = &bytes[take..];
        }
    }
}

impl<R: AsyncRead + Unpin> AsyncRead for LineWatch<R> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let poll = Pin::new(&mut self.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = poll {
            self.watch(&buf.filled()[before..]);
        }
        poll
    }
}

/// The top-level `id` and `method` of the JSON object that `head` starts, as far as `head`
/// goes (the rest of the object may be cut off).
fn head_fields(head: &[u8]) -> (Option<RequestId>, Option<String>) {
    let (mut id, mut method) = (None, None);
    let mut rest = skip_ws(head);
    let Some(after) = rest.strip_prefix(b"{") else {
        return (id, method);
    };
    rest = after;
    while let Some((key, after)) = value::<String>(skip_ws(rest)) {
        let Some(after) = skip_ws(after).strip_prefix(b":") else {
            break;
        };
        let after = skip_ws(after);
        rest = match key.as_str() {
            "id" => match value::<RequestId>(after) {
                Some((v, r)) => {
                    id = Some(v);
                    r
                }
                None => break,
            },
            "method" => match value::<String>(after) {
                Some((v, r)) => {
                    method = Some(v);
                    r
                }
                None => break,
            },
            _ => match value::<IgnoredAny>(after) {
                Some((_, r)) => r,
                None => break,
            },
        };
        match skip_ws(rest).strip_prefix(b",") {
            Some(after) => rest = after,
            None => break,
        }
    }
    (id, method)
}

/// One JSON value at the start of `bytes`, and what follows it.
fn value<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Option<(T, &[u8])> {
    let mut values = serde_json::Deserializer::from_slice(bytes).into_iter::<T>();
    let parsed = values.next()?.ok()?;
    Some((parsed, &bytes[values.byte_offset()..]))
}

fn skip_ws(bytes: &[u8]) -> &[u8] {
    let start = bytes
        .iter()
        .position(|b| !b.is_ascii_whitespace())
        .unwrap_or(bytes.len());
    &bytes[start..]
}

/// rmcp's stdio transport, answering the lines it drops for their length.
pub struct Answering<T> {
    inner: T,
    notes: mpsc::UnboundedReceiver<Oversized>,
}

impl<T: Transport<RoleServer>> Answering<T> {
    async fn answer(&mut self, note: &Oversized) -> bool {
        tracing::warn!(
            bytes = note.bytes,
            limit = MAX_LINE_BYTES,
            method = note.method.as_deref().unwrap_or("?"),
            "answered a message over the line limit with an error"
        );
        self.inner.send(note.answer()).await.is_ok()
    }
}

impl<T: Transport<RoleServer>> Transport<RoleServer> for Answering<T> {
    type Error = T::Error;

    fn send(
        &mut self,
        item: TxJsonRpcMessage<RoleServer>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        self.inner.send(item)
    }

    async fn receive(&mut self) -> Option<RxJsonRpcMessage<RoleServer>> {
        loop {
            // rmcp's receive may be dropped mid-line: it keeps what it read and resumes.
            let received = tokio::select! {
                biased;
                Some(note) = self.notes.recv() => {
                    if !self.answer(&note).await {
                        return None;
                    }
                    continue;
                }
                received = self.inner.receive() => received,
            };
            if received.is_none() {
                // The input ended right after a long line: answer it before closing.
                while let Ok(note) = self.notes.try_recv() {
                    if !self.answer(&note).await {
                        break;
                    }
                }
            }
            return received;
        }
    }

    fn close(&mut self) -> impl Future<Output = Result<(), Self::Error>> + Send {
        self.inner.close()
    }
}

/// The stdio transport over `reader` and `writer`: rmcp's, with the line limit answered.
pub fn transport<R, W>(reader: R, writer: W) -> Answering<impl Transport<RoleServer>>
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let (notes, received) = mpsc::unbounded_channel();
    let inner = AsyncRwTransport::new_server(LineWatch::new(reader, notes), writer)
        .with_max_line_length(MAX_LINE_BYTES);
    Answering {
        inner,
        notes: received,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn id_and_method_come_from_the_start_of_a_cut_off_line() {
        let head = br#" {"jsonrpc":"2.0", "id" : 7,"method":"tools/call","params":{"name":"send","arguments":{"body":"xxxx"#;
        assert_eq!(
            head_fields(head),
            (Some(RequestId::Number(7)), Some("tools/call".into()))
        );
        let nested = br#"{"params":{"id":1,"method":"x"},"id":"a-1","method":"m"}"#;
        assert_eq!(
            head_fields(nested),
            (Some(RequestId::String("a-1".into())), Some("m".into())),
            "only the top level counts"
        );
        let late = br#"{"jsonrpc":"2.0","params":{"arguments":{"body":"xxxx"#;
        assert_eq!(head_fields(late), (None, None));
        assert_eq!(head_fields(b"not json"), (None, None));
    }

    #[test]
    fn only_lines_over_the_limit_are_noted_however_the_bytes_come() {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let mut watch = LineWatch::new(tokio::io::empty(), tx);
        let start = br#"{"id":3,"method":"tools/call","params":{"x":""#;
        let exact = MAX_LINE_BYTES - start.len() - 4;
        watch.watch(start);
        for _ in 0..exact / 1000 {
            watch.watch(&[b'x'; 1000]);
        }
        watch.watch(&vec![b'x'; exact % 1000]);
        watch.watch(b"\"}}\n{\"id\":4}\n");
        assert!(rx.try_recv().is_err(), "a line of exactly the limit passes");
        watch.watch(start);
        watch.watch(&vec![b'x'; MAX_LINE_BYTES]);
        watch.watch(b"\"}}\n");
        let note = rx.try_recv().unwrap();
        assert_eq!(note.id, Some(RequestId::Number(3)));
        assert_eq!(note.bytes, start.len() + MAX_LINE_BYTES + 4);
        let answer = serde_json::to_value(note.answer()).unwrap();
        assert_eq!(answer["id"], 3);
        let message = answer["error"]["message"].as_str().unwrap();
        assert!(
            message.contains("16 MiB") && message.contains("params.arguments"),
            "{message}"
        );
    }
}
