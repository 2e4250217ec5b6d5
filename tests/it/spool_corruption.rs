//! Damaged spool files against the real relay process: a flipped byte costs the one copy it is
//! in, loudly (log, `/metrics`, `mailslot relay check`), and every other copy is delivered; a
//! torn tail after `kill -9` is not damage. Byte positions in every part of a record are
//! covered by the unit tests beside `scan.rs`.

use crate::common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

use common::*;
use mailslot::client::{Connection, RelayUrl};
use mailslot::crypto::seal;
use mailslot::protocol::{Limits, Message, MessageId};
use serde_json::Value;

/// A `mailslot relay` process, with what it logged before it listened.
struct RelayProcess {
    child: Child,
    url: RelayUrl,
    startup: Vec<String>,
}

impl RelayProcess {
    fn start(db: &Path) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_mailslot"))
            .args(["relay", "--listen", "127.0.0.1:0", "--db"])
            .arg(db)
            .env_clear()
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let mut startup = Vec::new();
        let url = loop {
            let line = lines
                .next()
                .unwrap_or_else(|| panic!("the relay exited before listening: {startup:#?}"))
                .unwrap();
            if let Some(rest) = line.split_once(" listening on ").map(|(_, r)| r) {
                break rest.split(' ').next().unwrap().parse().unwrap();
            }
            startup.push(line);
        };
        // Keep draining stderr so the relay never blocks on a full pipe.
        std::thread::spawn(move || for _ in lines {});
        Self {
            child,
            url,
            startup,
        }
    }

    /// SIGTERM, and waits for it to close the spool and exit.
    fn stop(mut self) {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
        assert!(self.child.wait().unwrap().success());
    }

    /// SIGKILL: the spool stays as the process left it.
    fn kill_9(self) {
        drop(self);
    }

    fn logged(&self, what: &str) -> Vec<&String> {
        self.startup.iter().filter(|l| l.contains(what)).collect()
    }

    /// The value of a counter in `/metrics`.
    async fn counter(&self, series: &str) -> f64 {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let addr = self
            .url
            .as_str()
            .strip_prefix("ws://")
            .and_then(|rest| rest.split('/').next())
            .unwrap();
        let mut socket = tokio::net::TcpStream::connect(addr).await.unwrap();
        socket
            .write_all(
                format!("GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n")
                    .as_bytes(),
            )
            .await
            .unwrap();
        let mut text = String::new();
        tokio::time::timeout(EVENT_TIMEOUT, socket.read_to_string(&mut text))
            .await
            .unwrap()
            .unwrap();
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {series} in {text}"))
    }
}

impl Drop for RelayProcess {
    /// A failed test does not leave its relay running.
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Registers bob, sends him `n` messages from alice (each answered `sent`); their ids in order.
async fn send(url: &RelayUrl, bob: &TestAgent, n: usize) -> Vec<MessageId> {
    Connection::connect(url, &bob.name, &bob.identity, None)
        .await
        .unwrap()
        .close()
        .await;
    let alice = TestAgent::new("alice");
    let keys = vec![(bob.address(), bob.identity.public().clone())];
    let mut conn = Connection::connect(url, &alice.name, &alice.identity, None)
        .await
        .unwrap();
    let mut ids = Vec::new();
    for i in 0..n {
        let m = Message::new(
            alice.address(),
            vec![bob.address()],
            format!("copy {i}"),
            "body",
        );
        let envelope = seal(&m, &alice.identity, &keys, &Limits::default())
            .unwrap()
            .remove(0);
        ids.push(conn.send_envelope(envelope).await.unwrap());
    }
    conn.close().await;
    ids
}

/// What bob receives now, sorted.
async fn receive(url: &RelayUrl, bob: &TestAgent) -> Vec<MessageId> {
    let report = tokio::time::timeout(
        EVENT_TIMEOUT,
        mailslot::client::sync(url, &bob.name, &bob.identity, None, &bob.store),
    )
    .await
    .unwrap()
    .unwrap();
    let mut received = report.received;
    received.sort();
    received
}

fn segment(db: &Path, seg: u32) -> PathBuf {
    db.with_file_name(format!("relay.db-spool/{seg:08}.seg"))
}

/// Flips the byte `after` bytes past where message `id`'s routing fields are in segment 1.
fn flip_after(db: &Path, id: MessageId, after: usize) {
    let path = segment(db, 1);
    let mut bytes = std::fs::read(&path).unwrap();
    let at = bytes
        .windows(36)
        .position(|w| w == id.to_string().as_bytes())
        .expect("the copy is in segment 1");
    bytes[at + after] ^= 0xff;
    std::fs::write(&path, bytes).unwrap();
}

/// `mailslot relay check --json --db DB`: its exit code and report.
fn check(db: &Path) -> (Option<i32>, Value, Output) {
    let out = Command::new(env!("CARGO_BIN_EXE_mailslot"))
        .args(["relay", "check", "--json", "--db"])
        .arg(db)
        .env_clear()
        .output()
        .unwrap();
    let report = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    (out.status.code(), report, out)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flipped_byte_costs_only_its_copy_and_says_so_everywhere() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("relay.db");
    let relay = RelayProcess::start(&db);
    let bob = TestAgent::new("bob");
    let ids = send(&relay.url, &bob, 100).await;
    relay.stop();
    let (code, clean, _) = check(&db);
    assert_eq!(code, Some(0), "{clean}");
    assert_eq!(clean["spool"]["copies_waiting"], 100);
    assert_eq!(
        clean["spool"]["unclosed"],
        Value::Null,
        "a relay that shut down closed its spool"
    );

    // Inside the 10th copy's envelope.
    flip_after(&db, ids[9], 300);
    let (code, report, out) = check(&db);
    assert_eq!(code, Some(3), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(report["clean"], false);
    let damaged = report["spool"]["damaged"].as_array().unwrap();
    assert_eq!(damaged.len(), 1, "{report}");
    assert_eq!(damaged[0]["segment"], 1);
    assert_eq!(damaged[0]["kind"], "copy");
    assert_eq!(damaged[0]["id"], ids[9].to_string());
    assert_eq!(damaged[0]["sender"], "alice");
    assert_eq!(damaged[0]["recipient"], "bob");
    assert_eq!(damaged[0]["loss"], "copy");
    assert_eq!(report["spool"]["copies_waiting"], 99);
    let text = Command::new(env!("CARGO_BIN_EXE_mailslot"))
        .args(["relay", "check", "--db"])
        .arg(&db)
        .env_clear()
        .output()
        .unwrap();
    let text = String::from_utf8(text.stdout).unwrap();
    assert!(
        text.contains(&format!("id {}, from alice, for bob; LOST", ids[9]))
            && text.ends_with("DAMAGED\n"),
        "{text}"
    );

    let relay = RelayProcess::start(&db);
    let logged = relay.logged("damaged spool record");
    assert_eq!(logged.len(), 1, "{:#?}", relay.startup);
    assert!(
        logged[0].contains("ERROR")
            && logged[0].contains("segment 00000001 at byte")
            && logged[0].contains(&ids[9].to_string())
            && logged[0].contains("LOST"),
        "{}",
        logged[0]
    );
    assert_eq!(
        relay.logged("the spool is DAMAGED").len(),
        1,
        "{:#?}",
        relay.startup
    );
    assert_eq!(
        relay
            .counter("mailslot_relay_storage_spool_corrupt_records_total")
            .await,
        1.0
    );
    assert_eq!(
        relay
            .counter("mailslot_relay_storage_spool_lost_copies_total")
            .await,
        1.0
    );
    let mut expected: Vec<MessageId> = ids.iter().copied().filter(|id| *id != ids[9]).collect();
    expected.sort();
    assert_eq!(receive(&relay.url, &bob).await, expected);
    relay.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_first_record_loses_no_copy() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("relay.db");
    let relay = RelayProcess::start(&db);
    let bob = TestAgent::new("bob");
    let ids = send(&relay.url, &bob, 100).await;
    relay.stop();
    // The checksum of segment 1's first record.
    let path = segment(&db, 1);
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[5] ^= 0xff;
    std::fs::write(&path, bytes).unwrap();

    let (code, report, _) = check(&db);
    assert_eq!(code, Some(3));
    let damaged = report["spool"]["damaged"].as_array().unwrap();
    assert_eq!(damaged.len(), 1, "{report}");
    assert_eq!(
        (
            &damaged[0]["offset"],
            &damaged[0]["kind"],
            &damaged[0]["loss"]
        ),
        (
            &Value::from(0),
            &Value::from("mark"),
            &Value::from("nothing")
        )
    );
    let relay = RelayProcess::start(&db);
    assert_eq!(
        relay.logged("damaged spool record").len(),
        1,
        "{:#?}",
        relay.startup
    );
    assert_eq!(
        relay
            .counter("mailslot_relay_storage_spool_lost_copies_total")
            .await,
        0.0
    );
    let mut expected = ids;
    expected.sort();
    assert_eq!(receive(&relay.url, &bob).await, expected, "all 100 kept");
    relay.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_torn_tail_after_kill_9_is_not_damage() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("relay.db");
    let relay = RelayProcess::start(&db);
    let bob = TestAgent::new("bob");
    let mut ids = send(&relay.url, &bob, 20).await;
    relay.kill_9();

    let (code, report, _) = check(&db);
    assert_eq!(code, Some(0), "{report}");
    let unclosed = &report["spool"]["unclosed"];
    let (seg, end) = (
        unclosed["segment"].as_u64().expect("left unclosed") as u32,
        unclosed["end"].as_u64().unwrap() as usize,
    );
    // The first bytes of a copy the process died writing: a length, a checksum, a kind.
    let path = segment(&db, seg);
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[end..end + 10].copy_from_slice(&[0x40, 2, 0, 0, 9, 9, 9, 9, 2, 5]);
    std::fs::write(&path, bytes).unwrap();
    let (code, report, _) = check(&db);
    assert_eq!(code, Some(0), "{report}");
    assert_eq!(report["spool"]["damaged"], Value::Array(vec![]));

    let relay = RelayProcess::start(&db);
    assert!(
        relay.logged("damaged spool record").is_empty() && relay.logged("DAMAGED").is_empty(),
        "{:#?}",
        relay.startup
    );
    assert_eq!(
        relay.logged("was not closed").len(),
        1,
        "{:#?}",
        relay.startup
    );
    assert_eq!(
        relay
            .counter("mailslot_relay_storage_spool_corrupt_records_total")
            .await,
        0.0
    );
    ids.sort();
    assert_eq!(receive(&relay.url, &bob).await, ids);
    relay.stop();
    let (code, report, _) = check(&db);
    assert_eq!(code, Some(0), "{report}");
    assert_eq!(
        report["spool"]["unclosed"],
        Value::Null,
        "the restart closed the torn segment, the stop its own"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relay_check_refuses_while_a_relay_runs_on_the_database() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("relay.db");
    let relay = RelayProcess::start(&db);
    let (code, _, out) = check(&db);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("offline") && stderr.contains("mailslot relay stop"),
        "{stderr}"
    );
    relay.stop();
    let (code, _, out) = check(&dir.path().join("nothing.db"));
    assert_eq!(code, Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("no relay database at"),
        "{out:?}"
    );
}
