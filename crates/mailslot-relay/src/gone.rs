//! Whether a SQLite relay's database is still the file it opened. A relay whose home was
//! deleted (by a script that made it, say) keeps its open files and its port but can write
//! nothing new, so every agent that uses the port fails until it exits; it notices by looking.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// How often the files are looked at.
const POLL: Duration = Duration::from_secs(2);

/// Why the relay's database is no longer its own.
#[derive(Debug, thiserror::Error)]
pub enum DatabaseGone {
    /// The file or its folder was deleted.
    #[error("{path} was deleted")]
    Deleted {
        /// What is missing.
        path: PathBuf,
    },
    /// Another file or folder now has its name.
    #[error("{path} was replaced by another")]
    Replaced {
        /// What was replaced.
        path: PathBuf,
    },
}

/// The database file and its folder as they were when the relay opened them (device and
/// inode), to compare with what their names lead to now.
pub struct DatabaseWatch {
    watched: Vec<(PathBuf, (u64, u64))>,
}

fn identity(path: &Path) -> std::io::Result<(u64, u64)> {
    std::fs::metadata(path).map(|m| (m.dev(), m.ino()))
}

impl DatabaseWatch {
    /// Notes the database file `db` and its folder as they are now.
    pub fn new(db: &Path) -> std::io::Result<Self> {
        let mut watched = vec![(db.to_owned(), identity(db)?)];
        if let Some(dir) = db.parent().filter(|d| !d.as_os_str().is_empty()) {
            watched.push((dir.to_owned(), identity(dir)?));
        }
        Ok(Self { watched })
    }

    /// What changed, if anything did. A path that cannot be looked at for another reason
    /// (permissions) counts as unchanged: only a certain loss stops the relay.
    pub fn check(&self) -> Option<DatabaseGone> {
        self.watched
            .iter()
            .find_map(|(path, was)| match identity(path) {
                Ok(now) if now == *was => None,
                Ok(_) => Some(DatabaseGone::Replaced { path: path.clone() }),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    Some(DatabaseGone::Deleted { path: path.clone() })
                }
                Err(_) => None,
            })
    }

    /// Returns once the database is gone, looking every two seconds.
    pub async fn gone(&self) -> DatabaseGone {
        let mut tick = tokio::time::interval(POLL);
        loop {
            tick.tick().await;
            if let Some(gone) = self.check() {
                return gone;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_deleted_or_replaced_database_is_noticed() {
        let home = tempfile::tempdir().unwrap();
        let dir = home.path().join("relay");
        std::fs::create_dir(&dir).unwrap();
        let db = dir.join("relay.db");
        std::fs::write(&db, b"x").unwrap();
        let watch = DatabaseWatch::new(&db).unwrap();
        assert!(watch.check().is_none());
        std::fs::write(dir.join("other.db"), b"y").unwrap();
        std::fs::rename(dir.join("other.db"), &db).unwrap();
        assert!(matches!(watch.check(), Some(DatabaseGone::Replaced { path }) if path == db));
        let watch = DatabaseWatch::new(&db).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(matches!(watch.check(), Some(DatabaseGone::Deleted { path }) if path == db));
        // The same path made again is another folder.
        std::fs::create_dir(&dir).unwrap();
        std::fs::write(&db, b"x").unwrap();
        assert!(matches!(watch.check(), Some(DatabaseGone::Replaced { .. })));
    }
}
