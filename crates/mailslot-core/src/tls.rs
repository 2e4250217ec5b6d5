//! The TLS client settings every outgoing connection uses: an agent's to its relay, and a
//! relay's links and discovery requests to other relays. rustls with the `ring` provider,
//! certificates always verified against the platform's trusted roots, which the standard
//! `SSL_CERT_FILE` / `SSL_CERT_DIR` variables replace (how an owner trusts a private CA).

use std::sync::{Arc, OnceLock};

use rustls::{ClientConfig, RootCertStore};

/// How to trust a private CA, for error messages.
pub const TRUST_HINT: &str = "if the relay uses a private CA, set SSL_CERT_FILE to its CA bundle \
    (PEM) or SSL_CERT_DIR to a folder of CA certificates";

/// The TLS settings, built once per process: `ring`, TLS 1.2 and 1.3, the trusted roots.
pub fn client_config() -> Result<Arc<ClientConfig>, String> {
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
pub fn http_tls(tls: bool) -> Result<ClientConfig, String> {
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
