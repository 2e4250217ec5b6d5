//! Relay-to-relay delivery: real relays on different loopback ports deliver each other's mail
//! over the link, exactly once, through an outage of the receiving relay and a `kill -9` of
//! the sending one, and bounce what the other relay is never there to take; a relay that
//! speaks for another relay's agents is refused; owners on both sides decide who may write.

use crate::common;

use std::collections::HashSet;
use std::sync::Arc;

use common::*;
use mailslot::protocol::{Address, Message, MessageId, RelayName};

fn at(agent: &TestAgent, relay: &TestRelay) -> Address {
    Address::remote(agent.name.clone(), relay.relay.name().clone())
}

/// Syncs `agent` until it has received `n` messages in all; returns their ids in order.
async fn receive(
    agent: &TestAgent,
    relay: &TestRelay,
    n: usize,
) -> Vec<mailslot::protocol::MessageId> {
    let mut got = Vec::new();
    let deadline = tokio::time::Instant::now() + EVENT_TIMEOUT * 4;
    while got.len() < n {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} got {} of {n}",
            agent.name,
            got.len()
        );
        let report = agent.sync(relay).await;
        assert!(report.unreadable.is_empty(), "{:?}", report.unreadable);
        got.extend(report.received);
        if got.len() < n {
            // The link delivers in the background; the next sync asks again.
            tokio::task::yield_now().await;
        }
    }
    got
}

/// Syncs `agent` until the relay reports a bounce; returns it.
async fn bounced(agent: &TestAgent, relay: &TestRelay) -> mailslot::protocol::Bounce {
    let deadline = tokio::time::Instant::now() + EVENT_TIMEOUT * 2;
    loop {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no bounce for {}",
            agent.name
        );
        if let Some(bounce) = agent.sync(relay).await.bounced.first() {
            return bounce.clone();
        }
        // The links and the expiry run in the background; the next sync asks again.
        tokio::task::yield_now().await;
    }
}

/// Two relays (A set up by `a`, B by `b`), alice registered at A and bob at B, and their
/// full addresses.
async fn pair(
    a: impl FnOnce(&mut mailslot::relay::RelayConfig),
    b: impl FnOnce(&mut mailslot::relay::RelayConfig),
) -> (TestRelay, TestRelay, TestAgent, TestAgent, Address, Address) {
    let (a, b) = (TestRelay::start(a).await, TestRelay::start(b).await);
    let (alice, bob) = (TestAgent::new("alice"), TestAgent::new("bob"));
    alice.sync(&a).await;
    bob.sync(&b).await;
    let (alice_at, bob_at) = (at(&alice, &a), at(&bob, &b));
    (a, b, alice, bob, alice_at, bob_at)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mail_accepted_while_the_other_relay_is_down_is_delivered_once_when_it_is_back() {
    let (a, b, alice, bob, alice_at, bob_at) = pair(|c| c.expiry_interval_secs = 1, |_| {}).await;

    // The first message, with B up, pins bob@B's keys at alice.
    let first = Message::new(alice_at.clone(), vec![bob_at.clone()], "hello", "0");
    let report = alice.send(&a, first.clone()).await;
    assert_eq!(report.sent, [first.id], "{:?}", report.not_sent);
    assert_eq!(receive(&bob, &b, 1).await, [first.id]);

    let b_name = b.relay.name().clone();
    let b = b.stop().await;
    let mut ids = Vec::new();
    for i in 0..200 {
        let m = Message::new(
            alice_at.clone(),
            vec![bob_at.clone()],
            "while down",
            i.to_string(),
        );
        ids.push(m.id);
        alice
            .store
            .call(move |s| s.queue_outgoing(&m))
            .await
            .unwrap();
    }
    let report = alice.sync(&a).await;
    assert_eq!(
        report.sent.len(),
        200,
        "A took all 200 with B down: {:?}",
        report.not_sent
    );
    // Shown per relay while they wait.
    let queued = format!("mailslot_relay_link_queued{{relay=\"{}\"}} ", b_name);
    metric_at_least(&a, &queued, 200).await;

    let b = b.restart().await;
    let got = receive(&bob, &b, 200).await;
    assert_eq!(got.len(), 200, "no more than sent");
    let unique: HashSet<_> = got.iter().collect();
    assert_eq!(unique.len(), 200, "none twice");
    assert_eq!(got, ids, "in the order sent");
    let report = bob.sync(&b).await;
    assert!(
        report.received.is_empty() && report.duplicates == 0,
        "{report:?}"
    );
    a.relay.shutdown().await;
    b.relay.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mail_for_a_relay_that_never_comes_back_bounces_after_the_ttl() {
    let (a, b, alice, bob, alice_at, bob_at) = pair(
        |c| {
            c.ttl_secs = 1;
            c.expiry_interval_secs = 1;
        },
        |_| {},
    )
    .await;
    let first = Message::new(alice_at.clone(), vec![bob_at.clone()], "hello", "0");
    alice.send(&a, first).await;
    receive(&bob, &b, 1).await;

    let _down = b.stop().await;
    let lost = Message::new(alice_at, vec![bob_at.clone()], "lost", "1");
    let report = alice.send(&a, lost.clone()).await;
    assert_eq!(report.sent, [lost.id]);
    let bounce = bounced(&alice, &a).await;
    assert_eq!(
        (bounce.id, &bounce.to),
        (lost.id, &bob_at),
        "named per recipient"
    );
    a.relay.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_delivering_mail_from_another_relays_sender_is_refused() {
    use mailslot::protocol::{ErrorCode, LinkAnswer, Refusal};

    let (a, b, c) = (
        TestRelay::start(|_| {}).await,
        TestRelay::start(|_| {}).await,
        TestRelay::start(|_| {}).await,
    );
    let bob = TestAgent::new("bob");
    bob.sync(&b).await;
    let bob_at = at(&bob, &b);
    let mut ws = link_as(&c, &b).await;
    let mut deliver = async |seq, from: &str| {
        deliver_raw(&mut ws, seq, &Address::parse(from).unwrap(), &bob, &bob_at).await
    };
    // C claims a sender of A's.
    let forged = deliver(1, &format!("mallory@{}", a.relay.name())).await;
    assert_eq!(
        forged,
        LinkAnswer::Taken {
            seq: 1,
            refused: vec![Refusal {
                to: bob_at.clone(),
                code: ErrorCode::NotSender
            }]
        }
    );
    // Its own sender is taken.
    let own = deliver(2, &format!("carol@{}", c.relay.name())).await;
    assert_eq!(
        own,
        LinkAnswer::Taken {
            seq: 2,
            refused: vec![]
        }
    );
    // Bob is offered exactly the one from C's own agent (carol is unknown at C, so unreadable).
    let report = bob.sync(&b).await;
    let offered: Vec<String> = report
        .unreadable
        .iter()
        .map(|(from, _, _)| from.to_string())
        .chain(report.received.iter().map(|id| id.to_string()))
        .collect();
    assert_eq!(offered, [format!("carol@{}", c.relay.name())], "{report:?}");
    for r in [a, b, c] {
        r.relay.shutdown().await;
    }
}

/// The relay's `/metrics` text.
async fn metrics(relay: &TestRelay) -> String {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let url = format!("http://{}/metrics", relay.relay.addr());
    let client = reqwest::Client::builder().no_proxy().build().unwrap();
    client.get(&url).send().await.unwrap().text().await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cc_and_bcc_across_three_relays_reach_each_recipient_once_and_hide_the_bcc() {
    let (a, b, c) = (
        TestRelay::start(|_| {}).await,
        TestRelay::start(|_| {}).await,
        TestRelay::start(|_| {}).await,
    );
    let (alice, erin) = (TestAgent::new("alice"), TestAgent::new("erin"));
    let (bob, dave, carol) = (
        TestAgent::new("bob"),
        TestAgent::new("dave"),
        TestAgent::new("carol"),
    );
    for (agent, relay) in [
        (&alice, &a),
        (&erin, &a),
        (&bob, &b),
        (&dave, &b),
        (&carol, &c),
    ] {
        agent.sync(relay).await;
    }
    let mut m = Message::new(
        at(&alice, &a),
        vec![at(&bob, &b), erin.address()],
        "plan",
        "friday",
    );
    m.cc = vec![at(&carol, &c)];
    m.bcc = vec![at(&dave, &b)];
    let report = alice.send(&a, m.clone()).await;
    assert_eq!(report.sent, [m.id], "{:?}", report.not_sent);

    for (agent, relay) in [(&erin, &a), (&bob, &b), (&dave, &b), (&carol, &c)] {
        assert_eq!(receive(agent, relay, 1).await, [m.id], "{}", agent.name);
        let stored = agent
            .store
            .call(move |s| s.message(&m.id))
            .await
            .unwrap()
            .unwrap();
        if agent.name == dave.name {
            continue;
        }
        assert!(
            stored.message.bcc.is_empty(),
            "{} learns the BCC list: {:?}",
            agent.name,
            stored.message.bcc
        );
    }
    for (agent, relay) in [(&erin, &a), (&bob, &b), (&dave, &b), (&carol, &c)] {
        let again = agent.sync(relay).await;
        assert!(again.received.is_empty(), "{} got it twice", agent.name);
    }
    // Each other relay took its own recipients' copies: bob's and dave's at B, carol's at C.
    let shown = metrics(&a).await;
    let line = |relay: &TestRelay| {
        format!(
            "mailslot_relay_link_delivered_total{{relay=\"{}\"}} ",
            relay.relay.name()
        )
    };
    assert!(shown.contains(&format!("{}2", line(&b))), "{shown}");
    assert!(shown.contains(&format!("{}1", line(&c))), "{shown}");
    let at_b = metrics(&b).await;
    assert!(
        at_b.contains(&format!(
            "mailslot_relay_link_received_total{{relay=\"{}\"}} 2",
            a.relay.name()
        )),
        "{at_b}"
    );
    for r in [a, b, c] {
        r.relay.shutdown().await;
    }
}

/// Waits until `relay`'s `/metrics` has a line starting `prefix` whose value is at least `n`.
async fn metric_at_least(relay: &TestRelay, prefix: &str, n: u64) {
    let deadline = tokio::time::Instant::now() + EVENT_TIMEOUT * 2;
    loop {
        let shown = metrics(relay).await;
        let value = shown
            .lines()
            .find_map(|l| l.strip_prefix(prefix))
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or(0);
        if value >= n {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{prefix} never reached {n}:\n{shown}"
        );
        tokio::task::yield_now().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dialing_relay_whose_key_changed_is_refused() {
    let (a, b, alice, bob, alice_at, bob_at) = pair(|c| c.expiry_interval_secs = 1, |_| {}).await;
    let first = Message::new(alice_at.clone(), vec![bob_at.clone()], "hello", "0");
    alice.send(&a, first.clone()).await;
    assert_eq!(
        receive(&bob, &b, 1).await,
        [first.id],
        "both relays pinned each other"
    );
    let failures = format!(
        "mailslot_relay_link_failures_total{{relay=\"{}\"}} ",
        b.relay.name()
    );

    // A comes back with another key (same name): B refuses its link.
    let stopped = a.stop().await;
    let a = stopped.restart_with_a_new_key().await;
    let second = Message::new(alice_at.clone(), vec![bob_at.clone()], "again", "1");
    assert_eq!(alice.send(&a, second).await.sent.len(), 1, "A takes it");
    metric_at_least(&a, &failures, 1).await;
    metric_at_least(
        &b,
        "mailslot_relay_rejections_total{code=\"auth_failed\"} ",
        1,
    )
    .await;
    let report = bob.sync(&b).await;
    assert!(
        report.received.is_empty(),
        "B took mail over a link it should refuse"
    );
    a.relay.shutdown().await;
    b.relay.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answering_relay_whose_key_changed_is_refused() {
    let (a, b, alice, bob, alice_at, bob_at) = pair(|c| c.expiry_interval_secs = 1, |_| {}).await;
    let first = Message::new(alice_at.clone(), vec![bob_at.clone()], "hello", "0");
    alice.send(&a, first.clone()).await;
    assert_eq!(receive(&bob, &b, 1).await, [first.id]);

    // B comes back with another key under the same name: A delivers nothing to it.
    let stopped = b.stop().await;
    let b = stopped.restart_with_a_new_key().await;
    let second = Message::new(alice_at, vec![bob_at], "again", "1");
    assert_eq!(alice.send(&a, second).await.sent.len(), 1, "A takes it");
    let failures = format!(
        "mailslot_relay_link_failures_total{{relay=\"{}\"}} ",
        b.relay.name()
    );
    metric_at_least(&a, &failures, 1).await;
    assert!(
        !metrics(&b)
            .await
            .contains("mailslot_relay_link_received_total{"),
        "the restarted B took nothing"
    );
    let report = bob.sync(&b).await;
    assert!(report.received.is_empty());
    a.relay.shutdown().await;
    b.relay.shutdown().await;
}

/// `mailslot --json relay pins ARGS --db DB` with no terminal on stdin: its output.
async fn relay_pins(db: &std::path::Path, args: &[&str]) -> std::process::Output {
    let home = tempfile::tempdir().unwrap();
    tokio::process::Command::new(env!("CARGO_BIN_EXE_mailslot"))
        .args(["--json", "relay", "pins"])
        .args(args)
        .arg("--db")
        .arg(db)
        .env_clear()
        .env("MAILSLOT_HOME", home.path())
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .unwrap()
}

/// The JSON a `relay pins` command printed, which must have succeeded.
fn pins_json(out: &std::process::Output) -> serde_json::Value {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The pinned fingerprint of each relay `db` lists.
async fn pinned(db: &std::path::Path) -> Vec<(String, String)> {
    pins_json(&relay_pins(db, &[]).await)["pins"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["relay"].as_str().unwrap().to_owned(),
                p["fingerprint"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_replaces_a_changed_relay_key_and_the_waiting_mail_goes() {
    let (a, b, alice, bob, alice_at, bob_at) = pair(
        |c| c.expiry_interval_secs = 1,
        |c| c.expiry_interval_secs = 1,
    )
    .await;
    let first = Message::new(alice_at.clone(), vec![bob_at.clone()], "hello", "0");
    alice.send(&a, first.clone()).await;
    assert_eq!(receive(&bob, &b, 1).await, [first.id]);
    let (a_name, b_name) = (a.relay.name().to_string(), b.relay.name().to_string());
    let old = b.relay.fingerprint().to_string();
    assert_eq!(pinned(&a.db()).await, [(b_name.clone(), old.clone())]);

    // B comes back with another key: A refuses it and keeps the mail.
    let b = b.stop().await.restart_with_a_new_key().await;
    let new = b.relay.fingerprint().to_string();
    let second = Message::new(alice_at.clone(), vec![bob_at.clone()], "again", "1");
    assert_eq!(alice.send(&a, second.clone()).await.sent.len(), 1);
    let failures = format!("mailslot_relay_link_failures_total{{relay=\"{b_name}\"}} ");
    metric_at_least(&a, &failures, 1).await;

    // Without a terminal nothing is asked; a fingerprint other than B's changes nothing.
    let unasked = relay_pins(&a.db(), &["trust", &b_name]).await;
    assert_eq!(unasked.status.code(), Some(1));
    let said = String::from_utf8_lossy(&unasked.stderr);
    assert!(said.contains(&new) && said.contains(&old), "{said}");
    let wrong = relay_pins(&a.db(), &["trust", &b_name, "--fingerprint", &old]).await;
    assert_eq!(wrong.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&wrong.stderr).contains("nothing changed"));
    assert_eq!(pinned(&a.db()).await, [(b_name.clone(), old.clone())]);

    // The fingerprint B's operator confirmed: the pin moves, beside the running relay.
    let trusted = pins_json(&relay_pins(&a.db(), &["trust", &b_name, "--fingerprint", &new]).await);
    assert_eq!(trusted["was"], old.as_str());
    assert_eq!(trusted["fingerprint"], new.as_str());
    assert_eq!(trusted["changed"], true);
    assert_eq!(
        receive(&bob, &b, 1).await,
        [second.id],
        "the waiting mail goes at the link's next attempt"
    );

    // B's operator forgets A's pin: A's next link (after a restart, so the open one goes) is
    // a first contact, pinned again.
    let removed = pins_json(&relay_pins(&b.db(), &["remove", &a_name]).await);
    assert_eq!(
        removed["removed"],
        a.relay.fingerprint().to_string().as_str()
    );
    assert!(pinned(&b.db()).await.is_empty());
    let gone = relay_pins(&b.db(), &["remove", &a_name]).await;
    assert_eq!(gone.status.code(), Some(1), "nothing to remove");
    let a = a.stop().await.restart().await;
    let third = Message::new(alice_at, vec![bob_at], "and again", "2");
    alice.send(&a, third.clone()).await;
    assert_eq!(receive(&bob, &b, 1).await, [third.id]);
    assert_eq!(
        pinned(&b.db()).await,
        [(a_name, a.relay.fingerprint().to_string())]
    );
    a.relay.shutdown().await;
    b.relay.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_contact_request_across_relays_approved_by_the_owner_opens_mail_both_ways() {
    use mailslot::protocol::{ClientFrame, ErrorCode, OwnerAct, Policy, RequestCode, ServerFrame};

    let contacts = |c: &mut mailslot::relay::RelayConfig| {
        c.default_policy = Some(Policy::Contacts);
        c.expiry_interval_secs = 1;
    };
    let (a, b, alice, bob, alice_at, bob_at) = pair(contacts, contacts).await;

    // A stranger's mail is refused by B, and the refusal comes back as a bounce.
    let early = Message::new(alice_at.clone(), vec![bob_at.clone()], "hi", "stranger");
    assert_eq!(alice.send(&a, early.clone()).await.sent, [early.id]);
    let bounce = bounced(&alice, &a).await;
    assert_eq!((bounce.id, &bounce.to), (early.id, &bob_at));

    // alice asks bob@B: the code comes back to her, bob sees the request without it.
    let mut alice_conn = alice.connect(&a).await;
    let code: RequestCode = match alice_conn
        .call(|r| ClientFrame::Connect {
            reference: r,
            to: bob_at.clone(),
            note: "we share the deploy".into(),
        })
        .await
        .unwrap()
    {
        ServerFrame::Requested { code, .. } => code,
        other => panic!("expected requested, got {other:?}"),
    };
    let mut bob_conn = bob.connect(&b).await;
    let seen = consent_state(&mut bob_conn).await;
    assert_eq!(seen.incoming.len(), 1, "{seen:?}");
    assert_eq!(seen.incoming[0].agent, alice_at);
    assert!(
        seen.incoming[0].code.is_none(),
        "the code never reaches the target"
    );
    assert_eq!(
        consent_state(&mut alice_conn).await.outgoing[0].agent,
        bob_at
    );

    // A wrong code is refused; bob's owner approves with the right one.
    let approve = async |conn: &mut mailslot::client::Connection, code: RequestCode| {
        let owner_signature = bob.owner_signs(
            conn,
            &OwnerAct::Approve {
                from: &alice_at,
                code: &code,
            },
        );
        conn.call(|r| ClientFrame::Approve {
            reference: r,
            from: alice_at.clone(),
            code,
            dry_run: false,
            owner_signature,
        })
        .await
    };
    let wrong: RequestCode = "AAAA-AAAA".parse().unwrap();
    match approve(&mut bob_conn, wrong).await {
        Err(mailslot::client::ClientError::Refused { code, .. }) => {
            assert_eq!(code, ErrorCode::BadCode)
        }
        other => panic!("a wrong code: {other:?}"),
    }
    let done = approve(&mut bob_conn, code).await.unwrap();
    let ServerFrame::Done { detail, .. } = done else {
        panic!("{done:?}")
    };
    assert!(!detail.contains("could not be told"), "{detail}");
    assert_eq!(
        consent_state(&mut bob_conn).await.contacts,
        std::slice::from_ref(&alice_at)
    );
    assert_eq!(
        consent_state(&mut alice_conn).await.contacts,
        std::slice::from_ref(&bob_at),
        "A knows too"
    );
    alice_conn.close().await;
    bob_conn.close().await;

    // Mail now passes both relays' consent, both ways.
    let m = Message::new(alice_at.clone(), vec![bob_at.clone()], "plan", "friday");
    assert_eq!(alice.send(&a, m.clone()).await.sent, [m.id]);
    assert_eq!(receive(&bob, &b, 1).await, [m.id]);
    let back = Message::new(bob_at, vec![alice_at], "re: plan", "yes");
    assert_eq!(bob.send(&b, back.clone()).await.sent, [back.id]);
    assert_eq!(receive(&alice, &a, 1).await, [back.id]);
    a.relay.shutdown().await;
    b.relay.shutdown().await;
}

async fn consent_state(
    conn: &mut mailslot::client::Connection,
) -> mailslot::client::consent::ConsentState {
    mailslot::client::consent::state(conn).await.unwrap()
}

/// Puts `messages` in `agent`'s outbox, for its next sync to send.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_of_the_sending_relay_mid_stream_loses_and_doubles_nothing_sent() {
    const N: usize = 300;
    const BATCH: usize = 20;
    // A is a process of its own, to be killed; it must come back on the same address, since
    // that is its name, and on the same database (and so the same key, pinned at B).
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("relay.db");
    let listen = free_loopback_addr();
    let (mut a, a_url) = spawn_relay_on(&db, listen, dir.path());
    let b = TestRelay::start(|_| {}).await;
    let (alice, bob) = (Arc::new(TestAgent::new("alice")), TestAgent::new("bob"));
    alice.sync_url(&a_url).await;
    bob.sync(&b).await;
    let alice_at = Address::remote(
        alice.name.clone(),
        RelayName::new(&listen.to_string()).unwrap(),
    );
    let bob_at = at(&bob, &b);
    let messages: Vec<Message> = (0..N)
        .map(|i| {
            Message::new(
                alice_at.clone(),
                vec![bob_at.clone()],
                "mid-stream",
                i.to_string(),
            )
        })
        .collect();

    // alice sends batch after batch until A dies under her; what A answered `sent` is kept.
    let first_sent = Arc::new(tokio::sync::Notify::new());
    let sender = tokio::spawn({
        let (alice, url, messages) = (alice.clone(), a_url.clone(), messages.clone());
        let first_sent = first_sent.clone();
        async move {
            let (mut sent, mut queued) = (Vec::new(), 0);
            for batch in messages.chunks(BATCH) {
                alice.queue(batch).await;
                queued += batch.len();
                let sync = mailslot::client::sync(
                    &url,
                    &alice.name,
                    &alice.identity,
                    Some(alice.owner.public()),
                    &alice.store,
                );
                match tokio::time::timeout(EVENT_TIMEOUT, sync).await {
                    Ok(Ok(report)) => {
                        sent.extend(report.sent);
                        first_sent.notify_one();
                    }
                    // A is gone: what this sync sent stays in alice's outbox or on A's disk.
                    Ok(Err(_)) | Err(_) => break,
                }
            }
            (sent, queued)
        }
    });
    // A has answered `sent` for a batch and alice sends the next ones; the link is
    // streaming once bob has mail from A: kill A then.
    tokio::time::timeout(EVENT_TIMEOUT, first_sent.notified())
        .await
        .expect("A answered no batch");
    let mut got = receive(&bob, &b, 1).await;
    a.kill();
    let (sent_before, queued) = sender.await.unwrap();
    eprintln!(
        "killed A with {} of {N} answered sent, {} at bob",
        sent_before.len(),
        got.len()
    );

    let (_a, url) = spawn_relay_on(&db, listen, dir.path());
    assert_eq!(url, a_url, "A is back on its address");
    alice.queue(&messages[queued..]).await;
    // Sends cut off by the kill go again from alice's outbox; A deduplicates those it had.
    let report = alice.sync_url(&a_url).await;
    assert!(report.not_sent.is_empty(), "{:?}", report.not_sent);
    let sent: HashSet<MessageId> = sent_before.into_iter().chain(report.sent).collect();

    got.extend(receive(&bob, &b, N - got.len()).await);
    let unique: HashSet<MessageId> = got.iter().copied().collect();
    assert_eq!(unique.len(), got.len(), "none stored twice at bob");
    let missing: Vec<_> = sent.difference(&unique).collect();
    assert!(
        missing.is_empty(),
        "{} messages answered `sent` never arrived, e.g. {:?}",
        missing.len(),
        missing.first()
    );
    let all: HashSet<MessageId> = messages.iter().map(|m| m.id).collect();
    assert_eq!(unique, all, "every message arrived, and nothing else");
    let report = bob.sync(&b).await;
    assert!(report.received.is_empty(), "{report:?}");
    b.relay.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_blocks_a_whole_relay_and_lifts_the_block() {
    use mailslot::protocol::{ClientFrame, ErrorCode, OwnerAct, Peer};

    let (a, b, alice, bob, alice_at, bob_at) = pair(|c| c.expiry_interval_secs = 1, |_| {}).await;

    // bob's owner blocks every agent of A.
    let relay_a = Peer::AnyAt(a.relay.name().clone());
    let mut bob_conn = bob.connect(&b).await;
    let owner_signature = bob.owner_signs(&bob_conn, &OwnerAct::Block(&relay_a));
    bob_conn
        .call(|r| ClientFrame::Block {
            reference: r,
            agent: relay_a.clone(),
            owner_signature,
        })
        .await
        .unwrap();
    assert_eq!(
        consent_state(&mut bob_conn).await.blocked,
        std::slice::from_ref(&relay_a)
    );

    // Mail from A bounces as refused, and so does a contact request.
    let blocked = Message::new(alice_at.clone(), vec![bob_at.clone()], "hi", "blocked");
    assert_eq!(alice.send(&a, blocked.clone()).await.sent, [blocked.id]);
    let bounce = bounced(&alice, &a).await;
    assert_eq!((bounce.id, &bounce.to), (blocked.id, &bob_at));
    let mut alice_conn = alice.connect(&a).await;
    match alice_conn
        .call(|r| ClientFrame::Connect {
            reference: r,
            to: bob_at.clone(),
            note: String::new(),
        })
        .await
    {
        Err(mailslot::client::ClientError::Refused { code, .. }) => {
            assert_eq!(code, ErrorCode::NotAllowed)
        }
        other => panic!("a request from a blocked relay: {other:?}"),
    }
    assert!(
        consent_state(&mut alice_conn).await.outgoing.is_empty(),
        "the refused request is withdrawn at A"
    );
    alice_conn.close().await;

    // Lifted: A's mail is taken again.
    let owner_signature = bob.owner_signs(&bob_conn, &OwnerAct::Unblock(&relay_a));
    bob_conn
        .call(|r| ClientFrame::Unblock {
            reference: r,
            agent: relay_a.clone(),
            owner_signature,
        })
        .await
        .unwrap();
    bob_conn.close().await;
    let after = Message::new(alice_at, vec![bob_at], "hi", "again");
    assert_eq!(alice.send(&a, after.clone()).await.sent, [after.id]);
    assert_eq!(receive(&bob, &b, 1).await, [after.id]);
    a.relay.shutdown().await;
    b.relay.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_that_expires_at_the_recipients_relay_bounces_to_the_sender_on_its_relay() {
    let (a, b, alice, bob, alice_at, bob_at) = pair(
        |_| {},
        |c| {
            c.ttl_secs = 1;
            c.expiry_interval_secs = 1;
        },
    )
    .await;
    // bob never comes back for it: B expires it, and tells A.
    let m = Message::new(alice_at, vec![bob_at.clone()], "unread", "x");
    assert_eq!(alice.send(&a, m.clone()).await.sent, [m.id]);
    let bounce = bounced(&alice, &a).await;
    assert_eq!(
        (bounce.id, &bounce.to),
        (m.id, &bob_at),
        "named as B names it"
    );
    // It expired at B: bob never gets the copy.
    metric_at_least(&b, "mailslot_relay_expired_total ", 1).await;
    let report = bob.sync(&b).await;
    assert!(report.received.is_empty(), "{report:?}");
    a.relay.shutdown().await;
    b.relay.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_denial_across_relays_withdraws_the_request_at_the_requesters_relay() {
    use mailslot::protocol::{ClientFrame, OwnerAct, ServerFrame};

    let (a, b, alice, bob, alice_at, bob_at) = pair(|_| {}, |_| {}).await;
    let mut alice_conn = alice.connect(&a).await;
    let asked = alice_conn
        .call(|r| ClientFrame::Connect {
            reference: r,
            to: bob_at.clone(),
            note: String::new(),
        })
        .await
        .unwrap();
    assert!(matches!(asked, ServerFrame::Requested { .. }), "{asked:?}");
    assert_eq!(consent_state(&mut alice_conn).await.outgoing.len(), 1);

    let mut bob_conn = bob.connect(&b).await;
    let owner_signature = bob.owner_signs(&bob_conn, &OwnerAct::Deny(&alice_at));
    bob_conn
        .call(|r| ClientFrame::Deny {
            reference: r,
            agent: alice_at.clone(),
            owner_signature,
        })
        .await
        .unwrap();
    assert!(consent_state(&mut bob_conn).await.incoming.is_empty());
    assert!(
        consent_state(&mut alice_conn).await.outgoing.is_empty(),
        "withdrawn at A too"
    );
    alice_conn.close().await;
    bob_conn.close().await;
    a.relay.shutdown().await;
    b.relay.shutdown().await;
}

/// A server on loopback that answers every request with `body` (a JSON string a discovery
/// fetch cannot read) and counts the connections it accepted; its address.
async fn not_a_relay(
    body: &'static str,
) -> (std::net::SocketAddr, Arc<std::sync::atomic::AtomicUsize>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let accepted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    tokio::spawn({
        let accepted = accepted.clone();
        async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                accepted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                tokio::spawn(async move {
                    let _ = socket.read(&mut [0u8; 4096]).await;
                    let answer = format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                        body.len()
                    );
                    let _ = socket.write_all(answer.as_bytes()).await;
                });
            }
        }
    });
    (addr, accepted)
}

/// The message of `relay`'s refusal of a stranger's hello naming `name` (signed by a key of
/// its own: the relay must look the name up to find out it is not that relay's).
async fn stranger_names(relay: &TestRelay, name: &str) -> (mailslot::protocol::ErrorCode, String) {
    let stranger = mailslot::crypto::RelayIdentity::generate();
    let (_, answer) = hello_as(&RelayName::new(name).unwrap(), &stranger, relay).await;
    match answer {
        mailslot::protocol::LinkAnswer::Error { code, message } => (code, message),
        other => panic!("a stranger naming {name} was welcomed: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn naming_a_loopback_port_makes_no_fetch_and_every_failure_reads_the_same() {
    use mailslot::protocol::{ClientFrame, ErrorCode, ServerFrame};
    use std::sync::atomic::Ordering;

    const SECRET: &str = "\"SECRET-BODY-4711\"";
    let (server, fetched) = not_a_relay(SECRET).await;
    let closed = free_loopback_addr();
    let other = TestRelay::start(|_| {}).await;

    // A relay as operators run it: private addresses are not reached.
    let guarded = TestRelay::start(|c| c.allow_private_relays = false).await;
    for target in [
        server.to_string(),
        closed.to_string(),
        other.relay.name().to_string(),
    ] {
        let (code, message) = stranger_names(&guarded, &target).await;
        assert_eq!(code, ErrorCode::AuthFailed, "{message}");
        assert!(message.contains("allow_private_relays"), "{message}");
    }
    // An agent's request to an agent at a loopback address is refused before any look-up.
    let alice = TestAgent::new("alice");
    let mut conn = alice.connect(&guarded).await;
    let refused = conn
        .call(|r| ClientFrame::Connect {
            reference: r,
            to: mailslot::protocol::Address::parse(&format!("x@{server}")).unwrap(),
            note: String::new(),
        })
        .await;
    match refused {
        Err(mailslot::client::ClientError::Refused { code, message, .. }) => {
            assert_eq!(code, ErrorCode::NotAllowed, "{message}");
            assert!(message.contains("allow_private_relays"), "{message}");
        }
        other => panic!("connect to a loopback relay: {other:?}"),
    }
    conn.close().await;
    assert_eq!(
        fetched.load(Ordering::SeqCst),
        0,
        "the guarded relay fetched nothing"
    );

    // Where loopback is allowed (as in these tests), a port that is closed and one that
    // answers something else read the same, and nothing of the answer comes back.
    let open = TestRelay::start(|_| {}).await;
    let (closed_code, closed_says) = stranger_names(&open, &closed.to_string()).await;
    let (open_code, open_says) = stranger_names(&open, &server.to_string()).await;
    assert!(
        fetched.load(Ordering::SeqCst) > 0,
        "the allowed relay looked it up"
    );
    assert_eq!(closed_code, open_code);
    assert_eq!(
        closed_says.replace(&closed.to_string(), "HOST"),
        open_says.replace(&server.to_string(), "HOST"),
        "closed and open ports are told apart"
    );
    assert!(!open_says.contains("SECRET"), "{open_says}");
    assert!(
        open_says.contains("could not be reached or is not a mailslot relay"),
        "{open_says}"
    );

    // The same for an agent's contact request to a relay there.
    let bob = TestAgent::new("bob");
    let mut conn = bob.connect(&open).await;
    let mut ask = async |host: &std::net::SocketAddr| match conn
        .call(|r| ClientFrame::Connect {
            reference: r,
            to: mailslot::protocol::Address::parse(&format!("x@{host}")).unwrap(),
            note: String::new(),
        })
        .await
    {
        Err(mailslot::client::ClientError::Refused { code, message, .. }) => {
            (code, message.replace(&host.to_string(), "HOST"))
        }
        Ok(ServerFrame::Requested { .. }) => panic!("a request to {host} was passed on"),
        other => panic!("{other:?}"),
    };
    let (a, b) = (ask(&closed).await, ask(&server).await);
    assert_eq!(a, b, "closed and open ports are told apart");
    assert!(!b.1.contains("SECRET"), "{}", b.1);
    conn.close().await;
    for r in [other, guarded, open] {
        r.relay.shutdown().await;
    }
}

/// A relay `B` and a second relay with `B`'s key that calls itself `localhost:PORT`.
async fn one_key_two_names(
    b_tweak: impl FnOnce(&mut mailslot::relay::RelayConfig),
) -> (TestRelay, TestRelay, mailslot::crypto::RelayIdentity) {
    let b = TestRelay::start(b_tweak).await;
    let key_file = mailslot::relay::identity_beside(&b.db());
    let listen = free_loopback_addr();
    let alias = TestRelay::start(move |c| {
        c.listen = listen;
        c.host = Some(RelayName::new(&format!("localhost:{}", listen.port())).unwrap());
        c.identity = Some(key_file);
    })
    .await;
    let (key, _) =
        mailslot::crypto::RelayIdentity::load_or_create(&mailslot::relay::identity_beside(&b.db()))
            .unwrap();
    assert_eq!(b.relay.fingerprint(), alias.relay.fingerprint(), "one key");
    (b, alias, key)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_denied_relay_is_refused_under_another_name_with_the_same_key() {
    use mailslot::protocol::{ErrorCode, LinkAnswer};

    let (b, alias, key) = one_key_two_names(|_| {}).await;
    let b_name = b.relay.name().clone();
    let a = TestRelay::start(move |c| c.deny_relays = vec![b_name]).await;
    let (_, by_name) = hello_as(b.relay.name(), &key, &a).await;
    assert!(
        matches!(
            &by_name,
            LinkAnswer::Error {
                code: ErrorCode::NotAllowed,
                ..
            }
        ),
        "{by_name:?}"
    );
    let (_, by_key) = hello_as(alias.relay.name(), &key, &a).await;
    match by_key {
        LinkAnswer::Error { code, message } => {
            assert_eq!(code, ErrorCode::NotAllowed, "{message}");
            assert!(message.contains("denied"), "{message}");
        }
        other => panic!(
            "the denied relay was welcomed as {}: {other:?}",
            alias.relay.name()
        ),
    }
    // Denied by its fingerprint alone, under any name.
    let fingerprint = b.relay.fingerprint().clone();
    let c = TestRelay::start(move |c| c.deny_relay_keys = vec![fingerprint]).await;
    let (_, answer) = hello_as(alias.relay.name(), &key, &c).await;
    assert!(
        matches!(
            &answer,
            LinkAnswer::Error {
                code: ErrorCode::NotAllowed,
                ..
            }
        ),
        "{answer:?}"
    );
    for r in [a, b, alias, c] {
        r.relay.shutdown().await;
    }
}

/// Delivers one copy from `from` (an agent of the relay on the other end of `ws`) to `to`
/// over the raw link; the answer.
async fn deliver_raw(
    ws: &mut RawSocket,
    seq: u64,
    from: &Address,
    to: &TestAgent,
    to_at: &Address,
) -> mailslot::protocol::LinkAnswer {
    use futures_util::{SinkExt, StreamExt};
    use mailslot::protocol::{Limits, deliver_frame};
    use tokio_tungstenite::tungstenite::Message as Ws;
    let m = Message::new(from.clone(), vec![to_at.clone()], "s", "b");
    let sealed = mailslot::crypto::seal(
        &m,
        &mailslot::crypto::Identity::generate(),
        &[(to_at.clone(), to.identity.public().clone())],
        &Limits::default(),
    )
    .unwrap()
    .remove(0);
    ws.send(Ws::text(deliver_frame(seq, &sealed.to_bytes()).unwrap()))
        .await
        .unwrap();
    let Some(Ok(Ws::Text(text))) = ws.next().await else {
        panic!("no answer")
    };
    serde_json::from_str(&text).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_relay_under_two_names_shares_one_rate_bucket() {
    use mailslot::protocol::{ErrorCode, LinkAnswer};

    let (b, alias, key) = one_key_two_names(|_| {}).await;
    let a = TestRelay::start(|c| {
        c.relay_rate = 0.001;
        c.relay_burst = 2.0;
    })
    .await;
    let alice = TestAgent::new("alice");
    alice.sync(&a).await;
    let alice_at = at(&alice, &a);
    let from = |relay: &TestRelay| {
        Address::remote(
            mailslot::protocol::AgentName::new("carol").unwrap(),
            relay.relay.name().clone(),
        )
    };
    let (mut ws, welcome) = hello_as(b.relay.name(), &key, &a).await;
    assert!(matches!(welcome, LinkAnswer::Welcome { .. }), "{welcome:?}");
    for seq in 1..=2 {
        let answer = deliver_raw(&mut ws, seq, &from(&b), &alice, &alice_at).await;
        assert!(matches!(answer, LinkAnswer::Taken { .. }), "{answer:?}");
    }
    let (mut ws, welcome) = hello_as(alias.relay.name(), &key, &a).await;
    assert!(matches!(welcome, LinkAnswer::Welcome { .. }), "{welcome:?}");
    let answer = deliver_raw(&mut ws, 1, &from(&alias), &alice, &alice_at).await;
    assert!(
        matches!(
            answer,
            LinkAnswer::Later {
                code: ErrorCode::RateLimited,
                ..
            }
        ),
        "a second name is a second bucket: {answer:?}"
    );
    for r in [a, b, alias] {
        r.relay.shutdown().await;
    }
}

/// Sends one raw link request and reads its answer.
async fn ask_raw(
    ws: &mut RawSocket,
    request: &mailslot::protocol::LinkRequest,
) -> mailslot::protocol::LinkAnswer {
    use futures_util::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::Message as Ws;
    ws.send(Ws::text(serde_json::to_string(request).unwrap()))
        .await
        .unwrap();
    let next = tokio::time::timeout(EVENT_TIMEOUT, ws.next())
        .await
        .expect("an answer in time");
    let Some(Ok(Ws::Text(text))) = next else {
        panic!("no answer: {next:?}")
    };
    serde_json::from_str(&text).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_contact_requests_from_another_relay_is_bounded_capped_and_rings_once() {
    use mailslot::agent::Agent;
    use mailslot::config::Paths;
    use mailslot::mailbox::{Mailbox, RelayStatus};
    use mailslot::protocol::{AgentName, ErrorCode, LinkAnswer, LinkRequest, Policy, RequestCode};

    let (to_agent, from_relay, ttl) = (5, 8, 3600);
    let a = TestRelay::start(move |c| {
        c.default_policy = Some(Policy::Contacts);
        c.max_requests_to_agent = to_agent;
        c.max_requests_from_relay = from_relay;
        c.request_ttl_secs = ttl;
    })
    .await;
    let c = TestRelay::start(|_| {}).await;
    // bob at A runs as an agent does, with its doorbell.
    let home = tempfile::tempdir().unwrap();
    let paths = Paths::new(Some(home.path().to_owned()), None).unwrap();
    let (agent, _) = Agent::open_or_create(&paths, &AgentName::new("bob").unwrap()).unwrap();
    let bob = Mailbox::open(agent, a.url.clone()).await.unwrap();
    let doorbell = mailslot::doorbell::Doorbell::new(&bob);
    let mut rings = doorbell.subscribe("test");
    doorbell.start();
    tokio::time::timeout(
        EVENT_TIMEOUT,
        bob.watch_status().wait_for(|s| *s == RelayStatus::Online),
    )
    .await
    .expect("bob connects")
    .unwrap();
    let dave = TestAgent::new("dave");
    dave.sync(&a).await;

    let mut ws = link_as(&c, &a).await;
    let mut flood = async |target: &str, from: std::ops::Range<usize>| {
        let mut answers = Vec::new();
        for i in from {
            let request = LinkRequest::Connect {
                from: Address::parse(&format!("u{i}@{}", c.relay.name())).unwrap(),
                to: Address::parse(&format!("{target}@{}", a.relay.name())).unwrap(),
                note: format!("flood {i}"),
                code: RequestCode::from_random([i as u8, 1, 2, 3, 4]),
                expires_at: "2099-01-01T00:00:00Z".parse().unwrap(),
            };
            answers.push(ask_raw(&mut ws, &request).await);
        }
        answers
    };
    let refused = |answers: &[LinkAnswer], limit: &str| {
        answers
            .iter()
            .filter(|a| match a {
                LinkAnswer::Refused { code, message } => {
                    assert_eq!(*code, ErrorCode::TooManyRequests, "{message}");
                    assert!(message.contains(limit), "{message}");
                    true
                }
                LinkAnswer::Done {} => false,
                other => panic!("{other:?}"),
            })
            .count()
    };
    // Twelve to bob: the first five are taken, the rest refused, naming the limit.
    let to_bob = flood("bob", 0..12).await;
    assert_eq!(
        refused(&to_bob, "max_requests_to_agent"),
        12 - to_agent as usize
    );
    // Six to dave: three more make the relay's eight; the rest are refused.
    let to_dave = flood("dave", 100..106).await;
    assert_eq!(refused(&to_dave, "max_requests_from_relay"), 6 - 3);

    // Kept no longer than A's own request TTL, whatever C asked for.
    let latest = jiff::Timestamp::now() + jiff::SignedDuration::from_secs(ttl as i64 + 60);
    let incoming = bob.consent_state().await.unwrap().incoming;
    assert_eq!(incoming.len(), to_agent as usize);
    for q in &incoming {
        assert!(q.expires_at <= latest, "kept until {}", q.expires_at);
    }

    // One ring for the burst, naming how many asked.
    let ring = loop {
        let Some(mailslot::mailbox::Heard::Event(ring)) =
            tokio::time::timeout(EVENT_TIMEOUT, rings.next())
                .await
                .expect("a ring for the requests")
        else {
            panic!("the doorbell stopped or fell behind");
        };
        if ring.meta["kind"] == "contact_request" {
            break ring;
        }
    };
    assert_eq!(ring.meta["count"], to_agent.to_string(), "{}", ring.content);
    assert!(ring.content.contains("5 agents asked"), "{}", ring.content);
    // Nothing more rings for it: wait past the longest a burst is held.
    match tokio::time::timeout(std::time::Duration::from_secs(7), rings.next()).await {
        Err(_) => {}
        Ok(more) => panic!("a second ring for one burst: {more:?}"),
    }
    ws.close(None).await.unwrap();
    bob.close().await;
    a.relay.shutdown().await;
    c.relay.shutdown().await;
}
