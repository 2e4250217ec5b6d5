//! The owner CLI, run as a real process against a temporary MAILSLOT_HOME.

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use mailslot::protocol::{Address, AgentName, Attachment, Message};
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
        stderr(&again).contains("no memory id starts or ends with"),
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
fn bench_relay_calls_a_paced_first_run_paced_and_gives_figures_their_units() {
    let home = Home::new();
    let rows = home.json(&[
        "bench",
        "relay",
        "--agents",
        "4",
        "--messages",
        "40",
        "--rate",
        "400",
    ]);
    let cases = cases(&rows);
    assert!(
        cases
            .iter()
            .any(|c| c.starts_with("send→delivered, paced at 400/s (4 agents")),
        "{cases:?}"
    );
    assert!(!cases.iter().any(|c| c.contains("flat out")), "{cases:?}");
    let cpu = rows
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["case"] == "paced at 400/s: relay CPU per message, all of 1 node on SQLite")
        .unwrap_or_else(|| panic!("no relay CPU figure: {cases:?}"));
    assert_eq!(cpu["figure"]["unit"], "µs", "{cpu}");
    assert!(cpu["figure"]["value"].as_f64().unwrap() > 0.0, "{cpu}");
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
    has("flat out: federated delivered+acked/s, share of one relay's, median of 2".to_owned());
    has("paced at 400/s: federated delivered+acked/s, share of one relay's".to_owned());
    // A share is reported as a share, never in the rate column.
    for row in rows.as_array().unwrap() {
        if row["case"]
            .as_str()
            .unwrap()
            .contains("share of one relay's")
        {
            assert_eq!(row["figure"]["unit"], "%", "{row}");
            assert_eq!(row["ops_per_sec"], 0.0, "{row}");
        }
    }
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

/// `ARGS` run with `input` on stdin (written whole, or until the command stops reading).
fn with_stdin(home: &Home, args: &[&str], input: &[u8]) -> Output {
    let mut child = home
        .command(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let _ = child.stdin.take().unwrap().write_all(input);
    child.wait_with_output().unwrap()
}

/// How many times `what` occurs in `text`.
fn times(text: &str, what: &str) -> usize {
    text.matches(what).count()
}

#[test]
fn read_save_makes_the_folder_and_a_failed_save_leaves_the_message_unread() {
    let home = Home::new();
    home.ok(&["--agent", "bob", "init"]);
    let mut store = Store::open(&home.agent_dir("bob").join("store.db")).unwrap();
    let address = |n: &str| Address::local(AgentName::new(n).unwrap());
    let mut with_file = |name: &str| {
        let mut m = Message::new(
            address("alice"),
            vec![address("bob")],
            "logs",
            "see attached",
        );
        m.attachments = vec![Attachment::new(name, "text/plain", b"line 1\n".to_vec())];
        store
            .insert_message(&m, Direction::In, Trust::Verified)
            .unwrap();
        m.id.to_string()
    };
    let (first, second, third) = (
        with_file("notes.txt"),
        with_file("notes.txt"),
        with_file("other.txt"),
    );
    drop(store);

    // A folder that does not exist yet is made.
    let saved = home.run(&["--agent", "bob", "read", &first, "--save", "./inbox-files"]);
    assert!(saved.status.success(), "{}", stderr(&saved));
    assert_eq!(
        std::fs::read(home.path().join("inbox-files/notes.txt")).unwrap(),
        b"line 1\n"
    );
    assert!(stderr(&saved).contains("saved "), "{}", stderr(&saved));

    let still_unread = |id: &str| {
        home.json(&["--agent", "bob", "inbox"])
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m["id"] == id)
    };
    assert!(!still_unread(&first), "a saved message is read");

    // The file is there already: refused, said once, and the message stays unread.
    let taken = home.run(&["--agent", "bob", "read", &second, "--save", "./inbox-files"]);
    assert_eq!(taken.status.code(), Some(1));
    assert!(
        stderr(&taken).contains("notes.txt exists, and a saved attachment never replaces a file"),
        "{}",
        stderr(&taken)
    );
    assert!(still_unread(&second), "a failed save marks nothing read");

    // A folder that cannot be made (a file is in its way): the OS's words once, unread.
    std::fs::write(home.path().join("a-file"), "x").unwrap();
    let blocked = home.run(&["--agent", "bob", "read", &third, "--save", "./a-file/sub"]);
    assert_eq!(blocked.status.code(), Some(1));
    let said = stderr(&blocked);
    assert!(
        said.contains("--save ./a-file/sub: cannot make the folder")
            && times(&said, "os error") == 1,
        "{said}"
    );
    assert!(still_unread(&third), "a failed save marks nothing read");
}

#[test]
fn forget_takes_the_short_ids_read_takes() {
    let home = Home::new();
    home.ok(&["--agent", "bob", "init"]);
    let first = home.json(&["--agent", "bob", "remember", "the relay listens on 7878"]);
    let first = first["id"].as_str().unwrap().to_owned();
    home.ok(&["--agent", "bob", "remember", "standup is at nine"]);
    // Two memories made in the same minute share their first characters: too little to say.
    let both = home.run(&["--agent", "bob", "forget", &first[..6]]);
    assert_eq!(both.status.code(), Some(1));
    assert!(
        stderr(&both).contains("matches several memories"),
        "{}",
        stderr(&both)
    );
    // Its last characters name it, as they name a message for `read`.
    let gone = home.ok(&["--agent", "bob", "forget", &first[first.len() - 6..]]);
    assert_eq!(gone.trim(), format!("forgot {first}"));
    let left = home.json(&["--agent", "bob", "recall"]);
    assert_eq!(left.as_array().unwrap().len(), 1, "{left}");
    let none = home.run(&["--agent", "bob", "forget", &first[first.len() - 6..]]);
    assert_eq!(none.status.code(), Some(1));
    assert!(
        stderr(&none).contains("no memory id starts or ends with")
            && stderr(&none).contains("`mailslot --agent bob recall` lists them"),
        "{}",
        stderr(&none)
    );
    let bad = home.run(&["--agent", "bob", "forget", "xyz!"]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(
        stderr(&bad).contains("is not part of a memory id"),
        "{}",
        stderr(&bad)
    );
}

#[test]
fn an_empty_body_is_refused_and_a_huge_one_is_measured_and_nothing_is_queued() {
    let home = Home::new();
    home.ok(&["--agent", "alice", "init"]);
    let send = ["--agent", "alice", "send", "--to", "bob", "--subject", "s"];
    let nothing_queued = || {
        assert_eq!(
            home.json(&["--agent", "alice", "sent"]),
            serde_json::json!([]),
            "nothing was queued"
        );
    };

    let null = home.run(&[&send[..], &["--body-file", "/dev/null"]].concat());
    assert_eq!(null.status.code(), Some(1));
    assert!(
        stderr(&null).contains("body: --body-file /dev/null is empty")
            && stderr(&null).contains("--body TEXT"),
        "{}",
        stderr(&null)
    );
    // An empty pipe (stdin is not a terminal here): the same.
    let empty = with_stdin(&home, &send, b"\n");
    assert_eq!(empty.status.code(), Some(1));
    assert!(
        stderr(&empty).contains("body: the body on stdin is empty"),
        "{}",
        stderr(&empty)
    );
    nothing_queued();

    // 13 MB on stdin: its real size, and no advice no attachment could follow.
    let huge = with_stdin(&home, &send, &vec![b'x'; 13_000_000]);
    assert_eq!(huge.status.code(), Some(1));
    let said = stderr(&huge);
    assert!(
        said.contains("13000000 bytes (12.4 MiB)")
            && said.contains("65536 bytes (64 KiB)")
            && said.contains("8 MiB")
            && !said.contains("--attach")
            && !said.contains("in parts"),
        "{said}"
    );
    // 100 kB in a file: too large for a body, and an attachment takes it.
    let file = home.path().join("long.txt");
    std::fs::write(&file, vec![b'x'; 100_000]).unwrap();
    let long = home.run(&[&send[..], &["--body-file", file.to_str().unwrap()]].concat());
    assert_eq!(long.status.code(), Some(1));
    assert!(
        stderr(&long).contains("100000 bytes")
            && stderr(&long).contains(&format!("--attach {}", file.display())),
        "{}",
        stderr(&long)
    );
    nothing_queued();
}

#[test]
fn read_inbox_and_thread_say_what_was_verified_in_words() {
    let home = Home::new();
    home.ok(&["--agent", "bob", "init"]);
    let verified = home.deliver("bob", "alice", "hello", "from the real alice");
    let mut store = Store::open(&home.agent_dir("bob").join("store.db")).unwrap();
    let address = |n: &str| Address::local(AgentName::new(n).unwrap());
    let changed = Message::new(
        address("alice"),
        vec![address("bob")],
        "trust me",
        "new keys",
    );
    store
        .insert_message(&changed, Direction::In, Trust::KeyChanged)
        .unwrap();
    drop(store);
    let (verified, changed) = (verified.id.to_string(), changed.id.to_string());
    let mut shown = home.ok(&["--agent", "bob", "inbox"]);
    assert!(shown.contains("[KEY CHANGED]"), "{shown}");
    let read_verified = home.ok(&["--agent", "bob", "read", &verified]);
    assert!(
        read_verified.contains("Signature: verified (signed with the key pinned for alice)"),
        "{read_verified}"
    );
    let read_changed = home.ok(&["--agent", "bob", "read", &changed]);
    assert!(
        read_changed.contains("Signature: WARNING: signed with a key that differs"),
        "{read_changed}"
    );
    shown += &read_verified;
    shown += &read_changed;
    shown += &home.ok(&["--agent", "bob", "thread", &verified]);
    shown += &home.ok(&["--agent", "bob", "inbox", "--all"]);
    for debug in ["KeyChanged", "Verified", "Unverified", "(Own)"] {
        assert!(!shown.contains(debug), "{debug} in:\n{shown}");
    }
}

/// `ARGS --json`, then `ARGS --before LAST --json` while a page names more, each page's
/// ids in order, with the command each text page printed for the next.
fn every_page(home: &Home, args: &[&str]) -> (Vec<String>, Vec<String>) {
    let (mut ids, mut hints) = (Vec::new(), Vec::new());
    let mut before: Option<String> = None;
    loop {
        let mut page_args = args.to_vec();
        if let Some(b) = &before {
            page_args.extend(["--before", b]);
        }
        let text = home.ok(&page_args);
        let page = home.json(&page_args);
        let page: Vec<String> = page
            .as_array()
            .unwrap()
            .iter()
            .map(|m| {
                m["id"]
                    .as_str()
                    .or(m["memory"]["id"].as_str())
                    .unwrap()
                    .to_owned()
            })
            .collect();
        let Some(next) = text.lines().last().and_then(|l| l.split_once("more: `")) else {
            ids.extend(page);
            return (ids, hints);
        };
        let hint = next.1.trim_end_matches('`').to_owned();
        assert!(
            hint.ends_with(&format!("--before {}", page.last().unwrap())),
            "the next page starts after this one's last: {hint}"
        );
        hints.push(format!("{}  {hint}", next.0.trim_end()));
        before = page.last().cloned();
        ids.extend(page);
    }
}

#[test]
fn long_listings_come_in_pages_that_continue_exactly_where_the_last_stopped() {
    let home = Home::new();
    home.ok(&["--agent", "bob", "init"]);
    let mut store = Store::open(&home.agent_dir("bob").join("store.db")).unwrap();
    let address = |n: &str| Address::local(AgentName::new(n).unwrap());
    // 2,500 received and 1,200 sent, every one sent at the same millisecond: order and pages
    // cannot lean on timestamps.
    let at = jiff::Timestamp::from_millisecond(1_790_000_000_000).unwrap();
    let mail = |n: usize, from: &str, to: &str| {
        (0..n)
            .map(|i| {
                let mut m = Message::new(address(from), vec![address(to)], format!("m{i}"), "b");
                m.sent_at = at;
                m
            })
            .collect::<Vec<_>>()
    };
    let received = mail(2500, "alice", "bob");
    let sent = mail(1200, "bob", "alice");
    let batch: Vec<_> = received
        .iter()
        .map(|m| (m, Direction::In, Trust::Verified))
        .chain(sent.iter().map(|m| (m, Direction::Out, Trust::Own)))
        .collect();
    store.insert_messages(&batch).unwrap();
    // Some read ones, spread out, for the unread-first order of --all.
    let read: Vec<_> = received.iter().step_by(7).map(|m| m.id).collect();
    store.mark_read(&address("bob"), &read).unwrap();
    let memories: Vec<_> = (0..23)
        .map(|i| mailslot::store::MemoryDraft {
            text: format!("note {i}"),
            title: None,
            tags: Vec::new(),
            at,
        })
        .collect();
    let memories = store.remember_all(&memories).unwrap();
    drop(store);
    let newest_first = |ms: &[Message], keep: &dyn Fn(&Message) -> bool| {
        ms.iter()
            .rev()
            .filter(|m| keep(m))
            .map(|m| m.id.to_string())
            .collect::<Vec<_>>()
    };
    let is_read = |m: &Message| read.contains(&m.id);

    // The unread: 2,143 in three pages of up to 1,000, newest first.
    let (ids, hints) = every_page(&home, &["--agent", "bob", "inbox", "--limit", "1000"]);
    assert_eq!(ids, newest_first(&received, &|m| !is_read(m)));
    assert_eq!(hints.len(), 2, "{hints:?}");
    assert!(
        hints[0].starts_with(
            "1000 of 2142 unread shown; 1142  mailslot --agent bob inbox --limit 1000 --before "
        ),
        "{hints:?}"
    );
    // Everything, read or not, newest first; reading the message a page ended on moves
    // nothing: the next page is the same.
    let all = newest_first(&received, &|_| true);
    let (ids, _) = every_page(
        &home,
        &["--agent", "bob", "inbox", "--all", "--limit", "700"],
    );
    assert_eq!(ids, all);
    let page = |before: &str| home.json(&["--agent", "bob", "inbox", "--all", "--before", before]);
    let next = page(&all[699]);
    home.ok(&["--agent", "bob", "read", &all[699]]);
    assert_eq!(page(&all[699]), next);
    // Sent mail, and memories written in one millisecond.
    let (ids, _) = every_page(&home, &["--agent", "bob", "sent", "--limit", "1000"]);
    assert_eq!(ids, newest_first(&sent, &|_| true));
    let (ids, hints) = every_page(&home, &["--agent", "bob", "recall", "--limit", "5"]);
    let newest: Vec<String> = memories.iter().rev().map(|m| m.id.to_string()).collect();
    assert_eq!(ids, newest);
    assert_eq!(hints.len(), 4, "{hints:?}");
    // Ranked listings are not paged, and say when more may match.
    assert!(
        home.ok(&["--agent", "bob", "search", "b", "--limit", "5"])
            .contains(
                "the best 5 matches; more may match: add words to narrow it, or raise --limit"
            )
    );
    assert!(
        home.ok(&["--agent", "bob", "recall", "note", "--limit", "5"])
            .contains("the best 5 matches; more may match")
    );
    // A page past the end says so.
    let last = &all[all.len() - 1];
    assert!(
        home.ok(&["--agent", "bob", "inbox", "--all", "--before", last])
            .contains(&format!("no more messages after {last}"))
    );
}
