//! Crash safety: `kill -9` the relay process while several clients send; restart it on the
//! same database; every message a client saw `sent` for arrives, none twice.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use common::*;
use mailslot::client::Connection;
use mailslot::crypto::seal;
use mailslot::protocol::{Limits, MessageId};
use tokio::sync::Notify;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_loses_nothing_that_was_acknowledged() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("relay.db");
    let (mut relay, url) = spawn_relay(&db, dir.path());
    let bob = TestAgent::new("bob");
    let bob_keys = vec![(bob.address(), bob.identity.public().clone())];
    Connection::connect(&url, &bob.name, &bob.identity, None)
        .await
        .unwrap()
        .close()
        .await;

    let acked = Arc::new(std::sync::Mutex::new(Vec::<MessageId>::new()));
    let count = Arc::new(AtomicUsize::new(0));
    let enough = Arc::new(Notify::new());
    let mut senders = Vec::new();
    for i in 0..4 {
        let sender = TestAgent::new(&format!("sender{i}"));
        let (url, keys, acked, count, enough) = (
            url.clone(),
            bob_keys.clone(),
            acked.clone(),
            count.clone(),
            enough.clone(),
        );
        senders.push(tokio::spawn(async move {
            let mut conn = Connection::connect(&url, &sender.name, &sender.identity, None)
                .await
                .unwrap();
            // Flat out until the relay dies under us.
            for n in 0.. {
                let m = mailslot::protocol::Message::new(
                    sender.address(),
                    vec![keys[0].0.clone()],
                    format!("crash test {n}"),
                    "payload",
                );
                let env = seal(&m, &sender.identity, &keys, &Limits::default())
                    .unwrap()
                    .remove(0);
                match conn.send_envelope(env).await {
                    Ok(id) => {
                        acked.lock().unwrap().push(id);
                        if count.fetch_add(1, Ordering::SeqCst) + 1 == 400 {
                            enough.notify_one();
                        }
                    }
                    Err(_) => return,
                }
            }
        }));
    }
    tokio::time::timeout(EVENT_TIMEOUT, enough.notified())
        .await
        .expect("senders made no progress");
    relay.kill(); // SIGKILL
    for s in senders {
        s.await.unwrap();
    }
    let acked = acked.lock().unwrap().clone();
    assert!(acked.len() >= 400);

    let (mut relay, url) = spawn_relay(&db, dir.path());
    let report = tokio::time::timeout(
        EVENT_TIMEOUT,
        mailslot::client::sync(&url, &bob.name, &bob.identity, None, &bob.store),
    )
    .await
    .unwrap()
    .unwrap();
    let mut received = report.received.clone();
    assert_eq!(report.duplicates, 0, "nothing delivered twice");
    received.sort();
    let mut expected = acked;
    expected.sort();
    let missing: Vec<_> = expected
        .iter()
        .filter(|id| received.binary_search(id).is_err())
        .collect();
    assert!(
        missing.is_empty(),
        "{} acknowledged messages lost, e.g. {:?}",
        missing.len(),
        missing.first()
    );
    // Sends cut off mid-flight may have been stored without an answer: more is fine, less is not.
    assert!(received.len() >= expected.len());
    relay.kill();
}
