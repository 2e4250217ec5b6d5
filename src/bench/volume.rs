//! `bench mcp` at volume: `inbox` and `search` through a real `mailslot mcp` process whose
//! store was filled beforehand with thousands of unread messages (the case where tool calls
//! used to slow down).

use std::time::Instant;

use anyhow::bail;
use serde_json::json;

use super::corpus::Rng;
use super::stats::Summary;
use super::store::{query, sample_message};
use crate::agent::Agent;
use crate::client::RelayUrl;
use crate::config::Paths;
use crate::demo::driver::{Driver, Era};
use crate::progress::Progress;
use crate::protocol::{AgentName, Message};
use crate::store::{Direction, Trust};

/// Messages written per transaction while filling.
const LOAD_CHUNK: usize = 10_000;

/// Fills a new agent's store with `size` unread messages, starts its `mailslot mcp` and
/// measures `calls` calls each of `inbox` (limit 20) and `search` (two words, limit 20).
pub(super) async fn rows(
    exe: &std::path::Path,
    home: &std::path::Path,
    relay: &RelayUrl,
    size: u32,
    calls: u32,
) -> anyhow::Result<Vec<Summary>> {
    let name = format!("filled{size}");
    let paths = Paths::new(Some(home.to_owned()), None)?;
    let agent_name = AgentName::new(&name).map_err(anyhow::Error::msg)?;
    let filling = tokio::task::spawn_blocking(move || fill(&paths, &agent_name, size as usize));
    filling.await??;
    let agent = Driver::spawn(exe, home, &name, relay, Era::Legacy).await?;
    agent.wait_connected().await?;
    let mut queries = queries();
    let mut rows = Vec::new();
    for (case, tool) in [
        (
            format!("tool call: inbox, limit 20 @ {size} unread"),
            "inbox",
        ),
        (
            format!("tool call: search, 2 words, top 20 @ {size}"),
            "search",
        ),
    ] {
        let mut samples = Vec::with_capacity(calls as usize);
        let start = Instant::now();
        for _ in 0..calls {
            let args = match tool {
                "inbox" => json!({ "limit": 20 }),
                _ => json!({ "query": queries.next().unwrap_or_default(), "limit": 20 }),
            };
            let t = Instant::now();
            let result = agent.ok(tool, args).await?;
            samples.push(t.elapsed());
            if tool == "inbox" && result["messages"].as_array().map(Vec::len) != Some(20) {
                bail!("inbox over {size} unread messages did not list 20: {result}");
            }
        }
        rows.push(Summary::new(case, samples, start.elapsed()));
    }
    agent.close().await?;
    Ok(rows)
}

/// The messages of a store filled to `size`, the same in every run (`agent_mail.rs` fills its
/// peer with them too).
pub(super) fn corpus(size: usize) -> impl Iterator<Item = Message> {
    let mut rng = Rng::new(size as u64);
    std::iter::repeat_with(move || sample_message(&mut rng)).take(size)
}

/// The two-word queries `search` is measured with, the same in every run (and for the peer).
pub(super) fn queries() -> impl Iterator<Item = String> {
    let mut rng = Rng::new(7);
    std::iter::repeat_with(move || query(&mut rng))
}

/// Creates the agent and writes `size` received, unread messages to its store.
fn fill(paths: &Paths, name: &AgentName, size: usize) -> anyhow::Result<()> {
    let (mut agent, _) = Agent::open_or_create(paths, name)?;
    let bar = Progress::bar(size as u64, format!("filling a store with {size} messages"));
    let mut corpus = corpus(size);
    let mut left = size;
    while left > 0 {
        bar.set((size - left) as u64);
        let chunk = left.min(LOAD_CHUNK);
        let messages: Vec<Message> = corpus.by_ref().take(chunk).collect();
        let refs: Vec<_> = messages
            .iter()
            .map(|m| (m, Direction::In, Trust::Verified))
            .collect();
        agent.store.insert_messages(&refs)?;
        left -= chunk;
    }
    Ok(())
}
