//! The README's tour, walked exactly as printed: its `sh` block is read at test time and each
//! line run as the binary in a fresh home, against a relay process, with what the reader would
//! check asserted at every step. A tour and a CLI that drift apart fail here. The relay is the
//! test's own, named by `MAILSLOT_RELAY`, where a reader's first `init` starts one on
//! 127.0.0.1:7878 (`embedded.rs` tests that); the tour's `wait` keeps its printed timeout, as
//! bob's answer is already waiting when it runs.

use std::path::Path;
use std::process::{Command, Output, Stdio};

use crate::common::spawn_relay;

/// The words of each command line of the README's "A tour" block (comments left out).
fn tour() -> Vec<Vec<String>> {
    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md")).unwrap();
    let section = readme
        .split("\n## A tour\n")
        .nth(1)
        .expect("the README has a section \"## A tour\"");
    let block = section
        .split("```sh\n")
        .nth(1)
        .and_then(|b| b.split("\n```").next())
        .expect("the tour has a ```sh block");
    block.lines().map(words).filter(|w| !w.is_empty()).collect()
}

/// A line's words as `sh` splits them: spaces outside double quotes separate, quotes go, a
/// `#` after a space starts a comment. Any other shell syntax fails the test, so the tour
/// stays something this test runs exactly.
fn words(line: &str) -> Vec<String> {
    let (mut words, mut word, mut quoted, mut started) = (Vec::new(), String::new(), false, false);
    for c in line.chars() {
        match c {
            '"' => (quoted, started) = (!quoted, true),
            '#' if !quoted && !started => break,
            c if c.is_whitespace() && !quoted => {
                if started {
                    words.push(std::mem::take(&mut word));
                }
                started = false;
            }
            '\'' | '$' | '|' | ';' | '&' | '\\' | '<' | '>' | '`' | '*' if !quoted => {
                panic!("the tour uses shell syntax this test does not run ({c}): {line}")
            }
            c => {
                word.push(c);
                started = true;
            }
        }
    }
    assert!(!quoted, "an unclosed quote in the tour: {line}");
    if started {
        words.push(word);
    }
    words
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The message id a `sent ID: accepted by …` line gives.
fn sent_id(out: &str) -> String {
    let id = out
        .strip_prefix("sent ")
        .and_then(|rest| rest.split(':').next())
        .unwrap_or_else(|| panic!("not a sent line: {out}"));
    assert_eq!(id.len(), 36, "{out}");
    id.to_owned()
}

#[test]
fn the_readme_tour_runs_as_printed_in_a_fresh_home() {
    let dir = tempfile::tempdir().unwrap();
    let (_relay, url) = spawn_relay(dir.path().join("relay.db"), dir.path());
    let home = dir.path().join("home");
    let mut env: Vec<(String, String)> = Vec::new();
    // The ids the tour's steps printed: the message `send` printed (the tour's ID), bob's
    // answer.
    let (mut id, mut answer) = (None::<String>, None::<String>);
    let mut walked = Vec::new();
    for line in tour() {
        if line[0] == "export" {
            let (name, value) = line[1].split_once('=').expect("export NAME=VALUE");
            env.push((name.to_owned(), value.to_owned()));
            continue;
        }
        assert_eq!(
            line[0], "mailslot",
            "a tour step that is not mailslot: {line:?}"
        );
        let args: Vec<String> = line[1..]
            .iter()
            .map(|w| match w.as_str() {
                "ID" => id.clone().expect("ID before any step printed a message id"),
                _ => w.clone(),
            })
            .collect();
        let out: Output = Command::new(env!("CARGO_BIN_EXE_mailslot"))
            .args(&args)
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("MAILSLOT_HOME", &home)
            .env("MAILSLOT_RELAY", url.as_str())
            .envs(env.iter().map(|(k, v)| (k, v)))
            .current_dir(dir.path())
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
        let said = format!("`{}`:\n{stdout}\n{stderr}", line.join(" "));
        assert!(out.status.success(), "{said}");
        // Who acts: `--agent NAME`, else the exported MAILSLOT_AGENT.
        let agent = args
            .iter()
            .position(|a| a == "--agent")
            .map(|at| args[at + 1].clone())
            .or_else(|| {
                env.iter()
                    .find(|(k, _)| k == "MAILSLOT_AGENT")
                    .map(|(_, v)| v.clone())
            })
            .expect("every step acts as an agent");
        let command = args
            .iter()
            .enumerate()
            .find(|(at, a)| !a.starts_with("--") && (*at == 0 || args[at - 1] != "--agent"))
            .map(|(_, a)| a.clone())
            .unwrap();
        for debug in ["Verified", "KeyChanged", "Unverified"] {
            assert!(!stdout.contains(debug), "a Rust name in {said}");
        }
        let has = |words: &[&str]| {
            for w in words {
                assert!(stdout.contains(w), "no {w:?} in {said}");
            }
        };
        match (agent.as_str(), command.as_str()) {
            (name, "init") => has(&[&format!("agent {name} is ready"), "registered on"]),
            ("alice", "whoami" | "doing") => has(&[&args[args.len() - 1]]),
            ("alice", "remember") => has(&["remembered ", "\"relay port\""]),
            ("alice", "recall") => has(&["relay port", "The team relay listens on 7878"]),
            ("alice", "send") => {
                has(&["accepted by"]);
                id = Some(sent_id(&stdout));
            }
            ("bob", "sync") => has(&["1 received"]),
            ("bob", "inbox") => has(&[id.as_deref().unwrap(), "alice", "deploy window"]),
            ("bob", "read") => has(&[
                "From:    alice",
                "Signature: verified",
                "Subject: deploy window",
                "Friday 10:00?",
            ]),
            ("bob", "reply") => {
                has(&["accepted by"]);
                answer = Some(sent_id(&stdout));
            }
            // bob's answer was waiting: the wait ends at once with it.
            ("alice", "wait") => has(&[answer.as_deref().unwrap(), "From: bob", "Works for me"]),
            ("alice", "thread") => has(&[
                id.as_deref().unwrap(),
                answer.as_deref().unwrap(),
                "to   bob",
                "from bob",
            ]),
            ("alice", "sent") => {
                has(&[id.as_deref().unwrap()]);
                let state = stdout.split_whitespace().next().unwrap();
                assert!(
                    ["sent", "delivered"].contains(&state),
                    "the relay took it: {said}"
                );
            }
            ("alice", "search") => has(&[id.as_deref().unwrap(), answer.as_deref().unwrap()]),
            ("alice", "status") => has(&["alice", "reachable, registered", "2 messages"]),
            ("alice", "doctor") => {
                has(&["mailslot doctor for agent alice"]);
                assert!(
                    !stdout.lines().any(|l| l.starts_with("FAIL")),
                    "nothing fails: {said}"
                );
            }
            _ => panic!("the tour has a step this test does not check: {said}"),
        }
        walked.push(format!("{agent} {command}"));
    }
    assert_eq!(
        walked,
        [
            "alice init",
            "bob init",
            "alice whoami",
            "alice doing",
            "alice remember",
            "alice recall",
            "alice send",
            "bob sync",
            "bob inbox",
            "bob read",
            "bob reply",
            "alice wait",
            "alice thread",
            "alice sent",
            "alice search",
            "alice status",
            "alice doctor",
        ],
        "the tour's steps, in order"
    );
}
