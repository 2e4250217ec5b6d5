//! Delivered and bounced sent mail, end to end: a real relay on loopback and real `mailslot
//! mcp` processes. The sender learns a copy was delivered by asking the relay (`copies`);
//! every wait here is on a push (`mailslot://sent` changed, a channel event), and "not yet"
//! is shown by a later message that was checked in the same round.

use crate::common;

use common::mcp::*;
use common::*;
use rmcp::model::SubscribeRequestParams;
use serde_json::{Value, json};

const SENT: &str = "mailslot://sent";

/// Subscribes a legacy client to the sent view.
async fn subscribe_sent(c: &McpClient) {
    #[allow(deprecated)]
    c.client
        .subscribe(SubscribeRequestParams::new(SENT))
        .await
        .unwrap();
}

/// The sent tool's entry for `id`.
async fn sent_entry(c: &McpClient, id: &Value) -> Value {
    c.sent_entry(json!({ "limit": 50 }), id)
        .await
        .unwrap_or_else(|| panic!("{id} is not in the sent view"))
}

/// Waits, push by push, until the sent entry for `id` satisfies `done`; the entry.
async fn sent_when(c: &mut McpClient, id: &Value, done: impl Fn(&Value) -> bool) -> Value {
    loop {
        let entry = sent_entry(c, id).await;
        if done(&entry) {
            return entry;
        }
        c.wait_for(|p| matches!(p, Pushed::Updated(uri) if uri == SENT).then_some(()))
            .await;
    }
}

fn state_is(state: &'static str) -> impl Fn(&Value) -> bool {
    move |e: &Value| e["state"] == state
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delivered_reaches_the_sender_once_with_its_time_and_a_waiting_copy_stays_sent() {
    let relay = TestRelay::start(|_| {}).await;
    // Registered before their sessions start, so no send races a registration.
    let home = relay.home(&["bob", "carol"]);
    let mut alice = spawn_mcp(home.path(), "alice", &relay.url, Era::Legacy).await;
    let mut carol = spawn_mcp(home.path(), "carol", &relay.url, Era::Legacy).await;
    subscribe_sent(&alice).await;

    // Bob is offline: his copy waits. Carol is online and takes hers at once.
    let to_bob = alice.ok("send", send_args(&["bob"], "for bob", "x")).await;
    let to_carol = alice
        .ok("send", send_args(&["carol"], "for carol", "y"))
        .await;
    assert_eq!(to_bob["status"], "sent");
    assert_eq!(to_carol["status"], "sent");
    carol.channel_event().await;
    let carols = sent_when(&mut alice, &to_carol["message_id"], state_is("delivered")).await;
    let at = carols["recipients"][0]["at"].as_str().unwrap().to_owned();
    assert_eq!(carols["recipients"][0]["state"], "delivered", "{carols}");
    // Bob's copy was asked about in the same round, before carol's: still waiting.
    let bobs = sent_entry(&alice, &to_bob["message_id"]).await;
    assert_eq!(bobs["state"], "sent", "{bobs}");
    assert!(bobs["recipients"][0].get("at").is_none(), "{bobs}");
    let waiting = alice.ok("sent", json!({ "state": "sent" })).await;
    assert!(
        waiting["messages"]
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m["message_id"] == to_bob["message_id"]),
        "{waiting}"
    );

    // Bob comes online and takes his copy: alice's sent view says so, with a time.
    let mut bob = spawn_mcp(home.path(), "bob", &relay.url, Era::Legacy).await;
    let rung = bob.channel_event().await;
    assert_eq!(rung["meta"]["message_id"], to_bob["message_id"]);
    let bobs = sent_when(&mut alice, &to_bob["message_id"], state_is("delivered")).await;
    let bob_at = bobs["recipients"][0]["at"].as_str().unwrap().to_owned();
    assert!(bob_at >= at, "{bob_at} after {at}");

    // read and thread of the sent message show it, framed outside the fence.
    let read = alice
        .ok("read", json!({ "message_id": to_bob["message_id"] }))
        .await;
    assert_eq!(
        read["delivered"],
        json!([{ "to": "bob", "at": bob_at }]),
        "{read}"
    );
    let framed = read["framed"].as_str().unwrap();
    let fence = framed.find("<<<mailslot-untrusted").unwrap();
    assert!(
        framed.find("Delivered: bob by").unwrap() < fence,
        "{framed}"
    );
    let thread = alice
        .ok("thread", json!({ "thread_id": read["thread_id"] }))
        .await;
    assert_eq!(
        thread["messages"][0]["delivered"][0]["to"], "bob",
        "{thread}"
    );
    // The owner's CLI reads the same store.
    let cli = mailslot_cli(
        home.path(),
        relay.url.as_str(),
        &["--agent", "alice", "sent", "--json"],
    )
    .await;
    let cli: Value = serde_json::from_str(&cli).unwrap();
    let line = cli
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["id"] == to_bob["message_id"])
        .unwrap();
    assert_eq!(line["state"], "delivered", "{line}");

    // Later checks (another send starts one) change nothing: delivered once, same time.
    let again = alice.ok("send", send_args(&["carol"], "again", "z")).await;
    carol.channel_event().await;
    sent_when(&mut alice, &again["message_id"], state_is("delivered")).await;
    let bobs = sent_entry(&alice, &to_bob["message_id"]).await;
    assert_eq!(bobs["state"], "delivered");
    assert_eq!(bobs["recipients"][0]["at"], bob_at.as_str());
    let read = alice
        .ok("read", json!({ "message_id": to_bob["message_id"] }))
        .await;
    assert_eq!(read["delivered"].as_array().unwrap().len(), 1, "{read}");

    // A delivery never rings the model: the first channel event alice gets is carol's mail.
    carol
        .ok("send", send_args(&["alice"], "hello alice", "hi"))
        .await;
    let first = alice.channel_event().await;
    assert_eq!(first["meta"]["kind"], "message", "{first}");
    assert_eq!(first["meta"]["from"], "carol", "{first}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delivered_reaches_a_sender_that_was_offline_when_the_copy_was_taken() {
    let relay = TestRelay::start(|_| {}).await;
    let home = relay.home(&["bob"]);
    let alice = spawn_mcp(home.path(), "alice", &relay.url, Era::Legacy).await;
    let sent = alice
        .ok("send", send_args(&["bob"], "while away", "x"))
        .await;
    assert_eq!(sent["status"], "sent");
    assert_eq!(
        sent_entry(&alice, &sent["message_id"]).await["state"],
        "sent"
    );
    alice.0.close().await.unwrap();

    // Bob takes it while alice is away.
    let mut bob = spawn_mcp(home.path(), "bob", &relay.url, Era::Legacy).await;
    let rung = bob.channel_event().await;
    assert_eq!(rung["meta"]["message_id"], sent["message_id"]);

    // Alice comes back: her first connection asks, and the sent view says delivered.
    let alice = spawn_mcp(home.path(), "alice", &relay.url, Era::Modern).await;
    let mut updates = alice
        .client
        .listen(
            rmcp::model::SubscriptionFilter::builder()
                .resource_subscription(SENT)
                .build(),
        )
        .await
        .unwrap();
    let entry = loop {
        let entry = sent_entry(&alice, &sent["message_id"]).await;
        if entry["state"] == "delivered" {
            break entry;
        }
        let update = tokio::time::timeout(EVENT_TIMEOUT, updates.next())
            .await
            .expect("the sent view did not change")
            .unwrap();
        assert!(update.is_some(), "the listen stream ended");
    };
    assert!(entry["recipients"][0]["at"].is_string(), "{entry}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_that_expires_bounces_to_the_sender_with_a_ring_and_is_never_delivered() {
    let relay = TestRelay::start(|c| {
        c.ttl_secs = 1;
        c.expiry_interval_secs = 1;
    })
    .await;
    let home = relay.home(&["bob"]);
    let mut alice = spawn_mcp(home.path(), "alice", &relay.url, Era::Legacy).await;
    subscribe_sent(&alice).await;
    let sent = alice
        .ok("send", send_args(&["bob"], "nobody home", "x"))
        .await;
    assert_eq!(sent["status"], "sent");

    // The doorbell rings: a notice, outside any fence, naming the message and the recipient.
    let ring = alice.channel_event().await;
    assert_eq!(ring["meta"]["kind"], "bounced", "{ring}");
    let content = ring["content"].as_str().unwrap();
    let id = sent["message_id"].as_str().unwrap();
    assert!(
        content.contains(id) && content.contains("to bob"),
        "{content}"
    );
    let entry = sent_when(&mut alice, &sent["message_id"], state_is("bounced")).await;
    assert_eq!(entry["recipients"][0]["state"], "bounced", "{entry}");
    let read = alice
        .ok("read", json!({ "message_id": sent["message_id"] }))
        .await;
    assert_eq!(read["bounced"], json!(["bob"]), "{read}");
    assert!(read.get("delivered").is_none(), "{read}");

    // Later checks leave it bounced (a later send to carol shows one ran): a bounced copy is
    // never asked about again, so the relay's "gone" after alice acknowledged the bounce
    // cannot turn it into a delivery.
    // Registered before its session starts, so the send cannot race its registration.
    register(home.path(), "carol", &relay.url);
    let mut carol = spawn_mcp(home.path(), "carol", &relay.url, Era::Legacy).await;
    let later = alice.ok("send", send_args(&["carol"], "later", "y")).await;
    carol.channel_event().await;
    sent_when(&mut alice, &later["message_id"], state_is("delivered")).await;
    assert_eq!(
        sent_entry(&alice, &sent["message_id"]).await["state"],
        "bounced"
    );
}
