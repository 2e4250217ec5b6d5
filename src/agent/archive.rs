//! One agent in one file, sealed under a passphrase: `mailslot export` writes it, `mailslot
//! import` makes the agent again from it, on this machine or another.
//!
//! The file is a first line naming the format, a second line of JSON in the clear (the
//! agent's name and fingerprint, when it was made, how the key was stretched: nothing
//! secret, so `import` can refuse an existing agent before asking for the passphrase), then
//! the sealed bytes: a tar of `identity.key` and `store.db` (a consistent copy), bound to both
//! lines. The owner key is not in it: it is the owner's, already sealed, and shared by every
//! agent of a home.

use std::fs;
use std::io::Read;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use jiff::Timestamp;
use serde::{Deserialize, Serialize};
use zeroize::Zeroizing;

use super::{Agent, KEY_FILE, STORE_FILE};
use crate::config::Paths;
use crate::crypto::vault::{Lock, VaultError};
use crate::crypto::{Identity, KeyFileError, Passphrase};
use crate::protocol::{AgentName, Fingerprint};
use crate::store::{Store, StoreError};

/// The first line of every export.
const MAGIC: &[u8] = b"mailslot-export v1\n";
/// The longest header line accepted.
const MAX_HEADER_BYTES: usize = 4096;
/// The largest export read (the store dominates it).
pub const MAX_EXPORT_BYTES: u64 = 1 << 30;

/// What an export says about itself in the clear.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Header {
    /// The agent.
    pub agent: AgentName,
    /// Its fingerprint.
    pub fingerprint: Fingerprint,
    /// When the export was made.
    pub exported_at: Timestamp,
    /// How the sealing key was stretched from the passphrase.
    pub lock: Lock,
}

/// Why an export could not be written or read.
#[derive(Debug, thiserror::Error)]
pub enum ArchiveError {
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What the OS said.
        source: std::io::Error,
    },
    /// The file is not an export this build reads.
    #[error("{path} is not a mailslot export: {problem}")]
    NotAnExport {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        problem: String,
    },
    /// The passphrase does not open it (or the file was changed).
    #[error("the passphrase does not open {path}, or the file was changed")]
    WrongPassphrase {
        /// The file.
        path: PathBuf,
    },
    /// The agent exists here already.
    #[error("agent {agent} already exists in {dir}")]
    Exists {
        /// The agent.
        agent: AgentName,
        /// Its folder.
        dir: PathBuf,
    },
    /// The export's keys are not the ones its header names.
    #[error("the keys in {path} have fingerprint {found}, not the {named} its header names")]
    WrongKeys {
        /// The file.
        path: PathBuf,
        /// The header's.
        named: Fingerprint,
        /// The keys'.
        found: Fingerprint,
    },
    /// The keys inside could not be read.
    #[error(transparent)]
    Keys(#[from] KeyFileError),
    /// The store inside could not be copied or checked.
    #[error(transparent)]
    Store(#[from] StoreError),
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> ArchiveError + '_ {
    move |source| ArchiveError::Io {
        path: path.to_owned(),
        source,
    }
}

/// Writes `agent` to a new file `out` (mode 0600), sealed under `passphrase`; refuses to
/// overwrite a file.
pub fn export(agent: &Agent, passphrase: &Passphrase, out: &Path) -> Result<Header, ArchiveError> {
    let snapshot = Scratch::new(&agent.dir, "export")?;
    let store_copy = snapshot.path.join(STORE_FILE);
    agent.store.snapshot(&store_copy)?;
    let store_bytes = Zeroizing::new(fs::read(&store_copy).map_err(io(&store_copy))?);
    let mut tar = tar::Builder::new(Vec::new());
    append(&mut tar, KEY_FILE, &agent.identity.to_key_file())?;
    append(&mut tar, STORE_FILE, &store_bytes)?;
    let plain = Zeroizing::new(tar.into_inner().map_err(io(out))?);
    let header = Header {
        agent: agent.name.clone(),
        fingerprint: agent.identity.fingerprint(),
        exported_at: Timestamp::now(),
        lock: Lock::new(),
    };
    let head = header_line(&header);
    let sealed = header.lock.seal(passphrase, &plain, &aad(&head));
    let mut file = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(out)
        .map_err(io(out))?;
    use std::io::Write;
    file.write_all(MAGIC)
        .and_then(|()| file.write_all(&head))
        .and_then(|()| file.write_all(&sealed))
        .and_then(|()| file.sync_all())
        .map_err(io(out))?;
    Ok(header)
}

/// Reads the clear header of the export at `path`, and the sealed rest.
pub fn read_header(path: &Path) -> Result<(Header, Vec<u8>, Vec<u8>), ArchiveError> {
    let not = |problem: String| ArchiveError::NotAnExport {
        path: path.to_owned(),
        problem,
    };
    let file = fs::File::open(path).map_err(io(path))?;
    let len = file.metadata().map_err(io(path))?.len();
    if len > MAX_EXPORT_BYTES {
        return Err(not(format!(
            "it is {len} bytes; exports of up to {MAX_EXPORT_BYTES} bytes are read"
        )));
    }
    let mut bytes = Vec::with_capacity(len as usize);
    file.take(MAX_EXPORT_BYTES)
        .read_to_end(&mut bytes)
        .map_err(io(path))?;
    let rest = bytes
        .strip_prefix(MAGIC)
        .ok_or_else(|| not("it does not start with `mailslot-export v1`".into()))?;
    let end = rest
        .iter()
        .take(MAX_HEADER_BYTES)
        .position(|b| *b == b'\n')
        .ok_or_else(|| not(format!("no header line within {MAX_HEADER_BYTES} bytes")))?;
    let head = rest[..=end].to_vec();
    let header: Header =
        serde_json::from_slice(&head).map_err(|e| not(format!("its header: {e}")))?;
    Ok((header, head, rest[end + 1..].to_vec()))
}

/// Makes the agent of the export at `path` in `paths`' home. An existing agent of that name
/// is refused unless `replace`, which moves it aside first (returned).
pub fn import(
    paths: &Paths,
    path: &Path,
    passphrase: &Passphrase,
    replace: bool,
) -> Result<(Header, Option<PathBuf>), ArchiveError> {
    let (header, head, sealed) = read_header(path)?;
    let dir = paths.agent_dir(&header.agent);
    if dir.exists() && !replace {
        return Err(ArchiveError::Exists {
            agent: header.agent,
            dir,
        });
    }
    let plain = header
        .lock
        .open(passphrase, &sealed, &aad(&head))
        .map_err(|e| match e {
            VaultError::WrongPassphrase => ArchiveError::WrongPassphrase {
                path: path.to_owned(),
            },
            VaultError::Malformed(problem) => ArchiveError::NotAnExport {
                path: path.to_owned(),
                problem,
            },
        })?;
    let agents = paths.agent_dir(&header.agent);
    let parent = agents.parent().unwrap_or(Path::new("."));
    fs::create_dir_all(parent).map_err(io(parent))?;
    let staged = Scratch::new(parent, &format!("import-{}", header.agent))?;
    let (keys, store) = unpack(path, &plain)?;
    let identity = Identity::from_key_file(&keys, path)?;
    if identity.fingerprint() != header.fingerprint {
        return Err(ArchiveError::WrongKeys {
            path: path.to_owned(),
            named: header.fingerprint,
            found: identity.fingerprint(),
        });
    }
    identity.save_new(&staged.path.join(KEY_FILE))?;
    let store_path = staged.path.join(STORE_FILE);
    write_private(&store_path, &store)?;
    // Read back as the views read it, so an import never installs a store no view can read.
    let imported = Store::open(&store_path)?;
    imported.check_integrity()?;
    imported.check_rows()?;
    drop(imported);
    let moved_aside = if dir.exists() {
        let aside = parent.join(format!(
            ".replaced-{}-{}",
            header.agent,
            Timestamp::now().as_millisecond()
        ));
        fs::rename(&dir, &aside).map_err(io(&dir))?;
        Some(aside)
    } else {
        None
    };
    staged.keep_as(&dir)?;
    Ok((header, moved_aside))
}

/// A secret file's bytes, wiped when dropped.
type Secret = Zeroizing<Vec<u8>>;

/// The tar's two files (keys, store); anything else in it is refused.
fn unpack(path: &Path, plain: &[u8]) -> Result<(Secret, Secret), ArchiveError> {
    let not = |problem: String| ArchiveError::NotAnExport {
        path: path.to_owned(),
        problem,
    };
    let (mut keys, mut store) = (None, None);
    let mut archive = tar::Archive::new(plain);
    for entry in archive.entries().map_err(io(path))? {
        let mut entry = entry.map_err(io(path))?;
        let name = entry
            .path()
            .map_err(io(path))?
            .to_string_lossy()
            .into_owned();
        let mut bytes = Zeroizing::new(Vec::new());
        entry.read_to_end(&mut bytes).map_err(io(path))?;
        match name.as_str() {
            KEY_FILE if keys.is_none() => keys = Some(bytes),
            STORE_FILE if store.is_none() => store = Some(bytes),
            other => return Err(not(format!("it holds an unexpected file {other:?}"))),
        }
    }
    match (keys, store) {
        (Some(keys), Some(store)) => Ok((keys, store)),
        _ => Err(not(format!("it must hold {KEY_FILE} and {STORE_FILE}"))),
    }
}

fn append(tar: &mut tar::Builder<Vec<u8>>, name: &str, bytes: &[u8]) -> Result<(), ArchiveError> {
    let mut head = tar::Header::new_gnu();
    head.set_size(bytes.len() as u64);
    head.set_mode(0o600);
    head.set_cksum();
    tar.append_data(&mut head, name, bytes)
        .map_err(io(Path::new(name)))
}

fn header_line(header: &Header) -> Vec<u8> {
    let mut line = serde_json::to_vec(header).expect("a header always serializes");
    line.push(b'\n');
    line
}

/// What the sealed bytes are bound to: both clear lines.
fn aad(head: &[u8]) -> Vec<u8> {
    [MAGIC, head].concat()
}

fn write_private(path: &Path, bytes: &[u8]) -> Result<(), ArchiveError> {
    use std::io::Write;
    let mut file = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(io(path))?;
    file.write_all(bytes)
        .and_then(|()| file.sync_all())
        .map_err(io(path))
}

/// A private folder (0700) that is removed when dropped, unless kept.
struct Scratch {
    path: PathBuf,
    keep: bool,
}

impl Scratch {
    /// A new folder in `parent`, hidden (a leading dot is never an agent's name).
    fn new(parent: &Path, what: &str) -> Result<Self, ArchiveError> {
        let path = parent.join(format!(
            ".{what}-{}-{}",
            std::process::id(),
            Timestamp::now().as_nanosecond()
        ));
        fs::DirBuilder::new()
            .mode(0o700)
            .create(&path)
            .map_err(io(&path))?;
        Ok(Self { path, keep: false })
    }

    /// Renames the folder to `target` and keeps it.
    fn keep_as(mut self, target: &Path) -> Result<(), ArchiveError> {
        fs::rename(&self.path, target).map_err(io(target))?;
        self.keep = true;
        Ok(())
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if !self.keep {
            let _ = fs::remove_dir_all(&self.path);
        }
    }
}
