//! `bench store`: durable inserts, and recall/search latency as the store grows.

use std::time::Instant;

use jiff::ToSpan;

use super::StoreArgs;
use super::corpus::{Rng, VOCABULARY, sentence, word};
use super::stats::{Summary, measure};
use crate::progress::Progress;
use crate::protocol::{Address, AgentName, Message, now_millis};
use crate::store::{Direction, MemoryDraft, Store, Trust};

const BATCH: usize = 100;
const LOAD_CHUNK: usize = 10_000;

pub(super) fn sample_message(rng: &mut Rng) -> Message {
    let from =
        Address::local(AgentName::new(&format!("peer{}", rng.below(50))).expect("valid name"));
    let me = Address::local(AgentName::new("bench").expect("valid name"));
    Message::new(from, vec![me], sentence(rng, 6), sentence(rng, 60))
}

pub(super) fn query(rng: &mut Rng) -> String {
    format!(
        "{} {}",
        word(rng.below(VOCABULARY)),
        word(rng.below(VOCABULARY))
    )
}

pub(super) fn run(args: &StoreArgs) -> anyhow::Result<Vec<Summary>> {
    let dir = tempfile::tempdir()?;
    let mut rng = Rng::new(42);
    let mut rows = Vec::new();

    let mut store = Store::open(&dir.path().join("inserts.db"))?;
    let n = args.inserts as usize;
    let messages: Vec<Message> = (0..n).map(|_| sample_message(&mut rng)).collect();
    rows.push(measure("insert message (own durable txn)", n, |i| {
        store.insert_message(&messages[i], Direction::In, Trust::Verified)?;
        Ok(())
    })?);

    let batches: Vec<Vec<Message>> = (0..n / BATCH)
        .map(|_| (0..BATCH).map(|_| sample_message(&mut rng)).collect())
        .collect();
    let mut batch_summary = measure(
        format!("insert batch of {BATCH} (ops/s = messages)"),
        batches.len(),
        |i| {
            let refs: Vec<_> = batches[i]
                .iter()
                .map(|m| (m, Direction::In, Trust::Verified))
                .collect();
            store.insert_messages(&refs)?;
            Ok(())
        },
    )?;
    batch_summary.ops_per_sec *= BATCH as f64;
    rows.push(batch_summary);

    let texts: Vec<String> = (0..n).map(|_| sentence(&mut rng, 40)).collect();
    rows.push(measure("remember (own durable txn)", n, |i| {
        store.remember(&texts[i], None, &[])?;
        Ok(())
    })?);

    for &size in &args.sizes {
        let size = size as usize;
        let mut store = Store::open(&dir.path().join(format!("size-{size}.db")))?;
        load(&mut store, size, &mut rng)?;
        let queries: Vec<String> = (0..args.queries).map(|_| query(&mut rng)).collect();
        rows.push(measure(
            format!("recall, 2 words, top 10 @ {size}"),
            queries.len(),
            |i| {
                store.recall(Some(&queries[i]), 10)?;
                Ok(())
            },
        )?);
        rows.push(measure(
            format!("recall, no query, recent 10 @ {size}"),
            queries.len(),
            |_| {
                store.recall(None, 10)?;
                Ok(())
            },
        )?);
        rows.push(measure(
            format!("search mail, 2 words, top 20 @ {size}"),
            queries.len(),
            |i| {
                store.search_messages(&queries[i], 20)?;
                Ok(())
            },
        )?);
    }
    Ok(rows)
}

/// Fills a store with `size` memories and `size` messages, spread over the last year.
fn load(store: &mut Store, size: usize, rng: &mut Rng) -> anyhow::Result<()> {
    let started = Instant::now();
    let bar = Progress::bar(size as u64, format!("loading {size} memories and messages"));
    let now = now_millis();
    let mut left = size;
    while left > 0 {
        bar.set((size - left) as u64);
        let chunk = left.min(LOAD_CHUNK);
        let drafts: Vec<MemoryDraft> = (0..chunk)
            .map(|_| MemoryDraft {
                text: sentence(rng, 40),
                title: Some(sentence(rng, 5)),
                tags: vec![word(rng.below(50))],
                at: now - (rng.below(365 * 24) as i64).hours(),
            })
            .collect();
        store.remember_all(&drafts)?;
        let messages: Vec<Message> = (0..chunk).map(|_| sample_message(rng)).collect();
        let refs: Vec<_> = messages
            .iter()
            .map(|m| (m, Direction::In, Trust::Verified))
            .collect();
        store.insert_messages(&refs)?;
        left -= chunk;
    }
    tracing::info!(size, elapsed = ?started.elapsed(), "loaded");
    Ok(())
}
