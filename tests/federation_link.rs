//! Relay-to-relay delivery: real relays on different loopback ports deliver each other's mail
//! over the link, exactly once, through an outage of the receiving relay and a `kill -9` of
//! the sending one, and bounce what the other relay is never there to take; a relay that
//! speaks for another relay's agents is refused.

mod common;

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mail_accepted_while_the_other_relay_is_down_is_delivered_once_when_it_is_back() {
    let a = TestRelay::start(|c| c.expiry_interval_secs = 1).await;
    let b = TestRelay::start(|_| {}).await;
    let (alice, bob) = (TestAgent::new("alice"), TestAgent::new("bob"));
    alice.sync(&a).await;
    bob.sync(&b).await;
    let (alice_at, bob_at) = (at(&alice, &a), at(&bob, &b));

    // The first message, with B up, pins bob@B's keys at alice.
    let first = Message::new(alice_at.clone(), vec![bob_at.clone()], "hello", "0");
    let report = alice.send(&a, first.clone()).await;
    assert_eq!(report.sent, [first.id], "{:?}", report.not_sent);
    assert_eq!(receive(&bob, &b, 1).await, [first.id]);

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
    let a = TestRelay::start(|c| {
        c.ttl_secs = 1;
        c.expiry_interval_secs = 1;
    })
    .await;
    let b = TestRelay::start(|_| {}).await;
    let (alice, bob) = (TestAgent::new("alice"), TestAgent::new("bob"));
    alice.sync(&a).await;
    bob.sync(&b).await;
    let (alice_at, bob_at) = (at(&alice, &a), at(&bob, &b));
    let first = Message::new(alice_at.clone(), vec![bob_at.clone()], "hello", "0");
    alice.send(&a, first).await;
    receive(&bob, &b, 1).await;

    let _down = b.stop().await;
    let lost = Message::new(alice_at, vec![bob_at.clone()], "lost", "1");
    let report = alice.send(&a, lost.clone()).await;
    assert_eq!(report.sent, [lost.id]);
    let deadline = tokio::time::Instant::now() + EVENT_TIMEOUT * 2;
    loop {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no bounce for {}",
            lost.id
        );
        let report = alice.sync(&a).await;
        if let Some(bounce) = report.bounced.first() {
            assert_eq!(
                (bounce.id, &bounce.to),
                (lost.id, &bob_at),
                "named per recipient"
            );
            break;
        }
        tokio::task::yield_now().await;
    }
    a.relay.shutdown().await;
}

/// Puts `messages` in `agent`'s outbox, for its next sync to send.
async fn queue(agent: &TestAgent, messages: &[Message]) {
    for m in messages {
        let m = m.clone();
        agent
            .store
            .call(move |s| s.queue_outgoing(&m))
            .await
            .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_of_the_sending_relay_mid_stream_loses_and_doubles_nothing_sent() {
    const N: usize = 300;
    const BATCH: usize = 20;
    // A is a process of its own, to be killed; it must come back on the same address, since
    // that is its name, and on the same database (and so the same key, pinned at B).
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("relay.db");
    let listen = free_loopback_addr();
    let (mut a, a_url) = spawn_relay_on(&db, listen);
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
                queue(&alice, batch).await;
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

    let (_a, url) = spawn_relay_on(&db, listen);
    assert_eq!(url, a_url, "A is back on its address");
    queue(&alice, &messages[queued..]).await;
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
