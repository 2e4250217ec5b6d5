//! Several relay nodes on PostgreSQL under failure: a node killed with `kill -9` under load,
//! and the database restarting under load. Every message a sender saw `sent` for is delivered,
//! once, through the nodes that are left.

use crate::common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use common::postgres::PgCluster;
use common::*;
use mailslot::client::{Connection, RelayUrl};
use mailslot::crypto::{PublicIdentity, seal};
use mailslot::protocol::{Address, Limits, Message, MessageId, SealedEnvelope};
use tokio::sync::Notify;

/// What the senders saw: every id answered `sent`, and how many so far.
#[derive(Default)]
struct Sent {
    ids: Mutex<Vec<MessageId>>,
    count: AtomicUsize,
    enough: Notify,
}

impl Sent {
    fn record(&self, id: MessageId, enough_at: usize) {
        self.ids.lock().unwrap().push(id);
        if self.count.fetch_add(1, Ordering::SeqCst) + 1 == enough_at {
            self.enough.notify_one();
        }
    }
}

fn sealed(
    sender: &TestAgent,
    to: &(Address, PublicIdentity),
    n: usize,
) -> (MessageId, SealedEnvelope) {
    let m = Message::new(
        sender.address(),
        vec![to.0.clone()],
        format!("load {n}"),
        "payload",
    );
    let env = seal(
        &m,
        &sender.identity,
        std::slice::from_ref(to),
        &Limits::default(),
    )
    .unwrap()
    .remove(0);
    (m.id, env)
}

/// How long bob may take to drain the backlog. The client commits every delivery to its store
/// on its own (`synchronous = FULL`): ~500 fsyncs, 1.6 s on a quiet machine but 12–18 s
/// measured while a CI build ran beside it, so the event timeout was too tight. A bound on
/// progress, not a speed check.
const DRAIN_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(90);

/// Bob collects everything waiting through `url`; every id in `sent` must be there, none twice.
async fn all_delivered_once(bob: &TestAgent, url: &RelayUrl, sent: &Sent) {
    let report = tokio::time::timeout(
        DRAIN_TIMEOUT,
        mailslot::client::sync(url, &bob.name, &bob.identity, None, &bob.store),
    )
    .await
    .expect("bob's sync finished")
    .expect("bob's sync worked");
    assert_eq!(report.duplicates, 0, "nothing delivered twice");
    let mut received = report.received.clone();
    received.sort();
    let sent = sent.ids.lock().unwrap().clone();
    let missing: Vec<_> = sent
        .iter()
        .filter(|id| received.binary_search(id).is_err())
        .collect();
    assert!(
        missing.is_empty(),
        "{} of {} sent messages lost, e.g. {:?}",
        missing.len(),
        sent.len(),
        missing.first()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_killed_under_load_loses_nothing_that_was_sent() {
    let Some(cluster) = PgCluster::shared() else {
        return;
    };
    let db = cluster.create_database("node_killed").await;
    // One home for both nodes: they share the key kept there, as nodes of one database must.
    let home = tempfile::tempdir().unwrap();
    let (mut doomed, doomed_url) = spawn_relay(&db, home.path());
    let (mut survivor, survivor_url) = spawn_relay(&db, home.path());
    let bob = TestAgent::new("bob");
    Connection::connect(&survivor_url, &bob.name, &bob.identity, None)
        .await
        .unwrap()
        .close()
        .await;
    let to = (bob.address(), bob.identity.public().clone());

    // Four senders flat out, two on each node; the ones on the killed node stop at the error.
    let sent = Arc::new(Sent::default());
    let killed = Arc::new(AtomicBool::new(false));
    let mut senders = Vec::new();
    for i in 0..4 {
        let sender = TestAgent::new(&format!("sender{i}"));
        let url = if i % 2 == 0 {
            doomed_url.clone()
        } else {
            survivor_url.clone()
        };
        let (to, sent, killed) = (to.clone(), sent.clone(), killed.clone());
        senders.push(tokio::spawn(async move {
            let mut conn = Connection::connect(&url, &sender.name, &sender.identity, None)
                .await
                .unwrap();
            let mut after_kill = 0;
            for n in 0.. {
                let (_, env) = sealed(&sender, &to, n);
                match conn.send_envelope(env).await {
                    Ok(id) => sent.record(id, 400),
                    // The killed node's senders stop here.
                    Err(_) => return after_kill,
                }
                if killed.load(Ordering::SeqCst) {
                    after_kill += 1;
                    if after_kill == 50 {
                        return after_kill;
                    }
                }
            }
            after_kill
        }));
    }
    tokio::time::timeout(EVENT_TIMEOUT, sent.enough.notified())
        .await
        .expect("the senders made no progress");
    doomed.kill(); // SIGKILL
    killed.store(true, Ordering::SeqCst);
    let mut went_on = 0;
    for s in senders {
        if s.await.unwrap() == 50 {
            went_on += 1;
        }
    }
    assert_eq!(
        went_on, 2,
        "the senders on the surviving node went on sending"
    );
    all_delivered_once(&bob, &survivor_url, &sent).await;
    survivor.kill();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_database_restarting_under_load_loses_nothing_that_was_sent() {
    // A cluster of its own: restarting the shared one would disturb the other tests.
    let Some(cluster) = PgCluster::start() else {
        return;
    };
    let cluster = Arc::new(cluster);
    let db = cluster.create_database("db_restart").await;
    let node = |db: String| TestRelay::start(move |c| c.db = Some(db.into()));
    let (one, two) = (node(db.clone()).await, node(db).await);
    let (alice, bob) = (TestAgent::new("alice"), TestAgent::new("bob"));
    alice.sync(&one).await;
    bob.sync(&two).await;
    let to = (bob.address(), bob.identity.public().clone());

    // Alice sends through node 1 without pause; each message is sent again (same id, a
    // re-send the relay stores once) until it is answered `sent`, across the restart.
    const TOTAL: usize = 300;
    let sent = Arc::new(Sent::default());
    let sender = {
        let (url, to, sent) = (one.url.clone(), to.clone(), sent.clone());
        tokio::spawn(async move {
            let mut conn = None;
            let mut refused = 0usize;
            for n in 0..TOTAL {
                let (id, env) = sealed(&alice, &to, n);
                loop {
                    if conn.is_none() {
                        conn = Connection::connect(&url, &alice.name, &alice.identity, None)
                            .await
                            .ok();
                    }
                    let Some(c) = conn.as_mut() else {
                        refused += 1;
                        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                        continue;
                    };
                    match c.send_envelope(env.clone()).await {
                        Ok(got) => {
                            assert_eq!(got, id);
                            sent.record(id, TOTAL / 3);
                            break;
                        }
                        Err(_) => {
                            refused += 1;
                            conn = None;
                            // Back off while the database is away (not a synchronisation).
                            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                        }
                    }
                }
            }
            refused
        })
    };
    tokio::time::timeout(EVENT_TIMEOUT, sent.enough.notified())
        .await
        .expect("alice made no progress");
    let restarting = cluster.clone();
    tokio::task::spawn_blocking(move || restarting.restart())
        .await
        .unwrap();
    let refused = tokio::time::timeout(2 * EVENT_TIMEOUT, sender)
        .await
        .expect("alice finished after the restart")
        .unwrap();
    assert_eq!(sent.count.load(Ordering::SeqCst), TOTAL);
    eprintln!("sends refused or cut off while the database restarted: {refused}");
    all_delivered_once(&bob, &two.url, &sent).await;
}
