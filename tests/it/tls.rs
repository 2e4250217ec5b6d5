//! `wss://` end to end: the real relay on loopback behind a real TLS terminator (rustls, a
//! certificate for `localhost` signed by a test CA), and the real `mailslot` binary as the
//! client, which trusts the CA only through `SSL_CERT_FILE`.

use crate::common;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use common::{EVENT_TIMEOUT, TestRelay};
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose};
use rustls::ServerConfig;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;

/// A test CA and a server certificate for `localhost` that it signed.
struct Pki {
    ca_pem: String,
    server: Arc<ServerConfig>,
}

fn ca(name: &str) -> (CertificateParams, KeyPair, String) {
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let pem = params.self_signed(&key).unwrap().pem();
    (params, key, pem)
}

fn pki() -> Pki {
    let (ca_params, ca_key, ca_pem) = ca("mailslot test CA");
    let issuer = Issuer::new(ca_params, ca_key);
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::new(vec!["localhost".to_owned()]).unwrap();
    params
        .distinguished_name
        .push(DnType::CommonName, "localhost");
    let cert = params.signed_by(&key, &issuer).unwrap();
    let server =
        ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(
                vec![CertificateDer::from(cert.der().to_vec())],
                PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
            )
            .unwrap();
    Pki {
        ca_pem,
        server: Arc::new(server),
    }
}

/// A TLS terminator on loopback that forwards the decrypted bytes to `backend`, counting the
/// TLS sessions it established.
struct TlsFront {
    port: u16,
    sessions: Arc<AtomicUsize>,
}

async fn tls_front(backend: SocketAddr, config: Arc<ServerConfig>) -> TlsFront {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let acceptor = TlsAcceptor::from(config);
    let sessions = Arc::new(AtomicUsize::new(0));
    let count = sessions.clone();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let (acceptor, count) = (acceptor.clone(), count.clone());
            tokio::spawn(async move {
                // A client that refuses the certificate ends the handshake; nothing to forward.
                let Ok(mut tls) = acceptor.accept(tcp).await else {
                    return;
                };
                count.fetch_add(1, Ordering::SeqCst);
                let mut relay = TcpStream::connect(backend).await.unwrap();
                let _ = tokio::io::copy_bidirectional(&mut tls, &mut relay).await;
            });
        }
    });
    TlsFront { port, sessions }
}

/// A relay behind a TLS front, and a home for the CLI with two CA files: the right one and
/// an unrelated one.
struct Setup {
    relay: TestRelay,
    front: TlsFront,
    home: tempfile::TempDir,
    trusted_ca: PathBuf,
    other_ca: PathBuf,
}

impl Setup {
    async fn start() -> Self {
        let relay = TestRelay::start(|_| {}).await;
        let pki = pki();
        let backend: SocketAddr = relay.url.authority().parse().unwrap();
        let front = tls_front(backend, pki.server).await;
        let home = tempfile::tempdir().unwrap();
        let trusted_ca = home.path().join("ca.pem");
        std::fs::write(&trusted_ca, &pki.ca_pem).unwrap();
        let other_ca = home.path().join("other-ca.pem");
        std::fs::write(&other_ca, ca("some other CA").2).unwrap();
        let setup = Self {
            relay,
            front,
            home,
            trusted_ca,
            other_ca,
        };
        // Only init, register and mcp make agents. Offline: a registration would be a TLS
        // session, and the tests count the sessions their own commands make.
        for agent in ["alice", "bob"] {
            let out = setup
                .run(
                    &setup.trusted_ca,
                    agent,
                    &setup.wss("localhost"),
                    &["init", "--offline"],
                )
                .await;
            assert!(out.status.success(), "{}", stderr(&out));
        }
        setup
    }

    fn wss(&self, host: &str) -> String {
        format!("wss://{host}:{}", self.front.port)
    }

    /// Runs `mailslot --agent AGENT --relay RELAY --json ARGS…` with `SSL_CERT_FILE=ca` (and
    /// nothing else from this environment), waiting at most [`EVENT_TIMEOUT`].
    async fn run(&self, ca: &Path, agent: &str, relay: &str, args: &[&str]) -> Output {
        let child = Command::new(env!("CARGO_BIN_EXE_mailslot"))
            .args(["--agent", agent, "--relay", relay, "--json"])
            .args(args)
            .env_clear()
            .env("MAILSLOT_HOME", self.home.path())
            .env("SSL_CERT_FILE", ca)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let pid = nix::unistd::Pid::from_raw(child.id() as i32);
        let waiting = tokio::task::spawn_blocking(move || child.wait_with_output());
        match tokio::time::timeout(EVENT_TIMEOUT, waiting).await {
            Ok(out) => out.unwrap().unwrap(),
            Err(_) => {
                let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
                panic!("mailslot {args:?} did not finish within {EVENT_TIMEOUT:?}");
            }
        }
    }

    async fn json(&self, agent: &str, args: &[&str]) -> serde_json::Value {
        let out = self
            .run(&self.trusted_ca, agent, &self.wss("localhost"), args)
            .await;
        assert!(out.status.success(), "{args:?}: {}", stderr(&out));
        serde_json::from_slice(&out.stdout).unwrap()
    }
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[tokio::test]
async fn two_agents_exchange_mail_over_wss_with_a_private_ca_in_ssl_cert_file() {
    let s = Setup::start().await;
    let registered = s.json("bob", &["sync"]).await;
    assert_eq!(registered["received"], serde_json::json!([]));
    let sent = s
        .json(
            "alice",
            &[
                "send",
                "--to",
                "bob",
                "--subject",
                "hi",
                "--body",
                "over TLS",
            ],
        )
        .await;
    assert_eq!(sent["status"], "sent", "{sent}");
    assert_eq!(
        sent["detail"],
        format!("accepted by localhost:{}", s.front.port)
    );
    let got = s.json("bob", &["sync"]).await;
    assert_eq!(got["received"], serde_json::json!([sent["id"]]));
    let inbox = s.json("bob", &["inbox"]).await;
    assert!(inbox.to_string().contains("hi"), "{inbox}");
    assert!(
        s.front.sessions.load(Ordering::SeqCst) >= 3,
        "every command went through the TLS front"
    );
    s.relay.relay.shutdown().await;
}

#[tokio::test]
async fn an_untrusted_certificate_is_refused_with_what_to_do() {
    let s = Setup::start().await;
    let out = s
        .run(&s.other_ca, "bob", &s.wss("localhost"), &["sync"])
        .await;
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(
        err.contains("cannot reach the relay at wss://localhost:"),
        "{err}"
    );
    assert!(
        err.contains("the relay's certificate is not trusted"),
        "{err}"
    );
    assert!(err.contains("set SSL_CERT_FILE to its CA bundle"), "{err}");
    // A send is kept in the outbox, with the same reason.
    let out = s
        .run(
            &s.other_ca,
            "alice",
            &s.wss("localhost"),
            &["send", "--to", "bob", "--subject", "hi", "--body", "x"],
        )
        .await;
    assert!(out.status.success(), "{}", stderr(&out));
    let queued: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(queued["status"], "queued");
    assert!(
        queued["detail"]
            .as_str()
            .unwrap()
            .contains("certificate is not trusted"),
        "{queued}"
    );
    assert_eq!(
        s.front.sessions.load(Ordering::SeqCst),
        0,
        "no TLS session was established"
    );
    s.relay.relay.shutdown().await;
}

#[tokio::test]
async fn a_wrong_name_a_relay_without_tls_and_an_unreadable_trust_store_are_explained() {
    let s = Setup::start().await;
    // The certificate names localhost, not 127.0.0.1.
    let out = s
        .run(&s.trusted_ca, "bob", &s.wss("127.0.0.1"), &["sync"])
        .await;
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(
        err.contains("the relay's certificate is not valid for the name 127.0.0.1 ("),
        "{err}"
    );
    assert!(err.contains("use the host name the certificate"), "{err}");
    // wss:// to the relay itself, which speaks plain ws://.
    let plain = format!("wss://{}", s.relay.url.authority());
    let out = s.run(&s.trusted_ca, "bob", &plain, &["sync"]).await;
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(err.contains("the TLS handshake failed"), "{err}");
    assert!(err.contains("use ws:// for a relay without TLS"), "{err}");
    // A trust store that cannot be read says so, and how to fix it.
    let missing = s.home.path().join("missing.pem");
    let out = s.run(&missing, "bob", &s.wss("localhost"), &["sync"]).await;
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(
        err.contains("no trusted certificates could be read from SSL_CERT_FILE"),
        "{err}"
    );
    assert!(err.contains("missing.pem"), "{err}");
    assert!(
        err.contains("set SSL_CERT_FILE to a readable CA bundle"),
        "{err}"
    );
    assert_eq!(s.front.sessions.load(Ordering::SeqCst), 0);
    s.relay.relay.shutdown().await;
}
