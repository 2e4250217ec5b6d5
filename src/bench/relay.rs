//! `bench relay`: a load generator against real relay processes on loopback: one node on
//! SQLite, several nodes sharing one PostgreSQL database (the agents spread over them, so
//! mail crosses nodes), two federated relays (the agents spread over them and addressed as
//! `name@relay`, so mail crosses the relay-to-relay link) beside one relay, or relays given by
//! URL. Messages are signed and sealed before the timed phase; receivers acknowledge without
//! opening them, so the figures are the relays'. Every message must arrive exactly once. CPU time is read from `/proc`: the relay nodes'
//! and, when it runs here, the PostgreSQL server's.

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use futures_util::{SinkExt, StreamExt};
use tokio_tungstenite::tungstenite::Message as WsMessage;

use super::RelayBenchArgs;
use super::group;
use super::postgres::{Cluster, ServerCpu};
use super::proc;
use super::stats::Summary;
use crate::client::RelayUrl;
use crate::crypto::sign::{Domain, signature};
use crate::crypto::{Identity, seal};
use crate::protocol::{
    Address, AgentName, ClientFrame, Limits, Message, MessageId, OwnerKey, RelayName, ServerFrame,
    hello_payload,
};
use crate::relay::storage::is_postgres_url;

/// Sends in flight per connection before waiting for answers.
const WINDOW: usize = 64;
/// Acknowledge after this many deliveries.
const ACK_EVERY: usize = 64;

/// What the relay nodes started here store their data in.
#[derive(Debug, Clone)]
pub(super) enum Backend {
    /// A SQLite database of each node's own, in a temp folder.
    Sqlite,
    /// One PostgreSQL database that every node shares, and the relay key file they all use.
    Postgres(String, PathBuf),
}

/// A relay process started here.
struct Node {
    child: Child,
    /// The SQLite database, its spool and the node's home.
    dir: tempfile::TempDir,
}

/// The relays under test: child processes started here, or relays already running elsewhere.
/// Agents are spread over them in turn.
pub(super) struct Relays {
    nodes: Vec<Node>,
    urls: Vec<RelayUrl>,
    /// The relays' names when they are federated (independent relays, each with its own
    /// database): agents are then addressed as `name@relay`, so mail between agents on
    /// different relays crosses the relay-to-relay link. Empty for one relay or one cluster.
    federation: Vec<RelayName>,
    /// Who the relays are, for the report: "1 node on SQLite", "2 nodes on PostgreSQL".
    what: String,
}

impl Relays {
    /// The relays given with `--url`, or `--nodes` fresh child processes on `backend`.
    fn for_args(args: &RelayBenchArgs, backend: &Backend) -> anyhow::Result<Self> {
        if !args.url.is_empty() {
            return Ok(Self {
                nodes: Vec::new(),
                urls: args.url.clone(),
                federation: Vec::new(),
                what: match args.url.len() {
                    1 => "the relay at --url".to_owned(),
                    n => format!("{n} relays given with --url"),
                },
            });
        }
        Self::start(args.nodes as usize, backend)
    }

    /// `count` fresh nodes on `backend`.
    fn start(count: usize, backend: &Backend) -> anyhow::Result<Self> {
        let mut nodes = Vec::with_capacity(count);
        let mut urls = Vec::with_capacity(count);
        for _ in 0..count {
            let (node, url) = Node::start(backend)?;
            nodes.push(node);
            urls.push(url);
        }
        let plural = if count == 1 { "" } else { "s" };
        let on = match backend {
            Backend::Sqlite => "SQLite",
            Backend::Postgres(..) => "PostgreSQL",
        };
        Ok(Self {
            nodes,
            urls,
            federation: Vec::new(),
            what: format!("{count} node{plural} on {on}"),
        })
    }

    /// Two independent relays on loopback, each on a SQLite database of its own. A loopback
    /// relay's name is the address it listens on, and loopback relays reach each other over
    /// plain WebSocket, once allowed to reach loopback (`allow_private_relays`, set for every
    /// benchmark relay).
    fn federated() -> anyhow::Result<Self> {
        let mut relays = Self::start(2, &Backend::Sqlite)?;
        relays.federation = relays
            .urls
            .iter()
            .map(|u| RelayName::new(u.authority()))
            .collect::<Result<_, _>>()?;
        relays.what = "2 federated relays on SQLite".to_owned();
        Ok(relays)
    }

    /// The relay agent number `i` connects to: agents are spread over the relays in turn, so
    /// in a ring every message crosses from one node to the next.
    pub(super) fn url(&self, i: usize) -> &RelayUrl {
        &self.urls[i % self.urls.len()]
    }

    /// The address of agent number `i`, called `name`: with its relay's name when the relays
    /// are federated (what its envelopes' `from` and its recipients' keys must say), bare
    /// otherwise.
    fn address(&self, i: usize, name: &AgentName) -> Address {
        match self.federation.get(i % self.urls.len()) {
            Some(relay) => Address::remote(name.clone(), relay.clone()),
            None => Address::local(name.clone()),
        }
    }

    /// CPU seconds (user + system) so far, summed over the nodes started here.
    fn cpu_seconds(&self) -> Cpu {
        self.nodes
            .iter()
            .map(Node::cpu_seconds)
            .fold(Cpu::default(), |a, b| a.plus(&b))
    }

    /// The nodes' SQLite write-ahead logs on disk now, in MiB; 0 on PostgreSQL.
    fn wal_mib(&self) -> f64 {
        self.nodes.iter().map(Node::wal_mib).sum()
    }

    /// Resident memory now and at peak, in MiB, summed over the nodes started here.
    fn rss_mib(&self) -> (f64, f64) {
        self.nodes
            .iter()
            .map(Node::rss_mib)
            .fold((0.0, 0.0), |a, b| (a.0 + b.0, a.1 + b.1))
    }
}

impl Node {
    /// Starts a relay on `backend`, with limits no benchmark trips, and returns its URL.
    fn start(backend: &Backend) -> anyhow::Result<(Self, RelayUrl)> {
        let dir = tempfile::tempdir()?;
        let config = dir.path().join("relay.toml");
        // Benchmarks must not trip the abuse limits; federated ones link on loopback.
        std::fs::write(
            &config,
            "send_rate = 1e9\nsend_burst = 1e9\nquota_messages = 100000000\nquota_bytes = 100000000000\nregistration_burst = 1e9\nmax_connections_per_ip = 1000000\nrelay_rate = 1e9\nrelay_burst = 1e9\nallow_private_relays = true\n",
        )?;
        let (db, key) = match backend {
            Backend::Sqlite => (dir.path().join("relay.db").into_os_string(), None),
            Backend::Postgres(url, key) => (url.into(), Some(key)),
        };
        let mut command = Command::new(std::env::current_exe()?);
        command
            .args(["relay", "--listen", "127.0.0.1:0", "--db"])
            .arg(db);
        if let Some(key) = key {
            command.arg("--identity").arg(key);
        }
        let mut child = command
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
            eprintln!("relay: {line}");
        };
        std::thread::spawn(move || {
            lines.for_each(|l| {
                if let Ok(l) = l {
                    eprintln!("relay: {l}")
                }
            })
        });
        Ok((Self { child, dir }, url))
    }

    /// CPU seconds of the whole relay and of its SQLite storage threads.
    fn cpu_seconds(&self) -> Cpu {
        let proc = format!("/proc/{}", self.child.id());
        let thread = |name: &str| {
            std::fs::read_dir(format!("{proc}/task"))
                .into_iter()
                .flatten()
                .flatten()
                .find(|t| {
                    std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.trim() == name)
                })
                .map_or(0.0, |t| proc::cpu_seconds(&t.path().join("stat")))
        };
        Cpu {
            total: proc::cpu_seconds(Path::new(&format!("{proc}/stat"))),
            writer: thread("relay-writer"),
            syncer: thread("relay-sync"),
        }
    }

    /// The SQLite write-ahead log on disk now, in MiB (0 when there is none).
    fn wal_mib(&self) -> f64 {
        std::fs::metadata(self.dir.path().join("relay.db-wal")).map_or(0.0, |m| m.len() as f64)
            / (1024.0 * 1024.0)
    }

    /// Resident memory now and at peak, in MiB.
    fn rss_mib(&self) -> (f64, f64) {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .unwrap_or_default();
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

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub(super) type Socket = crate::client::RelaySocket;

async fn login(url: &RelayUrl, name: &AgentName, identity: &Identity) -> anyhow::Result<Socket> {
    Ok(login_as(url, (name, identity), None).await?.0)
}

/// Logs `name` in (registering it, with `owner` as its owner key when given); the socket and
/// the challenge's relay id and nonce, which owner acts on it are signed over.
pub(super) async fn login_as(
    url: &RelayUrl,
    (name, identity): (&AgentName, &Identity),
    owner: Option<OwnerKey>,
) -> anyhow::Result<(Socket, String, Vec<u8>)> {
    let mut ws = crate::client::open_socket(url, None, None).await?;
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
        owner,
        invite: None,
    };
    ws.send(WsMessage::Text(serde_json::to_string(&hello)?.into()))
        .await?;
    let Some(Ok(WsMessage::Text(text))) = ws.next().await else {
        bail!("no welcome")
    };
    match serde_json::from_str(&text)? {
        ServerFrame::Welcome { .. } => Ok((ws, relay, nonce)),
        other => bail!("login refused: {other:?}"),
    }
}

/// Shared results of a run.
#[derive(Default)]
pub(super) struct Tally {
    pub(super) sent_at: HashMap<MessageId, Instant>,
    latencies: Vec<Duration>,
    pub(super) received: HashMap<MessageId, u32>,
    /// When each message's latest copy arrived (a group send's last member).
    pub(super) last: HashMap<MessageId, Instant>,
    accepted: usize,
}

/// Runs `f` on the tally; never holds the lock across an await.
pub(super) fn with<T>(tally: &Mutex<Tally>, f: impl FnOnce(&mut Tally) -> T) -> anyhow::Result<T> {
    let mut t = tally
        .lock()
        .map_err(|_| anyhow::anyhow!("a benchmark task panicked"))?;
    Ok(f(&mut t))
}

pub(super) struct Agent {
    pub(super) name: AgentName,
    pub(super) identity: Identity,
}

pub(super) fn agents(n: usize, prefix: &str) -> anyhow::Result<Vec<Agent>> {
    (0..n)
        .map(|i| {
            Ok(Agent {
                name: AgentName::new(&format!("{prefix}{i}"))?,
                identity: Identity::generate(),
            })
        })
        .collect()
}

/// Seals `count` messages of `size` bytes from `from` (at `from_addr`) to `to` (at
/// `to_addr`), as ready-to-send `send` frames.
fn envelopes(
    (from, from_addr): (&Agent, Address),
    (to, to_addr): (&Agent, Address),
    count: usize,
    size: usize,
) -> anyhow::Result<Vec<(MessageId, String)>> {
    let keys = [(to_addr.clone(), to.identity.public().clone())];
    (0..count)
        .map(|i| {
            let m = Message::new(
                from_addr.clone(),
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
                    group: None,
                })?,
            ))
        })
        .collect()
}

/// `make(0..n)`, spread over the machine's cores (sealing is the slow part of a benchmark's
/// setup), in order.
pub(super) fn on_every_core<T: Send>(
    n: usize,
    make: impl Fn(usize) -> anyhow::Result<T> + Sync,
) -> anyhow::Result<Vec<T>> {
    let threads = std::thread::available_parallelism().map_or(1, |c| c.get());
    let make = &make;
    let mut made: Vec<(usize, T)> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|t| {
                scope.spawn(move || {
                    (t..n)
                        .step_by(threads)
                        .map(|i| Ok((i, make(i)?)))
                        .collect::<anyhow::Result<Vec<_>>>()
                })
            })
            .collect();
        workers
            .into_iter()
            .try_fold(Vec::with_capacity(n), |mut all, w| {
                all.extend(
                    w.join()
                        .map_err(|_| anyhow::anyhow!("a sealing thread panicked"))??,
                );
                anyhow::Ok(all)
            })
    })?;
    made.sort_by_key(|(i, _)| *i);
    Ok(made.into_iter().map(|(_, t)| t).collect())
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
pub(super) async fn drive(
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
                            t.last.insert(id, now);
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
    if let Some(db) = &args.db
        && !is_postgres_url(db)
    {
        bail!(
            "--db takes a PostgreSQL URL (postgres://USER@HOST:PORT/DB); one node on SQLite is the default"
        );
    }
    // Started on this thread, which lasts as long as the benchmark (see `Cluster::start`);
    // dropped after everything that uses it. Each node takes up to 17 connections, and
    // `--idle` starts a second set of nodes beside the first.
    let cluster = if args.url.is_empty() && args.db.is_none() && (args.postgres || args.nodes > 1) {
        Some(Cluster::start(args.nodes * 2 * 20 + 10)?)
    } else {
        None
    };
    // Every node of one relay uses one key (its database refuses another).
    let keys = tempfile::tempdir()?;
    let key = args
        .identity
        .clone()
        .unwrap_or_else(|| keys.path().join("relay.key"));
    let backend = match (&args.db, &cluster) {
        (Some(url), _) => Backend::Postgres(url.clone(), key),
        (None, Some(cluster)) => Backend::Postgres(cluster.url(), key),
        (None, None) => Backend::Sqlite,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let postgres = match (&backend, args.url.is_empty()) {
            (Backend::Postgres(url, _), true) => ServerCpu::find(url).await,
            _ => None,
        };
        let run = Run {
            args,
            backend,
            postgres,
            tag: run_tag()?,
            flows: Default::default(),
        };
        if args.federated {
            return run.federated().await;
        }
        let mut rows = Vec::new();
        let relays = Relays::for_args(args, &run.backend)?;
        rows.extend(run.flow(&relays, args.rate, &first_run(args.rate)).await?);
        if let Some(members) = args.group {
            // Beside the plain sends just measured, on the same relays.
            let plain = rows[0].ops_per_sec;
            rows.extend(group::run(&relays, args, (members as usize, &run.tag), plain).await?);
        }
        if let Some(rate) = args.paced_rate {
            rows.extend(
                run.flow(&relays, Some(rate), &format!("paced at {rate}/s"))
                    .await?,
            );
        }
        if args.backlog > 0 {
            rows.extend(run.backlog(&relays).await?);
        }
        if args.idle > 0 {
            rows.push(run.idle(args.idle as usize).await?);
        }
        Ok(rows)
    })
}

/// What the first run is called: paced when `--rate` is given, else flat out.
fn first_run(rate: Option<u32>) -> String {
    match rate {
        Some(rate) => format!("paced at {rate}/s"),
        None => "flat out".to_owned(),
    }
}

/// A few random hex digits, new for each run, in every agent's name: a database kept from an
/// earlier run (`--db`, `--url`) holds that run's names, registered with other keys.
fn run_tag() -> anyhow::Result<String> {
    let mut raw = [0u8; 3];
    getrandom::fill(&mut raw).map_err(|e| anyhow::anyhow!("no randomness: {e}"))?;
    Ok(raw.iter().map(|b| format!("{b:02x}")).collect())
}

/// What every phase of a run needs.
struct Run<'a> {
    args: &'a RelayBenchArgs,
    backend: Backend,
    /// The PostgreSQL server's CPU time, when the nodes started here use a server on this
    /// machine.
    postgres: Option<ServerCpu>,
    /// See [`run_tag`].
    tag: String,
    /// Flows run so far: each one's agents are new, named after its number.
    flows: std::sync::atomic::AtomicU32,
}

impl Run<'_> {
    /// The same ring on one relay and on two federated relays, one right after the other:
    /// flat out (`--rounds` times), then (with `--paced-rate`) paced; each time the federated
    /// throughput as a share of the one relay's, and the median share of the rounds. Agents alternate between the federated relays, so each
    /// relay both sends over its link and takes the other's.
    async fn federated(&self) -> anyhow::Result<Vec<Summary>> {
        if !self.args.agents.is_multiple_of(2) {
            bail!(
                "--federated needs an even --agents (not {}): the agents alternate between the two relays, so in the ring every message crosses to the other one",
                self.args.agents
            );
        }
        let one = Relays::start(1, &Backend::Sqlite)?;
        let two = Relays::federated()?;
        let rounds = self.args.rounds as usize;
        let mut phases = vec![(self.args.rate, first_run(self.args.rate), rounds)];
        if let Some(rate) = self.args.paced_rate {
            phases.push((Some(rate), format!("paced at {rate}/s"), 1));
        }
        let mut rows = Vec::new();
        for (rate, label, rounds) in phases {
            let mut shares = Vec::with_capacity(rounds);
            for round in 1..=rounds {
                // Each round's agents are new (named after its label).
                let label = match rounds {
                    1 => label.clone(),
                    _ => format!("{label}, round {round} of {rounds}"),
                };
                let single = self.flow(&one, rate, &label).await?;
                let federated = self.flow(&two, rate, &label).await?;
                let share = federated[0].ops_per_sec / single[0].ops_per_sec * 100.0;
                eprintln!("{label}: federated {share:.0} % of one relay's delivered+acked/s");
                rows.extend(single);
                rows.extend(federated);
                shares.push(share);
            }
            shares.sort_by(f64::total_cmp);
            let median = shares[shares.len() / 2];
            let of = match rounds {
                1 => String::new(),
                _ => {
                    let (low, high) = (shares[0], shares[shares.len() - 1]);
                    eprintln!(
                        "{label}: federated {median:.0} % of one relay's delivered+acked/s (median of {rounds}; {low:.0}–{high:.0} %)"
                    );
                    format!(", median of {rounds}")
                }
            };
            rows.push(Summary::figure(
                format!("{label}: federated delivered+acked/s, share of one relay's{of}"),
                median,
                "%",
            ));
        }
        Ok(rows)
    }

    /// Each agent sends to the next one in a ring; all run at once.
    async fn flow(
        &self,
        relays: &Relays,
        rate: Option<u32>,
        label: &str,
    ) -> anyhow::Result<Vec<Summary>> {
        let args = self.args;
        let n = args.agents as usize;
        let per_agent = (args.messages as usize).div_ceil(n);
        let flow = self
            .flows
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let ring = agents(n, &format!("ring{flow}-{}-", self.tag))?;
        eprintln!("sealing {} messages of {} bytes…", per_agent * n, args.size);
        let addresses: Vec<_> = (0..n).map(|i| relays.address(i, &ring[i].name)).collect();
        let outgoing = on_every_core(n, |i| {
            let next = (i + 1) % n;
            envelopes(
                (&ring[i], addresses[i].clone()),
                (&ring[next], addresses[next].clone()),
                per_agent,
                args.size as usize,
            )
        })?;
        let mut sockets = Vec::with_capacity(n);
        for (i, a) in ring.iter().enumerate() {
            sockets.push(login(relays.url(i), &a.name, &a.identity).await?);
        }
        let pace = rate.map(|r| Duration::from_secs_f64(n as f64 / f64::from(r.max(1))));
        let tally = Arc::new(Mutex::new(Tally::default()));
        let cpu_before = relays.cpu_seconds();
        let postgres_before = self.postgres.as_ref().map(ServerCpu::seconds);
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
        let cpu_after = relays.cpu_seconds();
        let postgres_cpu = self
            .postgres
            .as_ref()
            .zip(postgres_before)
            .map(|(server, before)| server.seconds() - before);
        let spent = cpu_after.minus(&cpu_before);
        let cpu = spent.total;
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
        let per_message = |seconds: f64| seconds * 1e6 / total as f64;
        let (_, peak) = relays.rss_mib();
        let writer = match self.backend {
            Backend::Sqlite => format!(
                "; SQLite writer thread {:.2} s, its syncer {:.2} s",
                spent.writer, spent.syncer
            ),
            Backend::Postgres(..) => String::new(),
        };
        let postgres = postgres_cpu.map_or(String::new(), |s| {
            format!(
                ", PostgreSQL CPU {s:.2} s ({:.1} µs/message)",
                per_message(s)
            )
        });
        let wal = match relays.wal_mib() {
            0.0 => String::new(),
            mib => format!(", WAL {mib:.0} MiB"),
        };
        eprintln!(
            "{label}: {n} agents on {}, {total} × {} B: {:.0} accepted/s, {:.0} delivered+acked/s, relay CPU {cpu:.2} s ({:.1} µs/message{writer}){postgres}, relay peak RSS {peak:.0} MiB{wal}, all delivered exactly once",
            relays.what,
            args.size,
            tally.accepted as f64 / elapsed.as_secs_f64(),
            total as f64 / elapsed.as_secs_f64(),
            per_message(cpu),
        );
        let mut rows = vec![Summary::new(
            format!(
                "send→delivered, {label} ({n} agents, {}, ops/s = delivered+acked)",
                relays.what
            ),
            tally.latencies,
            elapsed,
        )];
        if !relays.nodes.is_empty() {
            rows.push(Summary::figure(
                format!("{label}: relay CPU per message, all of {}", relays.what),
                per_message(cpu),
                "µs",
            ));
        }
        if let Some(seconds) = postgres_cpu {
            rows.push(Summary::figure(
                format!("{label}: PostgreSQL CPU per message"),
                per_message(seconds),
                "µs",
            ));
        }
        Ok(rows)
    }

    /// One recipient offline with a deep queue: accept rate at the start and the end of
    /// filling it, then the drain rate. The senders are spread over the relays; the recipient
    /// is on the first.
    async fn backlog(&self, relays: &Relays) -> anyhow::Result<Vec<Summary>> {
        let args = self.args;
        let total = args.backlog as usize;
        let senders = agents(10, &format!("backlog-sender-{}-", self.tag))?;
        let sink = agents(1, &format!("backlog-sink-{}-", self.tag))?.remove(0);
        drop(login(relays.url(0), &sink.name, &sink.identity).await?);
        let per = total / senders.len();
        eprintln!("sealing {total} messages for the backlog…");
        let mut sockets = Vec::new();
        let mut outgoing = Vec::new();
        for (i, s) in senders.iter().enumerate() {
            outgoing.push(envelopes(
                (s, relays.address(i, &s.name)),
                (&sink, relays.address(0, &sink.name)),
                per,
                args.size as usize,
            )?);
            sockets.push(login(relays.url(i), &s.name, &s.identity).await?);
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
        let ws = login(relays.url(0), &sink.name, &sink.identity).await?;
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
        Ok(vec![
            Summary::figure(
                format!("fill a {total} backlog, first tenth"),
                first,
                "messages/s",
            ),
            Summary::figure(
                format!("fill a {total} backlog, last tenth"),
                last,
                "messages/s",
            ),
            Summary::figure(
                format!("drain a {total} backlog"),
                received as f64 / drained.as_secs_f64(),
                "messages/s",
            ),
        ])
    }

    /// Holds `count` authenticated idle connections, spread over fresh relays, and reports
    /// their memory (summed over the nodes).
    async fn idle(&self, count: usize) -> anyhow::Result<Summary> {
        let relays = Relays::for_args(self.args, &self.backend)?;
        let (before, _) = relays.rss_mib();
        let crowd = agents(count, &format!("idle-{}-", self.tag))?;
        let mut sockets = Vec::with_capacity(count);
        for (i, a) in crowd.iter().enumerate() {
            sockets.push(login(relays.url(i), &a.name, &a.identity).await?);
        }
        let (rss, peak) = relays.rss_mib();
        eprintln!(
            "{count} idle connections on {}: relay RSS {rss:.0} MiB (peak {peak:.0} MiB; {before:.0} MiB with none)",
            relays.what
        );
        drop(sockets);
        Ok(Summary::figure(
            format!("{count} idle connections: relay RSS ({})", relays.what),
            rss,
            "MiB",
        ))
    }
}

/// CPU seconds (user + system): a relay's in all, and of the two SQLite storage threads that
/// cannot spread over cores, the writer (`relay-writer`) and the syncer that flushes what it
/// wrote (`relay-sync`); those two are 0 on PostgreSQL, whose writer is a task.
#[derive(Default)]
struct Cpu {
    total: f64,
    writer: f64,
    syncer: f64,
}

impl Cpu {
    fn plus(&self, other: &Cpu) -> Cpu {
        Cpu {
            total: self.total + other.total,
            writer: self.writer + other.writer,
            syncer: self.syncer + other.syncer,
        }
    }

    fn minus(&self, earlier: &Cpu) -> Cpu {
        Cpu {
            total: self.total - earlier.total,
            writer: self.writer - earlier.writer,
            syncer: self.syncer - earlier.syncer,
        }
    }
}

fn raise_fd_limit() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    if let Ok((_, hard)) = getrlimit(Resource::RLIMIT_NOFILE) {
        let _ = setrlimit(Resource::RLIMIT_NOFILE, hard, hard);
    }
}
