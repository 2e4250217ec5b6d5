//! The fixtures every module shares: a relay on an ephemeral loopback port, with named agents
//! in one call ([`TestRelay::with_agents`]), agents in temp homes, raw WebSocket access for
//! crafting bad frames, the real binary as a process, and the outside clients CI installs
//! ([`external_tools`]). Those that start something (a relay, an agent, a relay process, an
//! outside client) first take the test's module's turn ([`turns`]). PostgreSQL, `mailslot mcp`,
//! relay processes, consent and the model API mocks have modules of their own.

pub mod consent;
pub mod mcp;
pub mod model_api;
pub mod postgres;
pub mod relay_process;
mod turns;

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use mailslot::agent::Agent;
use mailslot::client::{Connection, RelayUrl, SyncReport};
use mailslot::config::Paths;
use mailslot::crypto::{Identity, Owner};
use mailslot::protocol::{Address, AgentName, ClientFrame, Message, OwnerAct, ServerFrame};
use mailslot::relay::{Relay, RelayConfig};
use mailslot::store::StoreHandle;
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message as WsMessage;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

/// How long any test waits for an expected event before failing.
pub const EVENT_TIMEOUT: Duration = Duration::from_secs(20);

/// The in-process relays' logs on stderr when `MAILSLOT_TEST_LOG` holds a filter (like
/// `mailslot=debug`); silent otherwise. For diagnosing a test that fails only sometimes.
pub fn logs() {
    if let Ok(filter) = std::env::var("MAILSLOT_TEST_LOG") {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .with_writer(std::io::stderr)
            .try_init();
    }
}

/// A relay on 127.0.0.1 with a temporary database.
pub struct TestRelay {
    pub relay: Relay,
    pub url: RelayUrl,
    config: RelayConfig,
    _dir: tempfile::TempDir,
}

/// A relay that was stopped; it starts again on the same address and database.
pub struct StoppedRelay {
    config: RelayConfig,
    dir: tempfile::TempDir,
}

impl StoppedRelay {
    /// The relay's database file.
    pub fn db(&self) -> std::path::PathBuf {
        self.config
            .db
            .clone()
            .expect("test relays have a database file")
    }

    /// Starts it again on the same address and database under a new key, as its operator
    /// would after losing the key file: the key the database recorded is removed too, or the
    /// relay refuses the new one.
    pub async fn restart_with_a_new_key(self) -> TestRelay {
        let db = self.db();
        std::fs::remove_file(mailslot::relay::identity_beside(&db)).unwrap();
        rusqlite::Connection::open(&db)
            .unwrap()
            .execute("DELETE FROM meta WHERE key = 'relay_key'", [])
            .unwrap();
        self.restart().await
    }

    pub async fn restart(self) -> TestRelay {
        self.restart_with(|_| {}).await
    }

    /// Starts it again on the same address and database with its config changed by `tweak`
    /// (a shorter TTL, say, for what it takes from now on).
    pub async fn restart_with(mut self, tweak: impl FnOnce(&mut RelayConfig)) -> TestRelay {
        tweak(&mut self.config);
        let relay = Relay::start(self.config.clone()).await.unwrap();
        TestRelay {
            url: relay.url().parse().unwrap(),
            relay,
            config: self.config,
            _dir: self.dir,
        }
    }
}

impl TestRelay {
    pub async fn start(tweak: impl FnOnce(&mut RelayConfig)) -> Self {
        turns::take();
        logs();
        let dir = tempfile::tempdir().unwrap();
        let mut config = RelayConfig {
            listen: "127.0.0.1:0".parse().unwrap(),
            db: Some(dir.path().join("relay.db")),
            // Test federations run on loopback, which a relay reaches only when allowed.
            allow_private_relays: true,
            ..RelayConfig::default()
        };
        tweak(&mut config);
        // Nodes on PostgreSQL keep no files beside a database, so their key file is named: one
        // per database, as every node of one relay shares it.
        let postgres = config
            .db
            .as_ref()
            .and_then(|d| d.to_str())
            .filter(|d| d.starts_with("postgres"));
        if let Some(url) = postgres
            && config.identity.is_none()
        {
            config.identity = Some(postgres::node_key(url));
        }
        let relay = Relay::start(config.clone()).await.unwrap();
        let url = relay.url().parse().unwrap();
        Self {
            relay,
            url,
            config,
            _dir: dir,
        }
    }

    /// A relay with the agents `names`, each registered: where most tests start.
    pub async fn with_agents<const N: usize>(names: [&str; N]) -> (Self, [TestAgent; N]) {
        let relay = Self::start(|_| {}).await;
        let agents = relay.agents(names).await;
        (relay, agents)
    }

    /// New agents `names`, registered with this relay in that order (by a first sync).
    pub async fn agents<const N: usize>(&self, names: [&str; N]) -> [TestAgent; N] {
        let agents = names.map(TestAgent::new);
        for agent in &agents {
            agent.sync(self).await;
        }
        agents
    }

    /// A home (`MAILSLOT_HOME`) with the agents `names` registered with this relay by
    /// `mailslot register`, for tests that run the CLI or `mailslot mcp` on it.
    pub fn home(&self, names: &[&str]) -> tempfile::TempDir {
        let home = tempfile::tempdir().unwrap();
        for name in names {
            register(home.path(), name, &self.url);
        }
        home
    }

    /// The relay's database file.
    pub fn db(&self) -> std::path::PathBuf {
        self.config
            .db
            .clone()
            .expect("test relays have a database file")
    }

    /// Shuts the relay down, keeping its address and database for [`StoppedRelay::restart`].
    pub async fn stop(self) -> StoppedRelay {
        let config = RelayConfig {
            listen: self.relay.addr(),
            ..self.config
        };
        self.relay.shutdown().await;
        StoppedRelay {
            config,
            dir: self._dir,
        }
    }
}

/// An agent with its own home.
pub struct TestAgent {
    pub name: AgentName,
    pub identity: Arc<Identity>,
    /// Its owner's key (in memory: the file and its passphrase are the CLI's business),
    /// registered with the relay on the agent's first connection.
    pub owner: Owner,
    pub store: StoreHandle,
    _home: tempfile::TempDir,
}

impl TestAgent {
    pub fn new(name: &str) -> Self {
        turns::take();
        let home = tempfile::tempdir().unwrap();
        let paths = Paths::new(Some(home.path().to_owned()), None).unwrap();
        let (agent, _) = Agent::open_or_create(&paths, &AgentName::new(name).unwrap()).unwrap();
        let Agent {
            name,
            identity,
            store,
            ..
        } = agent;
        Self {
            name,
            identity: Arc::new(identity),
            owner: Owner::generate(),
            store: StoreHandle::spawn(store).unwrap(),
            _home: home,
        }
    }

    pub fn address(&self) -> Address {
        Address::local(self.name.clone())
    }

    /// Its home: the CLI, `mailslot mcp` and the dashboard open the agent there.
    pub fn home(&self) -> &std::path::Path {
        self._home.path()
    }

    pub async fn connect(&self, relay: &TestRelay) -> Connection {
        self.connect_url(&relay.url).await
    }

    /// A delivery connection to the relay at `url`.
    pub async fn connect_url(&self, url: &RelayUrl) -> Connection {
        Connection::connect(url, &self.name, &self.identity, Some(self.owner.public()))
            .await
            .unwrap()
    }

    /// The owner's signature over `act` on `conn`, as `mailslot approve` and the like make.
    pub fn owner_signs(&self, conn: &Connection, act: &OwnerAct<'_>) -> Vec<u8> {
        conn.owner_signature(&self.owner, act)
    }

    pub async fn sync(&self, relay: &TestRelay) -> SyncReport {
        self.sync_url(&relay.url).await
    }

    /// Syncs with the relay at `url`.
    pub async fn sync_url(&self, url: &RelayUrl) -> SyncReport {
        tokio::time::timeout(
            EVENT_TIMEOUT,
            mailslot::client::sync(
                url,
                &self.name,
                &self.identity,
                Some(self.owner.public()),
                &self.store,
            ),
        )
        .await
        .expect("sync timed out")
        .unwrap()
    }

    /// Queues a message and syncs, returning the report.
    pub async fn send(&self, relay: &TestRelay, message: Message) -> SyncReport {
        self.send_url(&relay.url, message).await
    }

    /// Queues a message and syncs with the relay at `url`.
    pub async fn send_url(&self, url: &RelayUrl, message: Message) -> SyncReport {
        self.queue(std::slice::from_ref(&message)).await;
        self.sync_url(url).await
    }

    /// Queues messages in the outbox, in order, without syncing.
    pub async fn queue(&self, messages: &[Message]) {
        for m in messages {
            let m = m.clone();
            self.store
                .call(move |s| s.queue_outgoing(&m))
                .await
                .unwrap();
        }
    }

    pub fn message(&self, to: &[&TestAgent], subject: &str, body: &str) -> Message {
        Message::new(
            self.address(),
            to.iter().map(|a| a.address()).collect(),
            subject,
            body,
        )
    }
}

pub type RawSocket = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// Acts as the relay `c` over a raw link to `b`: shakes hands with `c`'s own key.
pub async fn link_as(c: &TestRelay, b: &TestRelay) -> RawSocket {
    let (c_key, _) =
        mailslot::crypto::RelayIdentity::load_or_create(&mailslot::relay::identity_beside(&c.db()))
            .unwrap();
    let (ws, answer) = hello_as(c.relay.name(), &c_key, b).await;
    assert!(
        matches!(answer, mailslot::protocol::LinkAnswer::Welcome { .. }),
        "{answer:?}"
    );
    ws
}

/// Opens a raw link to `b` and says hello as the relay `name`, signing with `key`; the socket
/// and `b`'s answer to the hello.
pub async fn hello_as(
    name: &mailslot::protocol::RelayName,
    key: &mailslot::crypto::RelayIdentity,
    b: &TestRelay,
) -> (RawSocket, mailslot::protocol::LinkAnswer) {
    use futures_util::{SinkExt, StreamExt};
    use mailslot::crypto::sign::Domain;
    use mailslot::protocol::{LINK_PATH, LinkAnswer, LinkRequest, link_payload};
    use tokio_tungstenite::tungstenite::Message as Ws;

    let url = format!("ws://{}{LINK_PATH}", b.relay.addr());
    let (mut ws, _) = tokio_tungstenite::connect_async(url.as_str())
        .await
        .unwrap();
    let Some(Ok(Ws::Text(text))) = ws.next().await else {
        panic!("no challenge")
    };
    let LinkAnswer::Challenge { nonce: theirs, .. } = serde_json::from_str(&text).unwrap() else {
        panic!("{text}")
    };
    let nonce = vec![7u8; 32];
    let payload = link_payload(name, b.relay.name(), &nonce, &theirs);
    let hello = LinkRequest::Hello {
        relay: name.clone(),
        nonce,
        signature: key.sign_link(Domain::LinkHello, &payload),
    };
    ws.send(Ws::text(serde_json::to_string(&hello).unwrap()))
        .await
        .unwrap();
    let next = tokio::time::timeout(EVENT_TIMEOUT, ws.next())
        .await
        .expect("an answer to the hello in time");
    let Some(Ok(Ws::Text(text))) = next else {
        panic!("no answer to the hello: {next:?}")
    };
    (ws, serde_json::from_str(&text).unwrap())
}

/// A raw socket after reading the challenge: (socket, relay id, nonce).
pub async fn raw_connect(relay: &TestRelay) -> (RawSocket, String, Vec<u8>) {
    let (mut ws, _) = tokio_tungstenite::connect_async(relay.url.as_str())
        .await
        .unwrap();
    match raw_recv(&mut ws).await {
        Some(ServerFrame::Challenge { relay, nonce, .. }) => (ws, relay, nonce),
        other => panic!("expected a challenge, got {other:?}"),
    }
}

/// Sends a frame as JSON text.
pub async fn raw_send(ws: &mut RawSocket, frame: &ClientFrame) {
    raw_send_text(ws, &serde_json::to_string(frame).unwrap()).await;
}

pub async fn raw_send_text(ws: &mut RawSocket, text: &str) {
    ws.send(WsMessage::Text(text.to_owned().into()))
        .await
        .unwrap();
}

/// The next frame, or `None` when the socket closed.
pub async fn raw_recv(ws: &mut RawSocket) -> Option<ServerFrame> {
    loop {
        let next = tokio::time::timeout(EVENT_TIMEOUT, ws.next())
            .await
            .expect("no frame in time");
        match next {
            Some(Ok(WsMessage::Text(t))) => return Some(serde_json::from_str(&t).unwrap()),
            Some(Ok(WsMessage::Close(_))) | None | Some(Err(_)) => return None,
            Some(Ok(_)) => {}
        }
    }
}

/// Authenticates a raw socket as `agent` (registering it).
pub async fn raw_login(relay: &TestRelay, agent: &TestAgent) -> RawSocket {
    let (mut ws, relay_id, nonce) = raw_connect(relay).await;
    raw_send(&mut ws, &hello(agent, &relay_id, &nonce)).await;
    match raw_recv(&mut ws).await {
        Some(ServerFrame::Welcome { .. }) => ws,
        other => panic!("expected welcome, got {other:?}"),
    }
}

pub fn hello(agent: &TestAgent, relay_id: &str, nonce: &[u8]) -> ClientFrame {
    use mailslot::crypto::sign::{Domain, signature};
    ClientFrame::Hello {
        agent: agent.name.clone(),
        signature: signature(
            &agent.identity,
            Domain::Hello,
            &mailslot::protocol::hello_payload(relay_id, nonce),
        )
        .to_vec(),
        register: Some(agent.identity.public().to_keys()),
        control: false,
        owner: None,
        invite: None,
    }
}

/// Reads frames until an error frame, skipping deliveries and the like.
pub async fn next_error(
    ws: &mut RawSocket,
) -> Option<(mailslot::protocol::ErrorCode, String, Option<u64>)> {
    loop {
        match raw_recv(ws).await? {
            ServerFrame::Error {
                code,
                message,
                retry_after_ms,
                ..
            } => return Some((code, message, retry_after_ms)),
            _ => continue,
        }
    }
}

/// Makes `name` in `home` and registers it with the relay (`mailslot register`), so that mail
/// to it is accepted before its MCP server first connects.
/// The arguments of a command line that runs mailslot — `mailslot ARGS` (or a path ending in
/// `/mailslot`), or the packages' forms `npx -y mailslot ARGS` and `uvx mailslot ARGS` — or
/// `None` when it runs something else.
pub fn mailslot_args(words: &[String]) -> Option<&[String]> {
    let (program, args) = words.split_first()?;
    match (program.as_str(), args) {
        ("npx", [y, name, args @ ..]) if y == "-y" && name == "mailslot" => Some(args),
        ("uvx", [name, args @ ..]) if name == "mailslot" => Some(args),
        _ => (program == "mailslot" || program.ends_with("/mailslot")).then_some(args),
    }
}

pub fn register(home: &std::path::Path, name: &str, relay: &RelayUrl) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_mailslot"))
        .args(["--agent", name, "--relay", relay.as_str(), "register"])
        .env_clear()
        .env("MAILSLOT_HOME", home)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The files that the environment variables `vars` name (set up by `.ci/<setup>`), or `None`
/// after saying on stderr that the test is skipped. When `require` is set to 1 (CI), missing
/// variables fail the test instead: CI never passes without running it. With the files found,
/// the test holds its module's turn until it ends ([`turns`]).
pub fn external_tools(
    vars: &[&str],
    require: &str,
    setup: &str,
    contributing_section: &str,
) -> Option<Vec<std::path::PathBuf>> {
    use std::io::Write;
    let found: Vec<Option<std::path::PathBuf>> = vars
        .iter()
        .map(|v| {
            std::env::var_os(v)
                .filter(|s| !s.is_empty())
                .map(std::path::PathBuf::from)
        })
        .collect();
    let missing: Vec<&str> = vars
        .iter()
        .zip(&found)
        .filter(|(_, f)| f.is_none())
        .map(|(v, _)| *v)
        .collect();
    if !missing.is_empty() {
        let required = std::env::var(require).is_ok_and(|v| v == "1");
        assert!(
            !required,
            "{require}=1 but {} not set: run `eval \"$(bash .ci/{setup})\"` first",
            missing.join(", ")
        );
        // Straight to stderr, past the test harness's capture, so that it is seen.
        let _ = writeln!(
            std::io::stderr(),
            "skipped: run .ci/{setup} (see CONTRIBUTING.md, \"{contributing_section}\"); {} not set",
            missing.join(", ")
        );
        return None;
    }
    let found: Vec<std::path::PathBuf> = found.into_iter().map(Option::unwrap).collect();
    for (var, path) in vars.iter().zip(&found) {
        assert!(
            path.is_file(),
            "{var}={} does not exist: re-run .ci/{setup}",
            path.display()
        );
    }
    turns::take();
    Some(found)
}

/// Polls `check` until it gives a value, failing the test after `limit` with `what`. For
/// outside processes that announce nothing (a gateway, Claude Code's screen and log).
pub async fn wait_until<T>(
    limit: Duration,
    what: &str,
    mut check: impl AsyncFnMut() -> Option<T>,
) -> T {
    let started = Instant::now();
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(
            started.elapsed() < limit,
            "timed out after {} s: {what}",
            limit.as_secs()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Runs `test` on a runtime of its own, in a network namespace with only loopback when the
/// machine allows it (every thread and process the runtime starts inherits it).
pub fn isolated<F: Future<Output = ()>>(test: impl FnOnce() -> F) {
    use nix::sched::{CloneFlags, unshare};
    match unshare(CloneFlags::CLONE_NEWNET) {
        Ok(()) => {
            // `ip` lives in sbin, which a minimal PATH may leave out.
            let ip = ["/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"]
                .into_iter()
                .find(|p| std::path::Path::new(p).exists())
                .unwrap_or("ip");
            let up = std::process::Command::new(ip)
                .args(["link", "set", "lo", "up"])
                .status();
            assert!(
                up.is_ok_and(|s| s.success()),
                "cannot bring up loopback in the test's network namespace (is iproute2 installed? .ci/claude-code-setup installs it)"
            );
        }
        Err(e) => eprintln!(
            "note: no network namespace ({e}); the client runs on the host network, pointed only at loopback"
        ),
    }
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
        .block_on(test());
}

/// Runs `mailslot ARGS` against `relay` with the agents in `home`; its stdout (fails the test
/// when it fails).
pub async fn mailslot_cli(home: &std::path::Path, relay: &str, args: &[&str]) -> String {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_mailslot"))
        .args(args)
        .env_clear()
        .env("MAILSLOT_HOME", home)
        .env("MAILSLOT_RELAY", relay)
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "mailslot {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// Runs `cmd` with `input` on its stdin and its output captured.
pub fn output_with_input(cmd: &mut std::process::Command, input: &str) -> std::process::Output {
    use std::io::Write;
    use std::process::Stdio;
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

/// Runs `mailslot ARGS` at a terminal (a pseudo-terminal from `script`, as an agent with a
/// shell could make one too) against the relay at `relay`, typing `input`; gives back the
/// exit code and what the terminal showed.
pub fn at_terminal(home: &std::path::Path, relay: &str, args: &str, input: &str) -> (i32, String) {
    let line = format!("{} {args}", env!("CARGO_BIN_EXE_mailslot"));
    let out = output_with_input(
        std::process::Command::new("script")
            .args(["-qec", &line, "/dev/null"])
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("MAILSLOT_HOME", home)
            .env("MAILSLOT_RELAY", relay),
        input,
    );
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

/// `text` with every fenced region taken out; fails the test on a fence that never closes.
pub fn outside_fences(text: &str) -> String {
    let mut rest = text;
    let mut out = String::new();
    while let Some(at) = rest.find("<<<mailslot-untrusted ") {
        out.push_str(&rest[..at]);
        let after = &rest[at + "<<<mailslot-untrusted ".len()..];
        let nonce = after.split(">>>").next().unwrap();
        let close = format!("<<<end mailslot-untrusted {nonce}>>>");
        let end = after
            .find(&close)
            .unwrap_or_else(|| panic!("a fence never closes in: {text}"));
        rest = &after[end + close.len()..];
    }
    out.push_str(rest);
    out
}

/// A `mailslot relay` process, killed (SIGKILL) when dropped, so a failing test leaves none.
pub struct RelayChild(std::process::Child);

impl RelayChild {
    /// Kills it with SIGKILL, as a crash would, and reaps it.
    pub fn kill(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for RelayChild {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Starts `mailslot relay` on `db` (a SQLite path or a PostgreSQL URL) in the home `home`
/// (where a relay on PostgreSQL keeps its key: nodes of one database share a home), listening
/// on a free loopback port, and returns it with the URL it printed.
pub fn spawn_relay(
    db: impl AsRef<std::ffi::OsStr>,
    home: &std::path::Path,
) -> (RelayChild, RelayUrl) {
    spawn_relay_on(db, "127.0.0.1:0".parse().unwrap(), home)
}

/// A loopback address with a port that was free a moment ago, for a relay that must come
/// back on the same address (its name, when no host is set) after a crash.
pub fn free_loopback_addr() -> std::net::SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

/// Starts `mailslot relay` on `db` in the home `home`, listening on `listen`, and returns it
/// with the URL it printed.
pub fn spawn_relay_on(
    db: impl AsRef<std::ffi::OsStr>,
    listen: std::net::SocketAddr,
    home: &std::path::Path,
) -> (RelayChild, RelayUrl) {
    use std::io::{BufRead, BufReader};
    turns::take();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_mailslot"))
        .args(["relay", "--listen", &listen.to_string(), "--db"])
        .arg(db)
        // Test federations run on loopback, which a relay reaches only when allowed.
        .arg("--allow-private-relays")
        .env_clear()
        .env("MAILSLOT_HOME", home)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let url = loop {
        let line = lines
            .next()
            .expect("the relay exited before listening")
            .unwrap();
        if let Some(rest) = line.split_once(" listening on ").map(|(_, r)| r) {
            break rest.split(' ').next().unwrap().parse().unwrap();
        }
    };
    // Keep draining stderr so the relay never blocks on a full pipe.
    std::thread::spawn(move || for _ in lines {});
    (RelayChild(child), url)
}

/// Hands a session's events to a test, in order.
struct ToTest(tokio::sync::mpsc::UnboundedSender<mailslot::client::ClientEvent>);

impl mailslot::client::Listener for ToTest {
    fn heard(&self, event: mailslot::client::ClientEvent) {
        let _ = self.0.send(event);
    }
}

/// The events up to the first that `pick` takes; fails after the usual timeout.
pub async fn until<T>(
    events: &mut tokio::sync::mpsc::UnboundedReceiver<mailslot::client::ClientEvent>,
    mut pick: impl FnMut(&mailslot::client::ClientEvent) -> Option<T>,
) -> (T, Vec<mailslot::client::ClientEvent>) {
    tokio::time::timeout(EVENT_TIMEOUT, async {
        let mut before = Vec::new();
        loop {
            let event = events.recv().await.expect("the session is running");
            if let Some(found) = pick(&event) {
                return (found, before);
            }
            before.push(event);
        }
    })
    .await
    .expect("the event did not come")
}

/// A long-running client session for `agent` on `url`, shown as `shown`, and its events.
pub fn session_shown(
    agent: &TestAgent,
    url: &RelayUrl,
    shown: mailslot::protocol::Shown,
) -> (
    mailslot::client::SessionHandle,
    tokio::sync::mpsc::UnboundedReceiver<mailslot::client::ClientEvent>,
) {
    let (events, heard) = tokio::sync::mpsc::unbounded_channel();
    let handle = mailslot::client::spawn_session(
        mailslot::client::SessionConfig {
            url: url.clone(),
            agent: agent.name.clone(),
            identity: agent.identity.clone(),
            owner: Some(agent.owner.public()),
            store: agent.store.clone(),
            trusted: Vec::new(),
            shown,
        },
        std::sync::Arc::new(ToTest(events)),
    );
    (handle, heard)
}

/// A long-running client session for `agent` on `url`, and its events.
pub fn session(
    agent: &TestAgent,
    url: &RelayUrl,
) -> (
    mailslot::client::SessionHandle,
    tokio::sync::mpsc::UnboundedReceiver<mailslot::client::ClientEvent>,
) {
    session_shown(agent, url, mailslot::protocol::Shown::Online)
}
