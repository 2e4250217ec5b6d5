//! Key rotation against a real relay and the real CLI: new keys signed by the old ones are
//! re-pinned by peers without a word; keys that nothing signed stay an alarm until the owner
//! accepts them.

use crate::common;

use std::path::Path;

use common::{TestAgent, TestRelay, mailslot_cli};
use mailslot::agent::Agent;
use mailslot::config::Paths;
use mailslot::protocol::AgentName;
use serde_json::Value;

async fn cli_json(home: &Path, relay: &TestRelay, agent: &str, args: &[&str]) -> Value {
    let mut all = vec!["--agent", agent, "--json"];
    all.extend_from_slice(args);
    let out = mailslot_cli(home, relay.url.as_str(), &all).await;
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{args:?}: {e}: {out}"))
}

async fn send(home: &Path, relay: &TestRelay, from: &str, to: &str, subject: &str) -> String {
    let sent = cli_json(
        home,
        relay,
        from,
        &["send", "--to", to, "--subject", subject, "--body", "text"],
    )
    .await;
    assert_eq!(sent["status"], "sent", "{sent}");
    sent["id"].as_str().unwrap().to_owned()
}

/// What `read` says of one message: its trust.
async fn trust_of(home: &Path, relay: &TestRelay, agent: &str, id: &str) -> Value {
    cli_json(home, relay, agent, &["read", id]).await["trust"].clone()
}

fn open(home: &Path, name: &str) -> Agent {
    let paths = Paths::new(Some(home.to_owned()), None).unwrap();
    Agent::open_or_create(&paths, &AgentName::new(name).unwrap())
        .unwrap()
        .0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signed_rotation_is_followed_silently_and_old_mail_still_opens() {
    let relay = TestRelay::start(|_| {}).await;
    let home = tempfile::tempdir().unwrap();
    let home = home.path();
    for name in ["alice", "bob"] {
        cli_json(home, &relay, name, &["init"]).await;
    }
    // Each pins the other.
    send(home, &relay, "alice", "bob", "before").await;
    cli_json(home, &relay, "bob", &["sync"]).await;
    let before = open(home, "bob").identity.fingerprint();

    let rotated = cli_json(home, &relay, "bob", &["rotate-keys"]).await;
    assert_eq!(rotated["old"], before.as_str());
    let new = rotated["new"].as_str().unwrap().to_owned();
    assert_ne!(new, before.as_str());
    assert_eq!(open(home, "bob").identity.fingerprint().as_str(), new);
    assert_eq!(rotated["announced"][0]["peer"], "alice");
    assert_eq!(rotated["announced"][0]["status"], "sent", "{rotated}");

    // Alice has not heard yet: her mail is sealed to bob's old keys, and bob still opens it.
    let to_old = send(home, &relay, "alice", "bob", "sealed to the old keys").await;
    let synced = cli_json(home, &relay, "bob", &["sync"]).await;
    assert!(synced.to_string().contains(&to_old), "{synced}");
    assert_eq!(trust_of(home, &relay, "bob", &to_old).await, "verified");

    // Alice takes the announcement: the pin moves, and no change is recorded.
    cli_json(home, &relay, "alice", &["sync"]).await;
    let alice = open(home, "alice");
    let bob_addr = "bob".parse().unwrap();
    let pinned = alice.store.contact(&bob_addr).unwrap().unwrap();
    assert_eq!(pinned.fingerprint.as_str(), new);
    assert_eq!(pinned.key_changes, 0, "a signed rotation is no alarm");
    drop(alice);
    let after = send(home, &relay, "bob", "alice", "signed by the new keys").await;
    cli_json(home, &relay, "alice", &["sync"]).await;
    assert_eq!(trust_of(home, &relay, "alice", &after).await, "verified");
    // The rotation notice is no mail.
    let inbox = cli_json(home, &relay, "alice", &["inbox", "--all"]).await;
    assert_eq!(inbox.as_array().unwrap().len(), 1, "{inbox}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unsigned_key_change_stays_an_alarm_until_the_owner_trusts_the_fingerprint() {
    let relay = TestRelay::start(|_| {}).await;
    let home = tempfile::tempdir().unwrap();
    let home = home.path();
    cli_json(home, &relay, "alice", &["init"]).await;
    let carol = TestAgent::new("carol");
    carol.connect(&relay).await.close().await;
    send(home, &relay, "alice", "carol", "pins carol").await;

    // Carol's owner lost her key: the operator releases the name on the stopped relay (the
    // documented procedure), and whoever registers it next has keys nothing signed.
    let stopped = relay.stop().await;
    let db = stopped.db();
    let released = mailslot_cli(
        home,
        "ws://127.0.0.1:9",
        &[
            "--json",
            "relay",
            "release",
            "carol",
            "--db",
            db.to_str().unwrap(),
        ],
    )
    .await;
    let released: Value = serde_json::from_str(&released).unwrap();
    assert_eq!(released["agent"], "carol");
    let relay = stopped.restart().await;
    let impostor = TestAgent::new("carol");
    let alice_addr = "alice".parse().unwrap();
    let mail = mailslot::protocol::Message::new(
        impostor.address(),
        vec![alice_addr],
        "from the new carol",
        "trust me",
    );
    let id = mail.id.to_string();
    impostor.send(&relay, mail).await;
    cli_json(home, &relay, "alice", &["sync"]).await;
    assert_eq!(trust_of(home, &relay, "alice", &id).await, "key_changed");
    let carol_addr = "carol".parse().unwrap();
    let contact = open(home, "alice")
        .store
        .contact(&carol_addr)
        .unwrap()
        .unwrap();
    assert_eq!(
        contact.fingerprint,
        carol.identity.fingerprint(),
        "the pin stays"
    );
    assert_eq!(contact.key_changes, 1);

    // Only the owner settles it: without a terminal there is no passphrase, and nothing moves.
    let presented = impostor.identity.fingerprint();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_mailslot"))
        .args([
            "--agent",
            "alice",
            "contacts",
            "trust",
            "carol",
            "--fingerprint",
        ])
        .arg(presented.as_str())
        .env_clear()
        .env("MAILSLOT_HOME", home)
        .env("MAILSLOT_RELAY", relay.url.as_str())
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("terminal") || err.contains("owner init"),
        "{err}"
    );
    // A fingerprint carol never presented is refused, naming the one she did.
    let mut alice = open(home, "alice");
    let wrong = TestAgent::new("x").identity.fingerprint();
    let refused = mailslot::mailbox::trust_presented_key(&mut alice, &carol_addr, &wrong)
        .unwrap_err()
        .to_string();
    assert!(refused.contains(presented.as_str()), "{refused}");
    // The owner's word (what the CLI does after the passphrase) moves the pin.
    let was = mailslot::mailbox::trust_presented_key(&mut alice, &carol_addr, &presented).unwrap();
    assert_eq!(was, carol.identity.fingerprint());
    let contact = alice.store.contact(&carol_addr).unwrap().unwrap();
    assert_eq!(contact.fingerprint, presented);
    assert_eq!(contact.key_changes, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_relay_takes_a_rotation_only_signed_by_the_registered_keys_for_the_session() {
    use mailslot::client::ClientError;
    use mailslot::crypto::{Identity, sign_rotation};
    use mailslot::protocol::ErrorCode;
    let relay = TestRelay::start(|_| {}).await;
    let bob = TestAgent::new("bob");
    let carol = TestAgent::new("carol");
    carol.connect(&relay).await.close().await;
    let mut conn = bob.connect(&relay).await;
    let next = Identity::generate();
    let refused = |r: Result<String, ClientError>| match r {
        Err(ClientError::Refused { code, message, .. }) => {
            assert_eq!(code, ErrorCode::BadRotation, "{message}");
            message
        }
        other => panic!("expected a refusal, got {other:?}"),
    };
    // Signed by keys that are not bob's registered ones.
    let stranger = Identity::generate();
    let mut forged = sign_rotation(&bob.name, &stranger, &next);
    forged.old = bob.identity.public().to_keys();
    let why = refused(conn.rotate_keys(forged).await);
    assert!(why.contains("old_signature"), "{why}");
    // Carol's statement on bob's session.
    let why = refused(
        conn.rotate_keys(sign_rotation(&carol.name, &carol.identity, &next))
            .await,
    );
    assert!(why.contains("carol"), "{why}");
    // Bob's own goes through once; the same statement again finds other keys registered.
    let own = sign_rotation(&bob.name, &bob.identity, &next);
    conn.rotate_keys(own.clone()).await.unwrap();
    refused(conn.rotate_keys(own.clone()).await);
    let (keys, chain) = conn.lookup_with_rotations(&bob.name).await.unwrap();
    assert_eq!(keys, next.public().to_keys());
    assert_eq!(chain, vec![own]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_mcp_session_follows_a_signed_rotation_without_an_alarm() {
    use common::mcp::{Era, spawn_mcp};
    use serde_json::json;
    let relay = TestRelay::start(|_| {}).await;
    let home = tempfile::tempdir().unwrap();
    let home = home.path();
    // Both registered before alice's session starts, so bob's first send cannot race it.
    for name in ["alice", "bob"] {
        cli_json(home, &relay, name, &["init"]).await;
    }
    let mut alice = spawn_mcp(home, "alice", &relay.url, Era::Legacy).await;
    // Bob pins alice by writing to her; her session pins bob by opening it.
    let before = send(home, &relay, "bob", "alice", "before").await;
    let rung = alice.channel_event().await;
    assert_eq!(rung["meta"]["message_id"], before.as_str());
    let old = open(home, "bob").identity.fingerprint();
    let whois = alice.ok("whois", json!({ "address": "bob" })).await;
    assert_eq!(whois["fingerprint"], old.as_str(), "{whois}");

    let rotated = cli_json(home, &relay, "bob", &["rotate-keys"]).await;
    assert_eq!(rotated["announced"][0]["status"], "sent", "{rotated}");
    let new = rotated["new"].as_str().unwrap().to_owned();
    let after = send(home, &relay, "bob", "alice", "after").await;

    // The notice rings nothing: the next event is bob's mail, signed by his new keys and
    // verified against the pin the notice moved.
    let rung = alice.channel_event().await;
    assert_eq!(rung["meta"]["message_id"], after.as_str(), "{rung}");
    assert_eq!(rung["meta"]["trust"], "verified", "{rung}");
    let read = alice.ok("read", json!({ "message_id": after })).await;
    assert_eq!(read["trust"], "verified", "{read}");
    let whois = alice.ok("whois", json!({ "address": "bob" })).await;
    assert_eq!(whois["fingerprint"], new.as_str(), "{whois}");
    assert!(whois.get("key_warning").is_none(), "{whois}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_on_another_relay_is_followed_only_through_a_rotation_its_pinned_keys_signed() {
    use common::{EVENT_TIMEOUT, wait_until};
    use mailslot::crypto::{Identity, sign_rotation};
    use mailslot::protocol::{Address, Message};
    use mailslot::store::Trust;
    let (a, b) = (
        TestRelay::start(|_| {}).await,
        TestRelay::start(|_| {}).await,
    );
    let (alice, ivy) = (TestAgent::new("alice"), TestAgent::new("ivy"));
    alice.sync(&a).await;
    ivy.sync(&b).await;
    let alice_at = Address::remote(alice.name.clone(), a.relay.name().clone());
    let ivy_at = Address::remote(ivy.name.clone(), b.relay.name().clone());
    // alice pins ivy@B's keys on her first letter.
    let hello = Message::new(ivy_at.clone(), vec![alice_at.clone()], "hello", "first");
    assert_eq!(ivy.send(&b, hello.clone()).await.sent, [hello.id]);
    wait_until(EVENT_TIMEOUT, "alice gets ivy's first letter", async || {
        (alice.sync(&a).await.received == [hello.id]).then_some(())
    })
    .await;

    // ivy moves to new keys at B, properly signed there.
    let next = Identity::generate();
    let genuine = sign_rotation(&ivy.name, &ivy.identity, &next);
    let mut conn = ivy.connect(&b).await;
    conn.rotate_keys(genuine.clone()).await.unwrap();
    conn.close().await;
    // What ivy sends next is signed by the new keys: first a statement the pinned keys never
    // signed, then a letter without one, then the genuine announcement, then a letter.
    let mut forged = sign_rotation(&ivy.name, &Identity::generate(), &next);
    forged.old = ivy.identity.public().to_keys();
    let letters = [
        Message::rotation(ivy_at.clone(), alice_at.clone(), forged),
        Message::new(ivy_at.clone(), vec![alice_at.clone()], "unexplained", "x"),
        Message::rotation(ivy_at.clone(), alice_at.clone(), genuine),
        Message::new(ivy_at.clone(), vec![alice_at.clone()], "explained", "y"),
    ];
    for m in &letters {
        let m = m.clone();
        ivy.store.call(move |s| s.queue_outgoing(&m)).await.unwrap();
    }
    let sent = mailslot::client::sync(&b.url, &ivy.name, &next, None, &ivy.store)
        .await
        .unwrap();
    assert_eq!(sent.sent.len(), 4, "{sent:?}");
    let (mut rotated, mut received) = (Vec::new(), Vec::new());
    wait_until(EVENT_TIMEOUT, "alice gets ivy's letters", async || {
        let report = alice.sync(&a).await;
        rotated.extend(report.rotated);
        received.extend(report.received);
        (received.len() == 2).then_some(())
    })
    .await;
    assert_eq!(rotated, [(ivy_at.clone(), false), (ivy_at.clone(), true)]);
    let trust = |id| {
        let store = alice.store.clone();
        async move {
            store
                .call(move |s| s.message(&id))
                .await
                .unwrap()
                .unwrap()
                .trust
        }
    };
    assert_eq!(trust(letters[1].id).await, Trust::KeyChanged);
    assert_eq!(trust(letters[3].id).await, Trust::Verified);
    let pinned = alice
        .store
        .call(move |s| s.contact(&ivy_at))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(pinned.fingerprint, next.fingerprint());
}
