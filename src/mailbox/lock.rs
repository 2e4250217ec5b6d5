//! Which process holds an agent's relay connection. The relay keeps one connection per agent
//! (a second replaces the first), so of several `mailslot mcp` processes for one agent only
//! the holder of this lock connects; the others serve from the shared store.
//!
//! Besides, every process that runs a session of the agent (not the owner's dashboard) holds
//! a shared lock on a second file for as long as it runs: the dashboard, which holds the
//! connection only while no session of the agent runs, gives it up when it sees that lock.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, Write};
use std::path::{Path, PathBuf};

const LOCK_FILE: &str = "relay-connection.lock";
const SESSIONS_FILE: &str = "agent-sessions.lock";

/// The lock file of the agent in `dir`.
pub struct ConnectionLock {
    path: PathBuf,
}

impl ConnectionLock {
    /// The lock for the agent whose folder is `dir`.
    pub fn for_agent(dir: &Path) -> Self {
        Self {
            path: dir.join(LOCK_FILE),
        }
    }

    /// Takes the lock for as long as the returned file stays open, recording this process's
    /// id in it; `Ok(None)` when another process holds it.
    pub fn try_take(&self) -> std::io::Result<Option<File>> {
        let mut file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(&self.path)?;
        match file.try_lock() {
            Ok(()) => {
                file.set_len(0)?;
                file.rewind()?;
                write!(file, "{}", std::process::id())?;
                file.flush()?;
                Ok(Some(file))
            }
            Err(std::fs::TryLockError::WouldBlock) => Ok(None),
            Err(std::fs::TryLockError::Error(e)) => Err(e),
        }
    }

    /// Marks this process as running a session of the agent for as long as the returned
    /// file stays open (a shared lock: every such process holds one).
    pub fn mark_session(&self) -> std::io::Result<File> {
        let file = self.sessions_file()?;
        // Waits only while a dashboard looks (`session_running` holds the lock for no longer).
        file.lock_shared()?;
        Ok(file)
    }

    /// The file [`ConnectionLock::session_running`] looks at, opened once by the dashboard.
    pub fn sessions_file(&self) -> std::io::Result<File> {
        OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(self.path.with_file_name(SESSIONS_FILE))
    }

    /// Whether a process runs a session of the agent (marked with
    /// [`ConnectionLock::mark_session`]), looking through `sessions`, the agent's
    /// [`ConnectionLock::sessions_file`].
    pub fn session_running(sessions: &File) -> std::io::Result<bool> {
        match sessions.try_lock() {
            Ok(()) => {
                sessions.unlock()?;
                Ok(false)
            }
            Err(std::fs::TryLockError::WouldBlock) => Ok(true),
            Err(std::fs::TryLockError::Error(e)) => Err(e),
        }
    }

    /// The process id the holder wrote, if readable.
    pub fn holder(&self) -> Option<u32> {
        let mut text = String::new();
        File::open(&self.path)
            .ok()?
            .read_to_string(&mut text)
            .ok()?;
        text.trim().parse().ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_holder_at_a_time_and_released_on_drop() {
        let dir = tempfile::tempdir().unwrap();
        let lock = ConnectionLock::for_agent(dir.path());
        let held = lock.try_take().unwrap().expect("free at first");
        assert!(lock.try_take().unwrap().is_none(), "taken twice");
        assert_eq!(lock.holder(), Some(std::process::id()));
        drop(held);
        assert!(lock.try_take().unwrap().is_some(), "not released");
    }

    #[test]
    fn a_session_is_seen_while_it_runs() {
        let dir = tempfile::tempdir().unwrap();
        let lock = ConnectionLock::for_agent(dir.path());
        let sessions = lock.sessions_file().unwrap();
        assert!(!ConnectionLock::session_running(&sessions).unwrap());
        let first = lock.mark_session().unwrap();
        let second = lock.mark_session().unwrap();
        assert!(ConnectionLock::session_running(&sessions).unwrap());
        drop(first);
        assert!(
            ConnectionLock::session_running(&sessions).unwrap(),
            "one still runs"
        );
        drop(second);
        assert!(!ConnectionLock::session_running(&sessions).unwrap());
    }
}
