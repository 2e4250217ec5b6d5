//! Opening the WebSocket to a relay: plain for `ws://`, TLS (rustls with the `ring` provider)
//! for `wss://`. The certificate is always verified, against the platform's trusted roots; the
//! standard `SSL_CERT_FILE` / `SSL_CERT_DIR` variables replace those roots (how an owner trusts
//! a private CA). TLS failures become reasons that say what to do.

use std::sync::{Arc, OnceLock};

use rustls::{CertificateError, ClientConfig, RootCertStore};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::{self, error::TlsError, protocol::WebSocketConfig};
use tokio_tungstenite::{Connector, MaybeTlsStream, WebSocketStream};

use super::{ClientError, RelayUrl};

/// A WebSocket to a relay, plain or TLS.
pub type RelaySocket = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// How to trust a private CA, for the messages below.
const TRUST_HINT: &str = "if the relay uses a private CA, set SSL_CERT_FILE to its CA bundle \
    (PEM) or SSL_CERT_DIR to a folder of CA certificates";

/// Connects to `url` and performs the WebSocket handshake (TLS first for `wss://`). Any
/// failure is [`ClientError::Unreachable`] with a reason that says what to do.
pub async fn open_socket(
    url: &RelayUrl,
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
    tokio_tungstenite::connect_async_tls_with_config(url.as_str(), config, true, connector)
        .await
        .map(|(ws, _)| ws)
        .map_err(|e| unreachable(describe(&e, url)))
}

/// The TLS settings, built once per process: `ring`, TLS 1.2 and 1.3, the trusted roots.
pub(crate) fn client_config() -> Result<Arc<ClientConfig>, String> {
    static CONFIG: OnceLock<Arc<ClientConfig>> = OnceLock::new();
    if let Some(config) = CONFIG.get() {
        return Ok(config.clone());
    }
    // The provider is chosen here rather than taken from the process default, so that no
    // feature combination in the dependency tree can make rustls panic for want of one.
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("cannot set up TLS: {e}"))?
        .with_root_certificates(trusted_roots()?)
        .with_no_client_auth();
    Ok(CONFIG.get_or_init(|| Arc::new(config)).clone())
}

/// TLS settings for an HTTP client (reqwest is built without a provider of its own, so it
/// always gets one): [`client_config`], or when the trusted roots cannot be read and `tls` is
/// not needed, `ring` with no roots (plain `http://` never uses them).
pub(crate) fn http_tls(tls: bool) -> Result<ClientConfig, String> {
    match client_config() {
        Ok(config) => Ok((*config).clone()),
        Err(e) if tls => Err(e),
        Err(_) => Ok(ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("cannot set up TLS: {e}"))?
        .with_root_certificates(RootCertStore::empty())
        .with_no_client_auth()),
    }
}

/// The platform's trusted roots, or those of `SSL_CERT_FILE` / `SSL_CERT_DIR` when set.
fn trusted_roots() -> Result<RootCertStore, String> {
    let found = rustls_native_certs::load_native_certs();
    let mut roots = RootCertStore::empty();
    let (added, ignored) = roots.add_parsable_certificates(found.certs);
    if added == 0 {
        let why = match found.errors.first() {
            Some(e) => format!(" ({e})"),
            None => String::new(),
        };
        let from_env = ["SSL_CERT_FILE", "SSL_CERT_DIR"]
            .into_iter()
            .any(|v| std::env::var_os(v).is_some());
        return Err(if from_env {
            format!(
                "no trusted certificates could be read from SSL_CERT_FILE / SSL_CERT_DIR{why}; \
                 set SSL_CERT_FILE to a readable CA bundle (PEM) or SSL_CERT_DIR to a folder of \
                 CA certificates"
            )
        } else {
            format!(
                "no trusted certificates found on this machine{why}; install its CA \
                 certificates (the ca-certificates package), or {TRUST_HINT}"
            )
        });
    }
    for error in &found.errors {
        tracing::warn!("loading trusted certificates: {error}");
    }
    if ignored > 0 {
        tracing::warn!("ignored {ignored} trusted certificates that could not be parsed");
    }
    Ok(roots)
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
