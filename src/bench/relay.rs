//! `bench relay`: a load generator against a real relay process on loopback. Messages are
//! signed and sealed before the timed phase; receivers acknowledge without opening them, so
//! the figures are the relay's. Every message must arrive exactly once.

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use futures_util::{SinkExt, StreamExt};
use tokio_tungstenite::tungstenite::Message as WsMessage;

use super::RelayBenchArgs;
use super::stats::Summary;
use crate::client::RelayUrl;
use crate::crypto::sign::{Domain, signature};
use crate::crypto::{Identity, seal};
use crate::protocol::{
    Address, AgentName, ClientFrame, Limits, Message, MessageId, ServerFrame, hello_payload,
};

/// Sends in flight per connection before waiting for answers.
const WINDOW: usize = 64;
/// Acknowledge after this many deliveries.
const ACK_EVERY: usize = 64;

/// The relay under test: a child process started here, or one already running elsewhere.
struct RelayProcess {
    child: Option<Child>,
    url: RelayUrl,
    dir: Option<tempfile::TempDir>,
}

impl RelayProcess {
    /// The relay given with `--url`, or a fresh child process.
    fn for_args(args: &RelayBenchArgs) -> anyhow::Result<Self> {
        match &args.url {
            Some(url) => Ok(Self {
                child: None,
                url: url.clone(),
                dir: None,
            }),
            None => Self::start(),
        }
    }

    fn start() -> anyhow::Result<Self> {
        let dir = tempfile::tempdir()?;
        let config = dir.path().join("relay.toml");
        // Benchmarks must not trip the abuse limits.
        std::fs::write(
            &config,
            "send_rate = 1e9\nsend_burst = 1e9\nquota_messages = 100000000\nquota_bytes = 100000000000\nregistration_burst = 1e9\nmax_connections_per_ip = 1000000\n",
        )?;
        let mut child = Command::new(std::env::current_exe()?)
            .args(["relay", "--listen", "127.0.0.1:0", "--db"])
            .arg(dir.path().join("relay.db"))
            .arg("--relay-config")
            .arg(&config)
            .arg("--home")
            .arg(dir.path())
            .env("MAILSLOT_LOG", "warn")
            .stdin(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .context("starting the relay")?;
        let mut lines = BufReader::new(child.stderr.take().context("relay stderr")?).lines();
        let url = loop {
            let line = lines
                .next()
                .context("the relay exited before listening")??;
            if let Some((_, rest)) = line.split_once(" listening on ") {
                break rest
                    .split(' ')
                    .next()
                    .unwrap_or_default()
                    .parse()
                    .map_err(anyhow::Error::msg)?;
            }
        };
        std::thread::spawn(move || {
            lines.for_each(|l| {
                if let Ok(l) = l {
                    eprintln!("relay: {l}")
                }
            })
        });
        Ok(Self {
            child: Some(child),
            url,
            dir: Some(dir),
        })
    }

    /// CPU seconds (user + system) so far, of the whole relay and of its storage writer
    /// thread (the one part that cannot spread over cores); 0 for a relay not started here.
    fn cpu_seconds(&self) -> (f64, f64) {
        let Some(child) = &self.child else {
            return (0.0, 0.0);
        };
        let proc = format!("/proc/{}", child.id());
        let writer = std::fs::read_dir(format!("{proc}/task"))
            .into_iter()
            .flatten()
            .flatten()
            .find(|t| {
                std::fs::read_to_string(t.path().join("comm"))
                    .is_ok_and(|c| c.trim() == "relay-writer")
            })
            .map_or(0.0, |t| stat_cpu_seconds(&t.path().join("stat")));
        (stat_cpu_seconds(Path::new(&format!("{proc}/stat"))), writer)
    }

    /// The relay's write-ahead log on disk now, in MiB; 0 for a relay not started here.
    fn wal_mib(&self) -> f64 {
        self.dir.as_ref().map_or(0.0, |d| {
            std::fs::metadata(d.path().join("relay.db-wal")).map_or(0.0, |m| m.len() as f64)
                / (1024.0 * 1024.0)
        })
    }

    /// Resident memory now and at peak, in MiB; 0 for a relay not started here.
    fn rss_mib(&self) -> (f64, f64) {
        let Some(child) = &self.child else {
            return (0.0, 0.0);
        };
        let status =
            std::fs::read_to_string(format!("/proc/{}/status", child.id())).unwrap_or_default();
        let kib = |key: &str| {
            status
                .lines()
                .find(|l| l.starts_with(key))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse::<f64>().ok())
                .unwrap_or(0.0)
        };
        (kib("VmRSS:") / 1024.0, kib("VmHWM:") / 1024.0)
    }
}

/// User + system CPU seconds in a `/proc` stat file; 0 when it cannot be read.
fn stat_cpu_seconds(path: &Path) -> f64 {
    let stat = std::fs::read_to_string(path).unwrap_or_default();
    let fields: Vec<&str> = stat
        .rsplit_once(") ")
        .map(|(_, r)| r.split(' ').collect())
        .unwrap_or_default();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // utime and stime are fields 14 and 15 of the whole line: 11 and 12 after the name, in
    // clock ticks, which Linux reports at USER_HZ = 100 a second.
    (ticks(11) + ticks(12)) / 100.0
}

impl Drop for RelayProcess {
    fn drop(&mut self) {
        if let Some(child) = &mut self.child {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

type Socket = crate::client::RelaySocket;

async fn login(url: &RelayUrl, name: &AgentName, identity: &Identity) -> anyhow::Result<Socket> {
    let mut ws = crate::client::open_socket(url, None).await?;
    let Some(Ok(WsMessage::Text(text))) = ws.next().await else {
        bail!("no challenge")
    };
    let ServerFrame::Challenge { relay, nonce, .. } = serde_json::from_str(&text)? else {
        bail!("not a challenge")
    };
    let hello = ClientFrame::Hello {
        agent: name.clone(),
        signature: signature(identity, Domain::Hello, &hello_payload(&relay, &nonce)).to_vec(),
        register: Some(identity.public().to_keys()),
        control: false,
        owner: None,
        invite: None,
    };
    ws.send(WsMessage::Text(serde_json::to_string(&hello)?.into()))
        .await?;
    let Some(Ok(WsMessage::Text(text))) = ws.next().await else {
        bail!("no welcome")
    };
    match serde_json::from_str(&text)? {
        ServerFrame::Welcome { .. } => Ok(ws),
        other => bail!("login refused: {other:?}"),
    }
}

/// Shared results of a run.
#[derive(Default)]
struct Tally {
    sent_at: HashMap<MessageId, Instant>,
    latencies: Vec<Duration>,
    received: HashMap<MessageId, u32>,
    accepted: usize,
}

/// Runs `f` on the tally; never holds the lock across an await.
fn with<T>(tally: &Mutex<Tally>, f: impl FnOnce(&mut Tally) -> T) -> anyhow::Result<T> {
    let mut t = tally
        .lock()
        .map_err(|_| anyhow::anyhow!("a benchmark task panicked"))?;
    Ok(f(&mut t))
}

struct Agent {
    name: AgentName,
    identity: Identity,
}

fn agents(n: usize, prefix: &str) -> anyhow::Result<Vec<Agent>> {
    (0..n)
        .map(|i| {
            Ok(Agent {
                name: AgentName::new(&format!("{prefix}{i}"))?,
                identity: Identity::generate(),
            })
        })
        .collect()
}

/// Seals `count` messages of `size` bytes from `from` to `to`, as ready-to-send `send` frames.
fn envelopes(
    from: &Agent,
    to: &Agent,
    count: usize,
    size: usize,
) -> anyhow::Result<Vec<(MessageId, String)>> {
    let to_addr = Address::local(to.name.clone());
    let keys = [(to_addr.clone(), to.identity.public().clone())];
    (0..count)
        .map(|i| {
            let m = Message::new(
                Address::local(from.name.clone()),
                vec![to_addr.clone()],
                "bench",
                "x".repeat(size),
            );
            let envelope = seal(&m, &from.identity, &keys, &Limits::default())?.remove(0);
            Ok((
                m.id,
                serde_json::to_string(&ClientFrame::Send {
                    reference: i.to_string(),
                    envelope,
                })?,
            ))
        })
        .collect()
}

/// Just what the generator needs from a relay frame; the envelope's bulk is skipped unparsed.
#[derive(serde::Deserialize)]
struct Incoming {
    #[serde(rename = "type")]
    kind: String,
    seq: Option<u64>,
    envelope: Option<EnvelopeId>,
    code: Option<String>,
    message: Option<String>,
}

#[derive(serde::Deserialize)]
struct EnvelopeId {
    id: MessageId,
}

/// One agent's connection: sends its envelopes (paced or flat out, at most `WINDOW` in flight)
/// and takes delivery of what others send it, acknowledging as it goes.
async fn drive(
    mut ws: Socket,
    outgoing: Vec<(MessageId, String)>,
    expected_in: usize,
    pace: Option<(Duration, Duration)>,
    tally: Arc<Mutex<Tally>>,
) -> anyhow::Result<()> {
    let total_out = outgoing.len();
    let mut queue = outgoing.into_iter();
    let (mut in_flight, mut answered, mut got, mut unacked) = (0usize, 0usize, 0usize, 0usize);
    let mut last_seq = 0;
    // Each agent's ticks are offset so the offered load is spread evenly, not sent in bursts.
    let mut ticker = pace.map(|(every, offset)| {
        tokio::time::interval_at(tokio::time::Instant::now() + offset, every)
    });
    loop {
        if answered == total_out && got == expected_in {
            if unacked > 0 {
                ws.send(WsMessage::Text(
                    serde_json::to_string(&ClientFrame::Ack { seq: last_seq })?.into(),
                ))
                .await?;
            }
            return Ok(());
        }
        let may_send = in_flight < WINDOW && answered + in_flight < total_out;
        let tick = async {
            match ticker.as_mut() {
                Some(t) => {
                    t.tick().await;
                }
                None => std::future::ready(()).await,
            }
        };
        tokio::select! {
            biased;
            frame = ws.next() => {
                let text = match frame {
                    Some(Ok(WsMessage::Text(text))) => text,
                    Some(Ok(WsMessage::Ping(_) | WsMessage::Pong(_))) => continue,
                    other => bail!("the relay closed the connection: {other:?}"),
                };
                let frame: Incoming = serde_json::from_str(&text)?;
                match (frame.kind.as_str(), frame.seq, frame.envelope) {
                    ("sent", _, _) => {
                        in_flight -= 1;
                        answered += 1;
                        with(&tally, |t| t.accepted += 1)?;
                    }
                    ("deliver", Some(seq), Some(EnvelopeId { id })) => {
                        let now = Instant::now();
                        with(&tally, |t| {
                            if let Some(sent) = t.sent_at.get(&id).copied() {
                                t.latencies.push(now - sent);
                            }
                            *t.received.entry(id).or_insert(0) += 1;
                        })?;
                        got += 1;
                        last_seq = seq;
                        unacked += 1;
                        if unacked >= ACK_EVERY {
                            ws.send(WsMessage::Text(serde_json::to_string(&ClientFrame::Ack { seq })?.into())).await?;
                            unacked = 0;
                        }
                    }
                    ("error", _, _) => bail!("relay refused: {}: {}", frame.code.unwrap_or_default(), frame.message.unwrap_or_default()),
                    _ => {}
                }
            }
            _ = tick, if may_send => {
                // Paced: one send per tick. Flat out: fill the window, then one flush, as a
                // client with a full outbox would.
                let batch = if ticker.is_some() { 1 } else { WINDOW - in_flight };
                for (id, text) in queue.by_ref().take(batch) {
                    with(&tally, |t| t.sent_at.insert(id, Instant::now()))?;
                    ws.feed(WsMessage::Text(text.into())).await?;
                    in_flight += 1;
                }
                ws.flush().await?;
            }
        }
    }
}

pub(super) fn run(args: &RelayBenchArgs) -> anyhow::Result<Vec<Summary>> {
    raise_fd_limit();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let mut rows = Vec::new();
        let relay = RelayProcess::for_args(args)?;
        rows.extend(flow(&relay, args, args.rate, "flat out").await?);
        if let Some(rate) = args.paced_rate {
            rows.extend(flow(&relay, args, Some(rate), &format!("paced at {rate}/s")).await?);
        }
        if args.backlog > 0 {
            rows.extend(backlog(&relay, args).await?);
        }
        if args.idle > 0 {
            rows.push(idle(args, args.idle as usize).await?);
        }
        Ok(rows)
    })
}

/// Each agent sends to the next one in a ring; all run at once.
async fn flow(
    relay: &RelayProcess,
    args: &RelayBenchArgs,
    rate: Option<u32>,
    label: &str,
) -> anyhow::Result<Vec<Summary>> {
    let n = args.agents as usize;
    let per_agent = (args.messages as usize).div_ceil(n);
    let ring = agents(n, &format!("ring{}-", label.len()))?;
    eprintln!("sealing {} messages of {} bytes…", per_agent * n, args.size);
    let mut outgoing = Vec::with_capacity(n);
    for (i, a) in ring.iter().enumerate() {
        outgoing.push(envelopes(
            a,
            &ring[(i + 1) % n],
            per_agent,
            args.size as usize,
        )?);
    }
    let mut sockets = Vec::with_capacity(n);
    for a in &ring {
        sockets.push(login(&relay.url, &a.name, &a.identity).await?);
    }
    let pace = rate.map(|r| Duration::from_secs_f64(n as f64 / f64::from(r.max(1))));
    let tally = Arc::new(Mutex::new(Tally::default()));
    let cpu_before = relay.cpu_seconds();
    let started = Instant::now();
    let tasks: Vec<_> = sockets
        .into_iter()
        .zip(outgoing)
        .enumerate()
        .map(|(i, (ws, out))| {
            let pace = pace.map(|every| (every, every.mul_f64(i as f64 / n as f64)));
            tokio::spawn(drive(ws, out, per_agent, pace, tally.clone()))
        })
        .collect();
    for t in tasks {
        t.await??;
    }
    let elapsed = started.elapsed();
    let cpu_after = relay.cpu_seconds();
    let (cpu, writer_cpu) = (cpu_after.0 - cpu_before.0, cpu_after.1 - cpu_before.1);
    let tally = Arc::try_unwrap(tally)
        .map_err(|_| anyhow::anyhow!("tasks still hold results"))?
        .into_inner()
        .map_err(|_| anyhow::anyhow!("poisoned"))?;
    let total = per_agent * n;
    let duplicates = tally.received.values().filter(|c| **c > 1).count();
    if tally.received.len() != total || duplicates > 0 {
        bail!(
            "exactly-once violated: {} of {total} arrived, {duplicates} more than once",
            tally.received.len()
        );
    }
    let (_, peak) = relay.rss_mib();
    eprintln!(
        "{label}: {n} agents, {total} × {} B: {:.0} accepted/s, {:.0} delivered+acked/s, relay CPU {cpu:.2} s ({:.1} µs/message; writer thread {writer_cpu:.2} s), relay peak RSS {peak:.0} MiB, WAL {:.0} MiB, all delivered exactly once",
        args.size,
        tally.accepted as f64 / elapsed.as_secs_f64(),
        total as f64 / elapsed.as_secs_f64(),
        cpu * 1e6 / total as f64,
        relay.wal_mib(),
    );
    Ok(vec![Summary::new(
        format!("send→delivered, {label} ({n} agents, ops/s = delivered+acked)"),
        tally.latencies,
        elapsed,
    )])
}

/// One recipient offline with a deep queue: accept rate at the start and the end of filling
/// it, then the drain rate.
async fn backlog(relay: &RelayProcess, args: &RelayBenchArgs) -> anyhow::Result<Vec<Summary>> {
    let total = args.backlog as usize;
    let senders = agents(10, "backlog-sender-")?;
    let sink = agents(1, "backlog-sink-")?.remove(0);
    drop(login(&relay.url, &sink.name, &sink.identity).await?);
    let per = total / senders.len();
    eprintln!("sealing {total} messages for the backlog…");
    let mut sockets = Vec::new();
    let mut outgoing = Vec::new();
    for s in &senders {
        outgoing.push(envelopes(s, &sink, per, args.size as usize)?);
        sockets.push(login(&relay.url, &s.name, &s.identity).await?);
    }
    let tally = Arc::new(Mutex::new(Tally::default()));
    let started = Instant::now();
    let tasks: Vec<_> = sockets
        .into_iter()
        .zip(outgoing)
        .map(|(ws, out)| tokio::spawn(drive(ws, out, 0, None, tally.clone())))
        .collect();
    for t in tasks {
        t.await??;
    }
    let fill = started.elapsed();
    let mut sent_at: Vec<Instant> = with(&tally, |t| t.sent_at.values().copied().collect())?;
    sent_at.sort();
    // Accept rate over the first and the last tenth of the fill.
    let tenth = sent_at.len() / 10;
    let rate = |a: Instant, b: Instant| tenth as f64 / (b - a).as_secs_f64().max(1e-9);
    let first = rate(sent_at[0], sent_at[tenth]);
    let last = rate(
        sent_at[sent_at.len() - 1 - tenth],
        sent_at[sent_at.len() - 1],
    );
    eprintln!(
        "backlog of {total}: accepted {first:.0}/s in the first tenth, {last:.0}/s in the last (filled in {:.1} s)",
        fill.as_secs_f64()
    );
    let ws = login(&relay.url, &sink.name, &sink.identity).await?;
    let drain_tally = Arc::new(Mutex::new(Tally::default()));
    let started = Instant::now();
    drive(
        ws,
        Vec::new(),
        per * senders.len(),
        None,
        drain_tally.clone(),
    )
    .await?;
    let drained = started.elapsed();
    let received = with(&drain_tally, |t| t.received.len())?;
    eprintln!(
        "drained {received} in {:.1} s: {:.0} delivered+acked/s",
        drained.as_secs_f64(),
        received as f64 / drained.as_secs_f64()
    );
    let mut fill_row = Summary::new(
        format!("fill a {total} backlog (first tenth ops/s)"),
        Vec::new(),
        Duration::ZERO,
    );
    fill_row.ops_per_sec = first;
    let mut last_row = Summary::new(
        format!("fill a {total} backlog (last tenth ops/s)"),
        Vec::new(),
        Duration::ZERO,
    );
    last_row.ops_per_sec = last;
    let mut drain_row = Summary::new(
        format!("drain a {total} backlog"),
        Vec::new(),
        Duration::ZERO,
    );
    drain_row.ops_per_sec = received as f64 / drained.as_secs_f64();
    Ok(vec![fill_row, last_row, drain_row])
}

/// Holds `count` authenticated idle connections and reports the relay's memory.
async fn idle(args: &RelayBenchArgs, count: usize) -> anyhow::Result<Summary> {
    let relay = RelayProcess::for_args(args)?;
    let (before, _) = relay.rss_mib();
    let crowd = agents(count, "idle-")?;
    let mut sockets = Vec::with_capacity(count);
    for a in &crowd {
        sockets.push(login(&relay.url, &a.name, &a.identity).await?);
    }
    let (rss, peak) = relay.rss_mib();
    eprintln!(
        "{count} idle connections: relay RSS {rss:.0} MiB (peak {peak:.0} MiB; {before:.0} MiB with none)"
    );
    let mut row = Summary::new(
        format!("{count} idle connections: relay RSS MiB in ops/s column"),
        Vec::new(),
        Duration::ZERO,
    );
    row.ops_per_sec = rss;
    drop(sockets);
    Ok(row)
}

fn raise_fd_limit() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    if let Ok((_, hard)) = getrlimit(Resource::RLIMIT_NOFILE) {
        let _ = setrlimit(Resource::RLIMIT_NOFILE, hard, hard);
    }
}
