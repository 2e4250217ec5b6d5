//! The long-running client session: mail pushed in as it arrives, the outbox sent on request,
//! and reconnection after the relay goes away and comes back.

use crate::common;

use std::time::Duration;

use common::*;
use mailslot::client::{ClientEvent, SendAnswer};
use mailslot::relay::{Relay, RelayConfig};
use tokio::sync::mpsc;

/// Waits for the first event matching `pick`, failing after the usual timeout.
async fn wait_for<T>(
    events: &mut mpsc::UnboundedReceiver<ClientEvent>,
    mut pick: impl FnMut(&ClientEvent) -> Option<T>,
) -> T {
    tokio::time::timeout(EVENT_TIMEOUT, async {
        loop {
            let event = events.recv().await.expect("the session is running");
            if let Some(found) = pick(&event) {
                return found;
            }
        }
    })
    .await
    .expect("the event did not come")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mail_is_pushed_into_a_running_session_and_acknowledged() {
    let relay = TestRelay::start(|_| {}).await;
    let (alice, bob) = (TestAgent::new("alice"), TestAgent::new("bob"));
    let (handle, mut events) = session(&bob, &relay.url);
    wait_for(&mut events, |e| {
        matches!(e, ClientEvent::Connected { .. }).then_some(())
    })
    .await;
    let m = alice.message(&[&bob], "live", "straight into the session");
    let id = m.id;
    alice.send(&relay, m).await;
    let got = wait_for(&mut events, |e| match e {
        ClientEvent::NewMail { id, .. } => Some(*id),
        _ => None,
    })
    .await;
    assert_eq!(got, id);
    assert!(
        bob.store
            .call(move |s| s.message(&id))
            .await
            .unwrap()
            .is_some(),
        "committed before the event"
    );
    handle.stop().await;
    let after = bob.sync(&relay).await;
    assert!(
        after.received.is_empty() && after.duplicates == 0,
        "the session acknowledged it: {after:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_session_reconnects_and_sends_what_was_queued_meanwhile() {
    let dir = tempfile::tempdir().unwrap();
    let config = RelayConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        db: Some(dir.path().join("relay.db")),
        ..RelayConfig::default()
    };
    let relay = Relay::start(config.clone()).await.unwrap();
    let addr = relay.addr();
    let url: mailslot::client::RelayUrl = relay.url().parse().unwrap();
    let (alice, bob) = (TestAgent::new("alice"), TestAgent::new("bob"));
    mailslot::client::sync(&url, &bob.name, &bob.identity, None, &bob.store)
        .await
        .unwrap();

    let (handle, mut events) = session(&alice, &url);
    wait_for(&mut events, |e| {
        matches!(e, ClientEvent::Connected { .. }).then_some(())
    })
    .await;
    relay.shutdown().await;
    let reason = wait_for(&mut events, |e| match e {
        ClientEvent::Disconnected { reason, .. } => Some(reason.clone()),
        _ => None,
    })
    .await;
    assert!(!reason.is_empty());

    // Queued while the relay is down.
    let m = alice.message(&[&bob], "while you were out", "queued");
    let id = m.id;
    alice
        .store
        .call(move |s| s.queue_outgoing(&m))
        .await
        .unwrap();
    handle.flush();

    let relay = Relay::start(RelayConfig {
        listen: addr,
        ..config
    })
    .await
    .unwrap();
    wait_for(&mut events, |e| {
        matches!(e, ClientEvent::Connected { .. }).then_some(())
    })
    .await;
    // Sent on reconnecting: either already (the outbox no longer has it; it is marked done
    // before the answer) or answered to a wait that started before that.
    let mut answer = handle.expect(id);
    let queued = alice
        .store
        .call(move |s| s.outbox_entry(&id))
        .await
        .unwrap();
    if queued.is_some() {
        let sent = tokio::time::timeout(EVENT_TIMEOUT, answer.answer())
            .await
            .expect("the answer did not come");
        assert_eq!(sent, Some(SendAnswer::Sent));
    }
    let report = tokio::time::timeout(
        Duration::from_secs(20),
        mailslot::client::sync(&url, &bob.name, &bob.identity, None, &bob.store),
    )
    .await
    .unwrap()
    .unwrap();
    assert_eq!(report.received, vec![id]);
    handle.stop().await;
    relay.shutdown().await;
}

/// Each send waits for its own answer, resolved as the relay takes its message: a long burst
/// (the outbox never empty while it lasts) answers every send `sent`, and a subscriber that
/// never reads holds up nothing. The answers once came from a broadcast sent only after the
/// outbox drained, so a burst longer than the send wait answered "queued" for sent mail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_sends_beside_a_subscriber_that_never_reads_answers_each_sent() {
    use futures_util::StreamExt;
    use mailslot::agent::Agent;
    use mailslot::config::Paths;
    use mailslot::mailbox::{Mailbox, RelayStatus, SendOutcome};
    use mailslot::protocol::{AgentName, Message};

    const SENDS: usize = 2_000;
    const AT_ONCE: usize = 64;
    // 2,000 sends are over the default burst (1,000, then 100/s): this test is about the
    // answers, not rates, and a burst faster than 10 s was refused `rate_limited`.
    let relay = TestRelay::start(|c| c.send_burst = SENDS as f64).await;
    let bob = TestAgent::new("bob");
    bob.sync(&relay).await;
    let home = tempfile::tempdir().unwrap();
    let paths = Paths::new(Some(home.path().to_owned()), None).unwrap();
    let (agent, _) = Agent::open_or_create(&paths, &AgentName::new("alice").unwrap()).unwrap();
    let alice = Mailbox::open(agent, relay.url.clone()).await.unwrap();
    let _never_reads = alice.subscribe("a subscriber that never reads");
    let mut status = alice.watch_status();
    tokio::time::timeout(
        EVENT_TIMEOUT,
        status.wait_for(|s| *s == RelayStatus::Online),
    )
    .await
    .expect("alice is online")
    .unwrap();

    let outcomes: Vec<_> = futures_util::stream::iter(0..SENDS)
        .map(|i| {
            let (alice, to) = (alice.clone(), bob.address());
            async move {
                let m = Message::new(alice.address().clone(), vec![to], format!("burst {i}"), "x");
                (i, alice.send(m).await)
            }
        })
        .buffer_unordered(AT_ONCE)
        .collect()
        .await;
    assert_eq!(outcomes.len(), SENDS);
    for (i, outcome) in outcomes {
        assert_eq!(outcome.unwrap(), SendOutcome::Sent, "send {i}");
    }
    let waiting = bob.connect(&relay).await.waiting();
    assert_eq!(
        waiting, SENDS as u64,
        "the relay holds each message for bob once"
    );
    alice.close().await;
}

/// A send is answered as soon as its own message is recorded as sent, not when the rest of
/// the outbox has gone: mail behind it that cannot go out yet (its recipient's relay takes
/// every connection and never answers) holds up nobody's answer but its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_send_is_answered_when_its_message_goes_out_not_when_the_outbox_drains() {
    use mailslot::agent::Agent;
    use mailslot::config::Paths;
    use mailslot::mailbox::{Mailbox, RelayStatus, SendOutcome};
    use mailslot::protocol::{Address, AgentName, Message};

    let relay = TestRelay::start(|_| {}).await;
    let bob = TestAgent::new("bob");
    bob.sync(&relay).await;
    // A relay that takes connections and never answers: a key lookup there waits out its
    // whole timeout (10 s), twice the send wait.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let silent_addr = silent.local_addr().unwrap();
    let held = tokio::spawn(async move {
        let mut sockets = Vec::new();
        while let Ok((socket, _)) = silent.accept().await {
            sockets.push(socket);
        }
    });
    let home = tempfile::tempdir().unwrap();
    let paths = Paths::new(Some(home.path().to_owned()), None).unwrap();
    let (agent, _) = Agent::open_or_create(&paths, &AgentName::new("alice").unwrap()).unwrap();
    let alice = Mailbox::open(agent, relay.url.clone()).await.unwrap();
    let mut status = alice.watch_status();
    tokio::time::timeout(
        EVENT_TIMEOUT,
        status.wait_for(|s| *s == RelayStatus::Online),
    )
    .await
    .expect("alice is online")
    .unwrap();

    let first = Message::new(
        alice.address().clone(),
        vec![bob.address()],
        "first",
        "to bob",
    );
    let stuck_to = Address::parse(&format!("x@{silent_addr}")).unwrap();
    let stuck = Message::new(
        alice.address().clone(),
        vec![stuck_to],
        "second",
        "nowhere yet",
    );
    // Polled in this order, so the first is queued first and leaves the outbox first.
    let (first, stuck) = tokio::join!(alice.send(first), alice.send(stuck));
    assert_eq!(first.unwrap(), SendOutcome::Sent, "answered as it went out");
    assert!(
        matches!(stuck.unwrap(), SendOutcome::Queued { .. }),
        "the stuck one stays queued"
    );
    alice.close().await;
    held.abort();
}
