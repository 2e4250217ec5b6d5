//! Which process holds an agent's relay connection. The relay keeps one connection per agent
//! (a second replaces the first), so of several `mailslot mcp` processes for one agent only
//! the holder of this lock connects; the others serve from the shared store.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, Write};
use std::path::{Path, PathBuf};

const LOCK_FILE: &str = "relay-connection.lock";

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
}
