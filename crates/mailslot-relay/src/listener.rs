//! Accepting sockets. Each socket takes a slot (per IP and in all) when it is accepted and
//! keeps it until it closes — through its HTTP requests, the WebSocket upgrade and the
//! session — so half-open connections count against the limits. A request head must arrive
//! within the request deadline (also between requests on a kept-alive socket), and every HTTP
//! answer must be ready within it.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::http::{Request, StatusCode};
use axum::response::{IntoResponse, Response};
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio_util::task::TaskTracker;
use tower::ServiceExt;

use super::inbound::{FrameDone, Meter};
use super::limits::{ConnectionSlot, Full};
use super::state::RelayState;
use crate::protocol::ErrorCode;

/// How long accepting pauses when the process is out of files, so the loop does not spin.
const OUT_OF_FILES_PAUSE: Duration = Duration::from_millis(100);
/// How long shutdown waits for HTTP connections (not sessions) to finish.
const DRAIN: Duration = Duration::from_secs(5);

/// A socket, its slot and its meter: the slot (and any share of the receive budget) is
/// released when the socket is dropped, wherever that is.
struct Counted {
    tcp: TcpStream,
    meter: Meter,
    _slot: ConnectionSlot,
}

impl AsyncRead for Counted {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        std::task::ready!(this.meter.poll_ready(cx));
        let before = buf.filled().len();
        let read = Pin::new(&mut this.tcp).poll_read(cx, buf);
        this.meter.count(buf.filled().len() - before);
        read
    }
}

impl AsyncWrite for Counted {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.tcp).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.tcp).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.tcp.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tcp).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tcp).poll_shutdown(cx)
    }
}

/// Accepts sockets until `shutdown` flips, serving each with `app`; then waits (briefly) for
/// the HTTP connections to finish. Upgraded sessions watch the same signal themselves.
pub async fn serve<S: Send + Sync + 'static>(
    state: Arc<RelayState<S>>,
    listener: TcpListener,
    app: Router,
    mut shutdown: watch::Receiver<bool>,
) {
    let tasks = TaskTracker::new();
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = shutdown.wait_for(|s| *s) => break,
        };
        let (tcp, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(e) => {
                pause_after(&e).await;
                continue;
            }
        };
        let slot = match state.connections.acquire(peer.ip()) {
            Ok(slot) => slot,
            Err(full) => {
                state.metrics.reject(ErrorCode::TooManyConnections);
                refuse(&tcp, peer, full);
                continue;
            }
        };
        // Small frames both ways: Nagle's algorithm would hold them back for tens of ms.
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::warn!(error = %e, "could not set TCP_NODELAY");
        }
        let (meter, done) = state.receive_budget.meter();
        let io = TokioIo::new(Counted {
            tcp,
            meter,
            _slot: slot,
        });
        tasks.spawn(connection(
            state.clone(),
            io,
            (peer, done),
            app.clone(),
            shutdown.clone(),
        ));
    }
    drop(listener);
    tasks.close();
    let _ = tokio::time::timeout(DRAIN, tasks.wait()).await;
}

/// Serves one socket's HTTP/1.1 requests, upgrades included.
async fn connection<S: Send + Sync + 'static>(
    state: Arc<RelayState<S>>,
    io: TokioIo<Counted>,
    (peer, done): (SocketAddr, FrameDone),
    app: Router,
    mut shutdown: watch::Receiver<bool>,
) {
    let deadline = state.config.request_timeout();
    let service = hyper::service::service_fn({
        let state = state.clone();
        move |mut request: Request<Incoming>| {
            // A new request ends what the socket read before it (an upgraded socket's
            // session marks its frames itself).
            done.mark();
            request.extensions_mut().insert(ConnectInfo(peer));
            request.extensions_mut().insert(done.clone());
            let answer = app.clone().oneshot(request.map(Body::new));
            let state = state.clone();
            async move {
                Ok::<_, std::convert::Infallible>(
                    match tokio::time::timeout(deadline, answer).await {
                        Ok(Ok(response)) => response,
                        Ok(Err(never)) => match never {},
                        Err(_) => {
                            state.metrics.reject(ErrorCode::RequestTimeout);
                            timed_out(deadline)
                        }
                    },
                )
            }
        }
    });
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new()).header_read_timeout(deadline);
    let conn = http.serve_connection(io, service).with_upgrades();
    tokio::pin!(conn);
    let served = tokio::select! {
        served = conn.as_mut() => Some(served),
        _ = shutdown.wait_for(|s| *s) => None,
    };
    let served = match served {
        Some(served) => served,
        None => {
            conn.as_mut().graceful_shutdown();
            conn.await
        }
    };
    if let Err(e) = served
        && e.is_timeout()
    {
        // hyper closes the socket without an answer: the client had not sent a request.
        state.metrics.reject(ErrorCode::RequestTimeout);
        tracing::debug!(%peer, "no request head in time; closed");
    }
}

fn timed_out(deadline: Duration) -> Response {
    let body = serde_json::json!({
        "code": ErrorCode::RequestTimeout,
        "message": format!("the request took over {} s", deadline.as_secs()),
    });
    (StatusCode::REQUEST_TIMEOUT, axum::Json(body)).into_response()
}

/// Answers a socket over a limit with 429 (its IP) or 503 (the relay) and closes it, without
/// waiting: the answer is small enough for the socket's buffer, and a client that does not
/// read it must not hold anything here.
fn refuse(tcp: &TcpStream, peer: SocketAddr, full: Full) {
    let (status, message) = match full {
        Full::Ip(n) => (
            "429 Too Many Requests",
            format!("{} already has {n} connections open", peer.ip()),
        ),
        Full::Relay(n) => (
            "503 Service Unavailable",
            format!("the relay has {n} connections open; try again later"),
        ),
    };
    let body =
        serde_json::json!({"code": ErrorCode::TooManyConnections, "message": message}).to_string();
    let answer = format!(
        "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    // What already arrived is read first: closing a socket with unread input resets it, and
    // a reset can destroy the answer before the client reads it.
    let _ = tcp.try_read(&mut [0u8; 2048]);
    let _ = tcp.try_write(answer.as_bytes());
    tracing::debug!(%peer, ?full, "connection refused");
}

/// After a failed accept: out of files waits a moment (the listener stays ready and would
/// spin); a connection that failed before it was accepted needs nothing.
async fn pause_after(e: &io::Error) {
    if matches!(
        e.raw_os_error(),
        Some(nix::libc::EMFILE | nix::libc::ENFILE | nix::libc::ENOBUFS | nix::libc::ENOMEM)
    ) {
        tracing::warn!(error = %e, "cannot accept: out of files or memory; lower max_connections or raise the open-file limit");
        tokio::time::sleep(OUT_OF_FILES_PAUSE).await;
    }
}
