//! Federation, first slice: each relay's identity and discovery document, remote agents' keys
//! fetched from their own relay and pinned under the full address, a relay whose key changed
//! refused, and a local namesake never pinned for a remote address. Real relays on different
//! loopback ports, real clients.

use crate::common;

use std::os::unix::fs::PermissionsExt;

use common::*;
use mailslot::client::{ClientError, Received, discover, receive, resolve_keys};
use mailslot::crypto::seal;
use mailslot::protocol::{
    Address, ErrorCode, Limits, Message, RelayInfo, RelayName, SealedEnvelope,
};
use mailslot::store::{KeyCheck, Trust};

fn at(agent: &str, relay: &TestRelay) -> Address {
    Address::parse(&format!("{agent}@{}", relay.relay.name())).unwrap()
}

fn http() -> reqwest::Client {
    // The crate's reqwest brings no TLS provider of its own; plain HTTP needs one installed.
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        .no_proxy()
        .timeout(EVENT_TIMEOUT)
        .build()
        .unwrap()
}

/// The discovery document and its Cache-Control header.
async fn well_known(relay: &TestRelay) -> (RelayInfo, String) {
    let url = format!("http://{}/.well-known/mailslot", relay.relay.addr());
    let response = http().get(&url).send().await.unwrap();
    assert_eq!(response.status(), 200);
    let cache = response.headers()["cache-control"]
        .to_str()
        .unwrap()
        .to_owned();
    (response.json().await.unwrap(), cache)
}

#[tokio::test]
async fn the_discovery_document_is_served_and_stable_across_restarts() {
    let relay = TestRelay::start(|_| {}).await;
    let (info, cache) = well_known(&relay).await;
    let name = RelayName::new(&relay.relay.addr().to_string()).unwrap();
    assert_eq!(
        info.name, name,
        "without host set, the relay is its address"
    );
    assert_eq!(relay.relay.name(), &name);
    assert_eq!(&info.fingerprint, relay.relay.fingerprint());
    assert_eq!(info.version, 1);
    assert_eq!(info.websocket.as_str(), "/v1/ws");
    assert!(cache.contains("max-age="), "{cache}");
    assert_eq!(discover(&[], &name).await.unwrap(), info);

    let key_file = {
        let mut f = relay.db().into_os_string();
        f.push(".key");
        std::path::PathBuf::from(f)
    };
    let mode = std::fs::metadata(&key_file).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "{}", key_file.display());
    let text = std::fs::read_to_string(&key_file).unwrap();
    assert!(
        !text.contains(&info.key.to_base64()),
        "the file holds the private key, not the public one"
    );

    let relay = relay.stop().await.restart().await;
    let (again, _) = well_known(&relay).await;
    assert_eq!(again, info, "the same key and name after a restart");
    relay.relay.shutdown().await;
}

#[tokio::test]
async fn a_configured_host_names_the_relay_and_its_agents() {
    let host = RelayName::new("relay.example.com").unwrap();
    let relay = TestRelay::start(|c| c.host = Some(host.clone())).await;
    let (info, _) = well_known(&relay).await;
    assert_eq!(info.name, host);

    // bob@relay.example.com is bob on this relay: the send is accepted and delivered.
    let (alice, bob) = (TestAgent::new("alice"), TestAgent::new("bob"));
    bob.sync(&relay).await;
    let to = Address::remote(bob.name.clone(), host.clone());
    let message = Message::new(alice.address(), vec![to.clone()], "hi", "local");
    let id = message.id;
    let sent = alice.send(&relay, message).await;
    assert_eq!(sent.sent, vec![id], "{sent:?}");
    // Bob opens the wrap addressed to his full address as his own.
    let got = bob.sync(&relay).await;
    assert_eq!(got.received, vec![id], "{got:?}");
    // One agent, one pin, however its address is spelt: a key change under either spelling
    // meets the same pin (review finding F1).
    let contacts = alice.store.call(|s| s.contacts()).await.unwrap();
    let pinned: Vec<String> = contacts.iter().map(|c| c.address.to_string()).collect();
    assert_eq!(pinned, ["bob"], "{contacts:?}");
    relay.relay.shutdown().await;
}

#[tokio::test]
async fn a_remote_agents_keys_come_from_its_own_relay_pinned_under_the_full_address() {
    let (a, b) = (
        TestRelay::start(|_| {}).await,
        TestRelay::start(|_| {}).await,
    );
    let alice = TestAgent::new("alice");
    let (local_bob, remote_bob) = (TestAgent::new("bob"), TestAgent::new("bob"));
    local_bob.sync(&a).await;
    remote_bob.sync(&b).await;
    let mut conn = alice.connect(&a).await;

    let remote = at("bob", &b);
    let found = resolve_keys(&mut conn, &alice.store, &[], &remote)
        .await
        .unwrap();
    assert_eq!(&found.keys, remote_bob.identity.public());
    assert_eq!(found.check, KeyCheck::Pinned);
    assert_eq!(
        found.relay,
        Some((b.relay.name().clone(), b.relay.fingerprint().clone()))
    );
    let pinned = {
        let remote = remote.clone();
        alice
            .store
            .call(move |s| s.pinned_keys(&remote))
            .await
            .unwrap()
    };
    assert_eq!(pinned.as_ref(), Some(remote_bob.identity.public()));
    let relay_pin = {
        let name = b.relay.name().clone();
        alice
            .store
            .call(move |s| s.pinned_relay(&name))
            .await
            .unwrap()
            .unwrap()
    };
    assert_eq!(&relay_pin.fingerprint, b.relay.fingerprint());
    assert!(
        alice
            .store
            .call(|s| s.pinned_keys(&Address::parse("bob").unwrap()))
            .await
            .unwrap()
            .is_none(),
        "the remote bob is not the bare bob"
    );

    // A bare bob, and bob at alice's own relay, are the local bob.
    for local in [Address::parse("bob").unwrap(), at("bob", &a)] {
        let found = resolve_keys(&mut conn, &alice.store, &[], &local)
            .await
            .unwrap();
        assert_eq!(&found.keys, local_bob.identity.public(), "{local}");
        assert_eq!(found.relay, None);
    }

    // Unknown there: refused as B says, nothing pinned.
    let carol = at("carol", &b);
    let err = resolve_keys(&mut conn, &alice.store, &[], &carol)
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            ClientError::Refused {
                code: ErrorCode::UnknownAgent,
                ..
            }
        ),
        "{err}"
    );
    // A relay is known by the one name it publishes.
    let alias = Address::parse(&format!("bob@localhost:{}", b.relay.addr().port())).unwrap();
    let err = resolve_keys(&mut conn, &alice.store, &[], &alias)
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains(&format!("@{}", b.relay.name())), "{err}");
    for never in [carol, alias] {
        assert!(
            alice
                .store
                .call(move |s| s.pinned_keys(&never))
                .await
                .unwrap()
                .is_none()
        );
    }
    conn.close().await;
    a.relay.shutdown().await;
    b.relay.shutdown().await;
}

/// Every pin in `agent`'s store: address and fingerprint.
async fn pins(agent: &TestAgent) -> Vec<(String, String)> {
    let contacts = agent.store.call(|s| s.contacts()).await.unwrap();
    contacts
        .into_iter()
        .map(|c| (c.address.to_string(), c.fingerprint.to_string()))
        .collect()
}

#[tokio::test]
async fn a_local_impostor_is_never_pinned_for_a_remote_address() {
    let (a, b) = (
        TestRelay::start(|_| {}).await,
        TestRelay::start(|_| {}).await,
    );
    let (alice, impostor, remote_bob) = (
        TestAgent::new("alice"),
        TestAgent::new("bob"),
        TestAgent::new("bob"),
    );
    impostor.sync(&a).await;
    remote_bob.sync(&b).await;

    // To the remote bob alone, then beside the local one: each is sealed to its own keys
    // (whether relay A takes mail for B yet is the relay link's business, not this test's).
    let remote = at("bob", &b);
    let message = Message::new(
        alice.address(),
        vec![remote.clone()],
        "plan",
        "for bob at b",
    );
    alice.send(&a, message).await;
    let both = Message::new(
        alice.address(),
        vec![impostor.address(), remote.clone()],
        "plan",
        "both",
    );
    alice.send(&a, both).await;

    let mut pinned = pins(&alice).await;
    pinned.sort();
    let mut expected = vec![
        (
            "bob".to_owned(),
            impostor.identity.fingerprint().to_string(),
        ),
        (
            remote.to_string(),
            remote_bob.identity.fingerprint().to_string(),
        ),
    ];
    expected.sort();
    assert_eq!(
        pinned, expected,
        "the local bob is pinned as bob only, and {remote} has B's bob's keys"
    );
    a.relay.shutdown().await;
    b.relay.shutdown().await;
}

/// `letter` from `sender` sealed to `to` (the address on the key wrap and in the letter).
fn sealed(sender: &TestAgent, from: Address, to: Address, keys: &TestAgent) -> SealedEnvelope {
    let letter = Message::new(from, vec![to.clone()], "across", "sealed end to end");
    sealed_message(&letter, sender, to, keys)
}

#[tokio::test]
async fn a_remote_senders_keys_come_from_its_relay_and_a_local_namesake_is_never_pinned() {
    let (a, b) = (
        TestRelay::start(|_| {}).await,
        TestRelay::start(|_| {}).await,
    );
    let (bob, impostor, alice) = (
        TestAgent::new("bob"),
        TestAgent::new("alice"),
        TestAgent::new("alice"),
    );
    impostor.sync(&a).await;
    alice.sync(&b).await;
    let mut conn = bob.connect(&a).await;
    let alice_at_b = at("alice", &b);

    // The relay link delivers the copy as sealed: from alice's full address, wrapped for bob's.
    let envelope = sealed(&alice, alice_at_b.clone(), at("bob", &a), &bob);
    let id = envelope.id;
    let got = receive(
        &mut conn,
        &bob.store,
        &[],
        &bob.name,
        &bob.identity,
        envelope,
    )
    .await
    .unwrap();
    assert_eq!(
        got,
        Received::New {
            id,
            from: alice_at_b.clone(),
            trust: Trust::Verified
        }
    );
    let stored = bob
        .store
        .call(move |s| s.message(&id))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(stored.message.from, alice_at_b);
    assert_eq!(
        pins(&bob).await,
        [(
            alice_at_b.to_string(),
            alice.identity.fingerprint().to_string()
        )],
        "pinned under the full address with B's alice's keys; the local alice never"
    );

    // The local namesake signing as alice@B: refused against the pinned keys, nothing changes.
    let forged = sealed(
        &impostor,
        alice_at_b.clone(),
        Address::local(bob.name.clone()),
        &bob,
    );
    let got = receive(&mut conn, &bob.store, &[], &bob.name, &bob.identity, forged)
        .await
        .unwrap();
    assert!(matches!(got, Received::Unreadable { .. }), "{got:?}");
    assert_eq!(pins(&bob).await.len(), 1);

    // A wrap for bob at another relay is not for this bob.
    let elsewhere = sealed(&alice, alice_at_b.clone(), at("bob", &b), &bob);
    let got = receive(
        &mut conn,
        &bob.store,
        &[],
        &bob.name,
        &bob.identity,
        elsewhere,
    )
    .await
    .unwrap();
    match got {
        Received::Unreadable { reason, .. } => assert!(reason.contains("no key for"), "{reason}"),
        other => panic!("expected unreadable, got {other:?}"),
    }
    conn.close().await;
    a.relay.shutdown().await;
    b.relay.shutdown().await;
}

#[tokio::test]
async fn a_remote_senders_relay_out_of_reach_is_retried_and_an_unknown_sender_refused() {
    let (a, b) = (
        TestRelay::start(|_| {}).await,
        TestRelay::start(|_| {}).await,
    );
    let (bob, carol) = (TestAgent::new("bob"), TestAgent::new("carol"));
    let mut conn = bob.connect(&a).await;

    // A relay that is down: a port bound, then let go.
    let down = {
        let socket = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        socket.local_addr().unwrap()
    };
    let from = Address::parse(&format!("carol@{down}")).unwrap();
    let envelope = sealed(&carol, from.clone(), at("bob", &a), &bob);
    let kept = envelope.id;
    let got = receive(
        &mut conn,
        &bob.store,
        &[],
        &bob.name,
        &bob.identity,
        envelope,
    )
    .await
    .unwrap();
    match got {
        Received::Parked {
            from: f,
            id,
            reason,
        } => {
            assert_eq!((f, id), (from.clone(), kept));
            assert!(reason.contains(&down.to_string()), "{reason}");
        }
        other => panic!("expected a kept letter, got {other:?}"),
    }
    let waiting = bob.store.call(|s| s.parked_summary()).await.unwrap();
    assert_eq!(
        waiting,
        (1, vec![from.clone()]),
        "kept, so it can be acknowledged"
    );

    // B answers that carol does not exist there: for good, acknowledged as unreadable.
    let envelope = sealed(&carol, at("carol", &b), at("bob", &a), &bob);
    let id = envelope.id;
    let got = receive(
        &mut conn,
        &bob.store,
        &[],
        &bob.name,
        &bob.identity,
        envelope,
    )
    .await
    .unwrap();
    match got {
        Received::Unreadable {
            from, id: refused, ..
        } => assert_eq!((from, refused), (at("carol", &b), id)),
        other => panic!("expected unreadable, got {other:?}"),
    }
    assert!(pins(&bob).await.is_empty());
    let received = bob.store.call(|s| s.received_count(false)).await.unwrap();
    assert_eq!(received, 0, "nothing was stored");
    conn.close().await;
    a.relay.shutdown().await;
    b.relay.shutdown().await;
}

#[tokio::test]
async fn a_relay_presenting_a_changed_key_is_refused() {
    let (a, b) = (
        TestRelay::start(|_| {}).await,
        TestRelay::start(|_| {}).await,
    );
    let [_bob, carol] = b.agents(["bob", "carol"]).await;
    let alice = TestAgent::new("alice");
    let mut conn = alice.connect(&a).await;
    resolve_keys(&mut conn, &alice.store, &[], &at("bob", &b))
        .await
        .unwrap();
    let (name, old) = (b.relay.name().clone(), b.relay.fingerprint().clone());

    // Relay B comes back on the same address with a new key file.
    let stopped = b.stop().await;
    let b = stopped.restart_with_a_new_key().await;
    let new = b.relay.fingerprint().clone();
    assert_ne!(new, old);
    assert_eq!(b.relay.name(), &name);

    let carol_at_b = at("carol", &b);
    let err = resolve_keys(&mut conn, &alice.store, &[], &carol_at_b)
        .await
        .unwrap_err();
    match &err {
        ClientError::RelayKeyChanged {
            relay,
            pinned,
            presented,
        } => {
            assert_eq!((relay, pinned, presented), (&name, &old, &new));
        }
        other => panic!("expected a changed relay key, got {other}"),
    }
    let text = err.to_string();
    for part in [
        name.as_str(),
        old.as_str(),
        new.as_str(),
        "mailslot trust-relay",
    ] {
        assert!(text.contains(part), "{part} missing from: {text}");
    }
    let (relay_pin, carol_pin) = {
        let (name, carol) = (name.clone(), carol_at_b.clone());
        alice
            .store
            .call(move |s| Ok((s.pinned_relay(&name)?, s.pinned_keys(&carol)?)))
            .await
            .unwrap()
    };
    assert_eq!(relay_pin.unwrap().fingerprint, old, "the old key stays");
    assert!(
        carol_pin.is_none(),
        "nothing vouched by the new key is pinned"
    );

    // Once the owner trusts the new key, its answers are read again.
    let info = discover(&[], &name).await.unwrap();
    alice
        .store
        .call(move |s| s.trust_relay(&info.name, &info.key))
        .await
        .unwrap();
    let found = resolve_keys(&mut conn, &alice.store, &[], &carol_at_b)
        .await
        .unwrap();
    assert_eq!(&found.keys, carol.identity.public());
    conn.close().await;
    a.relay.shutdown().await;
    b.relay.shutdown().await;
}

/// Runs `mailslot ARGS` for the agents in `home` against `relay`; its output, success or not.
async fn cli(home: &std::path::Path, relay: &TestRelay, args: &[&str]) -> std::process::Output {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_mailslot"))
        .args(args)
        .env_clear()
        .env("MAILSLOT_HOME", home)
        .env("MAILSLOT_RELAY", relay.url.as_str())
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_pins_remote_keys_and_trusts_a_new_relay_key_only_as_confirmed() {
    let (a, b) = (
        TestRelay::start(|_| {}).await,
        TestRelay::start(|_| {}).await,
    );
    let bob = TestAgent::new("bob");
    bob.sync(&b).await;
    let home = a.home(&["alice"]);
    let bob_at_b = at("bob", &b).to_string();

    let out = cli(
        home.path(),
        &a,
        &["--agent", "alice", "--json", "keys", &bob_at_b],
    )
    .await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let shown: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(shown["address"], bob_at_b.as_str());
    assert_eq!(shown["status"], "pinned");
    assert_eq!(shown["fingerprint"], bob.identity.fingerprint().as_str());
    assert_eq!(shown["relay"]["name"], b.relay.name().as_str());
    assert_eq!(
        shown["relay"]["fingerprint"],
        b.relay.fingerprint().as_str()
    );

    // `doctor` checks every relay met: B answers with the key pinned for it.
    let other = |out: &std::process::Output| -> serde_json::Value {
        let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        report["checks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == "other relay")
            .cloned()
            .unwrap_or_else(|| panic!("no other-relay check: {report}"))
    };
    let doctor = ["--agent", "alice", "--json", "doctor"];
    let check = other(&cli(home.path(), &a, &doctor).await);
    assert_eq!(check["outcome"], "ok", "{check}");
    assert!(
        check["detail"]
            .as_str()
            .unwrap()
            .contains(b.relay.fingerprint().as_str()),
        "{check}"
    );

    let stopped = b.stop().await;
    let b = stopped.restart_with_a_new_key().await;
    let (name, new) = (
        b.relay.name().to_string(),
        b.relay.fingerprint().to_string(),
    );
    let out = cli(home.path(), &a, &doctor).await;
    assert!(!out.status.success(), "a changed relay key fails doctor");
    let check = other(&out);
    assert_eq!(check["outcome"], "fail", "{check}");
    assert!(check["detail"].as_str().unwrap().contains(&new), "{check}");
    assert!(
        check["fix"].as_str().unwrap().contains("trust-relay"),
        "{check}"
    );

    let out = cli(home.path(), &a, &["--agent", "alice", "keys", &bob_at_b]).await;
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("RELAY KEY CHANGED") && err.contains(&new) && err.contains("trust-relay"),
        "{err}"
    );

    let wrong = a.relay.fingerprint().to_string();
    let args = ["--agent", "alice", "trust-relay", &name, "--fingerprint"];
    let out = cli(home.path(), &a, &[&args[..], &[wrong.as_str()]].concat()).await;
    assert!(!out.status.success(), "a fingerprint other than presented");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("nothing was changed"), "{err}");
    let out = cli(home.path(), &a, &[&args[..], &[new.as_str()]].concat()).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let out = cli(
        home.path(),
        &a,
        &["--agent", "alice", "--json", "keys", &bob_at_b],
    )
    .await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let shown: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(shown["status"], "matches");
    assert_eq!(shown["relay"]["fingerprint"], new.as_str());
    a.relay.shutdown().await;
    b.relay.shutdown().await;
}

/// Runs `mailslot ARGS --json` for the agents in `home` against `relay` and parses what it
/// prints; fails the test when the command fails.
async fn cli_json(home: &std::path::Path, relay: &TestRelay, args: &[&str]) -> serde_json::Value {
    let out = cli(home, relay, &[&["--json"], args].concat()).await;
    assert!(
        out.status.success(),
        "mailslot {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alice_at_a_and_bob_at_b_write_and_reply_through_mcp_sessions() {
    use common::mcp::{Era, send_args, spawn_mcp};
    // Loopback relays reach each other over plain HTTP and WebSocket without configuration.
    let (a, b) = (
        TestRelay::start(|_| {}).await,
        TestRelay::start(|_| {}).await,
    );
    let (alice_home, bob_home) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let mut alice = spawn_mcp(alice_home.path(), "alice", &a.url, Era::Legacy).await;
    let mut bob = spawn_mcp(bob_home.path(), "bob", &b.url, Era::Legacy).await;
    // Both are registered once their sessions answer.
    alice.ok("recall", serde_json::json!({})).await;
    bob.ok("recall", serde_json::json!({})).await;
    let (alice_full, bob_full) = (at("alice", &a).to_string(), at("bob", &b).to_string());

    let sent = alice
        .ok(
            "send",
            send_args(&[&bob_full], "status?", "How far is the build?"),
        )
        .await;
    assert_eq!(sent["status"], "sent", "{sent}");
    let event = bob.channel_event().await;
    let meta = &event["meta"];
    assert_eq!(meta["from"], alice_full.as_str(), "{event}");
    assert_eq!(meta["message_id"], sent["message_id"]);
    assert_eq!(meta["trust"], "verified", "checked against the key from A");
    assert!(
        event["content"]
            .as_str()
            .unwrap()
            .contains("How far is the build?")
    );

    let reply = bob
        .ok(
            "reply",
            serde_json::json!({ "message_id": sent["message_id"], "body": "80 %" }),
        )
        .await;
    assert_eq!(reply["status"], "sent", "{reply}");
    assert_eq!(reply["thread_id"], sent["thread_id"]);
    let back = alice.channel_event().await;
    assert_eq!(back["meta"]["from"], bob_full.as_str(), "{back}");
    assert_eq!(back["meta"]["trust"], "verified");
    assert_eq!(back["meta"]["thread_id"], sent["thread_id"]);
    assert!(
        back["content"]
            .as_str()
            .unwrap()
            .contains("Subject: Re: status?")
    );
    a.relay.shutdown().await;
    b.relay.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alice_at_a_and_bob_at_b_write_and_reply_through_the_cli_exactly_once() {
    let (a, b) = (
        TestRelay::start(|_| {}).await,
        TestRelay::start(|_| {}).await,
    );
    let (alice_home, bob_home) = (a.home(&["alice"]), b.home(&["bob"]));
    let (alice_full, bob_full) = (at("alice", &a).to_string(), at("bob", &b).to_string());
    let (alice_home, bob_home) = (alice_home.path(), bob_home.path());

    let sent = cli_json(
        alice_home,
        &a,
        &[
            "--agent",
            "alice",
            "send",
            "--to",
            &bob_full,
            "--subject",
            "plan",
            "--body",
            "friday",
        ],
    )
    .await;
    assert_eq!(sent["status"], "sent", "{sent}");
    let id = sent["id"].as_str().unwrap().to_owned();

    // The relay link delivers in the background: sync until it is there.
    let deadline = tokio::time::Instant::now() + EVENT_TIMEOUT;
    let mut received = Vec::new();
    while received.is_empty() {
        assert!(tokio::time::Instant::now() < deadline, "bob never got {id}");
        let got = cli_json(bob_home, &b, &["--agent", "bob", "sync"]).await;
        assert_eq!(got["unreadable"], serde_json::json!([]), "{got}");
        received = got["received"].as_array().unwrap().clone();
        if received.is_empty() {
            // Waiting on the other relay, not on a clock: the next sync asks again.
            tokio::task::yield_now().await;
        }
    }
    assert_eq!(received, [serde_json::json!(id)], "exactly once");
    // The sender's views read mail that went to another relay, once it is delivered too.
    let deadline = tokio::time::Instant::now() + EVENT_TIMEOUT;
    loop {
        let got = cli_json(alice_home, &a, &["--agent", "alice", "sync"]).await;
        if got["delivered"].as_array().is_some_and(|d| !d.is_empty()) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "alice never heard that bob took {id}: {got}"
        );
        tokio::task::yield_now().await;
    }
    let sent_view = cli_json(alice_home, &a, &["--agent", "alice", "sent"]).await;
    let entry = &sent_view.as_array().unwrap()[0];
    assert_eq!(entry["state"], "delivered", "{sent_view}");
    assert_eq!(
        entry["recipients"][0]["to"],
        bob_full.as_str(),
        "{sent_view}"
    );
    assert_eq!(entry["recipients"][0]["state"], "delivered", "{sent_view}");
    for view in [&["read", &id][..], &["thread", &id], &["search", "friday"]] {
        let shown = cli_json(alice_home, &a, &[&["--agent", "alice"], view].concat()).await;
        assert!(shown.to_string().contains(&id), "{view:?}: {shown}");
    }
    let doctor = cli(alice_home, &a, &["--agent", "alice", "doctor"]).await;
    assert!(
        String::from_utf8_lossy(&doctor.stdout).contains("integrity ok"),
        "{}",
        String::from_utf8_lossy(&doctor.stdout)
    );
    let shown = cli_json(bob_home, &b, &["--agent", "bob", "read", &id]).await;
    assert_eq!(shown["message"]["from"], alice_full.as_str(), "{shown}");
    assert_eq!(shown["trust"], "verified", "{shown}");

    let reply = cli_json(
        bob_home,
        &b,
        &["--agent", "bob", "reply", &id, "--body", "friday works"],
    )
    .await;
    assert_eq!(reply["status"], "sent", "{reply}");
    let deadline = tokio::time::Instant::now() + EVENT_TIMEOUT;
    loop {
        assert!(
            tokio::time::Instant::now() < deadline,
            "alice never got the reply"
        );
        let got = cli_json(alice_home, &a, &["--agent", "alice", "sync"]).await;
        if let Some(first) = got["received"].as_array().unwrap().first() {
            let back = first.as_str().unwrap().to_owned();
            let shown = cli_json(alice_home, &a, &["--agent", "alice", "read", &back]).await;
            assert_eq!(shown["message"]["from"], bob_full.as_str(), "{shown}");
            assert_eq!(shown["message"]["in_reply_to"], id.as_str(), "{shown}");
            break;
        }
        tokio::task::yield_now().await;
    }
    // Nothing more for bob: the first copy was taken once.
    let again = cli_json(bob_home, &b, &["--agent", "bob", "sync"]).await;
    assert_eq!(again["received"], serde_json::json!([]), "{again}");
    a.relay.shutdown().await;
    b.relay.shutdown().await;
}

/// `message` from `sender`, sealed to `to` with `keys`' public keys.
fn sealed_message(
    message: &Message,
    sender: &TestAgent,
    to: Address,
    keys: &TestAgent,
) -> SealedEnvelope {
    seal(
        message,
        &sender.identity,
        &[(to, keys.identity.public().clone())],
        &Limits::default(),
    )
    .unwrap()
    .remove(0)
}

#[tokio::test]
async fn a_receipt_counts_only_from_the_exact_address_the_mail_went_to() {
    use mailslot::protocol::{Receipt, ReceiptKind};
    let (a, b) = (
        TestRelay::start(|_| {}).await,
        TestRelay::start(|_| {}).await,
    );
    let alice = TestAgent::new("alice");
    // bob and x here on A; a namesake bob and the real x on B.
    let (bob, x_here) = (TestAgent::new("bob"), TestAgent::new("x"));
    let (bob_there, x) = (TestAgent::new("bob"), TestAgent::new("x"));
    for agent in [&alice, &bob, &x_here] {
        agent.sync(&a).await;
    }
    for agent in [&bob_there, &x] {
        agent.sync(&b).await;
    }
    let sent = Message::new(
        alice.address(),
        vec![Address::local(bob.name.clone()), at("x", &b)],
        "plan",
        "ok?",
    );
    let (of, thread) = (sent.id, sent.thread);
    alice
        .store
        .call(move |s| s.insert_message(&sent, mailslot::store::Direction::Out, Trust::Verified))
        .await
        .unwrap();
    let ack = |answer: &str| Receipt {
        of,
        kind: ReceiptKind::Acknowledged,
        answer: Some(answer.into()),
    };
    let mut conn = alice.connect(&a).await;
    let mut give = async |giver: &TestAgent, from: Address, answer: &str| {
        let receipt = Message::receipt(from, alice.address(), thread, ack(answer));
        let envelope = sealed_message(&receipt, giver, alice.address(), &alice);
        receive(
            &mut conn,
            &alice.store,
            &[],
            &alice.name,
            &alice.identity,
            envelope,
        )
        .await
        .unwrap()
    };
    // The namesakes first: neither answers for the agent the mail went to.
    let got = give(&bob_there, at("bob", &b), "bob at B agrees").await;
    assert!(
        matches!(&got, Received::Unreadable { reason, .. } if reason.contains("not one of its recipients")),
        "{got:?}"
    );
    let got = give(&x_here, x_here.address(), "local x agrees").await;
    assert!(
        matches!(&got, Received::Unreadable { reason, .. } if reason.contains("not one of its recipients")),
        "{got:?}"
    );
    // The real ones count, each under the address the mail went to.
    let got = give(&bob, bob.address(), "bob agrees").await;
    assert!(
        matches!(&got, Received::Receipt { record, .. } if record.recipient == bob.address()),
        "{got:?}"
    );
    let got = give(&x, at("x", &b), "x agrees").await;
    assert!(
        matches!(&got, Received::Receipt { record, .. } if record.recipient == at("x", &b)),
        "{got:?}"
    );
    let stored = alice
        .store
        .call(move |s| s.message(&of))
        .await
        .unwrap()
        .unwrap();
    let answers: Vec<(String, String)> = stored
        .receipts
        .iter()
        .map(|r| (r.recipient.to_string(), r.answer.clone().unwrap()))
        .collect();
    let mut expected = vec![
        ("bob".to_owned(), "bob agrees".to_owned()),
        (at("x", &b).to_string(), "x agrees".to_owned()),
    ];
    let mut answers = answers;
    answers.sort();
    expected.sort();
    assert_eq!(answers, expected);
    conn.close().await;
    a.relay.shutdown().await;
    b.relay.shutdown().await;
}

#[tokio::test]
async fn a_relay_that_does_not_answer_for_its_senders_keys_holds_up_nothing_else() {
    let (a, b) = (
        TestRelay::start(|_| {}).await,
        TestRelay::start(|_| {}).await,
    );
    let [alice, bob] = a.agents(["alice", "bob"]).await;
    let carol = TestAgent::new("carol");
    carol.sync(&b).await;
    // carol's letter crosses to A; B is gone before bob asks it for carol's keys.
    let letter = Message::new(carol.address(), vec![at("bob", &a)], "from b", "across");
    let kept = letter.id;
    carol.send(&b, letter).await;
    wait_until(EVENT_TIMEOUT, "A took carol's letter", async || {
        (!carol.sync(&b).await.delivered.is_empty()).then_some(())
    })
    .await;
    let stopped = b.stop().await;
    let mut local = Vec::new();
    for i in 0..3 {
        let m = alice.message(&[&bob], &format!("local {i}"), "here");
        local.push(m.id);
        alice.send(&a, m).await;
    }
    let report = bob.sync(&a).await;
    let mut received = report.received.clone();
    received.sort();
    local.sort();
    assert_eq!(
        received, local,
        "mail behind the letter arrives: {report:?}"
    );
    assert_eq!(report.parked.len(), 1, "{report:?}");
    assert_eq!(report.parked[0].1, kept);
    assert_eq!(report.waiting, 1);
    // Acknowledged: the relay does not send it again.
    let again = bob.sync(&a).await;
    assert!(
        again.received.is_empty() && again.parked.is_empty(),
        "{again:?}"
    );
    assert_eq!(again.waiting, 1);

    // B answers again: the letter opens, verified against carol's keys from B.
    let b = stopped.restart().await;
    let report = bob.sync(&a).await;
    assert_eq!(report.received, [kept], "{report:?}");
    assert_eq!(report.waiting, 0);
    let stored = bob
        .store
        .call(move |s| s.message(&kept))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(stored.message.from, at("carol", &b));
    assert_eq!(stored.trust, Trust::Verified);
    a.relay.shutdown().await;
    b.relay.shutdown().await;
}
