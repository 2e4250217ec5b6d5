//! The last delivery's outcome, kept in the agent's folder so that `mailslot doctor` (another
//! process) can show it.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The file, in the agent's folder.
pub const STATUS_FILE: &str = "openclaw-doorbell.json";
/// The largest status file read.
const MAX_BYTES: u64 = 16 * 1024;

/// Where the last delivery stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DeliveryState {
    /// The gateway accepted it (or it was found in the session after an unclear answer).
    Delivered,
    /// It failed and is retried.
    Retrying,
    /// It was given up; the message is still in the inbox.
    Failed,
}

/// The last delivery attempt's outcome.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeliveryStatus {
    /// Where it stands.
    pub state: DeliveryState,
    /// The message.
    pub message_id: String,
    /// The OpenClaw session.
    pub session_key: String,
    /// When this was recorded.
    pub at: jiff::Timestamp,
    /// What went wrong and what to do, when it failed.
    pub error: Option<String>,
}

/// The status file of the agent whose folder is `dir`.
pub fn path(dir: &Path) -> PathBuf {
    dir.join(STATUS_FILE)
}

/// The last recorded status, if any (an unreadable file counts as none).
pub fn load(dir: &Path) -> Option<DeliveryStatus> {
    let path = path(dir);
    if std::fs::metadata(&path).ok()?.len() > MAX_BYTES {
        return None;
    }
    serde_json::from_slice(&std::fs::read(path).ok()?).ok()
}

/// Records `status` (atomically: a reader sees the old or the new one).
pub fn save(dir: &Path, status: &DeliveryStatus) -> std::io::Result<()> {
    let mut file = tempfile::NamedTempFile::new_in(dir)?;
    serde_json::to_writer_pretty(&mut file, status)?;
    file.persist(path(dir))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(load(dir.path()), None);
        let status = DeliveryStatus {
            state: DeliveryState::Retrying,
            message_id: "m".into(),
            session_key: "agent:main:dm:mailbox-bob".into(),
            at: jiff::Timestamp::now(),
            error: Some("add sessions_send to gateway.tools.allow in openclaw.json".into()),
        };
        save(dir.path(), &status).unwrap();
        assert_eq!(load(dir.path()), Some(status));
    }
}
