//! Opening the WebSocket to a relay: plain for `ws://`, TLS (rustls with the `ring` provider)
//! for `wss://`. The certificate is always verified, against the platform's trusted roots; the
//! standard `SSL_CERT_FILE` / `SSL_CERT_DIR` variables replace those roots (how an owner trusts
//! a private CA; see `crate::tls`). TLS failures become reasons that say what to do, and a
//! server that answers the handshake as something else is named as not a relay.

use rustls::CertificateError;
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::{self, error::TlsError, protocol::WebSocketConfig};
use tokio_tungstenite::{Connector, MaybeTlsStream, WebSocketStream};

use super::{ClientError, RelayUrl};

/// A WebSocket to a relay, plain or TLS.
pub type RelaySocket = WebSocketStream<MaybeTlsStream<TcpStream>>;

use crate::tls::{TRUST_HINT, client_config};

/// Connects to `url` (with `query` after a `?`, if any) and performs the WebSocket handshake
/// (TLS first for `wss://`). A server that answers but not with a WebSocket is
/// [`ClientError::NotARelay`]; any other failure is [`ClientError::Unreachable`] with a reason
/// that says what to do.
pub async fn open_socket(
    url: &RelayUrl,
    query: Option<&str>,
    config: Option<WebSocketConfig>,
) -> Result<RelaySocket, ClientError> {
    let unreachable = |reason: String| ClientError::Unreachable {
        url: url.to_string(),
        reason,
    };
    let connector = if url.is_tls() {
        Some(Connector::Rustls(client_config().map_err(unreachable)?))
    } else {
        None
    };
    let target = match query {
        Some(query) => format!("{}?{query}", url.as_str()),
        None => url.as_str().to_owned(),
    };
    tokio_tungstenite::connect_async_tls_with_config(target, config, true, connector)
        .await
        .map(|(ws, _)| ws)
        .map_err(|e| match not_a_relay(&e) {
            Some(answered) => ClientError::NotARelay {
                url: url.to_string(),
                answered,
            },
            None => unreachable(describe(&e, url)),
        })
}

/// What a server that answered the handshake, but not with a WebSocket, said (for "the
/// server at URL answered …"); `None` when nothing, or a WebSocket, answered.
fn not_a_relay(error: &tungstenite::Error) -> Option<String> {
    use tungstenite::error::ProtocolError as P;
    match error {
        tungstenite::Error::Http(response) => Some(format!("HTTP {}", response.status())),
        tungstenite::Error::Protocol(P::WrongHttpVersion) => {
            Some("in an HTTP version before 1.1".to_owned())
        }
        tungstenite::Error::Protocol(
            p @ (P::MissingConnectionUpgradeHeader
            | P::MissingUpgradeWebSocketHeader
            | P::SecWebSocketAcceptKeyMismatch
            | P::SecWebSocketSubProtocolError(_)
            | P::InvalidHeader(_)),
        ) => Some(format!("without a WebSocket upgrade ({p})")),
        tungstenite::Error::Protocol(P::HttparseError(_)) | tungstenite::Error::HttpFormat(_) => {
            Some("with something that is not HTTP".to_owned())
        }
        _ => None,
    }
}

/// A reason for a failed connection that names the problem and the fix.
fn describe(error: &tungstenite::Error, url: &RelayUrl) -> String {
    let host = url.authority();
    let rustls_error = match error {
        tungstenite::Error::Io(io) => io
            .get_ref()
            .and_then(|inner| inner.downcast_ref::<rustls::Error>()),
        tungstenite::Error::Tls(TlsError::Rustls(e)) => Some(&**e),
        tungstenite::Error::Tls(TlsError::InvalidDnsName) => {
            return format!(
                "{:?} is not a valid host name for TLS; use the name on the relay's certificate",
                url.host()
            );
        }
        _ => None,
    };
    let Some(tls) = rustls_error else {
        return error.to_string();
    };
    match tls {
        rustls::Error::InvalidCertificate(cert) => match cert {
            CertificateError::UnknownIssuer => format!(
                "the relay's certificate is not trusted: it is signed by an unknown certificate \
                 authority; {TRUST_HINT}"
            ),
            CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. } => {
                format!(
                    "the relay's certificate is not valid for the name {} ({tls}); use the host \
                     name the certificate was issued for in the wss:// URL",
                    url.host()
                )
            }
            CertificateError::Expired
            | CertificateError::ExpiredContext { .. }
            | CertificateError::NotValidYet
            | CertificateError::NotValidYetContext { .. } => format!(
                "the relay's certificate is outside its validity period: {tls}; renew it on the \
                 relay's TLS proxy, or check this machine's clock"
            ),
            _ => format!("the relay's certificate is refused: {tls}; {TRUST_HINT}"),
        },
        _ => format!(
            "the TLS handshake failed: {tls}; check that {host} serves TLS (use ws:// for a \
             relay without TLS)"
        ),
    }
}
