//! `mailslot relay`: run a relay in the foreground until SIGINT or SIGTERM; `relay status`
//! and `relay stop` for the one this home runs in the background; `relay invite` for a relay
//! that registers by invite only.

use std::net::SocketAddr;
use std::path::PathBuf;

use serde::Serialize;

use super::local_relay::{self, RelayFiles};
use super::{Ctx, output};
use crate::relay::{Relay, RelayConfig, make_invites};

/// Flags for `mailslot relay`.
#[derive(Debug, clap::Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct RelayArgs {
    /// Manage the background relay instead of running one
    #[command(subcommand)]
    pub action: Option<RelayAction>,
    /// Address to listen on [default: 127.0.0.1:7878]
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<SocketAddr>,
    /// Database file [default: <home>/relay/relay.db]
    #[arg(long, value_name = "PATH")]
    pub db: Option<PathBuf>,
    /// Relay config file (TOML: limits, quotas, rates, TTL, policy)
    #[arg(long = "relay-config", value_name = "FILE")]
    pub relay_config: Option<PathBuf>,
    /// Log format on stderr
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

/// What to do with this home's background relay.
#[derive(Debug, clap::Subcommand)]
pub enum RelayAction {
    /// Show whether this home's relay runs, and where
    Status,
    /// Stop this home's relay (SIGTERM, waits for it to finish)
    Stop,
    /// Make single-use invites for a relay with `registration = "closed"` (prints them once;
    /// the relay keeps only their digests). Works beside a running relay.
    Invite {
        /// The relay's database [default: <home>/relay/relay.db]
        #[arg(long, value_name = "PATH")]
        db: Option<PathBuf>,
        /// How many
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=1000))]
        count: u32,
    },
}

/// How logs are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// One readable line per event.
    Text,
    /// One JSON object per event.
    Json,
}

#[derive(Serialize)]
struct Status {
    running: bool,
    pid: Option<i32>,
    url: Option<String>,
    db: String,
}

pub(super) fn run(ctx: &Ctx, args: RelayArgs) -> anyhow::Result<()> {
    let db = args.db.clone().unwrap_or_else(|| ctx.paths.relay_db());
    match args.action {
        Some(RelayAction::Status) => {
            let running = local_relay::status(&db);
            let status = Status {
                running: running.is_some(),
                pid: running.as_ref().map(|r| r.0),
                url: running.map(|r| r.1),
                db: db.display().to_string(),
            };
            output::emit(ctx.json, &status, |s| match (&s.url, s.pid) {
                (Some(url), Some(pid)) => {
                    format!("relay running: pid {pid}, {url}, database {}", s.db)
                }
                _ => format!("no relay running for {}", s.db),
            })
        }
        Some(RelayAction::Stop) => {
            match local_relay::stop(&db)? {
                Some(pid) => println!("stopped the relay (pid {pid})"),
                None => println!("no relay running for {}", db.display()),
            }
            Ok(())
        }
        Some(RelayAction::Invite { db: chosen, count }) => {
            invite(ctx, &chosen.unwrap_or(db), count)
        }
        None => serve(args, db),
    }
}

#[derive(Serialize)]
struct Invites {
    db: String,
    invites: Vec<String>,
}

fn invite(ctx: &Ctx, db: &std::path::Path, count: u32) -> anyhow::Result<()> {
    let tokens = make_invites(db, count)?;
    let report = Invites {
        db: db.display().to_string(),
        invites: tokens.iter().map(|t| t.expose().to_owned()).collect(),
    };
    output::emit(ctx.json, &report, |r| {
        format!(
            "{}\nEach invite registers one new agent, once: `mailslot --agent NAME register --invite TOKEN` (they are shown only now).",
            r.invites.join("\n")
        )
    })
}

fn serve(args: RelayArgs, db: PathBuf) -> anyhow::Result<()> {
    let mut config = match &args.relay_config {
        Some(path) => RelayConfig::load(path)?,
        None => RelayConfig::default(),
    };
    if let Some(listen) = args.listen {
        config.listen = listen;
    }
    let db = args.db.or(config.db.take()).unwrap_or(db);
    config.db = Some(db.clone());
    if let Some(dir) = db.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let files = RelayFiles::for_db(&db);
    let _lock = files.lock()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let relay = Relay::start(config).await?;
        std::fs::write(
            &files.pid,
            format!("{} {}\n", std::process::id(), relay.url()),
        )?;
        eprintln!(
            "mailslot relay {} listening on {} (database {})",
            relay.relay_id(),
            relay.url(),
            db.display()
        );
        wait_for_signal().await?;
        eprintln!("mailslot relay: shutting down");
        relay.shutdown().await;
        local_relay::remove_pid(&files);
        anyhow::Ok(())
    })
}

/// Returns on SIGINT or SIGTERM.
pub(super) async fn wait_for_signal() -> anyhow::Result<()> {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        r = tokio::signal::ctrl_c() => r?,
        _ = term.recv() => {}
    }
    Ok(())
}
