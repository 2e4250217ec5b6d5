//! `mailslot relay migrate`: a SQLite relay with registrations, consent and waiting mail is
//! stopped, moved by the real binary into a fresh database of the test binary's private
//! PostgreSQL cluster, and served by two nodes there, which clients cannot tell from the old
//! relay. Skipped without PostgreSQL, except in CI (tests/it/common/postgres.rs).

use crate::common;

use std::path::Path;
use std::process::{Command, Output};

use common::consent::{approve, request};
use common::postgres::PgCluster;
use common::relay_process::RelayProcess;
use common::*;
use mailslot::client::{ClientError, Connection};
use mailslot::protocol::{AgentName, MessageId};
use mailslot::protocol::{ClientFrame, ErrorCode, Policy, RequestCode, ServerFrame};
use mailslot::relay::storage::{
    AgentRecord, PostgresStorage, Queue, Registry, Snapshot, Storage, StorageError, WaitingCopy,
};

/// Runs `mailslot [--json] relay migrate --from FROM --to TO` in an empty home.
fn migrate(from: &Path, to: &str, json: bool) -> Output {
    let home = tempfile::tempdir().unwrap();
    let mut command = Command::new(env!("CARGO_BIN_EXE_mailslot"));
    if json {
        command.arg("--json");
    }
    command
        .args(["relay", "migrate", "--from"])
        .arg(from)
        .args(["--to", to])
        .env_clear()
        .env("MAILSLOT_HOME", home.path())
        .output()
        .unwrap()
}

/// The code of the open request `conn`'s agent made, as its owner sees it.
async fn outgoing_code(conn: &mut Connection) -> Option<RequestCode> {
    match conn
        .call(|r| ClientFrame::Consent { reference: r })
        .await
        .unwrap()
    {
        ServerFrame::ConsentState { outgoing, .. } => outgoing.first()?.code.clone(),
        other => panic!("expected the consent state, got {other:?}"),
    }
}

#[tokio::test]
async fn a_sqlite_relay_moves_to_postgres_with_its_names_consent_and_mail() {
    let Some(cluster) = PgCluster::shared() else {
        return;
    };
    let contacts_only = |c: &mut mailslot::relay::RelayConfig| {
        c.default_policy = Some(Policy::Contacts);
    };
    let sqlite = TestRelay::start(contacts_only).await;
    let [alice, bob, mallory, carol] = sqlite.agents(["alice", "bob", "mallory", "carol"]).await;

    // alice and bob become contacts: alice asks, bob's owner approves with the code.
    let mut alice_conn = alice.connect(&sqlite).await;
    let code = request(&mut alice_conn, &bob).await;
    alice_conn
        .call(|r| ClientFrame::SetListing {
            reference: r,
            description: Some("plans the releases".into()),
        })
        .await
        .unwrap();
    alice_conn.close().await;
    let mut bob_conn = bob.connect(&sqlite).await;
    approve(&mut bob_conn, &bob, &alice, code).await.unwrap();
    bob_conn.close().await;
    // mallory's request stays open.
    let mut mallory_conn = mallory.connect(&sqlite).await;
    let mallory_code = request(&mut mallory_conn, &bob).await;
    mallory_conn.close().await;

    // Mail waits for bob, who is offline.
    let mut waiting = Vec::new();
    for i in 0..3 {
        let message = alice.message(&[&bob], &format!("note {i}"), "before the move");
        waiting.push(message.id);
        assert_eq!(alice.send(&sqlite, message).await.sent.len(), 1);
    }

    // carol gives her name back: it is held for the retired-name period.
    let mut carol_conn =
        Connection::connect_control(&sqlite.url, &carol.name, &carol.identity, None)
            .await
            .unwrap();
    carol_conn.retire(&carol.identity).await.unwrap();
    carol_conn.close().await;

    // erin rotated her keys: the statement moves with her.
    let erin = TestAgent::new("erin");
    let erin_next = mailslot::crypto::Identity::generate();
    let rotation = mailslot::crypto::sign_rotation(&erin.name, &erin.identity, &erin_next);
    let mut erin_conn = erin.connect(&sqlite).await;
    erin_conn.rotate_keys(rotation.clone()).await.unwrap();
    erin_conn.close().await;

    let relay_id = sqlite.relay.relay_id().to_owned();
    let fingerprint = sqlite.relay.fingerprint().clone();
    let db = sqlite.db();
    // Kept, so the stopped relay's folder outlives the migration.
    let _stopped = sqlite.stop().await;

    let url = cluster.create_database("migrate").await;
    let out = migrate(&db, &url, true);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["relay_id"], relay_id.as_str(), "{report}");
    assert_eq!(report["agents"], 5, "{report}");
    assert_eq!(report["retired"], 1, "{report}");
    assert_eq!(report["contacts"], 1, "{report}");
    assert_eq!(report["requests"], 1, "{report}");
    assert_eq!(report["recipients"], 1, "{report}");
    assert_eq!(report["copies"], 3, "{report}");
    assert!(report["bytes"].as_u64().unwrap() > 0, "{report}");
    assert_eq!(report["to"], url.as_str(), "{report}");

    // What only the storage shows: the owner key, the listing, the quota totals.
    let storage = PostgresStorage::connect(&url).await.unwrap();
    assert_eq!(storage.relay_id(), relay_id);
    assert_eq!(
        storage.owner(bob.name.clone()).await.unwrap(),
        Some(bob.owner.public())
    );
    assert_eq!(
        storage.keys(erin.name.clone()).await.unwrap(),
        Some(erin_next.public().to_keys())
    );
    assert_eq!(
        storage.rotations(erin.name.clone()).await.unwrap(),
        vec![rotation]
    );
    let listed = storage.directory(10).await.unwrap();
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(
        (&listed[0].0, listed[0].2.as_str()),
        (&alice.name, "plans the releases")
    );
    assert_eq!(storage.waiting(bob.name.clone()).await.unwrap(), 3);
    assert_eq!(storage.total_waiting().await.unwrap(), 3);
    drop(storage);

    // The relay's key moved too: a node with a key of its own is refused.
    let stranger = mailslot::relay::Relay::start(mailslot::relay::RelayConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        db: Some(url.clone().into()),
        identity: Some(common::postgres::node_key(&url)),
        ..Default::default()
    })
    .await;
    let refused = stranger.err().expect("a node with another key is refused");
    assert!(
        refused.to_string().contains(fingerprint.as_str()),
        "{refused}"
    );

    // Two nodes on the database with the SQLite relay's key file: the same relay id and key,
    // so every client's hello and every pinned key still verify.
    let node = |url: String| {
        let key = mailslot::relay::identity_beside(&db);
        TestRelay::start(move |c| {
            c.db = Some(url.into());
            c.identity = Some(key);
            c.default_policy = Some(Policy::Contacts);
        })
    };
    let (one, two) = (node(url.clone()).await, node(url.clone()).await);
    assert_eq!(one.relay.relay_id(), relay_id);
    assert_eq!(two.relay.relay_id(), relay_id);
    assert_eq!(one.relay.fingerprint(), &fingerprint);

    // bob gets exactly the mail that waited for him, in order.
    let got = bob.sync(&two).await;
    assert_eq!(got.received, waiting, "{got:?}");
    assert_eq!(got.duplicates, 0, "{got:?}");

    // Consent holds: the contact still writes, the stranger is still refused, and the open
    // request still carries the code mallory's owner was shown.
    let after = alice.message(&[&bob], "after", "the move");
    let id = after.id;
    assert_eq!(alice.send(&one, after).await.sent, vec![id]);
    assert_eq!(bob.sync(&two).await.received, vec![id]);
    let refused = mallory
        .send(&one, mallory.message(&[&bob], "hi", "let me in"))
        .await;
    assert!(
        refused.not_sent.len() == 1 && refused.not_sent[0].1.contains("not_allowed"),
        "{refused:?}"
    );
    let mut mallory_conn = mallory.connect(&two).await;
    assert_eq!(outgoing_code(&mut mallory_conn).await, Some(mallory_code));
    mallory_conn.close().await;

    // carol's name is still held.
    let newcomer = TestAgent::new("carol");
    let err = Connection::connect(&one.url, &newcomer.name, &newcomer.identity, None)
        .await
        .err()
        .expect("the name is held");
    assert!(
        matches!(
            err,
            ClientError::Refused {
                code: ErrorCode::NameRetired,
                ..
            }
        ),
        "{err:?}"
    );

    // A second migration into the same database is refused, and says what to do instead.
    let again = migrate(&db, &url, false);
    let said = String::from_utf8_lossy(&again.stderr);
    assert!(!again.status.success(), "{said}");
    assert!(
        said.contains("already holds a relay (5 agents") && said.contains("empty database"),
        "{said}"
    );

    one.relay.shutdown().await;
    two.relay.shutdown().await;
}

#[test]
fn a_running_relay_is_not_migrated() {
    let running = RelayProcess::start("", None);
    // Refused before the target is reached: nothing listens on port 1.
    let out = migrate(
        &running.dir.path().join("relay.db"),
        "postgres://postgres:hunter2@127.0.0.1:1/mailslot",
        false,
    );
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{said}");
    assert!(
        said.contains("only while it is stopped") && said.contains("another relay already uses"),
        "{said}"
    );
    assert!(!said.contains("hunter2"), "{said}");
}

#[tokio::test]
async fn a_failed_migration_leaves_the_database_as_it_was() {
    let Some(cluster) = PgCluster::shared() else {
        return;
    };
    let url = cluster.create_database("failed_migrate").await;
    let (alice, bob) = (TestAgent::new("alice"), TestAgent::new("bob"));
    let snapshot = |fail: bool| {
        let agents = [&alice, &bob]
            .map(|a| AgentRecord {
                name: a.name.clone(),
                keys: a.identity.public().to_keys(),
                registered_at_ms: 0,
                policy: Some(Policy::Open),
                listing: None,
                owner: Some(a.owner.public()),
                retired_until_ms: None,
                rotations: Vec::new(),
            })
            .to_vec();
        let copy = WaitingCopy {
            recipient: bob.name.clone(),
            sender: alice.name.clone(),
            id: MessageId::new(),
            envelope: b"{}".to_vec(),
            accepted_at_ms: 0,
            expires_at_ms: i64::MAX,
        };
        // The second chunk fails to read, after the first was written.
        let mut chunks = vec![Ok(vec![copy])];
        if fail {
            chunks.push(Err(StorageError::Database("the spool broke".into())));
        }
        Snapshot {
            relay_id: "relay-0123456789abcdef".into(),
            relay_key: None,
            agents,
            invites: Vec::new(),
            relations: Vec::new(),
            requests: Vec::new(),
            bounces: Vec::new(),
            relay_pins: Vec::new(),
            damaged_records: 0,
            copies: Box::new(chunks.into_iter()),
        }
    };
    let failed = PostgresStorage::import(&url, snapshot(true)).await;
    assert!(
        failed
            .as_ref()
            .is_err_and(|e| e.to_string().contains("the spool broke")),
        "{:?}",
        failed.map(|_| ())
    );
    let storage = PostgresStorage::connect(&url).await.unwrap();
    let name = |n: &str| AgentName::new(n).unwrap();
    assert_eq!(storage.keys(name("alice")).await.unwrap(), None);
    assert_eq!(storage.total_waiting().await.unwrap(), 0);
    assert_ne!(storage.relay_id(), "relay-0123456789abcdef");
    drop(storage);

    // Still empty, so the move can be made again.
    let moved = PostgresStorage::import(&url, snapshot(false))
        .await
        .unwrap();
    assert_eq!((moved.agents, moved.copies), (2, 1));
    let storage = PostgresStorage::connect(&url).await.unwrap();
    assert_eq!(storage.relay_id(), "relay-0123456789abcdef");
    assert_eq!(storage.waiting(bob.name.clone()).await.unwrap(), 1);
}
