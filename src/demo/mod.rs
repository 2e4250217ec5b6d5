//! `mailslot demo`: the real thing, end to end, in a temporary folder. It starts an embedded
//! relay on a free loopback port and two real `mailslot mcp` processes (alice and bob),
//! drives both with rmcp's client, and shows a message, bob's doorbell (resource update and
//! channel event with the framed text), bob's reply and alice's doorbell, with the measured
//! latencies. Then it cleans up.

pub mod driver;

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context;
use serde_json::{Value, json};

use crate::client::RelayUrl;
use crate::output::outln;
use crate::relay::{Relay, RelayConfig};
use driver::{Driver, Era, Pushed};

/// Runs the demo, printing as it goes.
pub async fn run() -> anyhow::Result<()> {
    let exe = std::env::current_exe().context("finding the mailslot binary")?;
    let home = tempfile::Builder::new()
        .prefix("mailslot-demo-")
        .tempdir()
        .context("making a temporary folder")?;
    let relay = Relay::start(RelayConfig {
        listen: "127.0.0.1:0".parse().expect("a valid address"),
        db: Some(home.path().join("relay.db")),
        ..RelayConfig::default()
    })
    .await
    .context("starting the embedded relay")?;
    let url: RelayUrl = relay.url().parse().map_err(anyhow::Error::msg)?;
    outln!("mailslot demo: two agents, a real relay, real MCP servers\n")?;
    outln!(
        "relay   {url} (embedded; data in {})",
        home.path().display()
    )?;

    let result = conversation(&exe, home.path(), &url).await;
    relay.shutdown().await;
    let cleaned = home.close();
    result?;
    cleaned.context("removing the temporary folder")?;
    outln!(
        "\ncleaned up: both MCP servers exited, the relay stopped, the temporary folder is gone."
    )?;
    Ok(())
}

async fn conversation(exe: &Path, home: &Path, url: &RelayUrl) -> anyhow::Result<()> {
    let alice = Driver::spawn(exe, home, "alice", url, Era::Legacy).await?;
    let mut bob = Driver::spawn(exe, home, "bob", url, Era::Legacy).await?;
    for (name, agent) in [("alice", &alice), ("bob", &bob)] {
        let identity = agent.wait_connected().await?;
        let fingerprint = identity["fingerprint"].as_str().unwrap_or("?").to_owned();
        outln!("{name:<7} mailslot mcp --agent {name}  (fingerprint {fingerprint})")?;
    }
    #[allow(deprecated)]
    bob.client
        .subscribe(rmcp::model::SubscribeRequestParams::new(crate::mcp::INBOX))
        .await?;
    outln!("        bob's client subscribed to {}", crate::mcp::INBOX)?;

    let body = "Is the release build green? Reply with the failing tests, if any.";
    outln!("\n1. alice calls the send tool: to bob, subject \"Build status?\"")?;
    let start = Instant::now();
    let sent = alice
        .ok(
            "send",
            json!({ "to": ["bob"], "subject": "Build status?", "body": body }),
        )
        .await?;
    let answered = start.elapsed();
    outln!(
        "   -> {} in {} ({})",
        sent["status"].as_str().unwrap_or("?"),
        ms(answered),
        sent["detail"].as_str().unwrap_or("")
    )?;

    outln!("\n2. bob's doorbell rings")?;
    bob.wait_for(|p| matches!(p, Pushed::Updated(uri) if uri == crate::mcp::INBOX).then_some(()))
        .await?;
    let updated = start.elapsed();
    outln!(
        "   notifications/resources/updated {}   {} after the send began",
        crate::mcp::INBOX,
        ms(updated)
    )?;
    let event = bob.channel_event().await?;
    let rang = start.elapsed();
    outln!(
        "   notifications/claude/channel                      {} after the send began",
        ms(rang)
    )?;
    show_event(&event)?;

    outln!("\n3. bob calls the reply tool")?;
    let reply_start = Instant::now();
    let mut alice = alice;
    let replied = bob
        .ok(
            "reply",
            json!({ "message_id": event["meta"]["message_id"], "body": "Green, except test_upload_resume (flaky, retried twice)." }),
        )
        .await?;
    outln!(
        "   -> {} in {}",
        replied["status"].as_str().unwrap_or("?"),
        ms(reply_start.elapsed())
    )?;

    outln!("\n4. alice's doorbell rings")?;
    let back = alice.channel_event().await?;
    let back_at = reply_start.elapsed();
    outln!(
        "   notifications/claude/channel                      {} after the reply began",
        ms(back_at)
    )?;
    show_event(&back)?;

    outln!("\nlatencies (this machine, one run):")?;
    outln!(
        "   send tool call answered (relay accepted)     {}",
        ms(answered)
    )?;
    outln!(
        "   send -> bob's resource update                {}",
        ms(updated)
    )?;
    outln!(
        "   send -> bob's channel event                  {}",
        ms(rang)
    )?;
    outln!(
        "   reply -> alice's channel event               {}",
        ms(back_at)
    )?;
    alice.close().await?;
    bob.close().await?;
    Ok(())
}

fn show_event(event: &Value) -> anyhow::Result<()> {
    outln!("   meta: {}", event["meta"])?;
    outln!("   content (what the model sees):")?;
    for line in event["content"].as_str().unwrap_or_default().lines() {
        outln!("   | {line}")?;
    }
    Ok(())
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1e3)
}
