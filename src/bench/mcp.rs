//! `mailslot bench mcp`: the MCP path end to end, through two real `mailslot mcp` processes
//! on an embedded relay, driven by rmcp's client: tool-call latency, send -> doorbell latency
//! at the recipient, and startup and shutdown of a server.

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde_json::json;

use super::McpBenchArgs;
use super::stats::Summary;
use crate::client::RelayUrl;
use crate::demo::driver::{Driver, Era, Pushed};
use crate::relay::{Relay, RelayConfig};

/// Runs the benchmark.
pub fn run(args: &McpBenchArgs) -> anyhow::Result<Vec<Summary>> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?
        .block_on(measure(args))
}

async fn measure(args: &McpBenchArgs) -> anyhow::Result<Vec<Summary>> {
    let exe = std::env::current_exe()?;
    let home = tempfile::tempdir()?;
    let relay = Relay::start(RelayConfig {
        listen: "127.0.0.1:0".parse().expect("a valid address"),
        db: Some(home.path().join("relay.db")),
        ..RelayConfig::default()
    })
    .await?;
    let url: RelayUrl = relay.url().parse().map_err(anyhow::Error::msg)?;
    let mut rows = Vec::new();

    // Startup: process start to an answered initialize; shutdown: input closed to exit.
    let mut starts = Vec::new();
    let mut exits = Vec::new();
    for i in 0..args.starts {
        let (start, exit) = start_and_exit(&exe, home.path(), &format!("probe{i}"), &url).await?;
        starts.push(start);
        exits.push(exit);
    }
    let total = starts.iter().sum();
    rows.push(Summary::new(
        "mcp start: spawn -> initialize answered",
        starts,
        total,
    ));
    let total = exits.iter().sum();
    rows.push(Summary::new(
        "mcp exit: stdin closed -> process exited",
        exits,
        total,
    ));

    let alice = Driver::spawn(&exe, home.path(), "alice", &url, Era::Legacy).await?;
    let mut bob = Driver::spawn(&exe, home.path(), "bob", &url, Era::Legacy).await?;
    wait_connected(&alice).await?;
    wait_connected(&bob).await?;
    #[allow(deprecated)]
    bob.client
        .subscribe(rmcp::model::SubscribeRequestParams::new(crate::mcp::INBOX))
        .await?;

    for (case, tool, call_args) in [
        (
            "tool call: inbox (read-only, with footer)",
            "inbox",
            json!({}),
        ),
        (
            "tool call: recall",
            "recall",
            json!({ "query": "release plan" }),
        ),
        (
            "tool call: remember",
            "remember",
            json!({ "text": "a note for the benchmark" }),
        ),
    ] {
        let mut samples = Vec::with_capacity(args.calls as usize);
        let start = Instant::now();
        for _ in 0..args.calls {
            let t = Instant::now();
            alice.ok(tool, call_args.clone()).await?;
            samples.push(t.elapsed());
        }
        rows.push(Summary::new(case, samples, start.elapsed()));
    }

    let body = "x".repeat(args.size as usize);
    let mut answered = Vec::with_capacity(args.messages as usize);
    let mut updated = Vec::with_capacity(args.messages as usize);
    let mut rang = Vec::with_capacity(args.messages as usize);
    let start = Instant::now();
    for i in 0..args.messages {
        let t = Instant::now();
        let sent = alice
            .ok(
                "send",
                json!({ "to": ["bob"], "subject": format!("bench {i}"), "body": body }),
            )
            .await?;
        answered.push(t.elapsed());
        if sent["status"] != "sent" {
            bail!("message {i} was not sent: {sent}");
        }
        bob.wait_for(|p| matches!(p, Pushed::Updated(_)).then_some(()))
            .await?;
        updated.push(t.elapsed());
        let event = bob.channel_event().await?;
        rang.push(t.elapsed());
        if event["meta"]["message_id"] != sent["message_id"] {
            bail!("bob's doorbell rang for another message: {event}");
        }
    }
    let total = start.elapsed();
    rows.push(Summary::new(
        "send tool call (relay accepted)",
        answered,
        total,
    ));
    rows.push(Summary::new(
        "send -> recipient resources/updated",
        updated,
        total,
    ));
    rows.push(Summary::new("send -> recipient channel event", rang, total));
    // A Claude Code hook with the unread mail bob now has: a whole process per prompt.
    let mut hooks = Vec::with_capacity(args.starts as usize);
    for _ in 0..args.starts {
        let t = Instant::now();
        let out = tokio::process::Command::new(&exe)
            .args(["--agent", "bob", "hook", "prompt"])
            .env_clear()
            .env(crate::config::ENV_HOME, home.path())
            .stdin(std::process::Stdio::null())
            .output()
            .await?;
        hooks.push(t.elapsed());
        if !out.status.success() || out.stdout.is_empty() {
            bail!(
                "mailslot hook prompt failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
    let total = hooks.iter().sum();
    rows.push(Summary::new(
        "hook prompt (process, unread digest)",
        hooks,
        total,
    ));
    alice.close().await?;
    bob.close().await?;
    relay.shutdown().await;
    Ok(rows)
}

async fn wait_connected(agent: &Driver) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        let identity: serde_json::Value =
            serde_json::from_str(&agent.read(crate::mcp::IDENTITY).await?)?;
        if identity["relay"]
            .as_str()
            .is_some_and(|r| r.starts_with("connected"))
        {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Err(anyhow::anyhow!("an agent did not connect to the relay")).context("bench mcp")
}

/// One server's life: how long until it answers `initialize`, and how long it takes to exit
/// once its input closes.
async fn start_and_exit(
    exe: &std::path::Path,
    home: &std::path::Path,
    agent: &str,
    relay: &RelayUrl,
) -> anyhow::Result<(Duration, Duration)> {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
    let t = Instant::now();
    let mut child = tokio::process::Command::new(exe)
        .args(["--agent", agent, "--relay", relay.as_str(), "mcp"])
        .env_clear()
        .env(crate::config::ENV_HOME, home)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()?;
    let mut stdin = child.stdin.take().context("no stdin")?;
    let mut stdout = BufReader::new(child.stdout.take().context("no stdout")?);
    let init = json!({ "jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": { "name": "bench", "version": "1" } } });
    stdin.write_all(format!("{init}\n").as_bytes()).await?;
    let mut line = String::new();
    stdout.read_line(&mut line).await?;
    if !line.contains("\"result\"") {
        bail!("initialize failed: {line}");
    }
    let started = t.elapsed();
    let t = Instant::now();
    drop(stdin);
    let status = tokio::time::timeout(Duration::from_secs(10), child.wait()).await??;
    if !status.success() {
        bail!("mailslot mcp exited with {status}");
    }
    Ok((started, t.elapsed()))
}
