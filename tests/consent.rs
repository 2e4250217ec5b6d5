//! Consent over a real relay whose default policy is `contacts`: strangers are refused,
//! requests carry codes only the requester sees, owners approve, deny and block.

mod common;

use std::process::{Command, Stdio};

use common::*;
use mailslot::client::ClientError;
use mailslot::protocol::{ClientFrame, ConsentEvent, ErrorCode, Policy, RequestCode, ServerFrame};

async fn contacts_relay() -> TestRelay {
    TestRelay::start(|c| c.default_policy = Some(Policy::Contacts)).await
}

fn refused(e: ClientError) -> ErrorCode {
    match e {
        ClientError::Refused { code, .. } => code,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

async fn request(conn: &mut mailslot::client::Connection, to: &TestAgent) -> RequestCode {
    match conn
        .call(|r| ClientFrame::Connect {
            reference: r,
            to: to.name.clone(),
            note: "we work on the relay together".into(),
        })
        .await
        .unwrap()
    {
        ServerFrame::Requested { code, .. } => code,
        other => panic!("expected requested, got {other:?}"),
    }
}

async fn approve(
    conn: &mut mailslot::client::Connection,
    from: &TestAgent,
    code: RequestCode,
) -> Result<ServerFrame, ClientError> {
    conn.call(|r| ClientFrame::Approve {
        reference: r,
        from: from.name.clone(),
        code,
    })
    .await
}

async fn next_event(ws: &mut RawSocket) -> ConsentEvent {
    loop {
        match raw_recv(ws).await.expect("socket open") {
            ServerFrame::Event { event } => return event,
            _ => continue,
        }
    }
}

#[tokio::test]
async fn strangers_are_refused_until_the_owner_approves() {
    let relay = contacts_relay().await;
    let (alice, bob) = (TestAgent::new("alice"), TestAgent::new("bob"));
    bob.sync(&relay).await;
    let report = alice
        .send(&relay, alice.message(&[&bob], "hello", "can we talk?"))
        .await;
    let (_, reason, retry) = &report.not_sent[0];
    assert!(reason.contains("not_allowed") && !retry, "{reason}");

    let mut bob_ws = raw_login(&relay, &bob).await;
    let mut conn = alice.connect(&relay).await;
    let code = request(&mut conn, &bob).await;

    // Bob is told about the request, but never sees the code.
    let event = next_event(&mut bob_ws).await;
    assert!(
        matches!(&event, ConsentEvent::RequestReceived { from, .. } if from == &alice.name),
        "{event:?}"
    );
    assert!(
        !serde_json::to_string(&event)
            .unwrap()
            .contains(code.as_str())
    );
    drop(bob_ws);
    let mut bob_conn = bob.connect(&relay).await;
    let ServerFrame::ConsentState { incoming, .. } = bob_conn
        .call(|r| ClientFrame::Consent { reference: r })
        .await
        .unwrap()
    else {
        panic!()
    };
    assert_eq!(incoming.len(), 1);
    assert_eq!(incoming[0].code, None, "the target's view has no code");
    let ServerFrame::ConsentState { outgoing, .. } = conn
        .call(|r| ClientFrame::Consent { reference: r })
        .await
        .unwrap()
    else {
        panic!()
    };
    assert_eq!(
        outgoing[0].code.as_ref(),
        Some(&code),
        "the requester's owner sees it"
    );

    // A wrong code does nothing; the right one makes them contacts, both ways.
    let wrong = RequestCode::from_random([1, 2, 3, 4, 5]);
    assert_eq!(
        refused(approve(&mut bob_conn, &alice, wrong).await.unwrap_err()),
        ErrorCode::BadCode
    );
    assert!(matches!(
        approve(&mut bob_conn, &alice, code).await.unwrap(),
        ServerFrame::Done { .. }
    ));
    conn.close().await;
    bob_conn.close().await;

    let report = alice.sync(&relay).await;
    assert!(report.not_sent.is_empty(), "{report:?}");
    let retry = alice
        .send(
            &relay,
            alice.message(&[&bob], "hello again", "approved now"),
        )
        .await;
    assert_eq!(retry.sent.len(), 1, "{retry:?}");
    assert_eq!(bob.sync(&relay).await.received.len(), 1);
    assert_eq!(
        bob.send(&relay, bob.message(&[&alice], "hi", "both ways"))
            .await
            .sent
            .len(),
        1
    );
}

#[tokio::test]
async fn the_requester_is_told_the_outcome() {
    let relay = contacts_relay().await;
    let [alice, bob, carol] = ["alice", "bob", "carol"].map(TestAgent::new);
    bob.sync(&relay).await;
    carol.sync(&relay).await;
    let mut conn = alice.connect(&relay).await;
    let code = request(&mut conn, &bob).await;
    request(&mut conn, &carol).await;
    conn.close().await;
    let mut alice_ws = raw_login(&relay, &alice).await;
    let mut bob_conn = bob.connect(&relay).await;
    approve(&mut bob_conn, &alice, code).await.unwrap();
    assert_eq!(
        next_event(&mut alice_ws).await,
        ConsentEvent::Approved {
            by: bob.name.clone()
        }
    );
    let mut carol_conn = carol.connect(&relay).await;
    carol_conn
        .call(|r| ClientFrame::Deny {
            reference: r,
            agent: alice.name.clone(),
        })
        .await
        .unwrap();
    assert_eq!(
        next_event(&mut alice_ws).await,
        ConsentEvent::Denied {
            by: carol.name.clone()
        }
    );
    let report = alice
        .send(&relay, alice.message(&[&carol], "please", "reconsider"))
        .await;
    assert!(
        report.not_sent[0].1.contains("not_allowed"),
        "a denial grants nothing"
    );
}

#[tokio::test]
async fn blocks_refuse_mail_and_requests_even_under_open() {
    let relay = TestRelay::start(|c| c.default_policy = Some(Policy::Open)).await;
    let (alice, bob) = (TestAgent::new("alice"), TestAgent::new("bob"));
    alice.sync(&relay).await;
    let mut bob_conn = bob.connect(&relay).await;
    bob_conn
        .call(|r| ClientFrame::Block {
            reference: r,
            agent: alice.name.clone(),
        })
        .await
        .unwrap();
    let report = alice
        .send(&relay, alice.message(&[&bob], "spam", "buy now"))
        .await;
    assert!(report.not_sent[0].1.contains("not_allowed"));
    let mut conn = alice.connect(&relay).await;
    let err = conn
        .call(|r| ClientFrame::Connect {
            reference: r,
            to: bob.name.clone(),
            note: String::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(refused(err), ErrorCode::NotAllowed);
    conn.close().await;
    bob_conn
        .call(|r| ClientFrame::Unblock {
            reference: r,
            agent: alice.name.clone(),
        })
        .await
        .unwrap();
    bob_conn.close().await;
    assert!(
        alice.sync(&relay).await.sent.is_empty(),
        "a refused message is not retried by itself"
    );
    assert_eq!(
        alice
            .store
            .call(|s| s.outbox_failed_items(10))
            .await
            .unwrap()
            .len(),
        1,
        "it is kept, marked failed"
    );
    let again = alice
        .send(&relay, alice.message(&[&bob], "sorry", "unblocked"))
        .await;
    assert_eq!(again.sent.len(), 1, "open policy again once unblocked");
}

#[tokio::test]
async fn pending_requests_and_approval_attempts_are_bounded() {
    let relay = TestRelay::start(|c| {
        c.default_policy = Some(Policy::Contacts);
        c.approvals_per_hour = 3.0;
    })
    .await;
    let targets: Vec<TestAgent> = (0..4)
        .map(|i| TestAgent::new(&format!("target{i}")))
        .collect();
    for t in &targets {
        t.sync(&relay).await;
    }
    let alice = TestAgent::new("alice");
    let mut conn = alice.connect(&relay).await;
    for t in &targets[..3] {
        request(&mut conn, t).await;
    }
    let err = conn
        .call(|r| ClientFrame::Connect {
            reference: r,
            to: targets[3].name.clone(),
            note: String::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(refused(err), ErrorCode::TooManyRequests);
    // Guessing codes is throttled.
    let mut t0 = targets[0].connect(&relay).await;
    for i in 0..3 {
        let guess = RequestCode::from_random([i, 0, 0, 0, 0]);
        assert_eq!(
            refused(approve(&mut t0, &alice, guess).await.unwrap_err()),
            ErrorCode::BadCode
        );
    }
    let guess = RequestCode::from_random([9, 9, 9, 9, 9]);
    assert_eq!(
        refused(approve(&mut t0, &alice, guess).await.unwrap_err()),
        ErrorCode::RateLimited
    );
}

// Multi-threaded: the test blocks on child processes while the in-process relay serves them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approve_refuses_without_a_terminal_and_works_at_one() {
    let relay = contacts_relay().await;
    let home = tempfile::tempdir().unwrap();
    let mailslot = |args: &[&str]| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_mailslot"));
        cmd.args(args)
            .env_clear()
            .env("MAILSLOT_HOME", home.path())
            .env("MAILSLOT_RELAY", relay.url.as_str());
        cmd
    };
    let ok = |cmd: &mut Command| {
        let out = cmd.stdin(Stdio::null()).output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    ok(&mut mailslot(&["--agent", "bob", "sync"]));
    let asked: serde_json::Value = serde_json::from_str(&ok(&mut mailslot(&[
        "--agent", "alice", "--json", "connect", "bob", "--note", "hi",
    ])))
    .unwrap();
    let code = asked["code"].as_str().unwrap().to_owned();
    let requests = ok(&mut mailslot(&["--agent", "bob", "--json", "requests"]));
    assert!(
        !requests.contains(&code),
        "the target's owner's listing has no code: {requests}"
    );

    let refused = mailslot(&["--agent", "bob", "approve", &code])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(refused.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&refused.stderr).contains("terminal"));

    // At a terminal (a pseudo-terminal from `script`), typing "y" approves.
    let bin = env!("CARGO_BIN_EXE_mailslot");
    let line = format!("{bin} --agent bob approve {code}");
    let mut at_tty = Command::new("script");
    at_tty
        .args(["-qec", &line, "/dev/null"])
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("MAILSLOT_HOME", home.path())
        .env("MAILSLOT_RELAY", relay.url.as_str())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped());
    let mut child = at_tty.spawn().unwrap();
    use std::io::Write;
    child.stdin.take().unwrap().write_all(b"y\n").unwrap();
    let out = child.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("fingerprint") && text.contains("alice is now a contact"),
        "{text}"
    );
    let contacts: serde_json::Value = serde_json::from_str(&ok(&mut mailslot(&[
        "--agent", "bob", "--json", "contacts",
    ])))
    .unwrap();
    assert_eq!(contacts["contacts"], serde_json::json!(["alice"]));
}
