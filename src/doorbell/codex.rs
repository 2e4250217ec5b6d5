//! Codex's queue: `codex queue --thread ID --message TEXT` hands a Codex thread a message that
//! an idle interactive session (the TUI with its background app-server, Codex's default)
//! starts a turn for at once, and a busy one after its turn (checked on 0.171.0:
//! docs/decisions.md, "Waking an idle Codex"). The bell (`doorbell::bell`) decides what to
//! hand over and when; this module finds the thread's Codex and runs the command.
//!
//! `mailslot mcp` learns its thread only from Codex's first tool call (`_meta.threadId`; the
//! app-server runs one MCP server per thread). It rings only a thread served by Codex's
//! app-server daemon, the interactive default: never a headless `codex exec`, whose queued
//! turns nobody would watch.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::protocol::ValidationError;

/// How long one `codex queue` may take.
const QUEUE_TIMEOUT: Duration = Duration::from_secs(10);
/// The longest message handed over (far above a notice).
const MAX_MESSAGE: usize = 8 * 1024;

/// A Codex thread id: a UUID, as Codex names its threads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ThreadId(String);

impl ThreadId {
    /// Validates `raw` (`_meta.threadId` of a tool call).
    pub fn parse(raw: &str) -> Result<Self, ValidationError> {
        uuid::Uuid::try_parse(raw)
            .map(|u| Self(u.hyphenated().to_string()))
            .map_err(|_| {
                ValidationError::new(
                    "_meta.threadId",
                    "is not a UUID; Codex names its threads by UUID",
                )
            })
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Why `codex queue` failed.
#[derive(Debug, thiserror::Error)]
#[error("codex queue: {0}")]
pub struct CodexError(String);

/// Where to queue a message for one Codex thread.
#[derive(Debug, Clone)]
pub struct CodexQueue {
    pub(super) codex: PathBuf,
    home: Option<PathBuf>,
    thread: ThreadId,
}

impl CodexQueue {
    /// The queue of `thread` in the Codex that started this process, when it is Codex's
    /// app-server daemon (an interactive session); `None` otherwise.
    pub fn of_parent(thread: ThreadId) -> Option<Self> {
        let parent = nix::unistd::getppid().as_raw() as u32;
        let daemon = parent_daemon(parent)?;
        Some(Self {
            codex: daemon.exe,
            home: daemon.home,
            thread,
        })
    }

    /// The thread.
    pub fn thread(&self) -> &str {
        self.thread.as_str()
    }

    /// Queues `text` for the thread.
    pub async fn push(&self, text: &str) -> Result<(), CodexError> {
        if text.len() > MAX_MESSAGE {
            return Err(CodexError(format!(
                "a notice of {} bytes is over {MAX_MESSAGE}",
                text.len()
            )));
        }
        let mut command = tokio::process::Command::new(&self.codex);
        command
            .args(["queue", "--thread", self.thread.as_str(), "--message", text])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true);
        if let Some(home) = &self.home {
            command.env("CODEX_HOME", home);
        }
        let out = tokio::time::timeout(QUEUE_TIMEOUT, command.output())
            .await
            .map_err(|_| CodexError(format!("no answer in {QUEUE_TIMEOUT:?}")))?
            .map_err(|e| CodexError(format!("cannot run {}: {e}", self.codex.display())))?;
        if out.status.success() {
            return Ok(());
        }
        let why = String::from_utf8_lossy(&out.stderr);
        Err(CodexError(format!(
            "{}: {}",
            out.status,
            why.trim().chars().take(300).collect::<String>()
        )))
    }
}

/// Codex's app-server daemon: its executable and its `CODEX_HOME`.
struct Daemon {
    exe: PathBuf,
    home: Option<PathBuf>,
}

/// `pid` if it is Codex's app-server daemon (`codex app-server … --managed-daemon`).
#[cfg(target_os = "linux")]
fn parent_daemon(pid: u32) -> Option<Daemon> {
    let argv = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let argv: Vec<&[u8]> = argv.split(|b| *b == 0).collect();
    let is_daemon =
        argv.iter().any(|a| *a == b"app-server") && argv.iter().any(|a| *a == b"--managed-daemon");
    if !is_daemon {
        return None;
    }
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).ok()?;
    let home = std::fs::read(format!("/proc/{pid}/environ"))
        .ok()
        .and_then(|env| {
            env.split(|b| *b == 0)
                .find_map(|v| v.strip_prefix(b"CODEX_HOME="))
                .map(|v| PathBuf::from(String::from_utf8_lossy(v).into_owned()))
        })
        .or_else(|| home_of_daemon(&exe));
    Some(Daemon { exe, home })
}

/// Not on Linux: the daemon is not recognised yet, so Codex is not rung.
#[cfg(not(target_os = "linux"))]
fn parent_daemon(_pid: u32) -> Option<Daemon> {
    None
}

/// The daemon runs from `$CODEX_HOME/packages/app-server-daemon/releases/<v>/bin/codex`.
#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
fn home_of_daemon(exe: &Path) -> Option<PathBuf> {
    let releases = exe.parent()?.parent()?.parent()?;
    let packages = releases.parent()?.parent()?;
    (packages.file_name()? == "packages").then(|| packages.parent().map(Path::to_path_buf))?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thread_ids_are_uuids() {
        assert!(ThreadId::parse("019a2b3c-4d5e-7f60-8a9b-0c1d2e3f4a5b").is_ok());
        let e = ThreadId::parse("--message; rm -rf /").unwrap_err();
        assert_eq!(e.field, "_meta.threadId");
    }

    #[test]
    fn the_daemon_lives_in_codex_home() {
        let exe = Path::new(
            "/h/.codex/packages/app-server-daemon/releases/0.171.0-x86_64-unknown-linux-musl/bin/codex",
        );
        assert_eq!(home_of_daemon(exe), Some(PathBuf::from("/h/.codex")));
        assert_eq!(home_of_daemon(Path::new("/usr/bin/codex")), None);
    }
}
