//! `relay pins`: the keys of other relays this relay pinned on first contact, on its database
//! (SQLite beside the running relay, or PostgreSQL): list them, remove one, or replace one
//! with the key its relay presents now once its operator confirmed it (`trust`). The relay
//! reads its pins at every contact, so a running relay follows a change at its next attempt.

use std::io::{BufRead, IsTerminal, Write};
use std::path::{Path, PathBuf};

use anyhow::bail;
use jiff::Timestamp;
use serde::Serialize;

use super::Ctx;
use super::output;
use super::relay_db::{postgres_url, shown};
use crate::crypto::relay_fingerprint;
use crate::protocol::{Fingerprint, RelayName};
use crate::relay::RelayConfig;
use crate::relay::storage::{PostgresStorage, RelayPins, SqlitePins};

/// What to do with the pins.
#[derive(Debug, clap::Subcommand)]
pub enum PinsAction {
    /// Forget a relay's pinned key: the next link to or from it pins the key it presents then,
    /// unchecked, as at first contact (`trust` compares the keys first)
    Remove {
        /// The relay, as in addresses: HOST[:PORT]
        #[arg(value_name = "HOST")]
        host: RelayName,
    },
    /// Fetch the key a relay presents now and pin it in place of the pinned one, after showing
    /// both fingerprints and asking (or with --fingerprint or --yes)
    Trust {
        /// The relay, as in addresses: HOST[:PORT]
        #[arg(value_name = "HOST")]
        host: RelayName,
        /// The fingerprint its operator confirmed: the relay must present exactly this key
        /// (then nothing is asked)
        #[arg(long, value_name = "FINGERPRINT", value_parser = super::parse_fingerprint)]
        fingerprint: Option<Fingerprint>,
        /// Replace the pin without asking (you compared the fingerprints yourself)
        #[arg(long)]
        yes: bool,
        /// The relay's config file, for its `trusted_hosts` (reached without TLS)
        #[arg(long = "relay-config", value_name = "FILE")]
        relay_config: Option<PathBuf>,
    },
}

#[derive(Serialize)]
struct PinView {
    relay: RelayName,
    fingerprint: Fingerprint,
    pinned_at: String,
}

#[derive(Serialize)]
struct PinList {
    db: String,
    pins: Vec<PinView>,
}

#[derive(Serialize)]
struct Removed {
    relay: RelayName,
    removed: Fingerprint,
}

#[derive(Serialize)]
struct Trusted {
    relay: RelayName,
    fingerprint: Fingerprint,
    /// The fingerprint pinned before, if any.
    was: Option<Fingerprint>,
    changed: bool,
}

/// `relay pins [ACTION]` on the relay database `db`.
pub(super) fn run(ctx: &Ctx, db: &Path, action: Option<PinsAction>) -> anyhow::Result<()> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(async {
            match postgres_url(db) {
                Some(url) => act(ctx, db, &PostgresStorage::connect(url).await?, action).await,
                None => act(ctx, db, &SqlitePins::open(db)?, action).await,
            }
        })
}

async fn act<P: RelayPins>(
    ctx: &Ctx,
    db: &Path,
    pins: &P,
    action: Option<PinsAction>,
) -> anyhow::Result<()> {
    match action {
        None => list(ctx, db, pins).await,
        Some(PinsAction::Remove { host }) => remove(ctx, db, pins, host).await,
        Some(PinsAction::Trust {
            host,
            fingerprint,
            yes,
            relay_config,
        }) => {
            let trusted = match relay_config {
                Some(file) => RelayConfig::load(&file)?.trusted_hosts,
                None => ctx.config.trusted_hosts.clone(),
            };
            let confirmed = match (fingerprint, yes) {
                (Some(fp), _) => Confirmed::Fingerprint(fp),
                (None, true) => Confirmed::Yes,
                (None, false) => Confirmed::Ask,
            };
            trust(ctx, db, pins, &trusted, host, confirmed).await
        }
    }
}

async fn list<P: RelayPins>(ctx: &Ctx, db: &Path, pins: &P) -> anyhow::Result<()> {
    let view = PinList {
        db: shown(db),
        pins: pins
            .relay_pins()
            .await?
            .into_iter()
            .map(|p| PinView {
                fingerprint: relay_fingerprint(&p.key),
                relay: p.relay,
                pinned_at: pinned_at(p.pinned_at_ms),
            })
            .collect(),
    };
    output::emit(ctx.json, &view, |v| {
        if v.pins.is_empty() {
            return format!(
                "{}: no other relay's key is pinned (a relay's key is pinned at its first link)",
                v.db
            );
        }
        v.pins
            .iter()
            .map(|p| format!("{}  {}  pinned {}", p.relay, p.fingerprint, p.pinned_at))
            .collect::<Vec<_>>()
            .join("\n")
    })
}

/// Unix ms as RFC 3339 (the stored number when it is out of range).
fn pinned_at(ms: i64) -> String {
    Timestamp::from_millisecond(ms).map_or_else(|_| ms.to_string(), |t| t.to_string())
}

async fn remove<P: RelayPins>(
    ctx: &Ctx,
    db: &Path,
    pins: &P,
    host: RelayName,
) -> anyhow::Result<()> {
    let Some(key) = pins.unpin_relay(host.clone()).await? else {
        bail!(
            "no key is pinned for {host} in {}; `mailslot relay pins --db {}` lists the pins",
            shown(db),
            crate::relay::shell_word(&shown(db))
        );
    };
    let removed = Removed {
        relay: host,
        removed: relay_fingerprint(&key),
    };
    output::emit(ctx.json, &removed, |r| {
        format!(
            "removed {}'s pinned key {}: its next link pins the key it presents then",
            r.relay, r.removed
        )
    })
}

/// How the operator confirmed the key a relay presents.
enum Confirmed {
    /// Its fingerprint, as its operator gave it.
    Fingerprint(Fingerprint),
    /// `--yes`.
    Yes,
    /// Not yet: ask at the terminal.
    Ask,
}

async fn trust<P: RelayPins>(
    ctx: &Ctx,
    db: &Path,
    pins: &P,
    trusted: &[RelayName],
    host: RelayName,
    confirmed: Confirmed,
) -> anyhow::Result<()> {
    let was = pins.pinned_relay(host.clone()).await?;
    let info = crate::client::discover(trusted, &host).await?;
    let was_fp = was.as_ref().map(relay_fingerprint);
    let mut trusted = Trusted {
        relay: host.clone(),
        fingerprint: info.fingerprint.clone(),
        was: was_fp.clone(),
        changed: false,
    };
    if was != Some(info.key) {
        match confirmed {
            Confirmed::Fingerprint(fp) if fp != info.fingerprint => bail!(
                "{host} presents the key {}, not {fp}; nothing changed. Check the fingerprint with {host}'s operator",
                info.fingerprint
            ),
            Confirmed::Fingerprint(_) | Confirmed::Yes => {}
            Confirmed::Ask => ask(&host, was_fp.as_ref(), &info.fingerprint)?,
        }
        if !pins.repin_relay(host.clone(), was, info.key).await? {
            bail!(
                "the pin of {host} in {} changed while you were deciding; nothing changed. Run the command again",
                shown(db)
            );
        }
        trusted.changed = true;
    }
    output::emit(ctx.json, &trusted, |t| match (&t.was, t.changed) {
        (_, false) => format!(
            "{}'s key {} is the one pinned; nothing changed",
            t.relay, t.fingerprint
        ),
        (Some(was), true) => format!(
            "{}'s key is now {} (it was {was}); links to and from it resume at their next attempt",
            t.relay, t.fingerprint
        ),
        (None, true) => format!("{}'s key {} is pinned", t.relay, t.fingerprint),
    })
}

/// Shows the pinned and the presented fingerprint and asks the person to confirm.
fn ask(host: &RelayName, was: Option<&Fingerprint>, presented: &Fingerprint) -> anyhow::Result<()> {
    let stdin = std::io::stdin();
    if !stdin.is_terminal() {
        bail!(
            "{host} presents the key {presented}{}; nothing changed. Compare it with {host}'s operator, then run this again at a terminal, or with --fingerprint {presented} (or --yes)",
            was.map(|w| format!(", not the pinned {w}"))
                .unwrap_or_default()
        );
    }
    let mut out = std::io::stderr();
    match was {
        Some(was) => writeln!(
            out,
            "{host}\n  pinned:   {was}\n  presents: {presented}\nThe key changed. Replace the pin only if {host}'s operator confirmed the new fingerprint (not through the relay itself)."
        )?,
        None => writeln!(
            out,
            "{host} presents {presented}; no key is pinned for it yet."
        )?,
    }
    write!(out, "Pin {presented} for {host}? [y/N] ")?;
    out.flush()?;
    let mut answer = String::new();
    stdin.lock().read_line(&mut answer)?;
    if !matches!(answer.trim().to_lowercase().as_str(), "y" | "yes") {
        bail!("not changed");
    }
    Ok(())
}
