//! The owner CLI, run as a real process against a temporary MAILSLOT_HOME.

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use mailslot::protocol::{Address, AgentName, Message};
use mailslot::store::{Direction, Store, Trust};
use serde_json::Value;

struct Home {
    dir: tempfile::TempDir,
}

impl Home {
    fn new() -> Self {
        Self {
            dir: tempfile::tempdir().unwrap(),
        }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_mailslot"));
        cmd.args(args)
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("MAILSLOT_HOME", self.path())
            // A relay that refuses at once: these tests need none, and `init` must not start
            // one on the shared default port.
            .env("MAILSLOT_RELAY", "ws://127.0.0.1:9")
            .current_dir(self.path());
        cmd
    }

    fn run(&self, args: &[&str]) -> Output {
        self.command(args).stdin(Stdio::null()).output().unwrap()
    }

    fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert!(
            out.status.success(),
            "{args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    fn json(&self, args: &[&str]) -> Value {
        let mut with_json = args.to_vec();
        with_json.push("--json");
        serde_json::from_str(&self.ok(&with_json)).unwrap()
    }

    fn agent_dir(&self, name: &str) -> PathBuf {
        self.path().join("agents").join(name)
    }

    fn deliver(&self, to: &str, from: &str, subject: &str, body: &str) -> Message {
        let mut store = Store::open(&self.agent_dir(to).join("store.db")).unwrap();
        let address = |n: &str| Address::local(AgentName::new(n).unwrap());
        let m = Message::new(address(from), vec![address(to)], subject, body);
        store
            .insert_message(&m, Direction::In, Trust::Verified)
            .unwrap();
        m
    }
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn first_use_creates_the_agent_once_with_private_keys() {
    let home = Home::new();
    let first = home.run(&["--agent", "alice", "init"]);
    assert!(first.status.success());
    // The relay is down: the agent is made anyway, and init says how to register it later.
    let said = String::from_utf8_lossy(&first.stdout);
    assert!(
        said.contains("not registered yet") && said.contains("`mailslot --agent alice register`"),
        "{said}"
    );
    assert!(
        stderr(&first).contains("created agent alice"),
        "{}",
        stderr(&first)
    );
    let key = home.agent_dir("alice").join("identity.key");
    assert_eq!(
        std::fs::metadata(&key).unwrap().permissions().mode() & 0o777,
        0o600
    );
    assert_eq!(
        std::fs::metadata(home.agent_dir("alice"))
            .unwrap()
            .permissions()
            .mode()
            & 0o777,
        0o700
    );
    let second = home.run(&["init", "--agent", "alice"]);
    assert!(second.status.success());
    assert!(
        !stderr(&second).contains("created"),
        "init twice must not recreate"
    );
    let who = home.json(&["--agent", "alice", "whoami"]);
    let fingerprint = who["fingerprint"].as_str().unwrap();
    assert_eq!(fingerprint.len(), 29);
    assert!(String::from_utf8_lossy(&first.stdout).contains(fingerprint));
    // The secret never shows up in any output.
    let secret: Value = serde_json::from_slice(&std::fs::read(&key).unwrap()).unwrap();
    let secret = secret["signing_key"].as_str().unwrap();
    for args in [
        &["--agent", "alice", "status", "--json"][..],
        &["--agent", "alice", "whoami"],
    ] {
        let out = home.run(args);
        assert!(
            !String::from_utf8_lossy(&out.stdout).contains(secret)
                && !stderr(&out).contains(secret)
        );
    }
}

#[test]
fn a_send_with_the_relay_down_says_queued_without_log_lines_unless_asked() {
    let home = Home::new();
    home.ok(&["--agent", "alice", "init", "--offline"]);
    let send = [
        "--agent",
        "alice",
        "send",
        "--to",
        "bob",
        "--subject",
        "s",
        "--body",
        "b",
    ];
    let out = home.run(&send);
    assert!(out.status.success(), "{}", stderr(&out));
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.starts_with("queued ")
            && said.contains("the relay at 127.0.0.1:9 is unreachable")
            && said.contains("`mailslot --agent alice sync`"),
        "{said}"
    );
    let err = stderr(&out);
    assert!(
        !err.contains("WARN") && !err.contains("mailslot::"),
        "no log lines: {err}"
    );
    // -v, MAILSLOT_LOG and RUST_LOG still show them.
    let verbose = [&["-v"][..], &send].concat();
    let logged = |out: Output| {
        let err = stderr(&out);
        assert!(
            err.contains("WARN mailslot::mailbox") && err.contains("relay unreachable"),
            "{err}"
        );
    };
    logged(home.run(&verbose));
    for var in ["MAILSLOT_LOG", "RUST_LOG"] {
        logged(
            home.command(&send)
                .env(var, "warn")
                .stdin(Stdio::null())
                .output()
                .unwrap(),
        );
    }
}

/// A web server on loopback that answers the next `requests` requests 404 with a page, and the
/// thread that does (joined once they came).
fn web_server(requests: usize) -> (String, std::thread::JoinHandle<()>) {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("ws://{}", listener.local_addr().unwrap());
    let serving = std::thread::spawn(move || {
        for _ in 0..requests {
            let (mut socket, _) = listener.accept().unwrap();
            let mut head = [0u8; 4096];
            let _ = socket.read(&mut head);
            let page = "<html><body>Not Found</body></html>";
            let _ = write!(
                socket,
                "HTTP/1.1 404 Not Found\r\ncontent-type: text/html\r\ncontent-length: {}\r\n\r\n{page}",
                page.len()
            );
        }
    });
    (url, serving)
}

#[test]
fn init_against_a_web_server_says_it_is_not_a_mailslot_relay_as_doctor_does() {
    let home = Home::new();
    let (url, serving) = web_server(2);
    let said = format!(
        "the server at {url}/v1/ws answered HTTP 404 Not Found: it is not a mailslot relay (check the relay URL"
    );
    let init = home.ok(&["--agent", "alice", "--relay", &url, "init"]);
    assert!(
        init.contains(&said) && init.contains("then run `mailslot --agent alice register`"),
        "{init}"
    );
    assert!(!init.contains("WebSocket protocol error"), "{init}");
    let out = home.run(&["--agent", "alice", "--relay", &url, "--json", "doctor"]);
    serving.join().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let relay = report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "relay")
        .unwrap();
    assert_eq!(relay["outcome"], "fail", "{report}");
    assert!(
        relay["detail"].as_str().unwrap().contains(&said),
        "{report}"
    );
}

#[test]
fn only_init_register_and_mcp_make_an_agent_and_a_typo_is_an_error() {
    let home = Home::new();
    let none = home.run(&["--agent", "alice", "inbox"]);
    assert_eq!(none.status.code(), Some(1));
    assert!(
        stderr(&none).contains("no agent named alice")
            && stderr(&none).contains("`mailslot --agent alice init`"),
        "{}",
        stderr(&none)
    );
    assert!(!home.agent_dir("alice").exists());
    home.ok(&["--agent", "alice", "init"]);

    let typo = home.run(&["--agent", "alcie", "whoami"]);
    assert_eq!(typo.status.code(), Some(1));
    assert!(
        stderr(&typo)
            .contains("; did you mean alice? To make alcie, run `mailslot --agent alcie init`"),
        "{}",
        stderr(&typo)
    );
    assert!(!home.agent_dir("alcie").exists());

    // No --agent in a folder called proj: the folder's name is not a new agent either.
    let proj = home.path().join("proj");
    std::fs::create_dir(&proj).unwrap();
    let out = home
        .command(&["status"])
        .current_dir(&proj)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("no agent named proj (this folder's name;")
            && stderr(&out).contains("; this home has alice. To make it, run `"),
        "{}",
        stderr(&out)
    );
    assert!(!home.agent_dir("proj").exists());
}

#[test]
fn identity_and_current_task_persist() {
    let home = Home::new();
    home.ok(&["--agent", "alice", "init"]);
    home.ok(&[
        "--agent",
        "alice",
        "whoami",
        "--set",
        "reviewer for the payments team",
    ]);
    home.ok(&["--agent", "alice", "doing", "--set", "reviewing PR 42"]);
    assert!(
        home.ok(&["--agent", "alice", "whoami"])
            .contains("reviewer for the payments team")
    );
    assert_eq!(
        home.json(&["--agent", "alice", "doing"])["current_task"],
        "reviewing PR 42"
    );
    let status = home.json(&["--agent", "alice", "status"]);
    assert_eq!(status["identity"], "reviewer for the payments team");
    assert_eq!(status["current_task"], "reviewing PR 42");
    home.ok(&["--agent", "alice", "doing", "--set", ""]);
    assert_eq!(
        home.json(&["--agent", "alice", "doing"])["current_task"],
        Value::Null
    );
}

#[test]
fn remember_recall_forget() {
    let home = Home::new();
    home.ok(&["--agent", "bob", "init"]);
    let a = home.json(&[
        "--agent",
        "bob",
        "remember",
        "--title",
        "relay",
        "--tag",
        "Ops",
        "the relay listens on 7878",
    ]);
    assert_eq!(a["tags"], serde_json::json!(["ops"]));
    let mut child = home
        .command(&["--agent", "bob", "remember", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"standup is at nine\nin the small room")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("standup is at nine"),
        "title from the first line"
    );

    let found = home.json(&["--agent", "bob", "recall", "relay port"]);
    assert_eq!(found.as_array().unwrap().len(), 1);
    assert_eq!(found[0]["memory"]["id"], a["id"]);
    assert_eq!(
        home.json(&["--agent", "bob", "recall"])
            .as_array()
            .unwrap()
            .len(),
        2
    );
    assert!(
        home.ok(&["--agent", "bob", "recall", "nonexistent"])
            .contains("no memories match")
    );

    let id = a["id"].as_str().unwrap();
    home.ok(&["--agent", "bob", "forget", id]);
    let again = home.run(&["--agent", "bob", "forget", id]);
    assert_eq!(again.status.code(), Some(1));
    assert!(
        stderr(&again).contains("no memory with id"),
        "{}",
        stderr(&again)
    );
    let big = home
        .command(&["--agent", "bob", "remember", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut big = big;
    let _ = big
        .stdin
        .take()
        .unwrap()
        .write_all(&vec![b'x'; 64 * 1024 + 1]);
    let out = big.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("65536"), "{}", stderr(&out));
}

#[test]
fn inbox_read_and_search_show_stored_mail() {
    let home = Home::new();
    home.ok(&["--agent", "bob", "init"]);
    assert!(
        home.ok(&["--agent", "bob", "inbox"])
            .contains("no unread mail")
    );
    let m = home.deliver(
        "bob",
        "alice",
        "Deploy window",
        "we deploy on friday at noon",
    );
    let listing = home.ok(&["--agent", "bob", "inbox"]);
    assert!(
        listing.contains("Deploy window") && listing.contains(&m.id.to_string()),
        "{listing}"
    );
    let json = home.json(&["--agent", "bob", "inbox"]);
    assert_eq!(json[0]["unread"], true);
    assert_eq!(json[0]["from"], "alice");

    let shown = home.ok(&["--agent", "bob", "read", &m.id.to_string()]);
    assert!(
        shown.contains("we deploy on friday at noon") && shown.contains("From:    alice"),
        "{shown}"
    );
    assert!(
        home.ok(&["--agent", "bob", "inbox"])
            .contains("no unread mail"),
        "read marks it read"
    );
    assert_eq!(
        home.json(&["--agent", "bob", "inbox", "--all"])[0]["unread"],
        false
    );

    assert_eq!(
        home.json(&["--agent", "bob", "search", "friday"])[0]["id"],
        m.id.to_string()
    );
    assert!(
        home.ok(&["--agent", "bob", "search", "nothing"])
            .contains("no mail matches")
    );
    let missing = home.run(&[
        "--agent",
        "bob",
        "read",
        &mailslot::protocol::MessageId::new().to_string(),
    ]);
    assert_eq!(missing.status.code(), Some(1));
    let status = home.json(&["--agent", "bob", "status"]);
    assert_eq!(
        (status["messages"].as_u64(), status["unread"].as_u64()),
        (Some(1), Some(0))
    );
}

/// Runs `cmd` with stdout piped, reads one line, closes the pipe and waits: what the shell's
/// `| head -1` does.
fn first_line_then_close(cmd: &mut Command) -> (Option<i32>, String, String) {
    use std::io::{BufRead, Read};
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    (child.wait().unwrap().code(), line, err)
}

#[test]
fn a_reader_that_goes_away_early_ends_the_command_quietly() {
    let home = Home::new();
    home.ok(&["--agent", "bob", "init"]);
    let mut store = Store::open(&home.agent_dir("bob").join("store.db")).unwrap();
    let address = |n: &str| Address::local(AgentName::new(n).unwrap());
    // Far more than a pipe holds (64 KiB), so the listing is still being written when the
    // reader leaves.
    for i in 0..400 {
        let subject = format!("{i:03} {}", "a long subject line ".repeat(12));
        let m = Message::new(address("alice"), vec![address("bob")], &subject, "hi");
        store
            .insert_message(&m, Direction::In, Trust::Verified)
            .unwrap();
    }
    drop(store);
    let (code, line, err) = first_line_then_close(
        &mut home.command(&["--agent", "bob", "--json", "inbox", "--limit", "1000"]),
    );
    assert_eq!(line.trim(), "[");
    assert_eq!(code, Some(0), "{err}");
    assert!(err.is_empty(), "nothing on stderr: {err}");

    // The demo writes as it goes: the reader leaves after its first line.
    let (code, line, err) =
        first_line_then_close(home.command(&["demo"]).env_remove("MAILSLOT_HOME"));
    assert!(line.starts_with("mailslot demo"), "{line}");
    assert_eq!(code, Some(0), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn usage_errors_exit_2_and_name_the_problem() {
    let home = Home::new();
    let bad_name = home.run(&["--agent", "Alice", "status"]);
    assert_eq!(bad_name.status.code(), Some(2));
    assert!(
        stderr(&bad_name).contains("agent name"),
        "{}",
        stderr(&bad_name)
    );
    assert_eq!(home.run(&["frobnicate"]).status.code(), Some(2));
    assert_eq!(
        home.run(&["--agent", "a", "recall", "--limit", "0"])
            .status
            .code(),
        Some(2)
    );
    let bad_id = home.run(&["--agent", "a", "read", "not-an-id"]);
    assert_eq!(bad_id.status.code(), Some(2));
    assert!(
        stderr(&bad_id).contains("is not part of a message id"),
        "{}",
        stderr(&bad_id)
    );
}

#[test]
fn the_agent_comes_from_env_then_config_then_the_folder() {
    let home = Home::new();
    let project = home.path().join("My Project");
    std::fs::create_dir(&project).unwrap();
    // `init` makes the agent it resolves, so it shows which one each source chose.
    let who = |cmd: &mut Command| -> Value {
        let out = cmd.arg("--json").output().unwrap();
        assert!(out.status.success(), "{}", stderr(&out));
        serde_json::from_slice(&out.stdout).unwrap()
    };
    assert_eq!(
        who(home.command(&["init"]).current_dir(&project))["agent"],
        "my-project"
    );
    std::fs::write(
        home.path().join("config.toml"),
        "default_agent = \"from-config\"\n",
    )
    .unwrap();
    assert_eq!(
        who(home.command(&["init"]).current_dir(&project))["agent"],
        "from-config"
    );
    assert_eq!(
        who(home.command(&["init"]).env("MAILSLOT_AGENT", "from-env"))["agent"],
        "from-env"
    );
    assert_eq!(
        who(home
            .command(&["init", "--agent", "from-flag"])
            .env("MAILSLOT_AGENT", "from-env"))["agent"],
        "from-flag"
    );
    std::fs::write(home.path().join("config.toml"), "defualt_agent = \"x\"\n").unwrap();
    let out = home.run(&["whoami"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("defualt_agent"), "{}", stderr(&out));
}

#[test]
fn a_config_file_named_on_purpose_must_exist() {
    let home = Home::new();
    let typo = home.path().join("confg.toml");
    let typo_s = typo.to_str().unwrap();
    let out = home.run(&["--agent", "a", "--config", typo_s, "whoami"]);
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(
        err.contains(&format!(
            "the config file {typo_s} does not exist (from --config"
        )) && err.contains("leave out --config"),
        "{err}"
    );
    let out = home
        .command(&["--agent", "a", "whoami"])
        .env("MAILSLOT_CONFIG", &typo)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(
        err.contains(&format!("(from MAILSLOT_CONFIG={typo_s})"))
            && err.contains("unset MAILSLOT_CONFIG"),
        "{err}"
    );
    // The default config file is optional, and a named one that exists is read.
    home.ok(&["--agent", "a", "init"]);
    home.ok(&["--agent", "from-file", "init"]);
    std::fs::write(&typo, "default_agent = \"from-file\"\n").unwrap();
    let who: Value =
        serde_json::from_str(&home.ok(&["--config", typo_s, "--json", "whoami"])).unwrap();
    assert_eq!(who["agent"], "from-file");
}

#[test]
fn printed_commands_name_the_agent_they_act_as() {
    let home = Home::new();
    home.ok(&["--agent", "bob", "init"]);
    // Chosen by the environment: the hint still works pasted into a shell without it.
    let empty = home
        .command(&["inbox"])
        .env("MAILSLOT_AGENT", "bob")
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&empty.stdout).contains("mailslot --agent bob inbox --all"),
        "{empty:?}"
    );
    let missing = home.run(&[
        "--agent",
        "bob",
        "read",
        &mailslot::protocol::MessageId::new().to_string(),
    ]);
    assert!(
        stderr(&missing).contains(
            "`mailslot --agent bob inbox --all` and `mailslot --agent bob sent` list them"
        ),
        "{}",
        stderr(&missing)
    );
    assert!(
        home.ok(&["--agent", "bob", "whoami"])
            .contains("mailslot --agent bob whoami --set")
    );
}

#[test]
fn missing_keys_are_never_silently_regenerated() {
    let home = Home::new();
    home.ok(&["--agent", "alice", "init"]);
    std::fs::remove_file(home.agent_dir("alice").join("identity.key")).unwrap();
    let out = home.run(&["--agent", "alice", "status"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("no key file"), "{}", stderr(&out));
}

/// The case names of a benchmark's JSON rows.
fn cases(rows: &Value) -> Vec<&str> {
    rows.as_array()
        .unwrap()
        .iter()
        .map(|r| r["case"].as_str().unwrap())
        .collect()
}

#[test]
fn bench_commands_run_and_report_percentiles() {
    let home = Home::new();
    let rows = home.json(&[
        "bench",
        "store",
        "--sizes",
        "200",
        "--queries",
        "10",
        "--inserts",
        "100",
    ]);
    let cases = cases(&rows);
    assert!(
        cases.iter().any(|c| c.starts_with("recall, 2 words")),
        "{cases:?}"
    );
    assert!(
        rows.as_array()
            .unwrap()
            .iter()
            .all(|r| r["p50_us"].as_f64().unwrap() > 0.0)
    );
    let rows = home.json(&["bench", "crypto", "--iterations", "10"]);
    assert_eq!(rows.as_array().unwrap().len(), 4);
}

#[test]
fn bench_relay_federated_runs_the_ring_across_two_relays_beside_one() {
    let home = Home::new();
    // The benchmark fails unless every message arrived exactly once.
    let rows = home.json(&[
        "bench",
        "relay",
        "--federated",
        "--agents",
        "4",
        "--messages",
        "40",
        "--paced-rate",
        "400",
        "--rounds",
        "2",
    ]);
    let cases = cases(&rows);
    let has = |prefix: String| {
        assert!(
            cases.iter().any(|c| c.starts_with(&prefix)),
            "{prefix}: {cases:?}"
        )
    };
    // Flat out once per round, paced once, each on one relay and on the pair.
    for phase in [
        "flat out, round 1 of 2",
        "flat out, round 2 of 2",
        "paced at 400/s",
    ] {
        for relays in ["1 node on SQLite", "2 federated relays on SQLite"] {
            has(format!("send→delivered, {phase} (4 agents, {relays}"));
        }
    }
    has("flat out: federated delivered+acked/s, % of one relay's, median of 2".to_owned());
    has("paced at 400/s: federated delivered+acked/s, % of one relay's (in".to_owned());
    let out = home.run(&["bench", "relay", "--rounds", "2"]);
    assert_eq!(out.status.code(), Some(2), "--rounds is for --federated");
    let out = home.run(&["bench", "relay", "--federated", "--agents", "3"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("even --agents"), "{}", stderr(&out));
}

#[test]
fn doctor_warns_until_the_owner_key_exists_and_owner_init_needs_a_terminal() {
    let home = Home::new();
    let out = home.run(&["--agent", "alice", "--json", "doctor"]);
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let owner = report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "owner key")
        .unwrap_or_else(|| panic!("no owner key check: {report}"));
    assert_eq!(owner["outcome"], "warn", "{report}");
    assert!(
        owner["fix"]
            .as_str()
            .unwrap()
            .contains("mailslot owner init")
    );

    // No terminal, no passphrase: nothing is made, and the error says why.
    let mut cmd = home.command(&["owner", "init"]);
    let out = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // setsid: no controlling terminal even when the test runner has one.
    unsafe {
        use std::os::unix::process::CommandExt;
        out.pre_exec(|| {
            nix::unistd::setsid().map_err(std::io::Error::from)?;
            Ok(())
        });
    }
    let out = out.output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("terminal"), "{}", stderr(&out));
    assert!(!home.path().join("owner.key").exists());
}

#[test]
fn doctor_reports_a_broken_config_as_a_fail_line_and_checks_the_rest() {
    let home = Home::new();
    home.ok(&["--agent", "alice", "init", "--offline"]);
    std::fs::write(home.path().join("config.toml"), "relay = [\n").unwrap();
    // Every other command stops at it.
    let status = home.run(&["--agent", "alice", "status"]);
    assert_eq!(status.status.code(), Some(1));
    assert!(
        stderr(&status).contains("is invalid"),
        "{}",
        stderr(&status)
    );

    let out = home.run(&["--agent", "alice", "--json", "doctor"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let checks = report["checks"].as_array().unwrap();
    let config = &checks[0];
    assert_eq!(config["name"], "config file", "{report}");
    assert_eq!(config["outcome"], "fail", "{report}");
    assert!(
        config["detail"]
            .as_str()
            .unwrap()
            .contains("config.toml is invalid"),
        "{report}"
    );
    assert!(
        config["fix"].as_str().unwrap().contains("move it aside"),
        "{report}"
    );
    // The checks that need no config still ran.
    for name in ["owner key", "keys", "store"] {
        assert!(checks.iter().any(|c| c["name"] == name), "{name}: {report}");
    }
    let text = home.run(&["--agent", "alice", "doctor"]);
    let said = String::from_utf8_lossy(&text.stdout);
    assert!(said.contains("FAIL  config file: "), "{said}");
    // A config file named on purpose that does not exist: the same line.
    let out = home.run(&[
        "--agent",
        "alice",
        "--config",
        "gone.toml",
        "--json",
        "doctor",
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let config = &report["checks"][0];
    assert_eq!(config["outcome"], "fail", "{report}");
    assert!(
        config["detail"]
            .as_str()
            .unwrap()
            .contains("does not exist")
            && config["fix"].as_str().unwrap().starts_with("create it"),
        "{report}"
    );
}

#[test]
fn doctor_says_which_path_wakes_an_idle_claude_code_session() {
    let home = Home::new();
    home.ok(&["--agent", "alice", "init"]);
    let check = |settings: Option<&str>| {
        let project = home.path().join("project");
        std::fs::create_dir_all(project.join(".claude")).unwrap();
        if let Some(settings) = settings {
            std::fs::write(project.join(".claude/settings.json"), settings).unwrap();
        }
        let out = home
            .command(&["--agent", "alice", "--json", "doctor"])
            .env("HOME", home.path())
            .current_dir(&project)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let report: Value = serde_json::from_slice(&out.stdout).unwrap();
        report["checks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == "claude code")
            .unwrap_or_else(|| panic!("no claude code check: {report}"))
            .clone()
    };
    let socket = check(None);
    assert_eq!(socket["outcome"], "ok", "{socket}");
    assert!(
        socket["detail"]
            .as_str()
            .unwrap()
            .contains("woken by the inbox socket"),
        "{socket}"
    );

    let refused = check(Some(r#"{"crossSessionInbound": "refuse"}"#));
    assert_eq!(refused["outcome"], "warn", "{refused}");
    let detail = refused["detail"].as_str().unwrap();
    assert!(
        detail.contains("woken by the rewake hook") && detail.contains("\"refuse\""),
        "{refused}"
    );
    assert!(
        refused["fix"]
            .as_str()
            .unwrap()
            .contains("mcp-config-examples/claude-code")
    );

    let mut example: Value = serde_json::from_str(
        &std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("mcp-config-examples/claude-code/.claude/settings.json"),
        )
        .unwrap(),
    )
    .unwrap();
    example["crossSessionInbound"] = Value::from("hold");
    let held = check(Some(&example.to_string()));
    assert_eq!(held["outcome"], "ok", "{held}");
    assert!(
        held["detail"].as_str().unwrap().contains("\"hold\""),
        "{held}"
    );
}

/// Reads `output` until it holds `needle`, from the chunks a reader thread sends.
fn read_until(
    chunks: &std::sync::mpsc::Receiver<Vec<u8>>,
    output: &mut String,
    needle: &str,
) -> bool {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !output.contains(needle) {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match chunks.recv_timeout(left) {
            Ok(chunk) => output.push_str(&String::from_utf8_lossy(&chunk)),
            Err(_) => return false,
        }
    }
    true
}

#[test]
fn mcp_at_a_terminal_says_what_it_is_and_serves_anyway() {
    use std::io::Read;
    let home = Home::new();
    home.ok(&["--agent", "alice", "init", "--offline"]);
    // A client's stdin is a pipe: nothing but the protocol (and logs) there.
    let piped = home.run(&["--agent", "alice", "mcp"]);
    assert!(piped.status.success(), "{}", stderr(&piped));
    assert!(!stderr(&piped).contains("over stdio"), "{}", stderr(&piped));

    // A person's stdin is a terminal: `script` runs it on a pseudo-terminal.
    let line = format!("'{}' --agent alice mcp", env!("CARGO_BIN_EXE_mailslot"));
    let mut script = Command::new("script")
        .args(["-qefc", &line, "/dev/null"])
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("MAILSLOT_HOME", home.path())
        .env("MAILSLOT_RELAY", "ws://127.0.0.1:9")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("script (util-linux) runs a command on a pseudo-terminal");
    let mut stdout = script.stdout.take().unwrap();
    let (send, chunks) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n @ 1..) = stdout.read(&mut buf) {
            if send.send(buf[..n].to_vec()).is_err() {
                break;
            }
        }
    });
    let mut output = String::new();
    assert!(
        read_until(&chunks, &mut output, "Ctrl-D or Ctrl-C ends this server."),
        "{output}"
    );
    assert!(
        output.contains("MCP server over stdio")
            && output.contains("`claude mcp add mailslot -- mailslot --agent alice mcp`")
            && output.contains("`mailslot help mcp`"),
        "{output}"
    );
    // It still serves: a client that runs it on a terminal gets its answer.
    let mut stdin = script.stdin.take().unwrap();
    writeln!(
        stdin,
        r#"{{"jsonrpc":"2.0","id":1,"method":"initialize","params":{{"protocolVersion":"2025-06-18","capabilities":{{}},"clientInfo":{{"name":"t","version":"1"}}}}}}"#
    )
    .unwrap();
    assert!(
        read_until(&chunks, &mut output, "\"serverInfo\""),
        "{output}"
    );
    // End of input (script passes it on as Ctrl-D) ends the server, and script with it.
    drop(stdin);
    drop(chunks);
    reader.join().unwrap();
    assert!(script.wait().unwrap().success());
}

#[test]
fn help_is_grouped_and_completions_and_man_pages_are_printed() {
    let home = Home::new();
    let help = home.ok(&["--help"]);
    // No command: the same grouped help (on stdout, exit 2: nothing ran), not clap's flat list.
    let bare = home.run(&[]);
    assert_eq!(bare.status.code(), Some(2));
    assert_eq!(String::from_utf8_lossy(&bare.stdout), help);
    assert_eq!(home.ok(&["help"]), help);
    assert!(!help.contains("[subcommands:"), "{help}");
    // The lines that had fallen behind what the commands do.
    for line in [
        "doctor         Check what the agent needs",
        "relay          Run a relay in the foreground, or manage one",
        "bench          Measure the store, the crypto, a relay and the MCP server",
    ] {
        assert!(help.contains(line), "{line}: {help}");
    }
    for family in [
        "The agent:",
        "Mail:",
        "Memory:",
        "Who may write",
        "LLM clients:",
    ] {
        assert!(help.contains(family), "{help}");
    }
    assert!(help.contains("  send "), "{help}");
    let send = home.ok(&["send", "--help"]);
    assert!(
        send.contains("Global options:") && send.contains("Examples:"),
        "{send}"
    );

    let bash = home.ok(&["completions", "bash"]);
    assert!(
        bash.contains("_mailslot()") && bash.contains("approve"),
        "{bash}"
    );
    let zsh = home.ok(&["completions", "zsh"]);
    assert!(zsh.starts_with("#compdef mailslot"), "{zsh}");
    let bad = home.run(&["completions", "tcsh"]);
    assert_eq!(bad.status.code(), Some(2));

    let page = home.ok(&["man"]);
    assert!(page.contains(".TH mailslot 1"), "{page}");
    let dir = home.path().join("man1");
    home.ok(&["man", "--dir", dir.to_str().unwrap()]);
    for page in ["mailslot.1", "mailslot-send.1", "mailslot-relay-migrate.1"] {
        assert!(dir.join(page).is_file(), "{page} missing");
    }
}

#[test]
fn an_agent_exported_under_a_passphrase_imports_elsewhere_with_its_keys_and_mail() {
    let home = Home::new();
    home.ok(&["--agent", "alice", "init"]);
    home.deliver("alice", "bob", "kept across machines", "the body");
    home.ok(&["--agent", "alice", "remember", "a memory that travels"]);
    let fingerprint = home.json(&["--agent", "alice", "whoami"])["fingerprint"].clone();
    let pass = home.path().join("pass");
    std::fs::write(&pass, "correct horse battery staple\n").unwrap();
    let file = home.path().join("alice.mailslot");
    let (file_arg, pass_arg) = (file.to_str().unwrap(), pass.to_str().unwrap());
    home.ok(&[
        "--agent",
        "alice",
        "export",
        "--out",
        file_arg,
        "--passphrase-file",
        pass_arg,
    ]);
    assert_eq!(
        std::fs::metadata(&file).unwrap().permissions().mode() & 0o777,
        0o600
    );
    // Nothing secret or private in the clear: not the key, not the mail.
    let bytes = std::fs::read(&file).unwrap();
    let key: Value = serde_json::from_slice(
        &std::fs::read(home.agent_dir("alice").join("identity.key")).unwrap(),
    )
    .unwrap();
    let clear = String::from_utf8_lossy(&bytes);
    assert!(!clear.contains(key["signing_key"].as_str().unwrap()));
    assert!(!clear.contains("kept across machines"));
    // Exporting again to the same file is refused.
    let again = home.run(&[
        "--agent",
        "alice",
        "export",
        "--out",
        file_arg,
        "--passphrase-file",
        pass_arg,
    ]);
    assert_eq!(again.status.code(), Some(1));

    // Another machine: the same keys, mail and memories.
    let other = Home::new();
    other.ok(&["import", file_arg, "--passphrase-file", pass_arg]);
    assert_eq!(
        other.json(&["--agent", "alice", "whoami"])["fingerprint"],
        fingerprint
    );
    assert!(
        other
            .ok(&["--agent", "alice", "inbox"])
            .contains("kept across machines")
    );
    assert!(
        other
            .ok(&["--agent", "alice", "recall", "travels"])
            .contains("a memory that travels")
    );

    // An existing agent is refused before any passphrase, and --replace keeps the old one.
    let exists = other.run(&["import", file_arg, "--passphrase-file", pass_arg]);
    assert_eq!(exists.status.code(), Some(1));
    assert!(stderr(&exists).contains("--replace"), "{}", stderr(&exists));
    other.ok(&[
        "import",
        file_arg,
        "--passphrase-file",
        pass_arg,
        "--replace",
    ]);
    let kept = std::fs::read_dir(other.path().join("agents"))
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with(".replaced-alice-")
        })
        .count();
    assert_eq!(kept, 1, "the replaced agent is kept aside");

    // A wrong passphrase, or a changed byte, opens nothing and makes nothing.
    let third = Home::new();
    let wrong = third.path().join("wrong");
    std::fs::write(&wrong, "not the passphrase at all").unwrap();
    let refused = third.run(&[
        "import",
        file_arg,
        "--passphrase-file",
        wrong.to_str().unwrap(),
    ]);
    assert_eq!(refused.status.code(), Some(1));
    assert!(
        stderr(&refused).contains("does not open"),
        "{}",
        stderr(&refused)
    );
    let mut tampered = bytes.clone();
    let last = tampered.len() - 1;
    tampered[last] ^= 1;
    let bad = third.path().join("tampered.mailslot");
    std::fs::write(&bad, tampered).unwrap();
    let refused = third.run(&[
        "import",
        bad.to_str().unwrap(),
        "--passphrase-file",
        pass_arg,
    ]);
    assert_eq!(refused.status.code(), Some(1));
    assert!(!third.agent_dir("alice").exists());
}
