//! A relay node reaches its PostgreSQL over TLS when the URL asks for it (`sslmode=require`),
//! checks the server's certificate against the trusted roots (`SSL_CERT_FILE` here), and says
//! what to fix when it cannot. The server is a private cluster that accepts TLS only.

use crate::common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use common::postgres::PgCluster;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose, SanType,
};

/// A CA (PEM) and a certificate for 127.0.0.1 it signed, with its key (PEM).
fn pki() -> (String, String, String) {
    let ca_key = KeyPair::generate().unwrap();
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(DnType::CommonName, "mailslot test database CA");
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let ca_pem = ca.self_signed(&ca_key).unwrap().pem();
    let issuer = Issuer::new(ca, ca_key);
    let key = KeyPair::generate().unwrap();
    let mut server = CertificateParams::new(Vec::<String>::new()).unwrap();
    server.subject_alt_names = vec![SanType::IpAddress([127, 0, 0, 1].into())];
    server
        .distinguished_name
        .push(DnType::CommonName, "127.0.0.1");
    let cert = server.signed_by(&key, &issuer).unwrap().pem();
    (ca_pem, cert, key.serialize_pem())
}

/// Runs `mailslot relay` on `db` until it listens (`Ok`) or exits (`Err` with its stderr).
fn relay_on(db: &str, ca: Option<&std::path::Path>) -> Result<(), String> {
    // Its own home: a relay on PostgreSQL keeps its key file there.
    let home = tempfile::tempdir().unwrap();
    let mut command = Command::new(env!("CARGO_BIN_EXE_mailslot"));
    command
        .args(["relay", "--listen", "127.0.0.1:0", "--db", db])
        .env_clear()
        .env("MAILSLOT_HOME", home.path())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    if let Some(ca) = ca {
        command.env("SSL_CERT_FILE", ca);
    }
    let mut child = command.spawn().unwrap();
    let mut said = Vec::new();
    for line in BufReader::new(child.stderr.take().unwrap()).lines() {
        let line = line.unwrap();
        if line.contains(" listening on ") {
            child.kill().unwrap();
            child.wait().unwrap();
            return Ok(());
        }
        said.push(line);
    }
    let status = child.wait().unwrap();
    assert!(
        !status.success(),
        "a relay that never listened exits with an error"
    );
    Err(said.join("\n"))
}

#[tokio::test]
async fn a_node_connects_to_its_database_over_verified_tls() {
    let Some(cluster) = PgCluster::start() else {
        return;
    };
    let plain = cluster.create_database("tls").await;
    let (ca, cert, key) = pki();
    cluster.require_tls(&cert, &key);
    let dir = tempfile::tempdir().unwrap();
    let ca_file = dir.path().join("ca.pem");
    std::fs::write(&ca_file, ca).unwrap();
    let tls = format!("{plain}?sslmode=require");

    relay_on(&tls, Some(&ca_file)).expect("the node connects over TLS and serves");

    let untrusted = relay_on(&tls, None).expect_err("a certificate nobody vouches for is refused");
    assert!(
        untrusted.contains("certificate") || untrusted.contains("SSL_CERT_FILE"),
        "the refusal says what is wrong with the certificate: {untrusted}"
    );
    let refused = relay_on(&plain, Some(&ca_file))
        .expect_err("a server that accepts only TLS refuses a plain connection");
    assert!(
        refused.contains("no encryption") || refused.contains("pg_hba"),
        "the refusal is the server's: {refused}"
    );
}
