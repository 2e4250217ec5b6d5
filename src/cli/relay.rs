//! `mailslot relay`: run a relay in the foreground until SIGINT or SIGTERM; `relay status`
//! and `relay stop` for the one on a SQLite database (this home's background relay by
//! default), found by the pid file beside it; `relay check` to verify a
//! stopped relay's database and spool; `relay pins` (in `relay_pins.rs`) for other relays'
//! pinned keys; `relay invite` for a relay that registers by invite
//! only; `relay migrate` to move a stopped SQLite relay into PostgreSQL.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, bail};
use serde::Serialize;

use super::Ctx;
use super::local_relay::{self, RelayFiles};
use super::output;
use super::relay_db::{postgres_url, shown};
use super::relay_pins::{self, PinsAction};
use crate::protocol::AgentName;
use crate::relay::storage::{
    CheckReport, Moved, PostgresStorage, SqliteStorage, is_postgres_url, redact_url,
};
use crate::relay::{
    DatabaseGone, DatabaseWatch, Relay, RelayConfig, make_invites, make_postgres_invites,
};

/// The exit code of `relay check` when it found damage.
const DAMAGED: u8 = 3;
/// The exit code of `relay status` and `relay stop` when no relay runs on the database
/// ("nothing", for scripts: `relay stop` had nothing to stop, which is not a failure to stop).
const NOT_RUNNING: u8 = 3;

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
    /// Database file, or postgres://USER@HOST:PORT/DB (add ?sslmode=require for TLS) to share
    /// one PostgreSQL database among several relay nodes [default: <home>/relay/relay.db]
    #[arg(long, value_name = "PATH|URL")]
    pub db: Option<PathBuf>,
    /// Relay config file (TOML: limits, quotas, rates, TTL, policy)
    #[arg(long = "relay-config", value_name = "FILE")]
    pub relay_config: Option<PathBuf>,
    /// The relay's key file, made at first start (mode 0600); every node on one PostgreSQL
    /// database must use the same file [default: <db>.key beside a SQLite database,
    /// <home>/relay/identity.key with PostgreSQL]
    #[arg(long, value_name = "FILE")]
    pub identity: Option<PathBuf>,
    /// Let this relay reach other relays on loopback, private and link-local addresses
    /// (`allow_private_relays` in the config file); the background relay a home starts on
    /// loopback sets it
    #[arg(long)]
    pub allow_private_relays: bool,
    /// Log format on stderr
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

/// What to do with this home's background relay.
#[derive(Debug, clap::Subcommand)]
pub enum RelayAction {
    /// Show whether the relay on a database (this home's by default) runs, and where; exits 3
    /// when it does not
    Status {
        /// The relay's database file [default: <home>/relay/relay.db]
        #[arg(long, value_name = "PATH")]
        db: Option<PathBuf>,
    },
    /// Stop the relay on a database (this home's by default): SIGTERM, then wait for it to
    /// finish; exits 3 when none runs there
    Stop {
        /// The relay's database file [default: <home>/relay/relay.db]
        #[arg(long, value_name = "PATH")]
        db: Option<PathBuf>,
    },
    /// Make single-use invites for a relay with `registration = "closed"` (prints them once;
    /// the relay keeps only their digests). Works beside a running relay.
    Invite {
        /// The relay's database: a file, or a postgres:// URL [default: <home>/relay/relay.db]
        #[arg(long, value_name = "PATH|URL")]
        db: Option<PathBuf>,
        /// How many
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=1000))]
        count: u32,
    },
    /// Free an agent's name at once on a stopped relay, for an owner who lost the agent's key
    /// (nothing can sign a rotation then); the owner registers it again with new keys, and
    /// its peers confirm the new fingerprint (`mailslot contacts trust`)
    Release {
        /// The agent
        #[arg(value_name = "AGENT")]
        name: AgentName,
        /// The relay's database: a file, or a postgres:// URL [default: <home>/relay/relay.db]
        #[arg(long, value_name = "PATH|URL")]
        db: Option<PathBuf>,
    },
    /// Other relays' keys this relay pinned at their first link: list them, forget one, or
    /// replace one with the key its relay presents now (`trust`); works beside a running relay
    Pins {
        /// Forget or replace a pin (none: list them)
        #[command(subcommand)]
        action: Option<PinsAction>,
        /// The relay's database: a file, or a postgres:// URL [default: <home>/relay/relay.db]
        #[arg(long, value_name = "PATH|URL", global = true)]
        db: Option<PathBuf>,
    },
    /// Verify a stopped relay's database and spool; exits 3 when something is damaged
    Check {
        /// Database file [default: <home>/relay/relay.db]
        #[arg(long, value_name = "PATH")]
        db: Option<PathBuf>,
    },
    /// Move a stopped SQLite relay (registrations, consent, waiting mail, its relay id) into an
    /// empty PostgreSQL database, in one transaction; the SQLite files are only read
    Migrate {
        /// The SQLite relay's database file [default: <home>/relay/relay.db]
        #[arg(long, value_name = "PATH")]
        from: Option<PathBuf>,
        /// The empty PostgreSQL database: postgres://USER@HOST:PORT/DB (add ?sslmode=require
        /// for TLS); its schema is created if missing
        #[arg(long, value_name = "URL")]
        to: String,
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

pub(super) fn run(ctx: &Ctx, args: RelayArgs) -> anyhow::Result<ExitCode> {
    let db = args.db.clone().unwrap_or_else(|| ctx.paths.relay_db());
    match args.action {
        Some(RelayAction::Check { db: checked }) => {
            return check(ctx, &checked.unwrap_or(db));
        }
        Some(RelayAction::Status { db: chosen }) => return status(ctx, &chosen.unwrap_or(db)),
        Some(RelayAction::Stop { db: chosen }) => return stop(ctx, &chosen.unwrap_or(db)),
        Some(RelayAction::Invite { db: chosen, count }) => {
            invite(ctx, &chosen.unwrap_or(db), count)
        }
        Some(RelayAction::Pins { action, db: chosen }) => {
            relay_pins::run(ctx, &chosen.unwrap_or(db), action)
        }
        Some(RelayAction::Migrate { from, to }) => migrate(ctx, &from.unwrap_or(db), &to),
        Some(RelayAction::Release { name, db: chosen }) => {
            release(ctx, &chosen.unwrap_or(db), &name)
        }
        None => serve(ctx, args, db),
    }
    .map(|()| ExitCode::SUCCESS)
}

/// `relay status`: whether a relay runs on `db`, by its pid file.
fn status(ctx: &Ctx, db: &Path) -> anyhow::Result<ExitCode> {
    only_files(db, "status")?;
    let running = local_relay::status(db);
    let status = Status {
        running: running.is_some(),
        pid: running.as_ref().map(|r| r.0),
        url: running.map(|r| r.1),
        db: db.display().to_string(),
    };
    output::emit(ctx.json, &status, |s| match (&s.url, s.pid) {
        (Some(url), Some(pid)) => format!("relay running: pid {pid}, {url}, database {}", s.db),
        _ => format!("no relay running for {}", s.db),
    })?;
    Ok(running_code(status.running))
}

#[derive(Serialize)]
struct Stopped {
    stopped: bool,
    pid: Option<i32>,
    db: String,
}

/// `relay stop`: the relay on `db`, whichever home or service started it.
fn stop(ctx: &Ctx, db: &Path) -> anyhow::Result<ExitCode> {
    only_files(db, "stop")?;
    let pid = local_relay::stop(db)?;
    let stopped = Stopped {
        stopped: pid.is_some(),
        pid,
        db: db.display().to_string(),
    };
    output::emit(ctx.json, &stopped, |s| match s.pid {
        Some(pid) => format!("stopped the relay (pid {pid}) on {}", s.db),
        None => format!(
            "no relay running for {}; nothing to stop (`mailslot relay status --db DB` shows whether one runs on another database)",
            s.db
        ),
    })?;
    Ok(running_code(stopped.stopped))
}

/// Refuses a PostgreSQL URL for `relay status` and `relay stop`: its nodes keep no pid file.
fn only_files(db: &Path, command: &str) -> anyhow::Result<()> {
    if postgres_url(db).is_some() {
        bail!(
            "relay {command} finds a relay by the pid file beside its SQLite database; nodes on PostgreSQL keep none: ask their service manager (systemctl {command} mailslot-relay) or each node's /healthz"
        );
    }
    Ok(())
}

/// 0 when a relay ran, else [`NOT_RUNNING`].
fn running_code(ran: bool) -> ExitCode {
    if ran {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(NOT_RUNNING)
    }
}

#[derive(Serialize)]
struct Checked<'a> {
    db: String,
    clean: bool,
    #[serde(flatten)]
    report: &'a CheckReport,
}

/// `relay check`: holds the relay's lock while it reads, so no relay starts on the files.
fn check(ctx: &Ctx, db: &Path) -> anyhow::Result<ExitCode> {
    if postgres_url(db).is_some() {
        anyhow::bail!(
            "relay check reads a SQLite relay's files; check a PostgreSQL database with PostgreSQL's own tools (amcheck, pg_dump)"
        );
    }
    let _lock = if db.is_file() {
        let lock = RelayFiles::for_db(db)
            .lock()
            .context("relay check reads the database offline")?;
        Some(lock)
    } else {
        None
    };
    let report = SqliteStorage::check(db)?;
    let checked = Checked {
        db: db.display().to_string(),
        clean: report.is_clean(),
        report: &report,
    };
    output::emit(ctx.json, &checked, |c| {
        let r = c.report;
        let mut lines = vec![format!(
            "database {}: schema {} (this build: {}), integrity {}",
            c.db,
            r.database.schema,
            r.database.current_schema,
            if r.database.problems.is_empty() {
                "ok"
            } else {
                "DAMAGED"
            }
        )];
        lines.extend(r.database.problems.iter().map(|p| format!("  {p}")));
        if r.database.schema > r.database.current_schema {
            lines.push("  the schema is newer than this build's: upgrade mailslot".into());
        }
        lines.push(format!("spool: {}", r.spool.summary()));
        lines.extend(r.spool.damaged.iter().map(|d| format!("  {d}")));
        if let Some(u) = &r.spool.unclosed {
            lines.push(format!(
                "note: segment {:08} was left unclosed by a relay that did not shut down; its records end at byte {} (not damage, the next start closes it)",
                u.segment, u.end
            ));
        }
        lines.push(if c.clean { "clean" } else { "DAMAGED" }.into());
        lines.join("\n")
    })?;
    Ok(if checked.clean {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(DAMAGED)
    })
}

#[derive(Serialize)]
struct Invites {
    db: String,
    invites: Vec<String>,
}

#[derive(Serialize)]
struct Released {
    agent: AgentName,
    dropped: u64,
}

/// `relay release NAME`: on SQLite under the relay's lock (a running relay remembers the
/// names it has seen); on PostgreSQL the operator stops the nodes first.
fn release(ctx: &Ctx, db: &Path, name: &AgentName) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let dropped = match postgres_url(db) {
        Some(url) => runtime.block_on(async {
            let storage = PostgresStorage::connect(url).await?;
            crate::relay::release(&storage, name).await
        })?,
        None => {
            let _lock = RelayFiles::for_db(db)
                .lock()
                .context("relay release changes the database offline: stop the relay first")?;
            let storage = SqliteStorage::open(db)?;
            runtime.block_on(crate::relay::release(&storage, name))?
        }
    };
    let Some(dropped) = dropped else {
        bail!(
            "no agent named {name} is registered in {}; nothing changed",
            shown(db)
        );
    };
    output::emit(
        ctx.json,
        &Released {
            agent: name.clone(),
            dropped,
        },
        |r| {
            format!(
                "{} is free: its keys, contacts, blocks, listing and owner key are gone, and {} queued message(s) for it were dropped.\nThe owner registers it again with new keys (`mailslot --agent {} register`, after moving the old agent folder aside); its peers see an unsigned key change and confirm the new fingerprint with the owner (`mailslot contacts trust`).",
                r.agent, r.dropped, r.agent
            )
        },
    )
}

fn invite(ctx: &Ctx, db: &Path, count: u32) -> anyhow::Result<()> {
    let tokens = match postgres_url(db) {
        Some(url) => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?
            .block_on(make_postgres_invites(url, count))?,
        None => make_invites(db, count)?,
    };
    let report = Invites {
        db: shown(db),
        invites: tokens.iter().map(|t| t.expose().to_owned()).collect(),
    };
    output::emit(ctx.json, &report, |r| {
        format!(
            "{}\nEach invite registers one new agent, once: `mailslot --agent NAME register --invite TOKEN` (they are shown only now).",
            r.invites.join("\n")
        )
    })
}

#[derive(Serialize)]
struct Migrated {
    from: String,
    to: String,
    #[serde(flatten)]
    moved: Moved,
}

/// `relay migrate`: holds the SQLite relay's lock while it reads, so none starts on the files.
fn migrate(ctx: &Ctx, from: &Path, to: &str) -> anyhow::Result<()> {
    if !is_postgres_url(to) {
        anyhow::bail!(
            "--to takes the PostgreSQL database's URL, postgres://USER@HOST:PORT/DB, not {}",
            redact_url(to)
        );
    }
    if postgres_url(from).is_some() {
        anyhow::bail!(
            "--from takes the SQLite relay's database file; a PostgreSQL relay needs no migration"
        );
    }
    let _lock = if from.is_file() {
        let lock = RelayFiles::for_db(from)
            .lock()
            .context("relay migrate reads the SQLite relay only while it is stopped")?;
        Some(lock)
    } else {
        None
    };
    let moved = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(async {
            let _spinner = crate::progress::Progress::spinner(format!(
                "moving {} into PostgreSQL",
                from.display()
            ));
            crate::relay::migrate(from, to).await
        })?;
    let report = Migrated {
        from: from.display().to_string(),
        to: redact_url(to),
        moved,
    };
    output::emit(ctx.json, &report, |r| {
        let m = &r.moved;
        let mut lines = vec![
            format!("moved relay {} from {} to {}:", m.relay_id, r.from, r.to),
            format!(
                "  {} agents ({} retired, their names held), {} unused invites",
                m.agents, m.retired, m.invites
            ),
            format!(
                "  {} contacts, {} blocks, {} open contact requests",
                m.contacts, m.blocks, m.requests
            ),
            format!(
                "  {} waiting copies ({} bytes) for {} recipients, {} bounces not fetched yet",
                m.copies, m.bytes, m.recipients, m.bounces
            ),
            format!("  {} other relays' keys pinned", m.relay_pins),
        ];
        if m.damaged_records > 0 {
            lines.push(format!(
                "  {} damaged spool records were skipped; `mailslot relay check --db {}` lists them",
                m.damaged_records, r.from
            ));
        }
        lines.push(format!(
            "Now start the relay nodes with --db on this database and --identity {} (the SQLite relay's key file, unless it ran with another; every node the same file); keep the SQLite files until they serve.",
            crate::relay::identity_beside(Path::new(&r.from)).display()
        ));
        lines.join("\n")
    })
}

/// Has the allocator map every buffer over 1 MiB on its own and unmap it when freed. glibc
/// otherwise raises that threshold to the largest buffer freed so far (up to 32 MiB), and
/// keeps freed frames in its per-thread arenas: the relay's memory would stay at its peak and
/// grow with fragmentation, whatever `max_receiving_bytes` bounds. Called before any thread.
fn return_large_buffers() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets a threshold of the allocator, before other threads exist.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 1 << 20);
    }
}

fn serve(ctx: &Ctx, args: RelayArgs, db: PathBuf) -> anyhow::Result<()> {
    let mut config = match &args.relay_config {
        Some(path) => RelayConfig::load(path)?,
        None => RelayConfig::default(),
    };
    if let Some(listen) = args.listen {
        config.listen = listen;
    }
    config.allow_private_relays |= args.allow_private_relays;
    let db = args.db.or(config.db.take()).unwrap_or(db);
    config.db = Some(db.clone());
    config.identity = args.identity.or(config.identity.take());
    if config.identity.is_none() && postgres_url(&db).is_some() {
        let file = ctx.paths.home().join("relay").join("identity.key");
        if let Some(dir) = file.parent() {
            std::fs::create_dir_all(dir)?;
        }
        config.identity = Some(file);
    }
    // A SQLite relay owns its files: one relay per database, found by `relay status` and
    // `relay stop`. Nodes on PostgreSQL share their database and keep no files.
    let files = match postgres_url(&db) {
        Some(_) => None,
        None => {
            if let Some(dir) = db.parent() {
                std::fs::create_dir_all(dir)?;
            }
            Some(RelayFiles::for_db(&db))
        }
    };
    let _lock = files.as_ref().map(RelayFiles::lock).transpose()?;
    return_large_buffers();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let relay = Relay::start(config).await?;
        if let Some(files) = &files {
            std::fs::write(
                &files.pid,
                format!("{} {}\n", std::process::id(), relay.url()),
            )?;
        }
        let watch = files
            .as_ref()
            .map(|_| DatabaseWatch::new(&db))
            .transpose()
            .with_context(|| format!("looking at {}", db.display()))?;
        eprintln!(
            "mailslot relay {} listening on {} (database {}) as {}, key {}",
            relay.relay_id(),
            relay.url(),
            shown(&db),
            relay.name(),
            relay.fingerprint()
        );
        let gone = tokio::select! {
            signalled = wait_for_signal() => {
                signalled?;
                None
            }
            gone = database_gone(watch.as_ref()) => Some(gone),
        };
        if let Some(gone) = &gone {
            tracing::error!(%gone, "the relay's database is gone; stopping, so that its port is free for a relay that can store mail");
        }
        eprintln!("mailslot relay: shutting down");
        relay.shutdown().await;
        match (gone, &files) {
            // The pid file by that name, if any, is another relay's now.
            (Some(gone), _) => bail!("the relay stopped: its database is gone ({gone})"),
            (None, Some(files)) => local_relay::remove_pid(files),
            (None, None) => {}
        }
        anyhow::Ok(())
    })
}

/// Returns once a SQLite relay's database is gone; never without one to watch.
async fn database_gone(watch: Option<&DatabaseWatch>) -> DatabaseGone {
    match watch {
        Some(watch) => watch.gone().await,
        None => std::future::pending().await,
    }
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
