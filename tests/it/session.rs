//! The long-running client session: mail pushed in as it arrives, the outbox sent on request,
//! and reconnection after the relay goes away and comes back.

use crate::common;

use std::time::Duration;

use common::*;
use mailslot::client::ClientEvent;
use mailslot::relay::{Relay, RelayConfig};
use tokio::sync::broadcast;

/// Waits for the first event matching `pick`, failing after the usual timeout.
async fn wait_for<T>(
    events: &mut broadcast::Receiver<ClientEvent>,
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
    let sent = wait_for(&mut events, |e| match e {
        ClientEvent::Sent(ids) => Some(ids.clone()),
        _ => None,
    })
    .await;
    assert_eq!(sent, vec![id]);
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
