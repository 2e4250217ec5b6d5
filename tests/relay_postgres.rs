//! Relays on PostgreSQL (`--db postgres://…`): the URL selects the backend, nodes on one
//! database are one relay to clients, and the URL's password never shows. Runs on the test
//! binary's private cluster (tests/common/postgres.rs); skipped without PostgreSQL, except in
//! CI.

mod common;

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
    assert!(
        std::fs::read_dir(home.path()).unwrap().next().is_none(),
        "a PostgreSQL node keeps no lock or pid files in the home"
    );
}
