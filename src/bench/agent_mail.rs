//! `bench mcp --agent-mail PYTHON`: `mcp_agent_mail`, the nearest peer, measured beside
//! `volume.rs`'s rows. Its server runs over stdio like `mailslot mcp` and is driven by the same
//! rmcp client; its store holds the same messages (`volume::corpus`) and its `search_messages`
//! gets the same two-word queries (`volume::queries`), as FTS5's `OR`, which is what mailslot's
//! `search` does with two words. Its own floor, a `health_check` call, is measured too, so that
//! a reader can tell the client's and the transport's share from the search's.

use std::path::Path;
use std::time::Instant;

use anyhow::{Context, bail};
use serde_json::{Value, json};

use super::stats::Summary;
use crate::demo::driver::{Driver, Era, text_of};

/// Starts its FastMCP server on stdio (its own CLI serves only HTTP).
const LAUNCH: &str =
    "from mcp_agent_mail.app import build_mcp_server; build_mcp_server().run('stdio')";

/// The version the published figures were taken with (`pip install mcp_agent_mail==0.1.0`).
const TESTED: &str = "0.1.0";

/// How its server is configured.
#[derive(Clone, Copy)]
enum Setup {
    /// As installed: a log panel drawn for every tool call, `search_messages` reached through
    /// its `call_extended_tool` meta-tool.
    Defaults,
    /// Its per-call logging off (as `mailslot mcp` logs warnings only) and every tool exposed,
    /// so that `search_messages` is called directly, as mailslot's `search` is.
    Tuned,
}

impl Setup {
    fn label(self) -> &'static str {
        match self {
            Setup::Defaults => "as installed",
            Setup::Tuned => "logging off, tools exposed",
        }
    }

    fn env(self) -> &'static [(&'static str, &'static str)] {
        match self {
            Setup::Defaults => &[],
            Setup::Tuned => &[
                ("TOOLS_LOG_ENABLED", "false"),
                ("LOG_RICH_ENABLED", "false"),
                ("LOG_LEVEL", "WARNING"),
                ("FASTMCP_LOG_LEVEL", "WARNING"),
                ("MCP_TOOLS_MODE", "extended"),
            ],
        }
    }

    /// The call that searches, with these arguments.
    fn search(self, args: Value) -> (&'static str, Value) {
        match self {
            Setup::Defaults => (
                "call_extended_tool",
                json!({ "tool_name": "search_messages", "arguments": args }),
            ),
            Setup::Tuned => ("search_messages", args),
        }
    }
}

/// Measures `calls` calls each of `health_check` and `search_messages` (two words, limit 20)
/// against `mcp_agent_mail` run by `python` over a store of `size` messages, as installed and
/// tuned.
pub(super) async fn rows(python: &Path, size: u32, calls: u32) -> anyhow::Result<Vec<Summary>> {
    check_installed(python).await?;
    let mut rows = Vec::new();
    for setup in [Setup::Tuned, Setup::Defaults] {
        rows.extend(measure(python, setup, size, calls).await?);
    }
    Ok(rows)
}

async fn measure(
    python: &Path,
    setup: Setup,
    size: u32,
    calls: u32,
) -> anyhow::Result<Vec<Summary>> {
    let dir = tempfile::tempdir()?;
    let db = dir.path().join("agent_mail.sqlite3");
    let project = dir.path().join("project");
    let mut cmd = tokio::process::Command::new(python);
    cmd.args(["-c", LAUNCH])
        .current_dir(dir.path())
        .env_clear()
        .env("HOME", dir.path())
        // It keeps a Git archive of its mail beside the database.
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env(
            "DATABASE_URL",
            format!("sqlite+aiosqlite:///{}", db.display()),
        )
        .env("STORAGE_ROOT", dir.path().join("archive"))
        .envs(setup.env().iter().copied());
    // Its log goes where an MCP host puts a server's stderr: not on this terminal.
    let (transport, _) = rmcp::transport::TokioChildProcess::builder(cmd)
        .stderr(std::process::Stdio::null())
        .spawn()
        .with_context(|| format!("starting mcp_agent_mail with {}", python.display()))?;
    let server = Driver::connect(transport, Era::Legacy).await?;
    let project_key = project.display().to_string();
    ok(
        &server,
        "ensure_project",
        json!({ "human_key": project_key }),
    )
    .await?;
    ok(
        &server,
        "register_agent",
        json!({ "project_key": project_key, "program": "bench", "model": "none" }),
    )
    .await?;
    let key = project_key.clone();
    tokio::task::spawn_blocking(move || fill(&db, &key, size as usize)).await??;
    let name = |what: &str| {
        format!(
            "mcp_agent_mail {TESTED}, {}: {what} @ {size}",
            setup.label()
        )
    };

    let mut rows = Vec::new();
    let mut samples = Vec::with_capacity(calls as usize);
    let start = Instant::now();
    for _ in 0..calls {
        let t = Instant::now();
        ok(&server, "health_check", json!({})).await?;
        samples.push(t.elapsed());
    }
    rows.push(Summary::new(
        name("health_check (its floor)"),
        samples,
        start.elapsed(),
    ));

    let mut queries = super::volume::queries();
    let mut found = 0;
    let mut samples = Vec::with_capacity(calls as usize);
    let start = Instant::now();
    for _ in 0..calls {
        let fts = queries
            .next()
            .unwrap_or_default()
            .split(' ')
            .map(|w| format!("\"{w}\""))
            .collect::<Vec<_>>()
            .join(" OR ");
        let (tool, args) =
            setup.search(json!({ "project_key": project_key, "query": fts, "limit": 20 }));
        let t = Instant::now();
        let result = ok(&server, tool, args).await?;
        samples.push(t.elapsed());
        found += hits(&result);
    }
    // A query that its FTS5 rejected, or a store left empty, would make it look fast.
    if found == 0 {
        bail!(
            "mcp_agent_mail's search_messages found nothing in {calls} queries over {size} \
             messages"
        );
    }
    rows.push(Summary::new(
        name("search_messages, 2 words (OR), top 20"),
        samples,
        start.elapsed(),
    ));
    server.close().await?;
    Ok(rows)
}

/// How many messages a search result lists, directly or through the meta-tool.
fn hits(result: &Value) -> usize {
    let list = result.get("result").unwrap_or(result);
    list.as_array()
        .or_else(|| list.get("result").and_then(Value::as_array))
        .map_or(0, Vec::len)
}

/// Fails with the fix when `python` cannot import the package.
async fn check_installed(python: &Path) -> anyhow::Result<()> {
    let out = tokio::process::Command::new(python)
        .args(["-c", "import mcp_agent_mail"])
        .output()
        .await
        .with_context(|| format!("--agent-mail: running {}", python.display()))?;
    if !out.status.success() {
        bail!(
            "--agent-mail: {} cannot import mcp_agent_mail; make a venv, `pip install \
             mcp_agent_mail=={TESTED}` into it and pass its bin/python",
            python.display()
        );
    }
    Ok(())
}

/// Calls a tool that must succeed; its structured result, or null when it gave none.
async fn ok(server: &Driver, tool: &str, args: Value) -> anyhow::Result<Value> {
    let result = server.call(tool, args).await?;
    if result.is_error == Some(true) {
        bail!("mcp_agent_mail's {tool} failed: {}", text_of(&result));
    }
    Ok(result.structured_content.unwrap_or(Value::Null))
}

/// Writes `size` messages from its one registered agent into its database, in one
/// transaction; its own triggers index them for FTS5. Through its `send_message` tool each
/// would also be a Git commit, which is the fill's cost, not the search's.
fn fill(db: &Path, project_key: &str, size: usize) -> anyhow::Result<()> {
    let mut conn = rusqlite::Connection::open(db)?;
    let tx = conn.transaction()?;
    let project: i64 = tx
        .query_row(
            "SELECT id FROM projects WHERE human_key = ?1",
            [project_key],
            |r| r.get(0),
        )
        .context("mcp_agent_mail's project")?;
    let sender: i64 = tx
        .query_row(
            "SELECT id FROM agents WHERE project_id = ?1",
            [project],
            |r| r.get(0),
        )
        .context("mcp_agent_mail's agent")?;
    {
        let mut insert = tx.prepare(
            "INSERT INTO messages (project_id, sender_id, subject, body_md, importance, \
             ack_required, created_ts, attachments) \
             VALUES (?1, ?2, ?3, ?4, 'normal', 0, '2026-01-01 00:00:00.000000', '[]')",
        )?;
        for m in super::volume::corpus(size) {
            insert.execute(rusqlite::params![project, sender, m.subject, m.body])?;
        }
    }
    tx.commit()?;
    Ok(())
}
