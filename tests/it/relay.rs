//! The relay and its client, over real sockets: delivery, exactly-once, BCC, abuse, consent-free
//! basics, replacement, shutdown, and HTTP.

use crate::common;

use common::*;
use mailslot::crypto::seal;
use mailslot::protocol::{ClientFrame, ErrorCode, Limits, ServerFrame};
use mailslot::store::{InboxQuery, Trust};

#[tokio::test]
async fn an_offline_recipient_gets_its_mail_exactly_once() {
    // bob is registered, then offline.
    let (relay, [bob]) = TestRelay::with_agents(["bob"]).await;
    let alice = TestAgent::new("alice");
    let message = alice.message(&[&bob], "plan", "ship on friday");
    let id = message.id;
    let sent = alice.send(&relay, message).await;
    assert_eq!(sent.sent, vec![id]);
    assert_eq!(alice.store.call(|s| s.outbox_len()).await.unwrap(), 0);

    let first = bob.sync(&relay).await;
    assert_eq!(first.received, vec![id]);
    let again = bob.sync(&relay).await;
    assert!(
        again.received.is_empty() && again.duplicates == 0,
        "acked mail is not redelivered: {again:?}"
    );
    let stored = bob
        .store
        .call(move |s| s.message(&id))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(stored.message.body, "ship on friday");
    assert_eq!(stored.trust, Trust::Verified);
    assert_eq!(bob.store.call(|s| s.message_count()).await.unwrap(), 1);
    relay.relay.shutdown().await;
}

#[tokio::test]
async fn cc_and_bcc_reach_everyone_and_bcc_stays_blind() {
    let (relay, [bob, carol, dave, erin]) =
        TestRelay::with_agents(["bob", "carol", "dave", "erin"]).await;
    let alice = TestAgent::new("alice");
    let mut m = alice.message(&[&bob], "budget", "numbers inside");
    m.cc = vec![carol.address()];
    m.bcc = vec![dave.address(), erin.address()];
    let id = m.id;
    assert_eq!(alice.send(&relay, m).await.sent, vec![id]);
    for (agent, bcc) in [
        (&bob, vec![]),
        (&carol, vec![]),
        (&dave, vec![dave.address()]),
        (&erin, vec![erin.address()]),
    ] {
        assert_eq!(
            agent.sync(&relay).await.received,
            vec![id],
            "{} got it",
            agent.name
        );
        let got = agent
            .store
            .call(move |s| s.message(&id))
            .await
            .unwrap()
            .unwrap()
            .message;
        assert_eq!(got.bcc, bcc, "{} sees only itself in bcc", agent.name);
        assert_eq!(got.cc, vec![carol.address()]);
    }
    let own = alice
        .store
        .call(move |s| s.message(&id))
        .await
        .unwrap()
        .unwrap()
        .message;
    assert_eq!(own.bcc.len(), 2, "the sender keeps the full bcc list");
}

#[tokio::test]
async fn replies_stay_in_the_thread() {
    let (relay, [alice, bob]) = TestRelay::with_agents(["alice", "bob"]).await;
    let first = alice.message(&[&bob], "question", "which port?");
    let (thread, first_id) = (first.thread, first.id);
    alice.send(&relay, first).await;
    bob.sync(&relay).await;
    let mut answer = bob.message(&[&alice], "Re: question", "7878");
    answer.thread = thread;
    answer.in_reply_to = Some(first_id);
    bob.send(&relay, answer).await;
    alice.sync(&relay).await;
    let conversation = alice.store.call(move |s| s.thread(&thread)).await.unwrap();
    assert_eq!(
        conversation
            .iter()
            .map(|m| m.message.body.as_str())
            .collect::<Vec<_>>(),
        vec!["which port?", "7878"]
    );
    assert_eq!(conversation[1].message.in_reply_to, Some(first_id));
}

#[tokio::test]
async fn resending_an_accepted_id_stores_nothing_new() {
    let (relay, [bob]) = TestRelay::with_agents(["bob"]).await;
    let alice = TestAgent::new("alice");
    let m = alice.message(&[&bob], "once", "only once");
    let keys = vec![(bob.address(), bob.identity.public().clone())];
    let mut conn = alice.connect(&relay).await;
    // Two different sealings of the same message: same id, different bytes.
    for _ in 0..2 {
        let env = seal(&m, &alice.identity, &keys, &Limits::default())
            .unwrap()
            .remove(0);
        assert_eq!(conn.send_envelope(env).await.unwrap(), m.id);
    }
    conn.close().await;
    let report = bob.sync(&relay).await;
    assert_eq!(
        (report.received.len(), report.duplicates),
        (1, 0),
        "{report:?}"
    );
}

#[tokio::test]
async fn a_lost_ack_means_redelivery_and_the_store_keeps_one_copy() {
    let (relay, [bob]) = TestRelay::with_agents(["bob"]).await;
    let alice = TestAgent::new("alice");
    let m = alice.message(&[&bob], "retry", "body");
    let id = m.id;
    alice.send(&relay, m).await;

    // Delivered but never committed: the connection drops first.
    let mut raw = raw_login(&relay, &bob).await;
    assert!(matches!(
        raw_recv(&mut raw).await,
        Some(ServerFrame::Deliver { .. })
    ));
    drop(raw);
    // Committed but the ack is lost: a sync that commits, then a connection that drops.
    let mut conn = bob.connect(&relay).await;
    let ServerFrame::Deliver { envelope, .. } = conn.recv().await.unwrap() else {
        panic!("expected a delivery")
    };
    let opened = mailslot::crypto::open(
        &envelope,
        &bob.address(),
        &bob.identity,
        alice.identity.public(),
        &Limits::default(),
    )
    .unwrap();
    bob.store
        .call(move |s| s.insert_message(&opened, mailslot::store::Direction::In, Trust::Verified))
        .await
        .unwrap();
    drop(conn);

    let report = bob.sync(&relay).await;
    assert_eq!(
        (report.received.len(), report.duplicates),
        (0, 1),
        "redelivered, deduplicated: {report:?}"
    );
    assert_eq!(bob.store.call(|s| s.message_count()).await.unwrap(), 1);
    assert!(bob.sync(&relay).await.duplicates == 0, "acked this time");
    assert_eq!(
        bob.store
            .call(|s| s.inbox(&InboxQuery::default()))
            .await
            .unwrap()[0]
            .message
            .id,
        id
    );
}

#[tokio::test]
async fn a_second_connection_replaces_the_first_cleanly() {
    let relay = TestRelay::start(|_| {}).await;
    let (alice, bob) = (TestAgent::new("alice"), TestAgent::new("bob"));
    let mut first = raw_login(&relay, &bob).await;
    let mut second = raw_login(&relay, &bob).await;
    let (code, _, _) = next_error(&mut first)
        .await
        .expect("the first connection is told why");
    assert_eq!(code, ErrorCode::Replaced);
    assert!(raw_recv(&mut first).await.is_none(), "and closed");
    // The new connection still gets mail pushed to it.
    alice
        .send(&relay, alice.message(&[&bob], "after", "replacement"))
        .await;
    loop {
        match raw_recv(&mut second).await {
            Some(ServerFrame::Deliver { .. }) => break,
            Some(ServerFrame::CaughtUp {}) => continue,
            other => panic!("expected a pushed delivery, got {other:?}"),
        }
    }
}

#[tokio::test]
async fn bad_hellos_are_refused_with_their_codes() {
    let relay = TestRelay::start(|c| c.auth_timeout_secs = 1).await;
    let (alice, mallory) = (TestAgent::new("alice"), TestAgent::new("mallory"));
    alice.sync(&relay).await;

    // Wrong signature: mallory signs, claiming to be alice.
    let (mut ws, relay_id, nonce) = raw_connect(&relay).await;
    let ClientFrame::Hello { signature, .. } = hello(&mallory, &relay_id, &nonce) else {
        unreachable!()
    };
    raw_send(
        &mut ws,
        &ClientFrame::Hello {
            agent: alice.name.clone(),
            signature,
            register: None,
            control: false,
            owner: None,
            invite: None,
        },
    )
    .await;
    assert_eq!(next_error(&mut ws).await.unwrap().0, ErrorCode::AuthFailed);

    // Replayed hello: a valid answer to another connection's challenge.
    let (_, relay_id, old_nonce) = raw_connect(&relay).await;
    let replay = hello(&alice, &relay_id, &old_nonce);
    let (mut ws, _, _) = raw_connect(&relay).await;
    raw_send(&mut ws, &replay).await;
    assert_eq!(next_error(&mut ws).await.unwrap().0, ErrorCode::AuthFailed);

    // Taking a registered name with other keys.
    let (mut ws, relay_id, nonce) = raw_connect(&relay).await;
    let ClientFrame::Hello {
        signature,
        register,
        ..
    } = hello(&mallory, &relay_id, &nonce)
    else {
        unreachable!()
    };
    raw_send(
        &mut ws,
        &ClientFrame::Hello {
            agent: alice.name.clone(),
            signature,
            register,
            control: false,
            owner: None,
            invite: None,
        },
    )
    .await;
    assert_eq!(next_error(&mut ws).await.unwrap().0, ErrorCode::NameTaken);

    // No hello at all: the deadline closes it.
    let (mut ws, _, _) = raw_connect(&relay).await;
    assert_eq!(next_error(&mut ws).await.unwrap().0, ErrorCode::AuthTimeout);

    // The relay still serves honest clients.
    assert!(alice.sync(&relay).await.not_sent.is_empty());
}

#[tokio::test]
async fn bad_sends_get_their_codes_and_the_connection_keeps_working() {
    let (relay, [bob, carol]) = TestRelay::with_agents(["bob", "carol"]).await;
    let alice = TestAgent::new("alice");
    let mut ws = raw_login(&relay, &alice).await;
    let keys = |a: &TestAgent| (a.address(), a.identity.public().clone());

    // Sending as someone else: carol's envelope on alice's connection.
    let forged = carol.message(&[&bob], "hi", "from 'carol'");
    let env = seal(&forged, &carol.identity, &[keys(&bob)], &Limits::default())
        .unwrap()
        .remove(0);
    raw_send(
        &mut ws,
        &ClientFrame::Send {
            reference: "r1".into(),
            envelope: env,
            group: None,
        },
    )
    .await;
    assert_eq!(next_error(&mut ws).await.unwrap().0, ErrorCode::NotSender);

    // Unknown recipient.
    let ghost = TestAgent::new("ghost");
    let m = alice.message(&[&ghost], "hi", "anyone?");
    let env = seal(&m, &alice.identity, &[keys(&ghost)], &Limits::default())
        .unwrap()
        .remove(0);
    raw_send(
        &mut ws,
        &ClientFrame::Send {
            reference: "r2".into(),
            envelope: env,
            group: None,
        },
    )
    .await;
    let (code, message, _) = next_error(&mut ws).await.unwrap();
    assert_eq!(code, ErrorCode::UnknownRecipient);
    assert!(message.contains("ghost"), "{message}");

    // Invalid JSON, then an unknown frame type.
    raw_send_text(&mut ws, "{not json").await;
    assert_eq!(next_error(&mut ws).await.unwrap().0, ErrorCode::BadFrame);
    raw_send_text(&mut ws, r#"{"type":"approve","code":"123456"}"#).await;
    assert_eq!(next_error(&mut ws).await.unwrap().0, ErrorCode::BadFrame);
    // Unknown fields are refused on every frame type, fieldless ones too.
    raw_send_text(&mut ws, r#"{"type":"ping","x":1}"#).await;
    let (code, message, _) = next_error(&mut ws).await.unwrap();
    assert_eq!(code, ErrorCode::BadFrame);
    assert!(message.contains("unknown field `x`"), "{message}");
    // A well-formed send frame whose envelope is not a sealed envelope.
    raw_send_text(&mut ws, r#"{"type":"send","ref":"r3","envelope":{"v":1}}"#).await;
    assert_eq!(
        next_error(&mut ws).await.unwrap().0,
        ErrorCode::InvalidEnvelope
    );

    // Still served.
    raw_send(&mut ws, &ClientFrame::Ping {}).await;
    loop {
        match raw_recv(&mut ws).await.expect("still open") {
            ServerFrame::Pong {} => break,
            ServerFrame::CaughtUp {} => continue,
            other => panic!("expected pong, got {other:?}"),
        }
    }
    // And bob received nothing forged.
    assert!(bob.sync(&relay).await.received.is_empty());
}

#[tokio::test]
async fn an_envelope_in_another_json_spelling_is_delivered_in_canonical_form() {
    let (relay, [bob]) = TestRelay::with_agents(["bob"]).await;
    let alice = TestAgent::new("alice");
    let mut ws = raw_login(&relay, &alice).await;
    let m = alice.message(&[&bob], "escaped", "a/b/c");
    let env = seal(
        &m,
        &alice.identity,
        &[(bob.address(), bob.identity.public().clone())],
        &Limits::default(),
    )
    .unwrap()
    .remove(0);
    let frame = serde_json::to_string(&ClientFrame::Send {
        reference: "r1".into(),
        envelope: env,
        group: None,
    })
    .unwrap();
    // JSON allows `\/` for `/`; base64 is full of slashes, and another encoder may write them so.
    assert!(frame.contains('/'));
    raw_send_text(&mut ws, &frame.replace('/', "\\/")).await;
    loop {
        match raw_recv(&mut ws).await.expect("still open") {
            ServerFrame::Sent { reference, .. } => break assert_eq!(reference, "r1"),
            ServerFrame::CaughtUp {} => continue,
            other => panic!("expected sent, got {other:?}"),
        }
    }
    let received = bob.sync(&relay).await.received;
    assert_eq!(
        received.len(),
        1,
        "bob opens it: the relay stored the canonical form"
    );
}

#[tokio::test]
async fn a_client_that_keeps_misbehaving_is_closed() {
    let relay = TestRelay::start(|c| c.max_errors_per_connection = 3).await;
    let alice = TestAgent::new("alice");
    let mut ws = raw_login(&relay, &alice).await;
    for _ in 0..4 {
        raw_send_text(&mut ws, "garbage").await;
    }
    let mut codes = Vec::new();
    while let Some((code, _, _)) = next_error(&mut ws).await {
        codes.push(code);
    }
    assert_eq!(codes.last(), Some(&ErrorCode::TooManyErrors), "{codes:?}");
    assert!(
        alice.sync(&relay).await.not_sent.is_empty(),
        "it may reconnect and behave"
    );
}

#[tokio::test]
async fn an_oversized_frame_is_refused_without_hurting_others() {
    let (relay, [bob]) = TestRelay::with_agents(["bob"]).await;
    let alice = TestAgent::new("alice");
    let mut ws = raw_login(&relay, &alice).await;
    let huge = format!(
        r#"{{"type":"ping","pad":"{}"}}"#,
        "x".repeat(Limits::default().envelope_bytes + 8192)
    );
    let _ = futures_util::SinkExt::send(
        &mut ws,
        tokio_tungstenite::tungstenite::Message::Text(huge.into()),
    )
    .await;
    assert_eq!(
        next_error(&mut ws).await.map(|e| e.0),
        Some(ErrorCode::TooLarge)
    );
    while raw_recv(&mut ws).await.is_some() {}
    let m = alice.message(&[&bob], "after", "the big one");
    assert_eq!(alice.send(&relay, m).await.sent.len(), 1);
    assert_eq!(bob.sync(&relay).await.received.len(), 1);
}

#[tokio::test]
async fn a_flood_is_rate_limited_with_a_retry_hint() {
    let relay = TestRelay::start(|c| {
        c.send_rate = 0.5;
        c.send_burst = 3.0;
    })
    .await;
    let (alice, bob) = (TestAgent::new("alice"), TestAgent::new("bob"));
    bob.sync(&relay).await;
    let mut conn = alice.connect(&relay).await;
    let keys = vec![(bob.address(), bob.identity.public().clone())];
    let mut accepted = Vec::new();
    let mut refusal = None;
    for i in 0..10 {
        let m = alice.message(&[&bob], &format!("flood {i}"), "x");
        let env = seal(&m, &alice.identity, &keys, &Limits::default())
            .unwrap()
            .remove(0);
        match conn.send_envelope(env).await {
            Ok(id) => accepted.push(id),
            Err(e) => {
                refusal = Some(e);
                break;
            }
        }
    }
    assert_eq!(accepted.len(), 3, "the burst passes");
    match refusal {
        Some(mailslot::client::ClientError::Refused {
            code: ErrorCode::RateLimited,
            retry_after_ms: Some(ms),
            ..
        }) => {
            assert!(ms > 0 && ms <= 2000, "{ms}");
        }
        other => panic!("expected rate_limited, got {other:?}"),
    }
    conn.close().await;
    let got = bob.sync(&relay).await.received;
    assert_eq!(got, accepted, "everything accepted arrives, in order");
}

#[tokio::test]
async fn a_full_mailbox_refuses_the_sender_and_loses_nothing() {
    let relay = TestRelay::start(|c| c.quota_messages = 2).await;
    let (alice, bob) = (TestAgent::new("alice"), TestAgent::new("bob"));
    bob.sync(&relay).await;
    for i in 0..2 {
        alice
            .send(&relay, alice.message(&[&bob], &format!("m{i}"), "x"))
            .await;
    }
    let third = alice.message(&[&bob], "m2", "x");
    let id = third.id;
    let report = alice.send(&relay, third).await;
    let (failed, reason, retry) = &report.not_sent[0];
    assert_eq!(*failed, id);
    assert!(reason.contains("quota_full") && *retry, "{reason}");
    assert_eq!(
        alice.store.call(|s| s.outbox_len()).await.unwrap(),
        1,
        "kept for retry"
    );
    assert_eq!(bob.sync(&relay).await.received.len(), 2);
    // Room again: the retry goes through.
    assert_eq!(alice.sync(&relay).await.sent, vec![id]);
    assert_eq!(bob.sync(&relay).await.received, vec![id]);
}

#[tokio::test]
async fn shutdown_tells_connected_clients_why() {
    let relay = TestRelay::start(|_| {}).await;
    let alice = TestAgent::new("alice");
    let mut ws = raw_login(&relay, &alice).await;
    let TestRelay { relay, .. } = relay;
    let shutdown = tokio::spawn(relay.shutdown());
    assert_eq!(
        next_error(&mut ws).await.unwrap().0,
        ErrorCode::ShuttingDown
    );
    shutdown.await.unwrap();
}

#[tokio::test]
async fn http_health_metrics_registration_and_lookup() {
    let relay = TestRelay::start(|_| {}).await;
    let base = format!("http://{}", relay.relay.addr());
    let get = |path: &str| {
        let url = format!("{base}{path}");
        async move { http(&url, None).await }
    };
    assert_eq!(get("/healthz").await, (200, "ok\n".to_owned()));
    let alice = TestAgent::new("alice");
    let keys = alice.identity.public().to_keys();
    let sig = mailslot::crypto::sign::signature(
        &alice.identity,
        mailslot::crypto::sign::Domain::Register,
        &mailslot::protocol::register_payload(&alice.name, &keys),
    );
    let body = serde_json::json!({"name": "alice", "keys": keys, "signature": mailslot::protocol::b64::encode(&sig)}).to_string();
    assert_eq!(http(&format!("{base}/v1/agents"), Some(&body)).await.0, 201);
    assert_eq!(
        http(&format!("{base}/v1/agents"), Some(&body)).await.0,
        200,
        "idempotent"
    );
    let mallory = TestAgent::new("mallory");
    let other = mallory.identity.public().to_keys();
    let sig = mailslot::crypto::sign::signature(
        &mallory.identity,
        mailslot::crypto::sign::Domain::Register,
        &mailslot::protocol::register_payload(&alice.name, &other),
    );
    let body = serde_json::json!({"name": "alice", "keys": other, "signature": mailslot::protocol::b64::encode(&sig)}).to_string();
    assert_eq!(http(&format!("{base}/v1/agents"), Some(&body)).await.0, 409);
    let (status, record) = get("/v1/agents/alice").await;
    assert_eq!(status, 200);
    assert!(
        record.contains(alice.identity.fingerprint().as_str()),
        "{record}"
    );
    assert_eq!(get("/v1/agents/nobody").await.0, 404);
    assert_eq!(get("/v1/agents/NOT-VALID").await.0, 400);
    // Traffic shows in the metrics.
    alice.sync(&relay).await;
    let (status, metrics) = get("/metrics").await;
    assert_eq!(status, 200);
    assert!(
        metrics.contains("mailslot_relay_accepted_total"),
        "{metrics}"
    );
    // So do the storage's writes: registrations and the sync's writes were batched, committed
    // and flushed.
    for series in [
        "mailslot_relay_storage_write_seconds_count",
        "mailslot_relay_storage_commit_seconds_count",
        "mailslot_relay_storage_batch_writes_count",
        "mailslot_relay_storage_flush_seconds_count",
    ] {
        let count: f64 = metrics
            .lines()
            .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {series} in {metrics}"));
        assert!(count > 0.0, "{series} is {count}");
    }
}

/// A tiny HTTP/1.1 client over a TCP socket, enough for the relay's endpoints.
async fn http(url: &str, post: Option<&str>) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let rest = url.strip_prefix("http://").unwrap();
    let (host, path) = rest
        .split_once('/')
        .map(|(h, p)| (h, format!("/{p}")))
        .unwrap();
    let mut stream = tokio::net::TcpStream::connect(host).await.unwrap();
    let request = match post {
        Some(body) => format!(
            "POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        ),
        None => format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"),
    };
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = Vec::new();
    stream.read_to_end(&mut response).await.unwrap();
    let text = String::from_utf8_lossy(&response).into_owned();
    let status = text.split(' ').nth(1).unwrap().parse().unwrap();
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (status, body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_delivery_window_counts_messages_not_sequence_numbers() {
    // Mail for two recipients interleaves, so bob's sequence numbers are far apart; a client
    // that has not acked yet must still get every message up to the window (1024).
    // 1,100 sends are over the default burst; this test is about delivery, not rates.
    let relay = TestRelay::start(|c| c.send_burst = 2000.0).await;
    let [bob, carol] = relay.agents(["bob", "carol"]).await;
    let alice = TestAgent::new("alice");
    let mut conn = alice.connect(&relay).await;
    let keys = |a: &TestAgent| vec![(a.address(), a.identity.public().clone())];
    for i in 0..1100 {
        let to = if i % 2 == 0 { &bob } else { &carol };
        let m = alice.message(&[to], "interleaved", "x");
        let env = seal(&m, &alice.identity, &keys(to), &Limits::default())
            .unwrap()
            .remove(0);
        conn.send_envelope(env).await.unwrap();
    }
    conn.close().await;
    let mut raw = raw_login(&relay, &bob).await;
    let mut delivered = 0;
    while delivered < 550 {
        match raw_recv(&mut raw).await.expect("open") {
            ServerFrame::Deliver { .. } => delivered += 1,
            ServerFrame::CaughtUp {} => break,
            _ => {}
        }
    }
    assert_eq!(delivered, 550, "all of bob's mail arrives before any ack");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_agents_at_once_are_all_served() {
    let relay = TestRelay::start(|_| {}).await;
    let agents: Vec<TestAgent> = (0..24)
        .map(|i| TestAgent::new(&format!("agent{i}")))
        .collect();
    for a in &agents {
        a.sync(&relay).await;
    }
    // Everyone sends to the next at once, then everyone syncs at once.
    let sends = agents.iter().enumerate().map(|(i, a)| {
        let next = &agents[(i + 1) % agents.len()];
        a.send(&relay, a.message(&[next], "ring", "hello neighbour"))
    });
    let first = futures_util::future::join_all(sends).await;
    assert!(first.iter().all(|r| r.sent.len() == 1), "{first:?}");
    // A send's sync also takes delivery, so count what each agent got over both rounds.
    let second = futures_util::future::join_all(agents.iter().map(|a| a.sync(&relay))).await;
    for (a, b) in first.iter().zip(&second) {
        assert_eq!(a.received.len() + b.received.len(), 1, "{a:?} then {b:?}");
        assert_eq!(a.duplicates + b.duplicates, 0);
    }
}

#[tokio::test]
async fn agents_opt_in_and_out_of_the_directory() {
    let (relay, [_bob]) = TestRelay::with_agents(["bob"]).await;
    let alice = TestAgent::new("alice");
    let base = format!("http://{}", relay.relay.addr());
    assert_eq!(
        http(&format!("{base}/v1/directory"), None).await,
        (200, "[]".to_owned()),
        "nobody is listed by default"
    );
    let mut conn = alice.connect(&relay).await;
    let too_long = "x".repeat(mailslot::protocol::MAX_DESCRIPTION_CHARS + 1);
    let err = conn
        .call(|reference| ClientFrame::SetListing {
            reference,
            description: Some(too_long),
        })
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            mailslot::client::ClientError::Refused {
                code: ErrorCode::BadFrame,
                ..
            }
        ),
        "{err:?}"
    );
    conn.call(|reference| ClientFrame::SetListing {
        reference,
        description: Some("reviews Rust code".into()),
    })
    .await
    .unwrap();
    let (status, body) = http(&format!("{base}/v1/directory"), None).await;
    assert_eq!(status, 200);
    let listed: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(listed[0]["agent"], "alice");
    assert_eq!(
        listed[0]["fingerprint"],
        alice.identity.fingerprint().as_str()
    );
    assert_eq!(listed[0]["description"], "reviews Rust code");
    let ServerFrame::DirectoryList { entries, .. } = conn
        .call(|reference| ClientFrame::Directory { reference })
        .await
        .unwrap()
    else {
        panic!("expected the directory")
    };
    assert_eq!(entries.len(), 1);
    conn.call(|reference| ClientFrame::SetListing {
        reference,
        description: None,
    })
    .await
    .unwrap();
    assert_eq!(http(&format!("{base}/v1/directory"), None).await.1, "[]");
}

#[tokio::test]
async fn presence_counts_delivery_sessions_of_visible_agents_only() {
    let relay = TestRelay::start(|_| {}).await;
    let [alice, bob, carol, dave] = ["alice", "bob", "carol", "dave"].map(TestAgent::new);
    let mut asker = alice.connect(&relay).await;
    let mut bob_conn = bob.connect(&relay).await;
    mailslot::client::directory::set_listing(&mut bob_conn, Some("builds relays".into()))
        .await
        .unwrap();
    // dave is listed, but over a control connection only: requests, no delivery session.
    let mut dave_control = mailslot::client::Connection::connect_control(
        &relay.url,
        &dave.name,
        &dave.identity,
        Some(dave.owner.public()),
    )
    .await
    .unwrap();
    mailslot::client::directory::set_listing(&mut dave_control, Some("writes docs".into()))
        .await
        .unwrap();
    let _carol = carol.connect(&relay).await;
    let online = mailslot::client::presence::online(&mut asker, None)
        .await
        .unwrap();
    let names: Vec<&str> = online.iter().map(|o| o.agent.as_str()).collect();
    assert_eq!(names, ["bob"], "carol is not visible, dave is not online");

    let too_many = (0..=mailslot::protocol::MAX_PRESENCE_AGENTS)
        .map(|i| mailslot::protocol::AgentName::new(&format!("a{i}")).unwrap())
        .collect();
    let err = mailslot::client::presence::online(&mut asker, Some(too_many))
        .await
        .unwrap_err();
    assert!(
        matches!(
            &err,
            mailslot::client::ClientError::Refused {
                code: ErrorCode::BadFrame,
                message,
                ..
            } if message.contains("at most 100")
        ),
        "{err:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ack_just_before_a_reconnect_is_honoured_by_the_next_connection() {
    // The client acks and at once connects again (closing the old socket, or leaving it to be
    // replaced). The relay applies acks asynchronously; the next connection must still not
    // get the acknowledged mail again.
    const ROUNDS: usize = 60;
    let (relay, [bob]) = TestRelay::with_agents(["bob"]).await;
    let alice = TestAgent::new("alice");
    let mut sender = alice.connect(&relay).await;
    let keys = vec![(bob.address(), bob.identity.public().clone())];
    let mut ws = raw_login(&relay, &bob).await;
    assert!(matches!(
        raw_recv(&mut ws).await,
        Some(ServerFrame::CaughtUp {})
    ));
    for round in 0..ROUNDS {
        let m = alice.message(&[&bob], &format!("round {round}"), "x");
        let env = seal(&m, &alice.identity, &keys, &Limits::default())
            .unwrap()
            .remove(0);
        sender.send_envelope(env).await.unwrap();
        let seq = match raw_recv(&mut ws).await {
            Some(ServerFrame::Deliver { seq, .. }) => seq,
            other => panic!("round {round}: expected the pushed delivery, got {other:?}"),
        };
        raw_send(&mut ws, &ClientFrame::Ack { seq }).await;
        let closed = round % 2 == 0;
        if closed {
            futures_util::SinkExt::close(&mut ws).await.unwrap();
        }
        let mut next = raw_login(&relay, &bob).await;
        match raw_recv(&mut next).await {
            Some(ServerFrame::CaughtUp {}) => {}
            other => panic!(
                "round {round} ({}): acked mail is not redelivered, got {other:?}",
                if closed { "closed" } else { "replaced" }
            ),
        }
        ws = next;
    }
    sender.close().await;
    relay.relay.shutdown().await;
}

/// `mailslot ARGS` in `home` (with `MAILSLOT_RELAY` when given), nothing on stdin.
fn cli_in(
    home: &std::path::Path,
    relay: Option<&mailslot::client::RelayUrl>,
    args: &[&str],
) -> std::process::Output {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_mailslot"));
    cmd.args(args).env_clear().env("MAILSLOT_HOME", home);
    if let Some(relay) = relay {
        cmd.env("MAILSLOT_RELAY", relay.as_str());
    }
    cmd.stdin(std::process::Stdio::null()).output().unwrap()
}

// Multi-threaded: the test blocks on child processes while the in-process relay serves them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_relay_registers_new_names_by_invite_only() {
    let relay =
        TestRelay::start(|c| c.registration = mailslot::relay::RegistrationMode::Closed).await;
    let home = tempfile::tempdir().unwrap();
    let mailslot = |args: &[&str]| cli_in(home.path(), Some(&relay.url), args);
    let text = |out: &std::process::Output| {
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    };

    let refused = mailslot(&["--agent", "alice", "register"]);
    assert_eq!(refused.status.code(), Some(1), "{}", text(&refused));
    assert!(
        text(&refused).contains("registration_closed")
            && text(&refused).contains("mailslot relay invite"),
        "the refusal names the fix: {}",
        text(&refused)
    );

    // The operator makes two invites beside the running relay.
    let db = relay.db();
    let made = mailslot(&[
        "--json",
        "relay",
        "invite",
        "--db",
        db.to_str().unwrap(),
        "--count",
        "2",
    ]);
    assert!(made.status.success(), "{}", text(&made));
    let made: serde_json::Value = serde_json::from_slice(&made.stdout).unwrap();
    let invites: Vec<String> = made["invites"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_owned())
        .collect();
    assert_eq!(invites.len(), 2);

    let alice = mailslot(&["--agent", "alice", "register", "--invite", &invites[0]]);
    assert!(alice.status.success(), "{}", text(&alice));
    let reused = mailslot(&["--agent", "bob", "register", "--invite", &invites[0]]);
    assert_eq!(reused.status.code(), Some(1));
    assert!(text(&reused).contains("bad_invite"), "{}", text(&reused));
    // A registered name needs no invite any more.
    let synced = mailslot(&["--agent", "alice", "sync"]);
    assert!(synced.status.success(), "{}", text(&synced));
    // Over HTTP too, a new name without an invite is refused.
    let carol = TestAgent::new("carol");
    let keys = carol.identity.public().to_keys();
    let sig = mailslot::crypto::sign::signature(
        &carol.identity,
        mailslot::crypto::sign::Domain::Register,
        &mailslot::protocol::register_payload(&carol.name, &keys),
    );
    let body = serde_json::json!({"name": "carol", "keys": keys, "signature": mailslot::protocol::b64::encode(&sig)}).to_string();
    let base = format!("http://{}", relay.relay.addr());
    let (status, answer) = http(&format!("{base}/v1/agents"), Some(&body)).await;
    assert_eq!(status, 403, "{answer}");
    assert!(answer.contains("registration_closed"), "{answer}");

    // The second invite, from the environment.
    let bob = std::process::Command::new(env!("CARGO_BIN_EXE_mailslot"))
        .args(["--agent", "bob", "register"])
        .env_clear()
        .env("MAILSLOT_HOME", home.path())
        .env("MAILSLOT_RELAY", relay.url.as_str())
        .env("MAILSLOT_INVITE", &invites[1])
        .output()
        .unwrap();
    assert!(bob.status.success(), "{}", text(&bob));

    // The relay keeps digests, never the tokens.
    for file in ["relay.db", "relay.db-wal"] {
        let bytes = std::fs::read(db.with_file_name(file)).unwrap_or_default();
        for token in &invites {
            assert!(
                !bytes.windows(token.len()).any(|w| w == token.as_bytes()),
                "{file} holds a token"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_retires_its_name_and_it_is_free_after_the_grace() {
    let (relay, [bob]) = TestRelay::with_agents(["bob"]).await;
    let alice = TestAgent::new("alice");
    let queued = alice
        .send(&relay, alice.message(&[&bob], "one", "for old bob"))
        .await;
    assert_eq!(queued.sent.len(), 1);

    // Only bob's own key, for this connection, retires bob.
    let mut conn =
        mailslot::client::Connection::connect_control(&relay.url, &bob.name, &bob.identity, None)
            .await
            .unwrap();
    let (mut ws, relay_id, nonce) = raw_connect(&relay).await;
    raw_send(&mut ws, &hello(&bob, &relay_id, &nonce)).await;
    assert!(matches!(
        raw_recv(&mut ws).await,
        Some(ServerFrame::Welcome { .. })
    ));
    let forged = mailslot::crypto::sign::signature(
        &alice.identity,
        mailslot::crypto::sign::Domain::Retire,
        &mailslot::protocol::retire_payload(&relay_id, &nonce, &bob.name),
    );
    raw_send(
        &mut ws,
        &ClientFrame::Retire {
            reference: "x".into(),
            signature: forged.to_vec(),
        },
    )
    .await;
    assert_eq!(next_error(&mut ws).await.unwrap().0, ErrorCode::AuthFailed);
    let detail = conn.retire(&bob.identity).await.unwrap();
    assert!(
        detail.contains("free again after") && detail.contains("1 queued message"),
        "{detail}"
    );
    conn.close().await;
    // bob's live delivery connection ends with it.
    assert_eq!(next_error(&mut ws).await.unwrap().0, ErrorCode::NameRetired);

    // Held: unknown to lookups and sends, and nobody (bob included) takes the name.
    let mut a = alice.connect(&relay).await;
    let err = a
        .call(|r| ClientFrame::Lookup {
            reference: r,
            agent: bob.name.clone(),
        })
        .await
        .unwrap_err();
    assert!(matches!(
        err,
        mailslot::client::ClientError::Refused {
            code: ErrorCode::UnknownAgent,
            ..
        }
    ));
    a.close().await;
    let refused = alice
        .send(&relay, alice.message(&[&bob], "two", "anyone?"))
        .await;
    assert!(
        refused.not_sent[0].1.contains("unknown_recipient"),
        "{:?}",
        refused.not_sent
    );
    let newcomer = TestAgent::new("bob");
    let err =
        mailslot::client::Connection::connect(&relay.url, &newcomer.name, &newcomer.identity, None)
            .await
            .err()
            .expect("the name is held");
    assert!(
        matches!(&err, mailslot::client::ClientError::Refused { code: ErrorCode::NameRetired, message, .. } if message.contains("free again after")),
        "{err:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retired_name_is_taken_afresh_after_its_grace() {
    let relay = TestRelay::start(|c| c.retired_name_days = 0).await;
    let (alice, bob) = (TestAgent::new("alice"), TestAgent::new("bob"));
    bob.sync(&relay).await;
    alice
        .send(&relay, alice.message(&[&bob], "old", "for old bob"))
        .await;
    let mut conn = bob.connect(&relay).await;
    conn.retire(&bob.identity).await.unwrap();
    conn.close().await;
    // A new agent takes the name with other keys: none of the old bob's mail, contacts or
    // owner key come with it.
    let newcomer = TestAgent::new("bob");
    let conn = newcomer.connect(&relay).await;
    assert_eq!(conn.waiting(), 0, "the old bob's mail was dropped");
    assert_eq!(conn.owner(), Some(&newcomer.owner.public()));
    conn.close().await;
    assert!(newcomer.sync(&relay).await.received.is_empty());

    // `mailslot retire` wants a person at a terminal.
    let home = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_mailslot"))
        .args(["--agent", "carol", "retire"])
        .env_clear()
        .env("MAILSLOT_HOME", home.path())
        .env("MAILSLOT_RELAY", relay.url.as_str())
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("terminal"));
}

/// A relay whose mail expires after a second, looked for every second.
async fn short_ttl_relay() -> TestRelay {
    TestRelay::start(|c| {
        c.ttl_secs = 1;
        c.expiry_interval_secs = 1;
    })
    .await
}

#[tokio::test]
async fn an_expired_copy_bounces_to_its_offline_sender_once_on_its_next_connection() {
    let relay = short_ttl_relay().await;
    let base = format!("http://{}", relay.relay.addr());
    let [bob, carol] = relay.agents(["bob", "carol"]).await;
    let alice = TestAgent::new("alice");
    let message = alice.message(&[&bob, &carol], "never read", "bob is away");
    let id = message.id;
    let report = alice.send(&relay, message).await;
    assert_eq!(report.sent, [id]);
    assert!(report.bounced.is_empty());
    // Carol takes her copy; bob never connects again. Alice is offline when bob's expires.
    assert_eq!(carol.sync(&relay).await.received, [id]);
    wait_until(EVENT_TIMEOUT, "bob's copy expires", async || {
        let (_, metrics) = http(&format!("{base}/metrics"), None).await;
        metrics
            .lines()
            .any(|l| l == "mailslot_relay_expired_total 1")
            .then_some(())
    })
    .await;

    // Alice's next connection brings the bounce, for bob's copy only.
    let report = alice.sync(&relay).await;
    assert_eq!(report.bounced.len(), 1, "{report:?}");
    assert_eq!(report.bounced[0].id, id);
    assert_eq!(report.bounced[0].to.to_string(), "bob");
    let stored = alice
        .store
        .call(move |s| s.message(&id))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(names(&stored.bounced), ["bob"]);

    // It was acknowledged: the relay forgot it, and the store has it once.
    assert!(alice.sync(&relay).await.bounced.is_empty());
    let stored = alice
        .store
        .call(move |s| s.message(&id))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(names(&stored.bounced), ["bob"]);
    assert!(
        bob.sync(&relay).await.received.is_empty(),
        "the copy is gone"
    );
}

#[tokio::test]
async fn a_copy_that_expires_while_the_relay_is_down_bounces_after_it_starts() {
    // A TTL of 0 has every copy past it at once; the next look for expired copies is a
    // minute away, so only the restart can find this one.
    let relay = TestRelay::start(|c| c.ttl_secs = 0).await;
    let alice = TestAgent::new("alice");
    let bob = TestAgent::new("bob");
    bob.sync(&relay).await;
    let message = alice.message(&[&bob], "while you were out", "b");
    let id = message.id;
    let report = alice.send(&relay, message).await;
    assert_eq!(report.sent, [id]);
    assert!(report.bounced.is_empty());
    let stopped = relay.stop().await;

    let relay = stopped.restart().await;
    let report = alice.sync(&relay).await;
    assert_eq!(report.bounced.len(), 1, "{report:?}");
    assert_eq!(
        (
            report.bounced[0].id,
            report.bounced[0].to.to_string().as_str()
        ),
        (id, "bob")
    );
    assert!(bob.sync(&relay).await.received.is_empty());

    // The expired record is still in the spool, so the next start bounces it again; the
    // sender's store records it once.
    let relay = relay.stop().await.restart().await;
    assert!(alice.sync(&relay).await.bounced.is_empty());
    let stored = alice
        .store
        .call(move |s| s.message(&id))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(names(&stored.bounced), ["bob"]);
}

fn names(agents: &[mailslot::protocol::Address]) -> Vec<String> {
    agents.iter().map(ToString::to_string).collect()
}

/// Reads frames until one `pick` accepts, skipping `caught_up` and the like.
async fn raw_until<T>(ws: &mut RawSocket, mut pick: impl FnMut(ServerFrame) -> Option<T>) -> T {
    loop {
        let frame = raw_recv(ws).await.expect("the socket closed");
        if let Some(v) = pick(frame) {
            return v;
        }
    }
}

/// Asks for bounces on a raw socket; the list.
async fn list_bounces(ws: &mut RawSocket, reference: &str) -> Vec<mailslot::protocol::Bounce> {
    let frame = ClientFrame::Bounces {
        reference: reference.into(),
    };
    raw_send(ws, &frame).await;
    raw_until(ws, |f| match f {
        ServerFrame::BounceList { bounces, .. } => Some(bounces),
        _ => None,
    })
    .await
}

#[tokio::test]
async fn bounces_on_the_wire_are_pushed_listed_bounded_and_only_the_senders_to_forget() {
    let relay = short_ttl_relay().await;
    let alice = TestAgent::new("alice");
    let bob = TestAgent::new("bob");
    let mallory = TestAgent::new("mallory");
    bob.sync(&relay).await;
    let message = alice.message(&[&bob], "s", "b");
    let id = message.id;
    alice.send(&relay, message).await;

    // Alice is online when the copy expires: her delivery connection is told.
    let mut ws = raw_login(&relay, &alice).await;
    raw_until(&mut ws, |f| {
        matches!(
            f,
            ServerFrame::Event {
                event: mailslot::protocol::ConsentEvent::Bounced {}
            }
        )
        .then_some(())
    })
    .await;
    let key = mailslot::protocol::CopyKey {
        id,
        to: mailslot::protocol::Address::local(bob.name.clone()),
    };

    // Another agent neither sees alice's bounces nor forgets them.
    let mut other = raw_login(&relay, &mallory).await;
    raw_send(
        &mut other,
        &ClientFrame::AckBounces {
            reference: "m1".into(),
            bounces: vec![key.clone()],
        },
    )
    .await;
    let detail = raw_until(&mut other, |f| match f {
        ServerFrame::Done { detail, .. } => Some(detail),
        _ => None,
    })
    .await;
    assert_eq!(detail, "0 bounce(s) forgotten");
    let listed = list_bounces(&mut other, "m2").await;
    assert!(listed.is_empty());

    let listed = list_bounces(&mut ws, "a1").await;
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].key(), key);

    // An acknowledgement is bounded; the error names the field, the limit and the fix.
    raw_send(
        &mut ws,
        &ClientFrame::AckBounces {
            reference: "a2".into(),
            bounces: vec![key.clone(); mailslot::protocol::MAX_BOUNCES + 1],
        },
    )
    .await;
    let (code, message, _) = next_error(&mut ws).await.unwrap();
    assert_eq!(code, ErrorCode::BadFrame);
    assert!(
        message.contains("bounces has 101 entries, over the limit of 100"),
        "{message}"
    );
    raw_send(
        &mut ws,
        &ClientFrame::AckBounces {
            reference: "a3".into(),
            bounces: vec![key],
        },
    )
    .await;
    let detail = raw_until(&mut ws, |f| match f {
        ServerFrame::Done { detail, .. } => Some(detail),
        _ => None,
    })
    .await;
    assert_eq!(detail, "1 bounce(s) forgotten");
    assert!(list_bounces(&mut ws, "a4").await.is_empty());
}

#[tokio::test]
async fn a_retired_agents_bounces_go_with_it() {
    let relay = short_ttl_relay().await;
    let base = format!("http://{}", relay.relay.addr());
    let alice = TestAgent::new("alice");
    let bob = TestAgent::new("bob");
    bob.sync(&relay).await;
    alice.send(&relay, alice.message(&[&bob], "s", "b")).await;
    wait_until(EVENT_TIMEOUT, "bob's copy expires", async || {
        let (_, metrics) = http(&format!("{base}/metrics"), None).await;
        metrics
            .lines()
            .any(|l| l == "mailslot_relay_expired_total 1")
            .then_some(())
    })
    .await;
    let waiting = || {
        let db = rusqlite::Connection::open(relay.db()).unwrap();
        db.query_row(
            "SELECT count(*) FROM bounces WHERE sender = 'alice'",
            [],
            |r| r.get::<_, i64>(0),
        )
        .unwrap()
    };
    assert_eq!(waiting(), 1);
    let mut conn = mailslot::client::Connection::connect_control(
        &relay.url,
        &alice.name,
        &alice.identity,
        None,
    )
    .await
    .unwrap();
    conn.retire(&alice.identity).await.unwrap();
    conn.close().await;
    assert_eq!(waiting(), 0);
}

#[tokio::test]
async fn a_relay_database_opened_with_another_key_is_refused() {
    let relay = TestRelay::start(|_| {}).await;
    let fingerprint = relay.relay.fingerprint().clone();
    let stopped = relay.stop().await;
    let other = tempfile::tempdir().unwrap();
    let key_file = other.path().join("other.key");
    let config = |identity: &std::path::Path| mailslot::relay::RelayConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        db: Some(stopped.db()),
        identity: Some(identity.to_owned()),
        ..Default::default()
    };
    // Its database recorded the relay's key at the first start: another key is refused,
    // naming both, and the key made for the attempt does not stay to be taken next time.
    let err = match mailslot::relay::Relay::start(config(&key_file)).await {
        Ok(relay) => {
            let name = relay.fingerprint().clone();
            relay.shutdown().await;
            panic!("a relay with another key ({name}) served the database of {fingerprint}")
        }
        Err(e) => e.to_string(),
    };
    assert!(
        err.contains(fingerprint.as_str()) && err.contains("--identity"),
        "{err}"
    );
    assert!(!key_file.exists(), "the refused key was left behind");
    let made = mailslot::crypto::RelayIdentity::generate();
    made.save_new(&key_file).unwrap();
    let err = mailslot::relay::Relay::start(config(&key_file))
        .await
        .err()
        .expect("refused")
        .to_string();
    assert!(
        err.contains(fingerprint.as_str())
            && err.contains(made.fingerprint().as_str())
            && err.contains(&key_file.display().to_string()),
        "both fingerprints and the file: {err}"
    );
    assert!(key_file.exists(), "a key file the relay did not make stays");
    // Its own key still opens it.
    let again = stopped.restart().await;
    assert_eq!(again.relay.fingerprint(), &fingerprint);
}

/// `relay status`, `check` and `stop` with `--db` find the relay on that database, not the
/// home's; `stop` speaks JSON and exits 3 when nothing runs there; "listening" is said once.
#[test]
fn relay_commands_with_db_act_on_the_relay_that_uses_it() {
    let relay = relay_process::RelayProcess::start("", None);
    let db = relay.dir.path().join("relay.db");
    let db_arg = db.to_str().unwrap();
    // Another home, whose own relay does not run: only --db can name the running one.
    let home = tempfile::tempdir().unwrap();
    let mailslot = |args: &[&str]| cli_in(home.path(), None, args);
    let json = |out: &std::process::Output| -> serde_json::Value {
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!("{e}: {}", String::from_utf8_lossy(&out.stdout));
        })
    };

    let status = mailslot(&["--json", "relay", "status", "--db", db_arg]);
    assert_eq!(status.status.code(), Some(0));
    assert_eq!(json(&status)["url"], relay.url.as_str());
    let pid = json(&status)["pid"].as_i64().unwrap();
    let home_status = mailslot(&["relay", "status"]);
    assert_eq!(
        home_status.status.code(),
        Some(3),
        "the home's relay does not run"
    );

    let check = mailslot(&["relay", "check", "--db", db_arg]);
    assert_eq!(check.status.code(), Some(1));
    let said = String::from_utf8_lossy(&check.stderr);
    assert!(
        said.contains(&format!("`mailslot relay stop --db {db_arg}`")),
        "{said}"
    );

    let stopped = mailslot(&["--json", "relay", "stop", "--db", db_arg]);
    assert_eq!(stopped.status.code(), Some(0), "{stopped:?}");
    let stopped = json(&stopped);
    assert_eq!(stopped["stopped"], true);
    assert_eq!(stopped["pid"].as_i64(), Some(pid));
    assert_eq!(
        mailslot(&["relay", "status", "--db", db_arg]).status.code(),
        Some(3)
    );

    let again = mailslot(&["--json", "relay", "stop", "--db", db_arg]);
    assert_eq!(again.status.code(), Some(3), "nothing to stop is exit 3");
    assert_eq!(json(&again)["stopped"], false);
    let again = mailslot(&["relay", "stop", "--db", db_arg]);
    assert_eq!(again.status.code(), Some(3));
    assert!(String::from_utf8_lossy(&again.stdout).contains("nothing to stop"));

    let log = relay.log();
    let listening: Vec<&String> = log.iter().filter(|l| l.contains("listening")).collect();
    assert_eq!(listening.len(), 1, "said once: {log:#?}");
}

#[test]
fn a_taken_listen_address_is_one_sentence_with_the_os_reason_once() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("relay.db");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_mailslot"))
        .args(["relay", "--listen", &addr, "--db"])
        .arg(&db)
        .env_clear()
        .env("MAILSLOT_HOME", dir.path())
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!("cannot listen on {addr}")),
        "{stderr}"
    );
    assert!(stderr.contains("--listen"), "names the fix: {stderr}");
    assert_eq!(
        stderr.matches("os error").count(),
        1,
        "the OS's reason once: {stderr}"
    );
}
