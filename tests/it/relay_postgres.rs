//! Relays on PostgreSQL (`--db postgres://…`): the URL selects the backend, nodes on one
//! database are one relay to clients, and the URL's password never shows. Runs on the test
//! binary's private cluster (tests/it/common/postgres.rs); skipped without PostgreSQL, except in
//! CI.

use crate::common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use common::postgres::PgCluster;
use common::*;

#[tokio::test]
async fn two_nodes_on_one_database_are_one_relay() {
    let Some(cluster) = PgCluster::shared() else {
        return;
    };
    let url = cluster.create_database("two_nodes").await;
    let node = |url: String| TestRelay::start(move |c| c.db = Some(url.into()));
    let (one, two) = (node(url.clone()).await, node(url).await);
    assert_eq!(one.relay.relay_id(), two.relay.relay_id());
    let (alice, bob) = (TestAgent::new("alice"), TestAgent::new("bob"));
    bob.sync(&two).await; // registers bob through node 2
    // Bob reads each message through one node and at once connects to the other: his ack
    // may still be committing on the first when the second reads, and the nodes take turns
    // (the second waits for the first's release), so nothing comes twice. Rounds, because
    // the race is narrow.
    let nodes = [&one, &two];
    for round in 0..12 {
        let (here, there) = (nodes[round % 2], nodes[(round + 1) % 2]);
        let message = alice.message(&[&bob], "plan", &format!("round {round}"));
        let id = message.id;
        assert_eq!(alice.send(here, message).await.sent, vec![id]);
        assert_eq!(bob.sync(here).await.received, vec![id]);
        let again = bob.sync(there).await;
        assert!(
            again.received.is_empty() && again.duplicates == 0,
            "round {round}: nothing again through the other node: {again:?}"
        );
    }
    one.relay.shutdown().await;
    two.relay.shutdown().await;
}

#[tokio::test]
async fn the_relay_logs_its_database_url_without_the_password() {
    let Some(cluster) = PgCluster::shared() else {
        return;
    };
    let url = cluster.create_database("redacted").await;
    // The test cluster trusts loopback, so the password is never asked for, only shown.
    let with_password = url.replace("postgres://postgres@", "postgres://postgres:hunter2@");
    let home = tempfile::tempdir().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_mailslot"))
        .args(["relay", "--listen", "127.0.0.1:0", "--db", &with_password])
        .env_clear()
        .env("MAILSLOT_HOME", home.path())
        .env("MAILSLOT_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut seen = Vec::new();
    for line in BufReader::new(child.stderr.take().unwrap()).lines() {
        let line = line.unwrap();
        let done = line.contains(" listening on ");
        seen.push(line);
        if done {
            break;
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    let log = seen.join("\n");
    assert!(
        log.contains(" listening on "),
        "the relay did not start: {log}"
    );
    assert!(log.contains("postgres://postgres:***@127.0.0.1"), "{log}");
    assert!(!log.contains("hunter2"), "the password was logged: {log}");
    // A PostgreSQL node keeps no lock or pid files in the home: only the relay's key, which
    // every node of the relay shares (`--identity`).
    let relay_dir = home.path().join("relay");
    let files: Vec<_> = std::fs::read_dir(home.path())
        .unwrap()
        .chain(std::fs::read_dir(&relay_dir).unwrap())
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(
        files,
        vec![relay_dir.clone(), relay_dir.join("identity.key")],
        "{files:?}"
    );
}

/// Runs `mailslot relay` on `url` in a fresh home (with `--identity FILE` if given) until it
/// listens or exits: whether it listened, and what it said.
fn node_process(
    url: &str,
    identity: Option<&std::path::Path>,
) -> (bool, String, tempfile::TempDir) {
    let home = tempfile::tempdir().unwrap();
    let mut command = Command::new(env!("CARGO_BIN_EXE_mailslot"));
    command.args(["relay", "--listen", "127.0.0.1:0", "--db", url]);
    if let Some(file) = identity {
        command.arg("--identity").arg(file);
    }
    let mut child = command
        .env_clear()
        .env("MAILSLOT_HOME", home.path())
        .env("MAILSLOT_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut seen = Vec::new();
    let mut listened = false;
    // Ends at " listening on " or when the process exits (its stderr closes).
    for line in BufReader::new(child.stderr.take().unwrap()).lines() {
        let line = line.unwrap();
        listened = line.contains(" listening on ");
        seen.push(line);
        if listened {
            break;
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    (listened, seen.join("\n"), home)
}

#[tokio::test]
async fn a_node_with_another_key_refuses_to_start() {
    let Some(cluster) = PgCluster::shared() else {
        return;
    };
    let url = cluster.create_database("other_key").await;
    let first = TestRelay::start({
        let url = url.clone();
        move |c| c.db = Some(url.into())
    })
    .await;
    let fingerprint = first.relay.fingerprint().clone();
    // Started without --identity, a node makes a key of its own in its home: refused, naming
    // the relay's key and the fix, and its new key file is not left to be taken next time.
    let (listened, said, home) = node_process(&url, None);
    assert!(
        !listened,
        "a node with another key served the relay: {said}"
    );
    assert!(
        said.contains(fingerprint.as_str()) && said.contains("--identity"),
        "{said}"
    );
    let made = home.path().join("relay").join("identity.key");
    assert!(said.contains(&made.display().to_string()), "{said}");
    assert!(!made.exists(), "the refused key was left behind");
    // With the relay's key file it joins.
    let (listened, said, _) = node_process(&url, Some(&common::postgres::node_key(&url)));
    assert!(listened, "{said}");
    assert!(said.contains(fingerprint.as_str()), "{said}");
    first.relay.shutdown().await;
}

/// `GET path` on the relay at `addr`: the status and the body.
async fn get(addr: std::net::SocketAddr, path: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = Vec::new();
    tokio::time::timeout(EVENT_TIMEOUT, stream.read_to_end(&mut response))
        .await
        .expect("an answer in time")
        .unwrap();
    let text = String::from_utf8_lossy(&response).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    (status, body.to_owned())
}

#[tokio::test]
async fn healthz_answers_503_while_the_database_is_down() {
    // A cluster of its own: this test stops it.
    let Some(cluster) = PgCluster::start() else {
        return;
    };
    let url = cluster.create_database("health").await;
    let relay = TestRelay::start(move |c| c.db = Some(url.into())).await;
    let addr = relay.relay.addr();
    assert_eq!(get(addr, "/healthz").await, (200, "ok\n".to_owned()));

    cluster.kill9();
    // The server's backends outlive its main process for a moment (they exit once they notice
    // it is gone), and one of them may still answer a pooled connection's `SELECT 1`.
    let body = wait_until(EVENT_TIMEOUT, "/healthz answers 503", async || {
        let (status, body) = get(addr, "/healthz").await;
        (status == 503).then_some(body)
    })
    .await;
    let said: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(said["status"], "unavailable", "{said}");
    assert_eq!(said["failed"], "database", "{said}");
    assert!(
        said["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{said}"
    );

    cluster.start_again();
    // The server accepts connections now; a pooled connection that broke is replaced.
    wait_until(EVENT_TIMEOUT, "/healthz answers ok again", async || {
        (get(addr, "/healthz").await == (200, "ok\n".to_owned())).then_some(())
    })
    .await;
    relay.relay.shutdown().await;
}

/// `relay pins` on a PostgreSQL relay's database: listed, replaced (`trust`, after fetching
/// the key the relay presents) and removed, for every node at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relay_pins_work_on_a_postgres_database() {
    use mailslot::relay::storage::{PostgresStorage, RelayPins};
    let Some(cluster) = PgCluster::shared() else {
        return;
    };
    let url = cluster.create_database("relay_pins").await;
    let storage = PostgresStorage::connect(&url).await.unwrap();
    let other = TestRelay::start(|_| {}).await;
    let name = other.relay.name().clone();
    let stale = mailslot::protocol::RelayKey::from_bytes([7; 32]);
    storage.pin_relay(name.clone(), stale).await.unwrap();
    let stale_fp = mailslot::crypto::relay_fingerprint(&stale).to_string();
    let home = tempfile::tempdir().unwrap();
    let pins = async |args: &[&str]| {
        let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_mailslot"))
            .args(["--json", "relay", "pins"])
            .args(args)
            .args(["--db", &url])
            .env_clear()
            .env("MAILSLOT_HOME", home.path())
            .stdin(Stdio::null())
            .output()
            .await
            .unwrap();
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()
    };

    let listed = pins(&[]).await;
    assert_eq!(listed["pins"][0]["relay"], name.as_str());
    assert_eq!(listed["pins"][0]["fingerprint"], stale_fp.as_str());
    assert!(!listed["db"].as_str().unwrap().is_empty());

    let trusted = pins(&["trust", name.as_str(), "--yes"]).await;
    assert_eq!(trusted["was"], stale_fp.as_str());
    assert_eq!(
        trusted["fingerprint"],
        other.relay.fingerprint().to_string()
    );
    let pinned = storage.pinned_relay(name.clone()).await.unwrap().unwrap();
    assert_eq!(
        &mailslot::crypto::relay_fingerprint(&pinned),
        other.relay.fingerprint(),
        "the storage every node reads holds the new key"
    );

    let removed = pins(&["remove", name.as_str()]).await;
    assert_eq!(removed["removed"], other.relay.fingerprint().to_string());
    assert!(pins(&[]).await["pins"].as_array().unwrap().is_empty());
    other.relay.shutdown().await;
}
