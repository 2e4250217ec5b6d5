//! The rewake hook: `mailslot hook wake` in a Claude Code hook entry with
//! `"asyncRewake": true` (SessionStart and Stop). Claude Code runs it in the background; when
//! it exits with code 2, its stderr wakes the model, idle or busy. It waits for mail the
//! session's model has not been shown and exits 2 with the fenced digest.
//!
//! It serves only sessions that no `mailslot mcp` process wakes by the channel or the inbox
//! socket (their claim in the store, `store::IdlePath`): with a live claim it waits without
//! taking anything, so one message never rings twice.
//!
//! It also waits while the session is busy (its hooks record turns: the PostToolUse and
//! Stop hooks show mail to a busy session), and leaves mail alone for its first moments,
//! while the hooks that run beside it at the same event show what is already there.
//!
//! Exactly one waiter per session: a Stop hook starts a new one after every turn, so a waiter
//! takes the session's lock file and a later one that finds it taken exits at once (the
//! first keeps waiting; Claude Code still wakes on it). A waiter ends when it rings, when the
//! session ends (its parent or Claude Code is gone), or after [`LIFE`].

use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::launch;
use crate::doorbell::digest::unread_digest;
use crate::doorbell::hooks::HookError;
use crate::protocol::AgentName;
use crate::store::{SessionKey, Store, Via};

/// The longest a waiter waits (the example's hook `timeout` is a little longer).
pub const LIFE: Duration = Duration::from_secs(12 * 3600);
/// How often the store and the session's processes are looked at.
const POLL: Duration = Duration::from_millis(200);
/// How long a new waiter leaves the mail alone: the hooks that run beside it at the same
/// event (SessionStart's digest, Stop's) show what is there already.
const GRACE: Duration = Duration::from_millis(1500);
/// Unread messages listed in the digest.
const DIGEST_ITEMS: usize = 10;
/// Lock files of sessions this old are swept.
const SWEEP_AFTER: Duration = Duration::from_secs(30 * 24 * 3600);
/// The folder of the waiters' lock files, in the agent's folder.
const LOCK_DIR: &str = "wake";

/// How a wait ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Woke {
    /// A headless session (`claude -p`): nothing to wake, and Claude Code would wait for it.
    Headless,
    /// Mail: the digest, for stderr (exit 2).
    Mail(String),
    /// Another waiter serves the session.
    Joined,
    /// The session ended.
    SessionEnded,
    /// [`LIFE`] passed.
    Expired,
}

/// The processes whose end ends the session: the hook's parent (the shell Claude Code runs
/// hooks in) and Claude Code.
#[derive(Debug, Clone, Copy)]
pub struct Watched {
    parent: u32,
    claude: Option<u32>,
}

impl Watched {
    /// This process's parent and Claude Code, now.
    pub fn now() -> Self {
        Self {
            parent: nix::unistd::getppid().as_raw() as u32,
            claude: launch::claude_pid(),
        }
    }

    fn gone(&self) -> bool {
        nix::unistd::getppid().as_raw() as u32 != self.parent
            || self.claude.is_some_and(|c| !alive(c))
    }
}

/// Whether process `pid` runs.
pub fn alive(pid: u32) -> bool {
    let Ok(pid) = i32::try_from(pid) else {
        return false;
    };
    matches!(
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None),
        Ok(()) | Err(nix::errno::Errno::EPERM)
    )
}

/// Waits for `session`'s unseen mail in `store` (agent `agent`, folder `agent_dir`).
pub fn wait(
    store: &mut Store,
    agent: &AgentName,
    agent_dir: &Path,
    session: &SessionKey,
    watched: Watched,
    life: Duration,
) -> Result<Woke, HookError> {
    if launch::hook_headless() {
        return Ok(Woke::Headless);
    }
    let Some(_lock) = take_lock(agent_dir, session)? else {
        return Ok(Woke::Joined);
    };
    let started = Instant::now();
    loop {
        if watched.gone() {
            return Ok(Woke::SessionEnded);
        }
        if started.elapsed() >= life {
            return Ok(Woke::Expired);
        }
        let served_elsewhere = store
            .idle_claim(session)?
            .is_some_and(|claim| alive(claim.pid));
        // A busy session is shown its mail by the hooks after each tool call and at Stop.
        if started.elapsed() >= GRACE && !served_elsewhere && !store.is_busy(session)? {
            let (unseen, total) = store.take_unseen(session, DIGEST_ITEMS, Via::Rewake)?;
            if !unseen.is_empty() {
                let digest = unread_digest(
                    &unseen,
                    total,
                    "Read them with the mailslot read tool (message_id) or the inbox tool before acting on them.",
                );
                return Ok(Woke::Mail(format!(
                    "New mail for {agent} (mailslot).\n{digest}"
                )));
            }
        }
        std::thread::sleep(POLL);
    }
}

/// Takes `session`'s lock file; `None` when another waiter holds it. Sweeps the lock files of
/// long-gone sessions on the way.
fn take_lock(agent_dir: &Path, session: &SessionKey) -> std::io::Result<Option<File>> {
    let dir = agent_dir.join(LOCK_DIR);
    std::fs::create_dir_all(&dir)?;
    sweep(&dir);
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(lock_path(&dir, session))?;
    match file.try_lock() {
        Ok(()) => Ok(Some(file)),
        Err(std::fs::TryLockError::WouldBlock) => Ok(None),
        Err(std::fs::TryLockError::Error(e)) => Err(e),
    }
}

fn lock_path(dir: &Path, session: &SessionKey) -> PathBuf {
    // A session key is letters, digits, '.', '_', ':' and '-': a safe file name, but not '.'.
    dir.join(format!("{}.lock", session.as_str().replace('.', "_")))
}

fn sweep(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let old = entry
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age > SWEEP_AFTER);
        if old
            && let Ok(file) = File::open(entry.path())
            && file.try_lock().is_ok()
        {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_lock_per_session() {
        let dir = tempfile::tempdir().unwrap();
        let s = SessionKey::new("c26a70b4-07bd-4ec2-9708-adeaeb9b6867").unwrap();
        let other = SessionKey::new("other").unwrap();
        let held = take_lock(dir.path(), &s).unwrap().expect("free");
        assert!(take_lock(dir.path(), &s).unwrap().is_none());
        assert!(take_lock(dir.path(), &other).unwrap().is_some());
        drop(held);
        assert!(take_lock(dir.path(), &s).unwrap().is_some());
    }

    #[test]
    fn this_process_is_alive_and_a_dead_pid_is_not() {
        assert!(alive(std::process::id()));
        assert!(!alive(i32::MAX as u32));
    }
}
