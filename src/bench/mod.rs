//! `mailslot bench`: measurements reported as medians and percentiles, never asserted.

mod agent_mail;
mod claude_code;
mod corpus;
mod crypto;
mod group;
mod mcp;
pub mod postgres;
mod proc;
mod relay;
mod stats;
mod store;
mod volume;

use clap::{Args, Subcommand};

use crate::output::outln;

pub use stats::Summary;

/// What to measure.
#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Store: insert, remember, recall and search at several sizes (in a temp folder)
    Store(StoreArgs),
    /// Crypto: seal+sign and open+verify a message to 1 and 5 recipients
    Crypto(CryptoArgs),
    /// Relay: throughput, latency, CPU and memory of a real relay process on loopback
    Relay(RelayBenchArgs),
    /// MCP: tool calls and send -> doorbell latency through two real `mailslot mcp` processes
    Mcp(McpBenchArgs),
}

/// Options for `bench mcp`.
#[derive(Debug, Args)]
pub struct McpBenchArgs {
    /// Messages sent one after another (each waits for the recipient's doorbell)
    #[arg(long, default_value_t = 300, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub messages: u32,
    /// Calls per measured tool
    #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub calls: u32,
    /// Server starts and exits measured
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..=1_000))]
    pub starts: u32,
    /// Body bytes per message
    #[arg(long, default_value_t = 1024, value_parser = clap::value_parser!(u32).range(1..=60_000))]
    pub size: u32,
    /// Messages sent with one attachment of --attachment-mib each (0: none)
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(0..=1_000))]
    pub attachments: u32,
    /// The attachment's size in MiB
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=8))]
    pub attachment_mib: u32,
    /// Also measure `inbox` and `search` (as many calls each as --calls) for an agent whose
    /// store holds this many unread messages; one agent per size, comma-separated
    #[arg(long, value_delimiter = ',', default_value = "10000", value_parser = clap::value_parser!(u32).range(20..=1_000_000))]
    pub store_sizes: Vec<u32>,
    /// Also measure mcp_agent_mail at each --store-sizes, through the same client over the
    /// same messages and queries: its `search_messages` and its floor (`health_check`). PYTHON
    /// is an interpreter with the `mcp_agent_mail` package installed
    #[arg(long, value_name = "PYTHON")]
    pub agent_mail: Option<std::path::PathBuf>,
    /// Also measure the paths that wake an idle session (inbox socket, rewake hook, channel)
    /// through this real Claude Code binary (run interactively in tmux against a loopback
    /// stand-in for its model API), and mailslot's share of the socket path
    #[arg(long, value_name = "PATH")]
    pub claude_code: Option<std::path::PathBuf>,
    /// The tmux binary for --claude-code
    #[arg(long, value_name = "PATH", default_value = "tmux")]
    pub tmux: std::path::PathBuf,
    /// Messages sent through Claude Code on each path, one at a time
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..=1_000))]
    pub channel_messages: u32,
}

/// Options for `bench relay`.
#[derive(Debug, Args)]
pub struct RelayBenchArgs {
    /// Connected agents; each sends to the next in a ring
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(2..=10_000))]
    pub agents: u32,
    /// Messages in the flat-out run
    #[arg(long, default_value_t = 20_000, value_parser = clap::value_parser!(u32).range(1..=10_000_000))]
    pub messages: u32,
    /// Body bytes per message
    #[arg(long, default_value_t = 1024, value_parser = clap::value_parser!(u32).range(1..=60_000))]
    pub size: u32,
    /// Offered load for the first run, messages per second [default: flat out]
    #[arg(long)]
    pub rate: Option<u32>,
    /// Also run at this offered load, messages per second
    #[arg(long, value_name = "MSGS_PER_SEC")]
    pub paced_rate: Option<u32>,
    /// Also fill one offline recipient's queue with this many messages, then drain it
    #[arg(long, default_value_t = 0)]
    pub backlog: u32,
    /// Target this running relay instead of starting one; give it once per node to spread the
    /// agents over several in turn (their rate limits and quotas must allow the load). Relay
    /// CPU and memory are then not reported
    #[arg(long, value_name = "URL", conflicts_with_all = ["nodes", "db", "postgres"])]
    pub url: Vec<crate::client::RelayUrl>,
    /// Relay nodes to start, the agents spread over them in turn (so in the ring every message
    /// crosses to another node); more than one runs on PostgreSQL
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=16))]
    pub nodes: u32,
    /// The nodes' shared database, postgres://USER@HOST:PORT/DB (its tables stay; each run
    /// registers new agents) [default: one node on SQLite; several on a throwaway PostgreSQL
    /// cluster]
    #[arg(long, value_name = "URL")]
    pub db: Option<String>,
    /// The relay key file every node on --db uses: the database records its relay's key at the
    /// first start and refuses nodes with another, so a later run on the same database needs
    /// the same file [default: a new key in a temp folder]
    #[arg(long, value_name = "FILE", requires = "db")]
    pub identity: Option<std::path::PathBuf>,
    /// Run the nodes on a throwaway PostgreSQL cluster, even one node: `initdb` in a temp
    /// folder (PostgreSQL's binaries on PATH or under /usr/lib/postgresql), a free loopback
    /// port, fsync and synchronous_commit on; removed at the end
    #[arg(long, conflicts_with = "db")]
    pub postgres: bool,
    /// Also hold this many idle authenticated connections and report relay memory
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=19_000))]
    pub idle: u32,
    /// Measure two federated relays (each on SQLite, agents alternating between them, so in
    /// the ring every message crosses the relay-to-relay link, both ways) beside the same load
    /// on one relay, in the same run; needs an even --agents
    #[arg(long, conflicts_with_all = ["url", "nodes", "db", "postgres", "backlog", "idle"])]
    pub federated: bool,
    /// With --federated: flat-out rounds, one relay then two in each; the share reported is
    /// the median of the rounds' (a shared machine's noise moves single runs by a third)
    #[arg(long, default_value_t = 3, requires = "federated", value_parser = clap::value_parser!(u32).range(1..=20))]
    pub rounds: u32,
    /// Also send to a group of this many members on the first relay, after the plain sends:
    /// send → last member delivered, and member copies/s beside the plain sends' rate (the
    /// group gets --messages / N messages, so about as many copies)
    #[arg(long, value_name = "N", conflicts_with = "federated", value_parser = clap::value_parser!(u32).range(2..=256))]
    pub group: Option<u32>,
}

/// Options for `bench store`.
#[derive(Debug, Args)]
pub struct StoreArgs {
    /// Store sizes to measure recall and search at
    #[arg(long, value_delimiter = ',', default_value = "1000,10000,100000")]
    pub sizes: Vec<u32>,
    /// Queries per size
    #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(u32).range(10..=100_000))]
    pub queries: u32,
    /// Single inserts (each its own durable transaction)
    #[arg(long, default_value_t = 2000, value_parser = clap::value_parser!(u32).range(10..=100_000))]
    pub inserts: u32,
}

/// Options for `bench crypto`.
#[derive(Debug, Args)]
pub struct CryptoArgs {
    /// Operations per case
    #[arg(long, default_value_t = 2000, value_parser = clap::value_parser!(u32).range(10..=1_000_000))]
    pub iterations: u32,
    /// Body size in bytes
    #[arg(long, default_value_t = 1024, value_parser = clap::value_parser!(u32).range(1..=65_536))]
    pub body_bytes: u32,
}

/// Runs a benchmark and prints its report.
pub fn run(cmd: BenchCommand, json: bool) -> anyhow::Result<()> {
    let rows = match cmd {
        BenchCommand::Store(args) => store::run(&args)?,
        BenchCommand::Crypto(args) => crypto::run(&args)?,
        BenchCommand::Relay(args) => relay::run(&args)?,
        BenchCommand::Mcp(args) => mcp::run(&args)?,
    };
    if json {
        outln!("{}", serde_json::to_string_pretty(&rows)?)?;
    } else {
        outln!("{}", stats::table(&rows))?;
        outln!("\nmachine: {}", stats::machine())?;
    }
    Ok(())
}
