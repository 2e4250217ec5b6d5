//! `mailslot relay`: run a relay in the foreground until SIGINT or SIGTERM.

use std::net::SocketAddr;
use std::path::PathBuf;

use super::Ctx;
use crate::relay::{Relay, RelayConfig};

/// Flags for `mailslot relay`.
#[derive(Debug, clap::Args)]
pub struct RelayArgs {
    /// Address to listen on [default: 127.0.0.1:7878]
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<SocketAddr>,
    /// Database file [default: <home>/relay/relay.db]
    #[arg(long, value_name = "PATH")]
    pub db: Option<PathBuf>,
    /// Relay config file (TOML: limits, quotas, rates, TTL)
    #[arg(long = "relay-config", value_name = "FILE")]
    pub relay_config: Option<PathBuf>,
    /// Log format on stderr
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

/// How logs are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// One readable line per event.
    Text,
    /// One JSON object per event.
    Json,
}

pub(super) fn run(ctx: &Ctx, args: RelayArgs) -> anyhow::Result<()> {
    let mut config = match &args.relay_config {
        Some(path) => RelayConfig::load(path)?,
        None => RelayConfig::default(),
    };
    if let Some(listen) = args.listen {
        config.listen = listen;
    }
    if let Some(db) = args.db {
        config.db = Some(db);
    }
    let db = config
        .db
        .get_or_insert_with(|| ctx.paths.relay_db())
        .clone();
    if let Some(dir) = db.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let relay = Relay::start(config).await?;
        eprintln!(
            "mailslot relay {} listening on {} (database {})",
            relay.relay_id(),
            relay.url(),
            db.display()
        );
        wait_for_signal().await?;
        eprintln!("mailslot relay: shutting down");
        relay.shutdown().await;
        anyhow::Ok(())
    })
}

async fn wait_for_signal() -> anyhow::Result<()> {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        r = tokio::signal::ctrl_c() => r?,
        _ = term.recv() => {}
    }
    Ok(())
}
