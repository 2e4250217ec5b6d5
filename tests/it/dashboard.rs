//! `mailslot dashboard` as a process against a real relay and real agents: refused without
//! its secret, a foreign Host, a POST without the CSRF token or from another Origin, and a
//! wrong passphrase; a contacts page that waits on no slow relay one request after another;
//! that the browser is handed a private launch page, never the secret; and in Debian's
//! Chromium driven by Playwright (`tests/it/browser/`): open the launch page, approve a contact
//! request with the owner passphrase, see alice's message arrive live, read it, and find its
//! hostile HTML shown as text.

use crate::common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::{EVENT_TIMEOUT, TestRelay, link_as, output_with_input};
use mailslot::protocol::Policy;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt};

const PASSPHRASE: &str = "correct horse battery staple";
const HOSTILE_SUBJECT: &str = "<img src=x onerror=\"window.__pwned = 'subject'\">";
const HOSTILE_BODY: &str = "Hi bob,\n<script>window.__pwned = 'script'</script>\n<img src=x onerror=\"window.__pwned = 'img'\">\n</pre><b>not bold</b>";

/// Runs `mailslot ARGS` with the agents of `home`; its stdout (fails the test when it fails).
fn mailslot(home: &Path, relay: &TestRelay, args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_mailslot"))
        .args(args)
        .env_clear()
        .env("MAILSLOT_HOME", home)
        .env("MAILSLOT_RELAY", relay.url.as_str())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "mailslot {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The dashboard process, killed when dropped; its stderr goes to a file the test reads.
struct DashboardChild {
    child: Child,
    url: String,
    addr: SocketAddr,
    stderr: tempfile::NamedTempFile,
}

impl Drop for DashboardChild {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl DashboardChild {
    fn logs(&self) -> String {
        std::fs::read_to_string(self.stderr.path()).unwrap()
    }
}

/// bob (in a home with an owner key, on a relay where agents accept mail only from
/// contacts), alice (in a home of her own) who asked bob for contact, and bob's dashboard.
struct World {
    relay: TestRelay,
    bob_home: tempfile::TempDir,
    alice_home: tempfile::TempDir,
    code: String,
    dashboard: DashboardChild,
}

/// bob's mail before the dashboard starts: this many messages (see [`fill_bob`]).
const FILLED: usize = 3_000;

/// With `opener`, the dashboard opens its launch page with it (see [`fake_opener`]); with
/// `filled`, bob has [`FILLED`] messages first.
async fn world(opener: Opener<'_>, filled: bool) -> World {
    let relay = TestRelay::start(|c| c.default_policy = Some(Policy::Contacts)).await;
    let bob_home = tempfile::tempdir().unwrap();
    let alice_home = tempfile::tempdir().unwrap();
    mailslot(bob_home.path(), &relay, &["--agent", "bob", "register"]);
    mailslot(alice_home.path(), &relay, &["--agent", "alice", "register"]);
    // The owner key, made as a person makes it: the passphrase typed twice at a terminal.
    let line = format!("{} owner init", env!("CARGO_BIN_EXE_mailslot"));
    let made = output_with_input(
        Command::new("script")
            .args(["-qec", &line, "/dev/null"])
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("MAILSLOT_HOME", bob_home.path())
            .env("MAILSLOT_RELAY", relay.url.as_str()),
        &format!("{PASSPHRASE}\n{PASSPHRASE}\n"),
    );
    let shown = String::from_utf8_lossy(&made.stdout);
    assert!(
        made.status.success() && shown.contains("registered"),
        "{shown}"
    );
    let asked: serde_json::Value = serde_json::from_str(&mailslot(
        alice_home.path(),
        &relay,
        &[
            "--agent",
            "alice",
            "--json",
            "connect",
            "bob",
            "--note",
            "<b>hello</b> from alice",
        ],
    ))
    .unwrap();
    let code = asked["code"].as_str().unwrap().to_owned();
    if filled {
        fill_bob(bob_home.path());
    }
    let dashboard = start_dashboard(bob_home.path(), &relay, opener);
    World {
        relay,
        bob_home,
        alice_home,
        code,
        dashboard,
    }
}

/// How the dashboard is to open a browser.
#[derive(Clone, Copy)]
enum Opener<'a> {
    /// It does not (`--no-open`): it only prints the URL.
    Not,
    /// With this program (`MAILSLOT_BROWSER`).
    With(&'a Path),
    /// As on a desktop, with no `MAILSLOT_BROWSER` (and here no display).
    Desktop,
}

/// The word only one of bob's [`FILLED`] messages has, in its subject.
const SEARCH_WORD: &str = "kubernetes";
const SEARCH_SUBJECT: &str = "kubernetes is down";

/// Gives bob [`FILLED`] received messages from alice, all sent at the same millisecond (so
/// paging cannot lean on timestamps): the one at [`SEARCH_SUBJECT`] somewhere in the middle;
/// the newest urgent, the one before it asking to be acknowledged.
fn fill_bob(home: &Path) {
    use mailslot::protocol::{Address, Importance, Message};
    use mailslot::store::{Direction, Store, Trust};
    let dir = home.join("agents").join("bob");
    let mut store = Store::open(&mailslot::agent::store_path(&dir)).unwrap();
    let (alice, bob) = (
        Address::parse("alice").unwrap(),
        Address::parse("bob").unwrap(),
    );
    let at = jiff::Timestamp::now();
    let mail: Vec<Message> = (0..FILLED)
        .map(|i| {
            let subject = if i == FILLED / 3 {
                SEARCH_SUBJECT.to_owned()
            } else {
                format!("filler {i}")
            };
            let mut m = Message::new(
                alice.clone(),
                vec![bob.clone()],
                subject,
                format!("body {i}"),
            );
            m.sent_at = at;
            m.importance = if i == FILLED - 1 {
                Importance::Urgent
            } else {
                Importance::Normal
            };
            m.ack_required = i == FILLED - 2;
            m
        })
        .collect();
    let rows: Vec<_> = mail
        .iter()
        .map(|m| (m, Direction::In, Trust::Verified))
        .collect();
    store.insert_messages(&rows).unwrap();
}

/// The dashboard's session cookie, for the secret in its URL.
fn enter(d: &DashboardChild) -> String {
    let secret = d.url.split("token=").nth(1).unwrap();
    let entry = get(
        d.addr,
        &format!("/?token={secret}"),
        &d.addr.to_string(),
        None,
    );
    entry
        .header("set-cookie")
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_owned()
}

/// The processes whose parent is `pid` (any of its threads), with their state letter.
fn children(pid: u32) -> Vec<(u32, char)> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).unwrap();
    tasks
        .filter_map(Result::ok)
        .filter_map(|t| std::fs::read_to_string(t.path().join("children")).ok())
        .flat_map(|c| {
            c.split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect::<Vec<u32>>()
        })
        .map(|child| {
            let stat = std::fs::read_to_string(format!("/proc/{child}/stat")).unwrap_or_default();
            let state = stat
                .rsplit_once(") ")
                .and_then(|(_, rest)| rest.chars().next())
                .unwrap_or('?');
            (child, state)
        })
        .collect()
}

/// `mailslot dashboard` for `home`, opening its launch page as `opener` says.
fn start_dashboard(home: &Path, relay: &TestRelay, opener: Opener<'_>) -> DashboardChild {
    let stderr = tempfile::NamedTempFile::new().unwrap();
    let mut command = Command::new(env!("CARGO_BIN_EXE_mailslot"));
    command
        .args(["dashboard", "--listen", "127.0.0.1:0"])
        .env_clear()
        .env("MAILSLOT_HOME", home)
        .env("MAILSLOT_RELAY", relay.url.as_str())
        .env("MAILSLOT_LOG", "debug");
    match opener {
        Opener::With(opener) => command.env("MAILSLOT_BROWSER", opener),
        Opener::Not => command.arg("--no-open"),
        Opener::Desktop => &mut command,
    };
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(stderr.reopen().unwrap())
        .spawn()
        .unwrap();
    // The URL is its first line of output; a dashboard that dies first ends the read.
    let mut first = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    let url = first.trim().to_owned();
    assert!(
        url.starts_with("http://127.0.0.1:") && url.contains("/?token="),
        "the dashboard printed {url:?}; stderr: {}",
        std::fs::read_to_string(stderr.path()).unwrap()
    );
    let addr = url["http://".len()..url.find("/?").unwrap()]
        .parse()
        .unwrap();
    DashboardChild {
        child,
        url,
        addr,
        stderr,
    }
}

/// An HTTP answer: status, headers (lowercase names), body.
struct Answer {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// One HTTP/1.1 request on a fresh connection, written byte for byte (so Host and Origin can
/// be anything).
fn http(addr: SocketAddr, request: &str) -> Answer {
    let mut socket = TcpStream::connect(addr).unwrap();
    socket.set_read_timeout(Some(EVENT_TIMEOUT)).unwrap();
    socket.write_all(request.as_bytes()).unwrap();
    let mut raw = Vec::new();
    socket.read_to_end(&mut raw).unwrap();
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    let mut lines = head.lines();
    let status = lines
        .next()
        .unwrap()
        .split(' ')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_lowercase(), v.trim().to_owned()))
        .collect();
    Answer {
        status,
        headers,
        body: body.to_owned(),
    }
}

fn get(addr: SocketAddr, path: &str, host: &str, cookie: Option<&str>) -> Answer {
    let cookie = cookie
        .map(|c| format!("Cookie: {c}\r\n"))
        .unwrap_or_default();
    http(
        addr,
        &format!("GET {path} HTTP/1.1\r\nHost: {host}\r\n{cookie}Connection: close\r\n\r\n"),
    )
}

fn post(
    addr: SocketAddr,
    path: &str,
    cookie: Option<&str>,
    origin: Option<&str>,
    form: &str,
) -> Answer {
    let cookie = cookie
        .map(|c| format!("Cookie: {c}\r\n"))
        .unwrap_or_default();
    let origin = origin
        .map(|o| format!("Origin: {o}\r\n"))
        .unwrap_or_default();
    http(
        addr,
        &format!(
            "POST {path} HTTP/1.1\r\nHost: {addr}\r\n{cookie}{origin}Content-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{form}",
            form.len()
        ),
    )
}

fn bob_requests(world: &World) -> serde_json::Value {
    serde_json::from_str(&mailslot(
        world.bob_home.path(),
        &world.relay,
        &["--agent", "bob", "--json", "requests"],
    ))
    .unwrap()
}

// Multi-threaded: the test blocks on child processes while the in-process relay serves them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_refuses_requests_without_its_secret() {
    let world = world(Opener::Not, false).await;
    let d = &world.dashboard;
    let addr = d.addr;
    let host = addr.to_string();
    let secret = d.url.split("token=").nth(1).unwrap();

    let bare = get(addr, "/", &host, None);
    assert_eq!(bare.status, 401, "no secret, no page: {}", bare.body);
    assert!(!bare.body.contains("bob"), "nothing about the agents leaks");
    assert_eq!(get(addr, "/agents/bob", &host, None).status, 401);
    assert_eq!(get(addr, "/events", &host, None).status, 401);
    assert_eq!(get(addr, "/?token=wrong", &host, None).status, 403);
    let forged = format!("mailslot_dashboard_{}=wrong", addr.port());
    assert_eq!(get(addr, "/", &host, Some(&forged)).status, 401);

    // The secret becomes a cookie, and the browser is sent on to a clean URL.
    let entry = get(addr, &format!("/?token={secret}"), &host, None);
    assert_eq!(entry.status, 303);
    assert_eq!(entry.header("location"), Some("/"));
    let set = entry.header("set-cookie").unwrap();
    assert!(
        set.contains("HttpOnly") && set.contains("SameSite=Strict"),
        "{set}"
    );
    let cookie = set.split(';').next().unwrap().to_owned();
    // The cookie is not the URL's token, and the URL works once: a copy of the link that
    // leaked (the browser's command line, its history) opens nothing.
    assert!(!cookie.contains(secret), "{cookie}");
    let again = get(addr, &format!("/?token={secret}"), &host, None);
    assert_eq!(again.status, 403, "{}", again.body);
    assert!(again.body.contains("works once"), "{}", again.body);
    let home = get(addr, "/", &host, Some(&cookie));
    assert_eq!(home.status, 200);
    assert!(home.body.contains(r#"href="/agents/bob""#), "{}", home.body);
    assert!(
        home.header("content-security-policy")
            .unwrap()
            .contains("script-src 'self'"),
        "no inline script may run"
    );

    // A name that resolves to 127.0.0.1 (DNS rebinding) is not this dashboard.
    let rebound = get(
        addr,
        "/",
        &format!("evil.example:{}", addr.port()),
        Some(&cookie),
    );
    assert_eq!(rebound.status, 421);

    // The page's CSRF token, and the request's note as text.
    let contacts = get(addr, "/agents/bob/contacts", &host, Some(&cookie));
    assert_eq!(contacts.status, 200);
    assert!(
        contacts
            .body
            .contains("&lt;b&gt;hello&lt;/b&gt; from alice"),
        "the note is text: {}",
        contacts.body
    );
    let csrf = contacts
        .body
        .split(r#"name="csrf" value=""#)
        .nth(1)
        .unwrap()
        .split('"')
        .next()
        .unwrap()
        .to_owned();
    let origin = format!("http://{host}");
    // The page's one form: the button pressed names the change, the requester's row its code.
    let form = |csrf: &str, passphrase: &str| {
        format!(
            "csrf={csrf}&action=approve+alice&code.alice={}&policy=contacts&passphrase={}",
            world.code,
            passphrase.replace(' ', "+")
        )
    };
    let path = "/agents/bob/consent";
    let refused = [
        (
            post(
                addr,
                path,
                Some(&cookie),
                Some(&origin),
                &form("", PASSPHRASE),
            ),
            403,
            "no CSRF token",
        ),
        (
            post(
                addr,
                path,
                Some(&cookie),
                Some(&origin),
                &form("x", PASSPHRASE),
            ),
            403,
            "a wrong CSRF token",
        ),
        (
            post(
                addr,
                path,
                Some(&cookie),
                Some("http://evil.example"),
                &form(&csrf, PASSPHRASE),
            ),
            403,
            "a foreign Origin",
        ),
        (
            post(addr, path, Some(&cookie), None, &form(&csrf, PASSPHRASE)),
            403,
            "no Origin",
        ),
        (
            post(addr, path, None, Some(&origin), &form(&csrf, PASSPHRASE)),
            401,
            "no secret",
        ),
    ];
    for (answer, status, what) in &refused {
        assert_eq!(answer.status, *status, "{what}: {}", answer.body);
    }
    // A wrong passphrase: sent on to the contacts page (Post/Redirect/Get), which says why
    // once and offers the typed code again, never the passphrase.
    let wrong = post(
        addr,
        path,
        Some(&cookie),
        Some(&origin),
        &form(&csrf, "not the owner's passphrase"),
    );
    assert_eq!(wrong.status, 303, "{}", wrong.body);
    let then = wrong.header("location").unwrap().to_owned();
    assert!(then.starts_with("/agents/bob/contacts?flash="), "{then}");
    let shown = get(addr, &then, &host, Some(&cookie));
    assert!(
        shown.body.contains("passphrase does not unlock"),
        "{}",
        shown.body
    );
    assert!(
        shown
            .body
            .contains(&format!(r#"name="code.alice" value="{}""#, world.code)),
        "the code is kept: {}",
        shown.body
    );
    assert!(!shown.body.contains("not the owner"), "{}", shown.body);
    assert_eq!(
        shown.body.matches(r#"name="passphrase""#).count(),
        1,
        "one passphrase field on the page"
    );
    let again = get(addr, &then, &host, Some(&cookie));
    assert!(
        !again.body.contains(r#"id="notice""#),
        "a flash shows once: {}",
        again.body
    );
    let open = bob_requests(&world);
    assert_eq!(
        open["incoming"][0]["agent"], "alice",
        "nothing was approved: {open}"
    );
    // A GET cannot change consent.
    assert_eq!(
        get(
            addr,
            &format!("{path}?{}", form(&csrf, PASSPHRASE)),
            &host,
            Some(&cookie)
        )
        .status,
        405
    );

    // Everything right: approved, signed with the owner key.
    let approved = post(
        addr,
        path,
        Some(&cookie),
        Some(&origin),
        &form(&csrf, PASSPHRASE),
    );
    assert_eq!(approved.status, 303, "{}", approved.body);
    let done = get(
        addr,
        approved.header("location").unwrap(),
        &host,
        Some(&cookie),
    );
    assert!(
        done.body.contains(r#"id="notice""#) && done.body.contains("notice ok"),
        "{}",
        done.body
    );
    assert_eq!(bob_requests(&world)["incoming"], serde_json::json!([]));
    // Block goes the same way (the same signing as the CLI's), and the policy too.
    let change = |action: &str| {
        format!(
            "csrf={csrf}&action={action}&policy=open&passphrase={}",
            PASSPHRASE.replace(' ', "+")
        )
    };
    let blocked = post(
        addr,
        path,
        Some(&cookie),
        Some(&origin),
        &change("block+alice"),
    );
    assert_eq!(blocked.status, 303, "{}", blocked.body);
    let opened = post(addr, path, Some(&cookie), Some(&origin), &change("policy"));
    assert_eq!(opened.status, 303, "{}", opened.body);
    let consent: serde_json::Value = serde_json::from_str(&mailslot(
        world.bob_home.path(),
        &world.relay,
        &["--agent", "bob", "--json", "contacts"],
    ))
    .unwrap();
    assert_eq!(
        consent["blocked"],
        serde_json::json!(["alice"]),
        "{consent}"
    );
    assert_eq!(consent["policy"], "open", "{consent}");
    let logs = d.logs();
    assert!(
        !logs.contains(PASSPHRASE) && !logs.contains("not the owner") && !logs.contains(secret),
        "no secret in the logs: {logs}"
    );
}

/// A stand-in for the desktop's browser opener: it writes what it was given (its arguments,
/// the file's and its folder's modes, a copy of the file) into `out`, then `out/done`.
fn fake_opener(out: &Path) -> std::path::PathBuf {
    let script = out.join("opener");
    let o = out.display();
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\nfor a in \"$@\"; do printf '%s\\n' \"$a\"; done > {o}/argv\nf=\"${{1#file://}}\"\nstat -c %a \"$f\" > {o}/mode\nstat -c %a \"$(dirname \"$f\")\" > {o}/dir_mode\ncp \"$f\" {o}/page.html\ntouch {o}/done\n"
        ),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    script
}

/// The value of attribute `name` after `after` in `html`.
fn attribute<'a>(html: &'a str, after: &str, name: &str) -> &'a str {
    let rest = &html[html.find(after).unwrap()..];
    let start = rest.find(&format!("{name}=\"")).unwrap() + name.len() + 2;
    let end = rest[start..].find('"').unwrap();
    &rest[start..start + end]
}

// Multi-threaded: the test blocks on child processes while the in-process relay serves them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_browser_gets_a_private_launch_page_never_the_secret() {
    let relay = TestRelay::start(|_| {}).await;
    let home = tempfile::tempdir().unwrap();
    let out = tempfile::tempdir().unwrap();
    mailslot(home.path(), &relay, &["--agent", "bob", "register"]);
    let d = start_dashboard(home.path(), &relay, Opener::With(&fake_opener(out.path())));
    let secret = d.url.split("token=").nth(1).unwrap().to_owned();
    let host = d.addr.to_string();
    common::wait_until(EVENT_TIMEOUT, "the opener ran", async || {
        out.path().join("done").exists().then_some(())
    })
    .await;
    let read = |name: &str| std::fs::read_to_string(out.path().join(name)).unwrap();
    // The opener exited, and was reaped: no zombie is left behind.
    let pid = d.child.id();
    common::wait_until(EVENT_TIMEOUT, "the opener was reaped", async || {
        children(pid).is_empty().then_some(())
    })
    .await;

    // The opener's command line names a file in the home, and carries no secret.
    let argv = read("argv");
    assert!(
        !argv.contains(&secret),
        "the secret on a command line: {argv}"
    );
    let launch_dir = home.path().join("dashboard");
    let file = argv.trim().strip_prefix("file://").unwrap();
    assert_eq!(
        Path::new(file).parent(),
        Some(launch_dir.as_path()),
        "{argv}"
    );
    assert_eq!(argv.lines().count(), 1, "{argv}");
    // Only the owner can read the file, or enter its folder.
    assert_eq!(read("mode").trim(), "600");
    assert_eq!(read("dir_mode").trim(), "700");

    // What the page does, done by hand: post the secret to the form's action, from a file://
    // page (Origin: null). The answer sets the cookie and moves on to `/`.
    let page = read("page.html");
    let action = attribute(&page, "<form", "action");
    assert_eq!(action, format!("http://{host}/login"));
    let token = attribute(&page, r#"name="token""#, "value");
    assert_eq!(token, secret);
    let login = |origin: &str| {
        let form = format!("token={token}");
        http(
            d.addr,
            &format!(
                "POST /login HTTP/1.1\r\nHost: {host}\r\nOrigin: {origin}\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{form}",
                form.len()
            ),
        )
    };
    let entered = login("null");
    assert_eq!(entered.status, 200, "{}", entered.body);
    assert!(
        entered
            .body
            .contains(r#"http-equiv="refresh" content="0; url=/""#),
        "{}",
        entered.body
    );
    let set = entered.header("set-cookie").unwrap();
    assert!(
        set.contains("HttpOnly") && set.contains("SameSite=Strict"),
        "{set}"
    );
    let cookie = set.split(';').next().unwrap().to_owned();
    let home_page = get(d.addr, "/", &host, Some(&cookie));
    assert_eq!(home_page.status, 200);
    assert!(
        home_page.body.contains(r#"href="/agents/bob""#),
        "{}",
        home_page.body
    );

    // Used, the page is gone, and neither it nor the printed link opens anything again.
    common::wait_until(EVENT_TIMEOUT, "the launch page was removed", async || {
        (!Path::new(file).exists()).then_some(())
    })
    .await;
    assert_eq!(login("null").status, 403);
    assert_eq!(
        get(d.addr, &format!("/?token={secret}"), &host, None).status,
        403
    );
    assert!(!d.logs().contains(&secret), "no secret in the logs");
}

/// What a failed browser script wrote on stderr.
async fn said(stderr: &mut tokio::process::ChildStderr) -> String {
    let mut text = String::new();
    let _ = tokio::time::timeout(
        Duration::from_secs(5),
        tokio::io::AsyncReadExt::read_to_string(stderr, &mut text),
    )
    .await;
    format!("the browser script said: {text}")
}

// Multi-threaded: the test blocks on child processes while the in-process relay serves them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_in_a_real_browser() {
    let Some(tools) = common::external_tools(
        &["MAILSLOT_NODE", "MAILSLOT_PLAYWRIGHT", "MAILSLOT_CHROMIUM"],
        "MAILSLOT_REQUIRE_BROWSER",
        "browser-setup",
        "The dashboard in a browser",
    ) else {
        return;
    };
    // The browser opens the launch page, as a desktop's would.
    let out = tempfile::tempdir().unwrap();
    let world = world(Opener::With(&fake_opener(out.path())), true).await;
    common::wait_until(EVENT_TIMEOUT, "the opener ran", async || {
        out.path().join("done").exists().then_some(())
    })
    .await;
    let launch = std::fs::read_to_string(out.path().join("argv")).unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/it/browser/dashboard.mjs");
    let mut browser = tokio::process::Command::new(&tools[0]);
    browser
        .arg(&script)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", std::env::temp_dir())
        .env("MAILSLOT_PLAYWRIGHT", &tools[1])
        .env("MAILSLOT_CHROMIUM", &tools[2])
        .env("DASHBOARD_URL", launch.trim())
        .env("AGENT", "bob")
        .env("REQUESTER", "alice")
        .env("CODE", &world.code)
        .env("PASSPHRASE", PASSPHRASE)
        .env("HOSTILE_SUBJECT", HOSTILE_SUBJECT)
        .env("HOSTILE_BODY", HOSTILE_BODY)
        .env("TOTAL", FILLED.to_string())
        .env("SEARCH_WORD", SEARCH_WORD)
        .env("SEARCH_SUBJECT", SEARCH_SUBJECT)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    if let Some(path) = std::env::var_os("MAILSLOT_DASHBOARD_SCREENSHOT") {
        browser.env("SCREENSHOT", path);
    }
    let mut child = browser.spawn().unwrap();
    let mut input = child.stdin.take().unwrap();
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let mut stderr = child.stderr.take().unwrap();
    // The first answer comes after Chromium starts and reads every page of bob's mail.
    let mut next_line = async |within: Duration| {
        tokio::time::timeout(within, lines.next_line())
            .await
            .ok()
            .and_then(Result::ok)
            .flatten()
    };

    // Approved, paged, searched: and with only the dashboard holding bob's connection, alice
    // (a contact now) does not see bob online.
    match next_line(EVENT_TIMEOUT * 6).await.as_deref() {
        Some("alone") => {}
        other => panic!("expected alone, got {other:?}: {}", said(&mut stderr).await),
    }
    assert!(
        !alice_sees_bob(&world.relay, world.alice_home.path()),
        "the dashboard made bob look online"
    );
    // A real session of bob's: online, and the dashboard makes way.
    let session = common::mcp::spawn_mcp(
        world.bob_home.path(),
        "bob",
        &world.relay.url,
        common::mcp::Era::Legacy,
    )
    .await;
    common::wait_until(EVENT_TIMEOUT, "alice sees bob online", async || {
        alice_sees_bob(&world.relay, world.alice_home.path()).then_some(())
    })
    .await;
    input.write_all(b"session\n").await.unwrap();
    input.flush().await.unwrap();

    // The page is open, live: alice's mail (accepted since the approval) goes to bob's
    // session, which stores it; the dashboard reads it from the store.
    match next_line(EVENT_TIMEOUT * 2).await.as_deref() {
        Some("ready") => {}
        other => panic!("expected ready, got {other:?}: {}", said(&mut stderr).await),
    }
    let sent = mailslot(
        world.alice_home.path(),
        &world.relay,
        &[
            "--agent",
            "alice",
            "send",
            "--to",
            "bob",
            "--subject",
            HOSTILE_SUBJECT,
            "--body",
            HOSTILE_BODY,
            "--importance",
            "urgent",
            "--ack-required",
        ],
    );
    assert!(sent.contains("accepted"), "approved, so accepted: {sent}");
    input.write_all(b"sent\n").await.unwrap();
    input.flush().await.unwrap();
    match next_line(EVENT_TIMEOUT * 2).await.as_deref() {
        Some("done") => {}
        other => panic!("expected done, got {other:?}: {}", said(&mut stderr).await),
    }
    drop(input);
    let status = tokio::time::timeout(EVENT_TIMEOUT, child.wait())
        .await
        .expect("the browser script exits")
        .unwrap();
    assert!(status.success(), "{status}");
    // Read in the page, still unread for the agent.
    let unread = mailslot(
        world.bob_home.path(),
        &world.relay,
        &["--agent", "bob", "inbox"],
    );
    assert!(unread.contains("alice"), "{unread}");
    let consent: serde_json::Value = serde_json::from_str(&mailslot(
        world.bob_home.path(),
        &world.relay,
        &["--agent", "bob", "--json", "contacts"],
    ))
    .unwrap();
    assert_eq!(consent["policy"], "open", "set in the page: {consent}");
    drop(session);
}

// Multi-threaded: the test blocks on child processes while the in-process relay serves them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_contacts_page_looks_up_requesters_keys_together_within_a_deadline() {
    use futures_util::{SinkExt, StreamExt};
    use mailslot::protocol::{Address, LinkAnswer, LinkRequest, RequestCode};
    use tokio_tungstenite::tungstenite::Message as Ws;

    let world = world(Opener::Not, false).await;
    // Six agents of relay C ask bob, over C's link to bob's relay.
    let c = TestRelay::start(|_| {}).await;
    let mut ws = link_as(&c, &world.relay).await;
    for i in 0..6u8 {
        let request = LinkRequest::Connect {
            from: Address::parse(&format!("u{i}@{}", c.relay.name())).unwrap(),
            to: Address::parse(&format!("bob@{}", world.relay.relay.name())).unwrap(),
            note: format!("request {i}"),
            code: RequestCode::from_random([i, 1, 2, 3, 4]),
            expires_at: jiff::Timestamp::now() + jiff::SignedDuration::from_secs(600),
        };
        ws.send(Ws::text(serde_json::to_string(&request).unwrap()))
            .await
            .unwrap();
        let Some(Ok(Ws::Text(answer))) = ws.next().await else {
            panic!("no answer")
        };
        assert_eq!(
            serde_json::from_str::<LinkAnswer>(&answer).unwrap(),
            LinkAnswer::Done {}
        );
    }
    ws.close(None).await.unwrap();
    // Then C stops, and what listens at its address never answers.
    let c_addr = c.relay.addr();
    c.relay.shutdown().await;
    let tarpit = tokio::net::TcpListener::bind(c_addr).await.unwrap();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = tarpit.accept().await {
            held.push(socket);
        }
    });

    let d = &world.dashboard;
    let (addr, host) = (d.addr, d.addr.to_string());
    let secret = d.url.split("token=").nth(1).unwrap().to_owned();
    let page = tokio::task::spawn_blocking(move || {
        let entry = get(addr, &format!("/?token={secret}"), &host, None);
        let cookie = entry
            .header("set-cookie")
            .unwrap()
            .split(';')
            .next()
            .unwrap()
            .to_owned();
        let started = std::time::Instant::now();
        let page = get(addr, "/agents/bob/contacts", &host, Some(&cookie));
        (page, started.elapsed())
    })
    .await
    .unwrap();
    let (page, took) = page;
    assert_eq!(page.status, 200, "{}", page.body);
    assert!(
        took < std::time::Duration::from_secs(8),
        "the page took {took:?} with six requesters' relay silent"
    );
    assert!(page.body.contains(&format!("u5@{c_addr}")), "{}", page.body);
    assert!(page.body.contains("not known yet"), "{}", page.body);
}

// Multi-threaded: the test blocks on child processes while the in-process relay serves them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_display_or_a_working_opener_it_says_to_open_the_url_yourself() {
    let relay = TestRelay::start(|_| {}).await;
    let home = tempfile::tempdir().unwrap();
    mailslot(home.path(), &relay, &["--agent", "bob", "register"]);
    let said = async |d: &DashboardChild, what: &str| {
        let yourself = format!(
            "open the URL above (http://{}/?token=…) in your browser",
            d.addr
        );
        common::wait_until(EVENT_TIMEOUT, what, async || {
            let logs = d.logs();
            logs.contains(&yourself).then_some(logs)
        })
        .await
    };

    // No DISPLAY, no WAYLAND_DISPLAY (the environment is cleared), no MAILSLOT_BROWSER: no
    // opener is started at all.
    let bare = start_dashboard(home.path(), &relay, Opener::Desktop);
    let logs = said(&bare, "the dashboard said there is no display").await;
    assert!(logs.contains("no display here"), "{logs}");
    assert!(children(bare.child.id()).is_empty(), "nothing was started");
    let secret = bare.url.split("token=").nth(1).unwrap();
    assert!(!logs.contains(secret), "the secret stays on stdout: {logs}");
    drop(bare);

    // An opener that fails: said, and reaped.
    let failing = start_dashboard(home.path(), &relay, Opener::With(Path::new("/bin/false")));
    let logs = said(&failing, "the dashboard said the opener failed").await;
    assert!(
        logs.contains("/bin/false could not open a browser"),
        "{logs}"
    );
    assert!(
        children(failing.child.id()).is_empty(),
        "the opener was reaped"
    );
}

/// What alice sees of bob's presence: whether he is online.
fn alice_sees_bob(relay: &TestRelay, alice_home: &Path) -> bool {
    let online: serde_json::Value = serde_json::from_str(&mailslot(
        alice_home,
        relay,
        &["--agent", "alice", "--json", "presence", "bob"],
    ))
    .unwrap();
    online
        .as_array()
        .unwrap()
        .iter()
        .any(|o| o["agent"] == "bob")
}

// Multi-threaded: the test blocks on child processes while the in-process relay serves them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_is_no_session_of_its_agents_and_makes_way_for_one() {
    let relay = TestRelay::start(|_| {}).await;
    let (bob_home, alice_home) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    mailslot(bob_home.path(), &relay, &["--agent", "bob", "register"]);
    // Listed, so alice may see whether bob is online.
    mailslot(
        bob_home.path(),
        &relay,
        &["--agent", "bob", "directory", "--join", "bob's desk"],
    );
    mailslot(alice_home.path(), &relay, &["--agent", "alice", "register"]);
    let d = start_dashboard(bob_home.path(), &relay, Opener::Not);
    let cookie = enter(&d);
    let (addr, host) = (d.addr, d.addr.to_string());
    let bob_row = move || {
        let page = get(addr, "/", &host, Some(&cookie)).body;
        let row = page
            .split(r#"href="/agents/bob""#)
            .nth(1)
            .unwrap_or_default();
        row[..row.find("</tr>").unwrap_or(row.len())].to_owned()
    };

    // The dashboard holds bob's delivery connection, and alice does not see bob online.
    common::wait_until(
        EVENT_TIMEOUT,
        "the dashboard holds bob's connection",
        async || bob_row().contains("connected to the relay").then_some(()),
    )
    .await;
    assert!(
        !alice_sees_bob(&relay, alice_home.path()),
        "the dashboard made bob look online"
    );

    // A real session of bob: the dashboard makes way, and bob is online.
    let mcp =
        common::mcp::spawn_mcp(bob_home.path(), "bob", &relay.url, common::mcp::Era::Legacy).await;
    common::wait_until(EVENT_TIMEOUT, "alice sees bob online", async || {
        alice_sees_bob(&relay, alice_home.path()).then_some(())
    })
    .await;
    let row = bob_row();
    assert!(row.contains("another mailslot process"), "{row}");

    // The session ends: the dashboard takes the connection back, hidden again.
    drop(mcp);
    common::wait_until(
        EVENT_TIMEOUT,
        "the dashboard holds bob's connection again",
        async || bob_row().contains("connected to the relay").then_some(()),
    )
    .await;
    common::wait_until(EVENT_TIMEOUT, "alice no longer sees bob", async || {
        (!alice_sees_bob(&relay, alice_home.path())).then_some(())
    })
    .await;
}

/// The owner writes to bob from bob's inbox page: the form's passphrase unlocks the owner key,
/// the message is stored signed (Post/Redirect/Get), and every view shows it as the owner's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_owner_writes_to_the_agent_from_its_page() {
    let world = world(Opener::Not, false).await;
    let d = &world.dashboard;
    let (addr, host) = (d.addr, d.addr.to_string());
    let cookie = enter(d);
    let origin = format!("http://{host}");
    let inbox = get(addr, "/agents/bob", &host, Some(&cookie));
    assert_eq!(inbox.status, 200);
    assert!(
        inbox.body.contains(r#"action="/agents/bob/tell""#),
        "{}",
        inbox.body
    );
    let csrf = inbox
        .body
        .split(r#"name="csrf" value=""#)
        .nth(1)
        .unwrap()
        .split('"')
        .next()
        .unwrap()
        .to_owned();
    let form = |csrf: &str, passphrase: &str| {
        format!(
            "csrf={csrf}&subject=Deploy&body=Stop+the+deploy.%0D%0A%3Cscript%3Ex%3C%2Fscript%3E&passphrase={}",
            passphrase.replace(' ', "+")
        )
    };
    let path = "/agents/bob/tell";
    let owner_mail = || -> Vec<serde_json::Value> {
        let listed: serde_json::Value = serde_json::from_str(&mailslot(
            world.bob_home.path(),
            &world.relay,
            &["--agent", "bob", "--json", "inbox", "--all"],
        ))
        .unwrap();
        listed.as_array().unwrap().clone()
    };
    assert_eq!(
        post(
            addr,
            path,
            Some(&cookie),
            Some(&origin),
            &form("x", PASSPHRASE)
        )
        .status,
        403,
        "a wrong CSRF token"
    );
    assert_eq!(
        post(
            addr,
            path,
            Some(&cookie),
            Some("http://evil.example"),
            &form(&csrf, PASSPHRASE)
        )
        .status,
        403,
        "a foreign Origin"
    );
    assert_eq!(
        get(
            addr,
            &format!("{path}?{}", form(&csrf, PASSPHRASE)),
            &host,
            Some(&cookie)
        )
        .status,
        405,
        "a GET changes nothing"
    );
    let wrong = post(
        addr,
        path,
        Some(&cookie),
        Some(&origin),
        &form(&csrf, "not the owner's passphrase"),
    );
    assert_eq!(wrong.status, 303, "{}", wrong.body);
    let then = wrong.header("location").unwrap().to_owned();
    assert!(then.starts_with("/agents/bob?flash="), "{then}");
    let shown = get(addr, &then, &host, Some(&cookie));
    assert!(
        shown.body.contains("passphrase does not unlock") && shown.body.contains("notice danger"),
        "{}",
        shown.body
    );
    assert!(owner_mail().is_empty(), "nothing was told");

    let told = post(
        addr,
        path,
        Some(&cookie),
        Some(&origin),
        &form(&csrf, PASSPHRASE),
    );
    assert_eq!(told.status, 303, "{}", told.body);
    let done = get(addr, told.header("location").unwrap(), &host, Some(&cookie));
    assert!(
        done.body.contains("notice ok") && done.body.contains("Told bob"),
        "{}",
        done.body
    );
    assert!(done.body.contains("from you, the owner"), "{}", done.body);
    let listed = owner_mail();
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0]["trust"], "owner", "{listed:?}");
    assert_eq!(listed[0]["subject"], "Deploy");
    let id = listed[0]["id"].as_str().unwrap();
    let read: serde_json::Value = serde_json::from_str(&mailslot(
        world.bob_home.path(),
        &world.relay,
        &["--agent", "bob", "--json", "read", id],
    ))
    .unwrap();
    assert_eq!(
        read["message"]["body"],
        "Stop the deploy.\n<script>x</script>"
    );
    let page = get(
        addr,
        &format!("/agents/bob/messages/{id}"),
        &host,
        Some(&cookie),
    );
    assert!(
        page.body.contains("you, the owner")
            && page.body.contains("Owner key")
            && page.body.contains("&lt;script&gt;x&lt;/script&gt;")
            && !page.body.contains("another agent's words"),
        "{}",
        page.body
    );
    let logs = d.logs();
    assert!(
        !logs.contains(PASSPHRASE) && !logs.contains("not the owner"),
        "no passphrase in the logs: {logs}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_owner_sees_the_agents_groups_and_joins_one_its_model_asked_for() {
    let world = world(Opener::Not, false).await;
    let (bob, relay) = (world.bob_home.path(), &world.relay);
    mailslot(bob, relay, &["--agent", "bob", "groups", "create", "crew"]);
    // bob's model asked to join (the `join_group` tool records only this wish).
    {
        let dir = bob.join("agents").join("bob");
        let store = mailslot::store::Store::open(&mailslot::agent::store_path(&dir)).unwrap();
        store
            .mark_group(
                &mailslot::protocol::Address::parse("crew").unwrap(),
                mailslot::store::Membership::Wished,
            )
            .unwrap();
    }
    let d = &world.dashboard;
    let (addr, host) = (d.addr, d.addr.to_string());
    let cookie = enter(d);
    let page = get(addr, "/agents/bob/contacts", &host, Some(&cookie));
    assert_eq!(page.status, 200);
    assert!(
        page.body.contains(r#"data-wished="crew""#)
            && page.body.contains(r#"value="join crew""#)
            && page.body.contains(r#"data-group="crew""#)
            && page.body.contains("Posting: members"),
        "{}",
        page.body
    );
    let csrf = page
        .body
        .split(r#"name="csrf" value=""#)
        .nth(1)
        .unwrap()
        .split('"')
        .next()
        .unwrap()
        .to_owned();
    let joined = || -> bool {
        let listed: serde_json::Value = serde_json::from_str(&mailslot(
            bob,
            relay,
            &["--agent", "bob", "--json", "groups"],
        ))
        .unwrap();
        let state = listed["marks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["group"] == "crew")
            .map(|m| m["state"].clone());
        state == Some(serde_json::json!("joined"))
    };
    assert!(!joined(), "not joined before the owner's signature");
    let form = |passphrase: &str| {
        format!(
            "csrf={csrf}&action=join+crew&policy=contacts&passphrase={}",
            passphrase.replace(' ', "+")
        )
    };
    let origin = format!("http://{host}");
    let path = "/agents/bob/consent";
    let wrong = post(
        addr,
        path,
        Some(&cookie),
        Some(&origin),
        &form("not the owner's passphrase"),
    );
    assert_eq!(wrong.status, 303, "{}", wrong.body);
    assert!(!joined(), "a wrong passphrase joins nothing");
    let done = post(addr, path, Some(&cookie), Some(&origin), &form(PASSPHRASE));
    assert_eq!(done.status, 303, "{}", done.body);
    let shown = get(addr, done.header("location").unwrap(), &host, Some(&cookie));
    assert!(
        shown.body.contains("notice ok") && shown.body.contains(r#"class="joined">crew"#),
        "{}",
        shown.body
    );
    assert!(joined(), "the store records the join, so crew's mail opens");
    let contacts: serde_json::Value = serde_json::from_str(&mailslot(
        bob,
        relay,
        &["--agent", "bob", "--json", "contacts"],
    ))
    .unwrap();
    assert!(
        contacts.to_string().contains("\"crew\""),
        "the relay holds bob's consent to crew: {contacts}"
    );
}
