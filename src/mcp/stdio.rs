//! Standard input that says when it ends. rmcp waits for in-flight handlers after its input
//! closes; a live `subscriptions/listen` or push loop would hold the exit for seconds. With
//! this wrapper, end of input cancels a token that those loops also wait on, so the process
//! exits within milliseconds.

use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, ReadBuf};
use tokio_util::sync::CancellationToken;

/// Wraps a reader; cancels `eof` when it reports end of input or an error.
pub struct EofSignal<R> {
    inner: R,
    eof: CancellationToken,
}

impl<R> EofSignal<R> {
    /// Wraps `inner`.
    pub fn new(inner: R, eof: CancellationToken) -> Self {
        Self { inner, eof }
    }
}

impl<R: AsyncRead + Unpin> AsyncRead for EofSignal<R> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let poll = Pin::new(&mut self.inner).poll_read(cx, buf);
        match &poll {
            Poll::Ready(Ok(())) if buf.filled().len() == before && buf.remaining() > 0 => {
                self.eof.cancel();
            }
            Poll::Ready(Err(_)) => self.eof.cancel(),
            _ => {}
        }
        poll
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    #[tokio::test]
    async fn end_of_input_cancels() {
        let token = CancellationToken::new();
        let mut reader = EofSignal::new(&b"abc"[..], token.clone());
        let mut out = Vec::new();
        reader.read_to_end(&mut out).await.unwrap();
        assert_eq!(out, b"abc");
        assert!(token.is_cancelled());
    }
}
