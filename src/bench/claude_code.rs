//! `mailslot bench mcp --claude-code PATH`: the doorbells that wake an idle Claude Code
//! session, through the real Claude Code. An interactive Claude Code (in a tmux server of its
//! own) runs `mailslot mcp` for one agent, with the example hooks; another agent sends it
//! messages one at a time; the time measured is from the send until the request that carries
//! the message (its id) reaches Claude Code's model (a loopback stand-in for the Anthropic
//! Messages API that answers every request with a short text). One session per path:
//! - the inbox socket: an ordinary account, no flags;
//! - the rewake hook: the same, with `crossSessionInbound: "refuse"` in the user's settings;
//! - the channel: an account with the channels preview (the cached account flag written into
//!   a temporary `~/.claude.json`) launched with the development-channels flag.
//!
//! [`socket_share`] measures mailslot's own part of the socket path: a real `mailslot mcp`
//! process told that a socket of the benchmark's is its session's inbox, send until the
//! notice is written there.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use axum::response::IntoResponse;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::stats::Summary;
use crate::agent::Agent;
use crate::client::RelayUrl;
use crate::config::Paths;
use crate::mailbox::{Mailbox, SendOutcome};
use crate::protocol::{Address, AgentName, Message};

/// How long Claude Code may take to start, or to ask its model about a message.
const WAIT: Duration = Duration::from_secs(60);
/// The pause after each answered turn, so the next message finds the session idle (the
/// rewake hook leaves mail alone for 1.5 s after a turn ends).
const SETTLE: Duration = Duration::from_millis(2500);
/// The dummy API key (Claude Code remembers approved keys by their last 20 characters).
const API_KEY: &str = "sk-ant-api03-mailslot-bench-key-000000000000000";

/// A path that wakes an idle session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WakePath {
    /// The session's inbox socket (any account).
    Socket,
    /// The rewake hook (the socket refused).
    Rewake,
    /// The channel (an account with the preview).
    Channel,
}

impl WakePath {
    fn name(self) -> &'static str {
        match self {
            WakePath::Socket => "socket",
            WakePath::Rewake => "rewake",
            WakePath::Channel => "channel",
        }
    }
}

/// The hooks of `mcp-config-examples/claude-code/.claude/settings.json`, running `exe` as
/// agent `agent`.
fn example_hooks(exe: &Path, agent: &str) -> Value {
    let hook = |kind: &str| json!({ "type": "command", "command": format!("'{}' --agent {agent} hook {kind}", exe.display()) });
    let wake = json!({
        "type": "command",
        "command": format!("'{}' --agent {agent} hook wake", exe.display()),
        "asyncRewake": true,
        "timeout": 43260,
    });
    json!({
        "SessionStart": [{ "hooks": [hook("session-start"), wake.clone()] }],
        "UserPromptSubmit": [{ "hooks": [hook("prompt")] }],
        "PostToolUse": [{ "hooks": [hook("post-tool")] }],
        "Stop": [{ "hooks": [hook("stop"), wake] }],
    })
}

/// Sends `messages` messages to an idle session woken by `path` and measures send -> the
/// model's request.
pub async fn wake_latency(
    exe: &Path,
    claude: &Path,
    tmux: &Path,
    home: &Path,
    relay: &RelayUrl,
    path: WakePath,
    messages: u32,
) -> anyhow::Result<Summary> {
    let (api, mut requests) = model_api().await?;
    // Each path's session and sender are agents of their own on the one relay.
    let agent = format!("cc-{}", path.name());
    let dir = home.join(format!("claude-code-{}", path.name()));
    let (project, user_home) = (dir.join("project"), dir.join("home"));
    let mailslot_home = dir.join("mailslot");
    std::fs::create_dir_all(project.join(".claude"))?;
    std::fs::create_dir_all(user_home.join(".claude"))?;
    let env = [
        ("HOME", user_home.display().to_string()),
        ("PATH", std::env::var("PATH").unwrap_or_default()),
        (crate::config::ENV_HOME, mailslot_home.display().to_string()),
        (crate::config::ENV_RELAY, relay.to_string()),
        ("ANTHROPIC_BASE_URL", api),
        ("ANTHROPIC_API_KEY", API_KEY.to_owned()),
        ("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1".to_owned()),
        ("DISABLE_AUTOUPDATER", "1".to_owned()),
        ("DISABLE_TELEMETRY", "1".to_owned()),
        ("DISABLE_ERROR_REPORTING", "1".to_owned()),
        (
            "CLAUDE_CODE_GB_DISK_CACHE_WHEN_TELEMETRY_OFF",
            "1".to_owned(),
        ),
    ];
    std::fs::write(
        project.join(".mcp.json"),
        json!({ "mcpServers": { "mailslot": {
            "command": exe, "args": ["mcp", "--agent", &agent],
        }}})
        .to_string(),
    )?;
    std::fs::write(
        project.join(".claude/settings.json"),
        json!({ "hooks": example_hooks(exe, &agent) }).to_string(),
    )?;
    let mut state = json!({
        "hasCompletedOnboarding": true,
        "customApiKeyResponses": { "approved": [&API_KEY[API_KEY.len() - 20..]], "rejected": [] },
        "projects": { project.display().to_string(): {
            "hasTrustDialogAccepted": true,
            "hasCompletedProjectOnboarding": true,
            "enabledMcpjsonServers": ["mailslot"],
        }},
    });
    if path == WakePath::Channel {
        state["cachedGrowthBookFeatures"] = json!({ "tengu_harbor": true });
    }
    std::fs::write(user_home.join(".claude.json"), state.to_string())?;
    let mut user_settings = json!({ "permissions": { "allow": ["mcp__mailslot"] } });
    if path == WakePath::Rewake {
        user_settings["crossSessionInbound"] = json!("refuse");
    }
    std::fs::write(
        user_home.join(".claude/settings.json"),
        user_settings.to_string(),
    )?;
    // Registered before Claude Code starts, so the first send is accepted.
    register(exe, &env, &agent).await?;

    let session = Tmux {
        tmux: tmux.to_owned(),
        socket: dir.join("tmux.sock"),
    };
    let debug_log = dir.join("claude-debug.log");
    let flags = if path == WakePath::Channel {
        "--dangerously-load-development-channels server:mailslot"
    } else {
        ""
    };
    let command = format!(
        "exec '{}' {flags} --debug-file '{}'",
        claude.display(),
        debug_log.display()
    );
    session
        .run(
            &env,
            &project,
            &[
                "new-session",
                "-d",
                "-s",
                "cc",
                "-x",
                "160",
                "-y",
                "50",
                &command,
            ],
        )
        .await?;
    let log_has = |text: &'static str| {
        let debug_log = debug_log.clone();
        move || {
            let debug_log = debug_log.clone();
            async move { Ok(std::fs::read_to_string(&debug_log).is_ok_and(|log| log.contains(text))) }
        }
    };
    if path == WakePath::Channel {
        poll(|| async {
            Ok(session
                .run(&env, &project, &["capture-pane", "-p", "-t", "cc"])
                .await?
                .contains("I am using this for local development"))
        })
        .await
        .context("Claude Code did not show the development-channels warning")?;
        session
            .run(&env, &project, &["send-keys", "-t", "cc", "Enter"])
            .await?;
        poll(log_has("Channel notifications registered"))
            .await
            .context("Claude Code did not register mailslot's channel (see its debug log)")?;
    } else {
        poll(log_has("MCP server \"mailslot\": Successfully connected"))
            .await
            .context("Claude Code did not connect mailslot's MCP server (see its debug log)")?;
        // The first waiter of the rewake path arms after its grace.
        tokio::time::sleep(SETTLE).await;
    }

    let what = format!("Claude Code's model ({})", path.name());
    let (samples, total) = timed_sends(
        mailslot_home,
        relay,
        &format!("{agent}-sender"),
        &agent,
        messages,
        &mut requests,
        &what,
    )
    .await?;
    drop(session);
    Ok(Summary::new(
        match path {
            WakePath::Socket => "socket: send -> Claude Code's model request (idle session)",
            WakePath::Rewake => "rewake hook: send -> Claude Code's model request (idle session)",
            WakePath::Channel => "channel: send -> Claude Code's model request (idle session)",
        },
        samples,
        total,
    ))
}

/// mailslot's own share of the socket path: a real `mailslot mcp` process (driven by rmcp's
/// client, as the demo does) is told by the environment Claude Code would give it that a
/// socket of the benchmark's is its session's inbox; the time is from the send until the
/// notice naming the message arrives on that socket.
pub async fn socket_share(
    exe: &Path,
    home: &Path,
    relay: &RelayUrl,
    messages: u32,
) -> anyhow::Result<Summary> {
    let dir = home.join("socket-share");
    std::fs::create_dir_all(&dir)?;
    let socket = dir.join("inbox.sock");
    let listener = tokio::net::UnixListener::bind(&socket)?;
    let (lines_tx, mut lines) = mpsc::unbounded_channel::<(Instant, String)>();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let tx = lines_tx.clone();
            tokio::spawn(async move {
                use tokio::io::AsyncBufReadExt;
                let mut reader = tokio::io::BufReader::new(stream).lines();
                while let Ok(Some(line)) = reader.next_line().await {
                    let _ = tx.send((Instant::now(), line));
                }
            });
        }
    });
    let mailslot_home = dir.join("mailslot");
    let env = [
        (crate::config::ENV_HOME, mailslot_home.display().to_string()),
        (crate::config::ENV_RELAY, relay.to_string()),
        (
            crate::config::ENV_CLAUDE_CODE_SESSION,
            uuid::Uuid::now_v7().to_string(),
        ),
        (
            crate::doorbell::claude_code::ENV_SOCKET,
            socket.display().to_string(),
        ),
    ];
    register(exe, &env, "share").await?;
    let mut cmd = tokio::process::Command::new(exe);
    cmd.args(["--agent", "share", "mcp"])
        .current_dir(&dir)
        .env_clear()
        .envs(env.iter().cloned())
        .env(crate::config::ENV_LOG, "warn");
    let transport = rmcp::transport::TokioChildProcess::new(cmd)
        .with_context(|| format!("starting {}", exe.display()))?;
    let driver =
        crate::demo::driver::Driver::connect(transport, crate::demo::driver::Era::Legacy).await?;
    let (samples, total) = timed_sends(
        mailslot_home,
        relay,
        "share-sender",
        "share",
        messages,
        &mut lines,
        "the inbox socket",
    )
    .await?;
    driver.close().await?;
    Ok(Summary::new(
        "socket, mailslot's share: send -> notice written to the inbox socket",
        samples,
        total,
    ))
}

/// Sends `messages` messages from a new agent `from` (in `mailslot_home`) to `to`, one at a
/// time and [`SETTLE`] apart (past its burst the bell paces notices, one per 2.5 s, and a
/// wait would measure the pacing, not the path), and times each from the send until a line
/// on `seen` names it. The samples and the whole run's time.
async fn timed_sends(
    mailslot_home: PathBuf,
    relay: &RelayUrl,
    from: &str,
    to: &str,
    messages: u32,
    seen: &mut mpsc::UnboundedReceiver<(Instant, String)>,
    what: &str,
) -> anyhow::Result<(Vec<Duration>, Duration)> {
    let paths = Paths::new(Some(mailslot_home), None)?;
    let (sender, _) = Agent::open_or_create(&paths, &AgentName::new(from)?)?;
    let sender = Mailbox::open(sender, relay.clone()).await?;
    let to = Address::parse(to)?;
    let mut samples = Vec::with_capacity(messages as usize);
    let start = Instant::now();
    for i in 0..messages {
        let message = Message::new(sender.address().clone(), vec![to.clone()], "bench", "x");
        let marker = message.id.to_string();
        let t = Instant::now();
        if !matches!(sender.send(message).await?, SendOutcome::Sent) {
            bail!("message {i} was not sent");
        }
        loop {
            let (at, line) = tokio::time::timeout(WAIT, seen.recv())
                .await
                .with_context(|| format!("{what} never saw message {i}"))?
                .context("the benchmark's listener stopped")?;
            if line.contains(&marker) {
                samples.push(at.duration_since(t));
                break;
            }
        }
        tokio::time::sleep(SETTLE).await;
    }
    let total = start.elapsed();
    sender.close().await;
    Ok((samples, total))
}

/// Registers `agent` with `exe` in the environment `env`.
async fn register(exe: &Path, env: &[(&str, String)], agent: &str) -> anyhow::Result<()> {
    let out = tokio::process::Command::new(exe)
        .args(["--agent", agent, "register"])
        .env_clear()
        .envs(env.iter().cloned())
        .output()
        .await?;
    if !out.status.success() {
        bail!(
            "registering {agent} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

/// A tmux server of the benchmark's own.
struct Tmux {
    tmux: PathBuf,
    socket: PathBuf,
}

impl Tmux {
    async fn run(
        &self,
        env: &[(&str, String)],
        dir: &Path,
        args: &[&str],
    ) -> anyhow::Result<String> {
        let out = tokio::process::Command::new(&self.tmux)
            .arg("-S")
            .arg(&self.socket)
            .args(args)
            .env_clear()
            .envs(env.iter().cloned())
            .current_dir(dir)
            .output()
            .await
            .with_context(|| format!("running {}", self.tmux.display()))?;
        if !out.status.success() {
            bail!("tmux {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = std::process::Command::new(&self.tmux)
            .arg("-S")
            .arg(&self.socket)
            .arg("kill-server")
            .status();
    }
}

/// Polls `check` every 100 ms until it holds, for at most [`WAIT`].
async fn poll<F: Future<Output = anyhow::Result<bool>>>(
    check: impl Fn() -> F,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + WAIT;
    while Instant::now() < deadline {
        if check().await? {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    bail!("timed out after {} s", WAIT.as_secs())
}

/// A stand-in for the Messages API on loopback: every request is answered with a short text
/// (streamed when asked to), and each request of the main conversation (one that offers
/// tools) is reported with the moment it arrived.
async fn model_api() -> anyhow::Result<(String, mpsc::UnboundedReceiver<(Instant, String)>)> {
    let (tx, rx) = mpsc::unbounded_channel();
    let app = axum::Router::new().fallback(move |body: String| {
        let tx = tx.clone();
        async move {
            let at = Instant::now();
            let request: Value = serde_json::from_str(&body).unwrap_or_default();
            if request["tools"].as_array().is_some_and(|t| !t.is_empty()) {
                let _ = tx.send((at, body));
            }
            answer(&request)
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}", listener.local_addr()?);
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok((url, rx))
}

fn answer(request: &Value) -> axum::response::Response {
    let message = json!({
        "id": "msg_bench", "type": "message", "role": "assistant",
        "model": request["model"].as_str().unwrap_or("claude"),
        "content": [{ "type": "text", "text": "ok" }],
        "stop_reason": "end_turn", "stop_sequence": null,
        "usage": { "input_tokens": 1, "output_tokens": 1 },
    });
    if request["stream"] != true {
        return axum::Json(message).into_response();
    }
    let mut start = message.clone();
    start["content"] = json!([]);
    start["stop_reason"] = Value::Null;
    let events = [
        (
            "message_start",
            json!({ "type": "message_start", "message": start }),
        ),
        (
            "content_block_start",
            json!({ "type": "content_block_start", "index": 0, "content_block": { "type": "text", "text": "" } }),
        ),
        (
            "content_block_delta",
            json!({ "type": "content_block_delta", "index": 0, "delta": { "type": "text_delta", "text": "ok" } }),
        ),
        (
            "content_block_stop",
            json!({ "type": "content_block_stop", "index": 0 }),
        ),
        (
            "message_delta",
            json!({ "type": "message_delta", "delta": { "stop_reason": "end_turn", "stop_sequence": null }, "usage": { "output_tokens": 1 } }),
        ),
        ("message_stop", json!({ "type": "message_stop" })),
    ];
    let body: String = events
        .iter()
        .map(|(name, data)| format!("event: {name}\ndata: {data}\n\n"))
        .collect();
    axum::response::Response::builder()
        .header("content-type", "text/event-stream")
        .body(axum::body::Body::from(body))
        .expect("a valid response")
}
