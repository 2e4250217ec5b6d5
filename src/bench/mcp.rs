//! `mailslot bench mcp`: the MCP path end to end, through two real `mailslot mcp` processes
//! on an embedded relay, driven by rmcp's client: tool-call latency, send -> doorbell latency
//! at the recipient, startup and shutdown of a server, the Claude Code hooks as processes,
//! `inbox` and `search` over stores of 10,000 and more messages (`volume.rs`; with
//! `--agent-mail`, mcp_agent_mail's search beside them, `agent_mail.rs`),
//! and with `--claude-code` the paths that wake an idle session (socket, rewake hook, channel)
//! through the real Claude Code, and mailslot's share of the socket path (`claude_code.rs`).

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
    // The tools are measured, not the relay's limits: at the default 100 sends a second (a
    // burst of 1,000) a run of more messages was refused part way, and a fill through `send`
    // timed the limit.
    let relay = Relay::start(RelayConfig {
        listen: "127.0.0.1:0".parse().expect("a valid address"),
        db: Some(home.path().join("relay.db")),
        send_rate: 1e9,
        send_burst: 1e9,
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
    alice.wait_connected().await?;
    bob.wait_connected().await?;
    #[allow(deprecated)]
    bob.client
        .subscribe(rmcp::model::SubscribeRequestParams::new(crate::mcp::INBOX))
        .await?;

    for (case, tool, call_args) in [
        (
            "tool call: inbox (read-only, with the notice)",
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
    if args.attachments > 0 {
        rows.extend(attachment_rows(&alice, &mut bob, home.path(), args).await?);
    }
    // Claude Code hooks with the unread mail bob now has: a whole process each time. A fresh
    // session has not seen the mail and gets the digest; after every tool call of a session
    // that has (the common case: nothing new since the last call) the hook prints nothing.
    for (case, kind, fresh) in [
        ("hook prompt (process, unread digest)", "prompt", true),
        ("hook post-tool (process, new mail)", "post-tool", true),
        ("hook post-tool (process, nothing new)", "post-tool", false),
    ] {
        rows.push(hook_row(&exe, home.path(), case, kind, args.starts, fresh).await?);
    }
    alice.close().await?;
    bob.close().await?;
    for &size in &args.store_sizes {
        rows.extend(super::volume::rows(&exe, home.path(), &url, size, args.calls).await?);
        if let Some(python) = &args.agent_mail {
            rows.extend(super::agent_mail::rows(python, size, args.calls).await?);
        }
    }
    if let Some(claude) = &args.claude_code {
        rows.push(
            super::claude_code::socket_share(&exe, home.path(), &url, args.channel_messages)
                .await?,
        );
        for path in [
            super::claude_code::WakePath::Socket,
            super::claude_code::WakePath::Rewake,
            super::claude_code::WakePath::Channel,
        ] {
            rows.push(
                super::claude_code::wake_latency(
                    &exe,
                    claude,
                    &args.tmux,
                    home.path(),
                    &url,
                    path,
                    args.channel_messages,
                )
                .await?,
            );
        }
    }
    relay.shutdown().await;
    Ok(rows)
}

/// Sends `args.attachments` messages with a file of `args.attachment_mib` MiB (random bytes,
/// so nothing compresses) from alice's working directory: the tool call until the relay
/// took it (read, stored, sealed, written durably at the relay), and until bob's doorbell.
async fn attachment_rows(
    alice: &Driver,
    bob: &mut Driver,
    dir: &std::path::Path,
    args: &McpBenchArgs,
) -> anyhow::Result<Vec<Summary>> {
    let mut rng = super::corpus::Rng::new(7);
    let bytes: Vec<u8> = (0..args.attachment_mib as usize * 1024 * 1024 / 8)
        .flat_map(|_| rng.next_u64().to_le_bytes())
        .collect();
    let file = dir.join("bench-attachment.bin");
    std::fs::write(&file, &bytes)?;
    let path = file
        .to_str()
        .context("the temp folder's path is not UTF-8")?;
    let (mut answered, mut rang) = (Vec::new(), Vec::new());
    let start = Instant::now();
    for i in 0..args.attachments {
        let t = Instant::now();
        let sent = alice
            .ok(
                "send",
                json!({ "to": ["bob"], "subject": format!("file {i}"), "body": "attached",
                        "attachments": [{ "path": path }] }),
            )
            .await?;
        answered.push(t.elapsed());
        if sent["status"] != "sent" {
            bail!("message {i} with an attachment was not sent: {sent}");
        }
        let event = bob.channel_event().await?;
        rang.push(t.elapsed());
        if event["meta"]["message_id"] != sent["message_id"] {
            bail!("bob's doorbell rang for another message: {event}");
        }
    }
    let total = start.elapsed();
    let mib = args.attachment_mib;
    Ok(vec![
        Summary::new(
            format!("send tool call, {mib} MiB attachment (relay accepted)"),
            answered,
            total,
        ),
        Summary::new(
            format!("send, {mib} MiB attachment -> recipient channel event"),
            rang,
            total,
        ),
    ])
}

/// Runs `mailslot --agent bob hook KIND` `n` times as Claude Code would: each time as a new
/// session (`fresh`: it must print the digest), or always as one session that has already
/// been shown the mail (one unmeasured run first; it must print nothing).
async fn hook_row(
    exe: &std::path::Path,
    home: &std::path::Path,
    case: &str,
    kind: &str,
    n: u32,
    fresh: bool,
) -> anyhow::Result<Summary> {
    let session = |i: u32| {
        if fresh {
            format!("{kind}-{i}")
        } else {
            format!("{kind}-seen")
        }
    };
    let run = async |i: u32| -> anyhow::Result<(Duration, bool)> {
        use tokio::io::AsyncWriteExt;
        let t = Instant::now();
        let mut child = tokio::process::Command::new(exe)
            .args(["--agent", "bob", "hook", kind])
            .env_clear()
            .env(crate::config::ENV_HOME, home)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()?;
        let input = json!({ "session_id": session(i), "hook_event_name": kind, "tool_name": "Bash", "prompt": "go on" });
        let mut stdin = child.stdin.take().context("no stdin")?;
        stdin.write_all(input.to_string().as_bytes()).await?;
        drop(stdin);
        let out = child.wait_with_output().await?;
        let elapsed = t.elapsed();
        if !out.status.success() {
            bail!(
                "mailslot hook {kind} failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok((elapsed, !out.stdout.is_empty()))
    };
    if !fresh {
        run(0).await?;
    }
    let mut samples = Vec::with_capacity(n as usize);
    for i in 0..n {
        let (elapsed, printed) = run(i).await?;
        if printed != fresh {
            bail!(
                "mailslot hook {kind} for session {:?} printed {}",
                session(i),
                if printed { "a digest" } else { "nothing" }
            );
        }
        samples.push(elapsed);
    }
    let total = samples.iter().sum();
    Ok(Summary::new(case, samples, total))
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
