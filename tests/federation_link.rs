//! Relay-to-relay delivery: real relays on different loopback ports deliver each other's mail
//! over the link, exactly once, through an outage of the receiving relay, and bounce what the
//! other relay is never there to take; a relay that speaks for another relay's agents is
//! refused.

mod common;

use std::collections::HashSet;

use common::*;
use mailslot::protocol::{Address, Message};

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
