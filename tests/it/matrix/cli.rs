//! The CLI's views of alice's mail (`inbox`, `sent`, `search`, `read`, `thread`, with `--json`),
//! export and import into a fresh home, and `doctor`'s store check.

use std::path::Path;

use mailslot::client::RelayUrl;
use mailslot::protocol::AgentName;
use serde_json::{Value, json};

use super::kinds::{
    Cells, Kind, Side, attachments_ok, entry, has, received_entry, searched, sent_entry, want,
};

const PASSPHRASE: &str = "matrix export passphrase";

/// `mailslot --agent alice --json ARGS` in `home`: exit status, stdout, stderr.
async fn alice_raw(home: &Path, relay: &RelayUrl, args: &[&str]) -> (bool, String, String) {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_mailslot"))
        .args(["--agent", "alice", "--json"])
        .args(args)
        .env_clear()
        .env("MAILSLOT_HOME", home)
        .env("MAILSLOT_RELAY", relay.as_str())
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// [`alice_raw`]'s JSON, or why there is none.
async fn alice_cli(home: &Path, relay: &RelayUrl, args: &[&str]) -> Result<Value, String> {
    let (ok, out, err) = alice_raw(home, relay, args).await;
    if !ok {
        return Err(format!("mailslot {args:?} failed: {err}"));
    }
    serde_json::from_str(&out)
        .map_err(|e| format!("mailslot {args:?} printed no JSON ({e}): {out}"))
}

/// What `read --json` (the stored message) must say of a kind.
fn stored_ok(v: &Value, k: &Kind) -> Result<(), String> {
    let m = &v["message"];
    want(m["id"] == k.id.to_string().as_str(), || format!("id: {v}"))?;
    match k.side {
        Side::In => {
            want(m["from"] == k.peer.as_str(), || format!("from: {m}"))?;
            want(v["direction"] == "in" && v["trust"] == "verified", || {
                format!("direction and trust: {v}")
            })?;
            if k.ack_required {
                want(has(&v["receipts"], "kind", "acknowledged"), || {
                    format!("alice's acknowledgement: {v}")
                })?;
            }
        }
        Side::Out => {
            want(m["to"] == json!([k.peer]), || format!("to: {m}"))?;
            want(v["direction"] == "out" && v["trust"] == "own", || {
                format!("direction and trust: {v}")
            })?;
            let receipt = |kind: &str| {
                v["receipts"].as_array().is_some_and(|r| {
                    r.iter().any(|r| {
                        r["recipient"] == k.peer.as_str()
                            && r["kind"] == kind
                            && k.answer.is_none_or(|a| r["answer"] == a)
                    })
                })
            };
            let shown = match k.state() {
                "delivered" => v["delivered"]
                    .as_array()
                    .is_some_and(|d| d.iter().any(|d| d[0] == k.peer.as_str())),
                "bounced" => v["bounced"] == json!([k.peer]),
                state => receipt(state),
            };
            want(shown, || format!("{} to {}: {v}", k.state(), k.peer))?;
        }
        Side::Owner => {
            want(m["from"] == k.peer.as_str(), || format!("from: {m}"))?;
            want(v["direction"] == "in" && v["trust"] == "owner", || {
                format!("direction and trust: {v}")
            })?;
            want(v["owner"]["verified"].is_string(), || {
                format!("the owner key's fingerprint: {v}")
            })?;
        }
        Side::Refused => return Err(format!("shown: {v}")),
    }
    attachments_ok(&v["attachments"], k)
}

/// `inbox`, `sent`, then per kind `search`, `read` and `thread`.
pub(crate) async fn check(home: &Path, relay: &RelayUrl, kinds: &[Kind], cells: &mut Cells) {
    match alice_cli(home, relay, &["inbox", "--all", "--limit", "100"]).await {
        Ok(list) => {
            for k in kinds {
                cells.record("cli inbox", &k.name, received_entry(&list, "id", k));
            }
        }
        Err(why) => cells.view_failed("cli inbox", kinds, &why),
    }
    match alice_cli(home, relay, &["sent", "--limit", "100"]).await {
        Ok(list) => {
            for k in kinds {
                cells.record("cli sent", &k.name, sent_entry(&list, "id", k));
            }
        }
        Err(why) => cells.view_failed("cli sent", kinds, &why),
    }
    for k in kinds {
        let found = alice_cli(home, relay, &["search", &k.word]).await;
        cells.record(
            "cli search",
            &k.name,
            found.and_then(|f| searched(&f, "id", k)),
        );
        let id = k.id.to_string();
        let read = alice_cli(home, relay, &["read", &id]).await;
        let thread = alice_cli(home, relay, &["thread", &id]).await;
        if k.side == Side::Refused {
            cells.record(
                "cli read",
                &k.name,
                want(read.is_err(), || format!("{read:?}")),
            );
            cells.record(
                "cli thread",
                &k.name,
                want(thread.is_err(), || format!("{thread:?}")),
            );
            continue;
        }
        cells.record("cli read", &k.name, read.and_then(|v| stored_ok(&v, k)));
        let line = thread.and_then(|lines| {
            entry(&lines, "id", &k.id)
                .cloned()
                .ok_or_else(|| format!("not in its thread: {lines}"))
        });
        cells.record(
            "cli thread",
            &k.name,
            line.and_then(|l| match k.side {
                Side::Owner => want(l["direction"] == "in" && l["trust"] == "owner", || {
                    format!("{l}")
                }),
                Side::In => want(
                    l["direction"] == "in" && l["from"] == k.peer.as_str(),
                    || format!("{l}"),
                ),
                _ => want(
                    l["direction"] == "out" && l["to"] == json!([k.peer]),
                    || format!("{l}"),
                ),
            }),
        );
    }
}

/// Export, then import into a fresh home: the same messages, in the same states.
pub(crate) async fn check_archive(
    home: &Path,
    relay: &RelayUrl,
    kinds: &[Kind],
    cells: &mut Cells,
) {
    let dir = tempfile::tempdir().unwrap();
    let (file, passphrase) = (
        dir.path().join("alice.mailslot"),
        dir.path().join("passphrase"),
    );
    std::fs::write(&passphrase, PASSPHRASE).unwrap();
    let (file, passphrase) = (file.to_str().unwrap(), passphrase.to_str().unwrap());
    let fresh = tempfile::tempdir().unwrap();
    // The owner moves the agent to another home of theirs, owner key and all: the owner's
    // mail travels with its signature and is checked again there.
    for file in ["owner.key", "owner.key.pinned"] {
        std::fs::copy(home.join(file), fresh.path().join(file)).unwrap();
    }
    let moved = async {
        alice_cli(
            home,
            relay,
            &["export", "--out", file, "--passphrase-file", passphrase],
        )
        .await?;
        alice_cli(
            fresh.path(),
            relay,
            &["import", file, "--passphrase-file", passphrase],
        )
        .await
    };
    if let Err(why) = moved.await {
        cells.view_failed("export/import", kinds, &why);
        return;
    }
    let inbox = ["inbox", "--all", "--limit", "100"];
    let sent = ["sent", "--limit", "100"];
    let listed = (
        in_both(home, fresh.path(), relay, &inbox).await,
        in_both(home, fresh.path(), relay, &sent).await,
    );
    let ((inbox, imported_inbox), (sent, imported_sent)) = match listed {
        (Ok(inbox), Ok(sent)) => (inbox, sent),
        (inbox, sent) => {
            let why = format!("{:?} / {:?}", inbox.err(), sent.err());
            cells.view_failed("export/import", kinds, &why);
            return;
        }
    };
    for k in kinds {
        let same = |before: &Value, after: &Value| {
            let (b, a) = (entry(before, "id", &k.id), entry(after, "id", &k.id));
            want(b == a, || format!("exported {b:?}, imported {a:?}"))
        };
        let outcome = received_entry(&imported_inbox, "id", k)
            .and_then(|()| sent_entry(&imported_sent, "id", k))
            .and_then(|()| same(&inbox, &imported_inbox))
            .and_then(|()| same(&sent, &imported_sent));
        cells.record("export/import", &k.name, outcome);
    }
    let imported = doctor_store(fresh.path(), relay).await;
    cells.record("export/import", "doctor of the imported store", imported);
}

/// `mailslot ARGS` for alice in the home she was exported from and the one she was imported
/// into.
async fn in_both(
    home: &Path,
    imported: &Path,
    relay: &RelayUrl,
    args: &[&str],
) -> Result<(Value, Value), String> {
    Ok((
        alice_cli(home, relay, args).await?,
        alice_cli(imported, relay, args).await?,
    ))
}

/// Rows of alice's store in `home`: messages and copies, counted by SQLite itself.
fn rows(home: &Path) -> (i64, i64) {
    let paths = mailslot::config::Paths::new(Some(home.to_owned()), None).unwrap();
    let store = mailslot::agent::store_path(&paths.agent_dir(&AgentName::new("alice").unwrap()));
    let conn = rusqlite::Connection::open(store).unwrap();
    let count = |table: &str| {
        conn.query_row(&format!("SELECT count(*) FROM {table}"), [], |r| r.get(0))
            .unwrap()
    };
    (count("messages"), count("deliveries"))
}

/// `doctor`'s store check in `home`: ok, and every message and copy read back.
async fn doctor_store(home: &Path, relay: &RelayUrl) -> Result<(), String> {
    let (_, out, err) = alice_raw(home, relay, &["doctor"]).await;
    let report: Value = serde_json::from_str(&out)
        .map_err(|e| format!("doctor printed no JSON ({e}): {out}{err}"))?;
    let store = report["checks"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["name"] == "store"))
        .ok_or(format!("no store check: {report}"))?;
    let (messages, copies) = rows(home);
    let counted = format!("read back {messages} messages, {copies} copies");
    want(
        store["outcome"] == "ok"
            && store["detail"]
                .as_str()
                .is_some_and(|d| d.contains(&counted)),
        || format!("expected ok and {counted:?}: {store}"),
    )
}

/// `doctor` on alice's home.
pub(crate) async fn check_doctor(home: &Path, relay: &RelayUrl, cells: &mut Cells) {
    let outcome = doctor_store(home, relay).await;
    cells.record("doctor", "every row of the store", outcome);
}
