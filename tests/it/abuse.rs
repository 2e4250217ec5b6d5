//! The relay holds under abuse (issue 14, item 3). Each test runs an abuser against a real
//! relay process for a few seconds while a healthy sender and recipient keep exchanging mail,
//! and checks that the relay's memory and open files stay bounded and that the abuser gets its
//! documented answer.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use common::relay_process::{RelayProcess, connect_from};
use common::*;
use mailslot::client::RelayUrl;
use tokio::io::AsyncWriteExt;
use tokio::task::JoinHandle;

/// Round trips the healthy pair must complete while the abuse goes on.
const HEALTHY_ROUNDS: usize = 5;

/// Alice sends to bob and bob receives it, over and over, each sync on a new connection.
struct HealthyPair {
    rounds: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    task: JoinHandle<()>,
}

impl HealthyPair {
    async fn start(url: &RelayUrl) -> Self {
        let (alice, bob) = (TestAgent::new("alice"), TestAgent::new("bob"));
        bob.sync_url(url).await;
        let rounds = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let task = tokio::spawn({
            let (url, rounds, stop) = (url.clone(), rounds.clone(), stop.clone());
            async move {
                while !stop.load(Ordering::Relaxed) {
                    let m = alice.message(&[&bob], "still here", "mail keeps flowing");
                    let id = m.id;
                    assert_eq!(alice.send_url(&url, m).await.sent, vec![id], "alice sends");
                    let got = bob.sync_url(&url).await.received;
                    assert_eq!(got, vec![id], "bob receives");
                    rounds.fetch_add(1, Ordering::Relaxed);
                }
            }
        });
        Self { rounds, stop, task }
    }

    /// Waits until the pair has exchanged [`HEALTHY_ROUNDS`] more messages.
    async fn keeps_exchanging_mail(&self, during: &str) {
        let from = self.rounds.load(Ordering::Relaxed);
        wait_until(
            EVENT_TIMEOUT,
            &format!("the healthy pair exchanges mail during {during}"),
            async || (self.rounds.load(Ordering::Relaxed) >= from + HEALTHY_ROUNDS).then_some(()),
        )
        .await;
    }

    async fn finish(self) {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.expect("the healthy pair never failed");
    }
}

/// What became of the abuser's half-sent requests.
#[derive(Debug, Default)]
struct Slowloris {
    /// Answered 429 with `too_many_connections`.
    refused: usize,
    /// Held, then closed by the relay without an answer.
    timed_out: usize,
    /// The most open files the relay had while the abuser held its sockets.
    max_relay_files: usize,
}

/// Keeps `sockets` connections from 127.0.0.2 open, each with half a request head, replacing
/// those the relay closes, until `stop`.
async fn slowloris(relay: &RelayProcess, sockets: usize, stop: &AtomicBool) -> Slowloris {
    let mut open = Vec::new();
    let mut seen = Slowloris::default();
    while !stop.load(Ordering::Relaxed) {
        while open.len() < sockets {
            let Ok(mut tcp) = connect_from("127.0.0.2", relay.addr).await else {
                break;
            };
            // A refused socket may already be closed: the write may fail, the answer is read.
            let _ = tcp
                .write_all(b"GET /v1/ws HTTP/1.1\r\nHost: relay\r\nUpgrade: websocket\r\n")
                .await;
            open.push(tcp);
        }
        seen.max_relay_files = seen.max_relay_files.max(relay.open_files());
        open.retain(|tcp| {
            let mut buf = [0u8; 512];
            match tcp.try_read(&mut buf) {
                Ok(0) => seen.timed_out += 1,
                Ok(n) => {
                    let answer = String::from_utf8_lossy(&buf[..n]);
                    assert!(
                        answer.starts_with("HTTP/1.1 429")
                            && answer.contains("too_many_connections"),
                        "{answer}"
                    );
                    seen.refused += 1;
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return true,
                Err(_) => seen.timed_out += 1,
            }
            false
        });
        // Pacing, not synchronisation: the abuser checks its sockets a few times a second.
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slowloris_sockets_time_out_and_count_against_their_ip() {
    // The abuser itself needs more than 1,100 files.
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
    setrlimit(Resource::RLIMIT_NOFILE, hard, hard).unwrap();
    assert!(
        hard >= 2048,
        "the test needs 2,048 open files; the hard limit is {hard}"
    );
    // 1,024 open files, as in the report; the limits are derived from it: 896 sockets in all,
    // 224 per IP.
    let relay = RelayProcess::start("request_timeout_secs = 2\n", Some(1024));
    let healthy = HealthyPair::start(&relay.url).await;
    let stop = AtomicBool::new(false);
    let (seen, ()) = tokio::join!(slowloris(&relay, 1100, &stop), async {
        // The abuser fills its share and keeps it full, then the relay closes the held
        // sockets at the deadline and the abuser opens new ones.
        wait_until(EVENT_TIMEOUT, "half-open sockets time out", async || {
            (relay
                .metric("mailslot_relay_rejections_total", "request_timeout")
                .await
                >= 224.0)
                .then_some(())
        })
        .await;
        healthy.keeps_exchanging_mail("a slowloris").await;
        stop.store(true, Ordering::Relaxed);
    });
    healthy.finish().await;
    assert!(seen.refused >= 800, "{seen:?}");
    assert!(seen.timed_out >= 224, "{seen:?}");
    assert!(
        seen.max_relay_files < 224 + 100,
        "one IP holds at most its 224 sockets: {seen:?}"
    );
    let refused = relay
        .metric("mailslot_relay_rejections_total", "too_many_connections")
        .await;
    assert!(refused >= seen.refused as f64, "{refused} {seen:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_body_that_never_ends_is_answered_408() {
    use tokio::io::AsyncReadExt;
    let relay = RelayProcess::start("request_timeout_secs = 1\n", None);
    let mut tcp = connect_from("127.0.0.3", relay.addr).await.unwrap();
    tcp.write_all(
        b"POST /v1/agents HTTP/1.1\r\nHost: relay\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"name\"",
    )
    .await
    .unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(EVENT_TIMEOUT, tcp.read_to_end(&mut answer))
        .await
        .expect("answered in time")
        .unwrap();
    let answer = String::from_utf8_lossy(&answer);
    assert!(
        answer.starts_with("HTTP/1.1 408") && answer.contains("request_timeout"),
        "{answer}"
    );
}

/// A raw WebSocket authenticated as `agent` (registering it).
async fn login(url: &RelayUrl, agent: &TestAgent) -> RawSocket {
    let (mut ws, _) = tokio_tungstenite::connect_async(url.as_str())
        .await
        .unwrap();
    let Some(mailslot::protocol::ServerFrame::Challenge { relay, nonce, .. }) =
        raw_recv(&mut ws).await
    else {
        panic!("expected a challenge")
    };
    raw_send(&mut ws, &hello(agent, &relay, &nonce)).await;
    match raw_recv(&mut ws).await {
        Some(mailslot::protocol::ServerFrame::Welcome { .. }) => ws,
        other => panic!("expected welcome, got {other:?}"),
    }
}

/// Sends `count` messages of about 200 KiB from `sender` to `to`. One is sealed; the others are
/// copies under new ids, which the relay cannot tell apart (it never opens mail), and which
/// spare the test sealing 200 KiB hundreds of times in a debug build.
async fn send_big_mail(url: &RelayUrl, sender: &TestAgent, to: &TestAgent, count: usize) {
    use mailslot::protocol::{Attachment, Limits, MessageId, SealedEnvelope};
    let mut conn = sender.connect_url(url).await;
    let keys = vec![(to.address(), to.identity.public().clone())];
    let mut m = sender.message(&[to], "big", "see the attachment");
    m.attachments = vec![Attachment::new(
        "blob.bin",
        "application/octet-stream",
        vec![7; 110 * 1024],
    )];
    let sealed = mailslot::crypto::seal(&m, &sender.identity, &keys, &Limits::default())
        .unwrap()
        .remove(0);
    let mut json = serde_json::to_value(&sealed).unwrap();
    for _ in 0..count {
        json["id"] = serde_json::to_value(MessageId::new()).unwrap();
        let env: SealedEnvelope = serde_json::from_value(json.clone()).unwrap();
        conn.send_envelope(env).await.unwrap();
    }
    conn.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_never_reads_is_disconnected_even_while_it_pings() {
    use futures_util::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::Message as WsMessage;
    let relay = RelayProcess::start("write_timeout_secs = 2\n", None);
    let healthy = HealthyPair::start(&relay.url).await;
    healthy.keeps_exchanging_mail("the start").await;
    let before = relay.rss_kib();
    let sloths = [TestAgent::new("sloth1"), TestAgent::new("sloth2")];
    let mut readers = Vec::new();
    let mut pingers = Vec::new();
    for sloth in &sloths {
        let (mut sink, stream) = login(&relay.url, sloth).await.split();
        readers.push(stream);
        // Pings, both kinds, and never a read.
        pingers.push(tokio::spawn(async move {
            loop {
                let ping = WsMessage::Ping(Vec::new().into());
                let app_ping = WsMessage::Text(r#"{"type":"ping"}"#.into());
                if sink.send(ping).await.is_err() || sink.send(app_ping).await.is_err() {
                    return;
                }
                // Pacing: a keepalive a few times a second.
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }));
    }
    let sender = TestAgent::new("mallory");
    let mut max_rss = before;
    for (i, (sloth, mut stream)) in sloths.iter().zip(readers).enumerate() {
        let cut_off = async {
            wait_until(
                EVENT_TIMEOUT,
                "the non-reader is disconnected",
                async || {
                    max_rss = max_rss.max(relay.rss_kib());
                    let cut = relay
                        .metric("mailslot_relay_rejections_total", "not_reading")
                        .await;
                    (cut > i as f64).then_some(())
                },
            )
            .await;
            // It reads now, within the relay's last 5 s for it: what its socket held, then
            // why it is closed.
            let mut last_error = None;
            let mut close = None;
            while let Ok(Some(Ok(message))) =
                tokio::time::timeout(EVENT_TIMEOUT, stream.next()).await
            {
                match message {
                    WsMessage::Text(t) if t.contains(r#""type":"error""#) => last_error = Some(t),
                    WsMessage::Close(frame) => close = frame.map(|f| u16::from(f.code)),
                    _ => {}
                }
            }
            let last_error = last_error.expect("told why");
            assert!(last_error.contains("not_reading"), "{last_error}");
            assert_eq!(close, Some(4003));
        };
        tokio::join!(send_big_mail(&relay.url, &sender, sloth, 250), cut_off);
        max_rss = max_rss.max(relay.rss_kib());
    }
    healthy
        .keeps_exchanging_mail("the non-readers' backlog")
        .await;
    healthy.finish().await;
    for pinger in pingers {
        pinger.await.unwrap();
    }
    let grown = max_rss.saturating_sub(before);
    eprintln!("relay RSS: {before} KiB before, at most {max_rss} KiB during the abuse");
    assert!(
        grown < 40 * 1024,
        "100 MB of mail for two non-readers grew the relay by {grown} KiB"
    );
}

/// `POST /v1/agents` registering `name` with `agent`'s keys, from the loopback address `from`;
/// the status and the answer.
async fn register_from(
    from: &str,
    relay: &RelayProcess,
    agent: &TestAgent,
    name: &str,
) -> (u16, String) {
    use mailslot::crypto::sign::{Domain, signature};
    use mailslot::protocol::{AgentName, b64, register_payload};
    use tokio::io::AsyncReadExt;
    let keys = agent.identity.public().to_keys();
    let sig = signature(
        &agent.identity,
        Domain::Register,
        &register_payload(&AgentName::new(name).unwrap(), &keys),
    );
    let body =
        serde_json::json!({"name": name, "keys": keys, "signature": b64::encode(&sig)}).to_string();
    let mut tcp = connect_from(from, relay.addr).await.unwrap();
    let request = format!(
        "POST /v1/agents HTTP/1.1\r\nHost: relay\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    tcp.write_all(request.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(EVENT_TIMEOUT, tcp.read_to_end(&mut answer))
        .await
        .expect("answered in time")
        .unwrap();
    let answer = String::from_utf8_lossy(&answer).into_owned();
    let status = answer.split(' ').nth(1).unwrap().parse().unwrap();
    (status, answer)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registration_flood_from_one_ip_is_rate_limited() {
    let relay = RelayProcess::start(
        "registration_burst = 20\nregistrations_per_hour = 60\n",
        None,
    );
    let healthy = HealthyPair::start(&relay.url).await;
    let (rss, files) = (relay.rss_kib(), relay.open_files());
    let mallory = TestAgent::new("mallory");
    let (mut created, mut refused) = (0, 0);
    let flood = async {
        for i in 0..300 {
            match register_from("127.0.0.2", &relay, &mallory, &format!("flood{i}")).await {
                (201, _) => created += 1,
                (429, answer) => {
                    assert!(answer.contains("rate_limited"), "{answer}");
                    assert!(answer.to_lowercase().contains("retry-after:"), "{answer}");
                    refused += 1;
                }
                (_, answer) => panic!("{answer}"),
            }
        }
    };
    tokio::join!(flood, healthy.keeps_exchanging_mail("a registration flood"));
    assert_eq!((created, refused), (20, 280), "the burst, then nothing");
    // The hello path takes from the same allowance.
    let tcp = connect_from("127.0.0.2", relay.addr).await.unwrap();
    let tcp = tokio_tungstenite::MaybeTlsStream::Plain(tcp);
    let (mut ws, _) = tokio_tungstenite::client_async(relay.url.as_str(), tcp)
        .await
        .unwrap();
    let Some(mailslot::protocol::ServerFrame::Challenge {
        relay: id, nonce, ..
    }) = raw_recv(&mut ws).await
    else {
        panic!("expected a challenge")
    };
    raw_send(&mut ws, &hello(&TestAgent::new("flood-ws"), &id, &nonce)).await;
    let (code, message, _) = next_error(&mut ws).await.expect("refused");
    assert_eq!(
        code,
        mailslot::protocol::ErrorCode::RateLimited,
        "{message}"
    );
    // Other addresses are not affected, and names already registered still connect.
    assert_eq!(
        register_from("127.0.0.3", &relay, &mallory, "newcomer")
            .await
            .0,
        201
    );
    assert_eq!(
        register_from("127.0.0.2", &relay, &mallory, "flood0")
            .await
            .0,
        200
    );
    healthy.finish().await;
    assert!(
        relay
            .metric("mailslot_relay_registrations_refused_total", "rate")
            .await
            >= 281.0
    );
    assert!(relay.open_files() < files + 20, "open files stay bounded");
    assert!(relay.rss_kib() < rss + 16 * 1024, "memory stays bounded");
}

/// A `send` frame of about `len` bytes from `sender` to `to`: one small sealed letter whose
/// ciphertext is padded to the size (the relay never opens mail, so it cannot tell).
fn large_send(sender: &TestAgent, to: &TestAgent, len: usize) -> String {
    use mailslot::protocol::{ClientFrame, Limits, MessageId, SealedEnvelope};
    let keys = vec![(to.address(), to.identity.public().clone())];
    let m = sender.message(&[to], "large", "padded");
    let mut sealed = mailslot::crypto::seal(&m, &sender.identity, &keys, &Limits::default())
        .unwrap()
        .remove(0);
    sealed.id = MessageId::new();
    sealed.ciphertext = vec![0; len / 4 * 3];
    let envelope: SealedEnvelope = sealed;
    serde_json::to_string(&ClientFrame::Send {
        reference: envelope.id.to_string(),
        envelope,
        group: None,
    })
    .unwrap()
}

/// `text` as one client WebSocket frame with a zero mask, written as is: the test's own
/// masking of hundreds of MiB would pace the senders, and the relay must hold against senders
/// as fast as its socket reads.
fn unmasked_text_frame(text: &str) -> Vec<u8> {
    let mut frame = vec![0x81, 0x80 | 127];
    frame.extend_from_slice(&(text.len() as u64).to_be_bytes());
    frame.extend_from_slice(&[0; 4]);
    frame.extend_from_slice(text.as_bytes());
    frame
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_senders_of_large_frames_stay_within_the_receiving_budget() {
    use futures_util::StreamExt;
    use mailslot::protocol::ServerFrame;
    use tokio_tungstenite::tungstenite::Message as WsMessage;
    const SENDERS: usize = 16;
    const FRAMES: usize = 1;
    const FRAME: usize = 15 * 1024 * 1024;
    const BUDGET_MIB: u64 = 32;
    // The documented bound (docs/decisions.md, "The receiving budget holds a frame until it
    // is stored"): 3 × the largest frames the budget admits at once (one 16 MiB frame here:
    // two shares need 32.1 MiB) + 2 MiB per sending socket, over the relay's memory before.
    const FRAMES_AT_ONCE: u64 = 1;
    const BOUND_MIB: u64 = 3 * 16 * FRAMES_AT_ONCE + 2 * SENDERS as u64 + 16;
    let relay = RelayProcess::start(
        &format!(
            "max_receiving_bytes = {}\nquota_bytes = 4294967296\n",
            BUDGET_MIB << 20
        ),
        None,
    );
    let sink = TestAgent::new("sink");
    sink.sync_url(&relay.url).await;
    let healthy = HealthyPair::start(&relay.url).await;
    healthy.keeps_exchanging_mail("the start").await;
    let before = relay.rss_kib();
    let mut senders = Vec::new();
    for i in 0..SENDERS {
        let sender = TestAgent::new(&format!("big{i}"));
        let mut ws = login(&relay.url, &sender).await;
        let frames: Vec<Vec<u8>> = (0..FRAMES)
            .map(|_| unmasked_text_frame(&large_send(&sender, &sink, FRAME)))
            .collect();
        senders.push(tokio::spawn(async move {
            // Every frame at once, then the answers: the relay must bound what it holds.
            let tokio_tungstenite::MaybeTlsStream::Plain(tcp) = ws.get_mut() else {
                panic!("a plain socket")
            };
            for frame in frames {
                tcp.write_all(&frame).await.unwrap();
            }
            let mut answers = Vec::new();
            while answers.len() < FRAMES {
                let next = tokio::time::timeout(EVENT_TIMEOUT * 6, ws.next())
                    .await
                    .expect("an answer to every large frame in time");
                match next {
                    Some(Ok(WsMessage::Text(t))) => match serde_json::from_str(&t).unwrap() {
                        ServerFrame::Sent { .. } => answers.push(Ok(())),
                        ServerFrame::Error {
                            code,
                            message,
                            retry_after_ms,
                            ..
                        } => answers.push(Err((code, message, retry_after_ms))),
                        _ => {}
                    },
                    Some(Ok(_)) => {}
                    other => panic!("the connection ended: {other:?}"),
                }
            }
            answers
        }));
    }
    let mut sent = 0;
    for sender in senders {
        for answer in sender.await.unwrap() {
            match answer {
                Ok(()) => sent += 1,
                Err((code, message, retry)) => assert!(
                    retry.is_some(),
                    "a large frame was refused for good: {code:?} {message}"
                ),
            }
        }
    }
    healthy.keeps_exchanging_mail("the large frames").await;
    healthy.finish().await;
    let peak = relay.peak_rss_kib();
    eprintln!(
        "relay RSS: {before} KiB before; peak {peak} KiB with {SENDERS} senders of {FRAMES} frames of {} MiB, budget {BUDGET_MIB} MiB; {sent} sent",
        FRAME >> 20
    );
    assert!(sent > 0, "nothing was taken");
    assert!(
        peak.saturating_sub(before) < BOUND_MIB * 1024,
        "the relay grew by {} MiB, over the documented {BOUND_MIB} MiB",
        peak.saturating_sub(before) / 1024
    );
}
