//! An agent's home on disk: its folder (mode 0700), key file and store. Opening an agent
//! that does not exist yet creates it.

pub mod archive;
pub mod voice;

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use crate::config::Paths;
use crate::crypto::{Identity, KeyFileError};
use crate::keys::{OwnerPinError, read_owner_public};
use crate::protocol::{Address, AgentName, OwnerKey};
use crate::store::{Store, StoreError};

const KEY_FILE: &str = "identity.key";
/// The keys a rotation moves to, written before the relay hears of them and renamed over
/// [`KEY_FILE`] once it has, so an interrupted rotation resumes with the same keys.
const NEXT_KEY_FILE: &str = "identity.key.next";
const STORE_FILE: &str = "store.db";

/// Why an agent could not be opened or created.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// The folder could not be made.
    #[error("cannot create {path}: {source}")]
    Io {
        /// The folder.
        path: PathBuf,
        /// What the OS said.
        source: std::io::Error,
    },
    /// The keys could not be read or written.
    #[error(transparent)]
    Keys(#[from] KeyFileError),
    /// The home's owner key is not the confirmed one.
    #[error(transparent)]
    OwnerKey(#[from] OwnerPinError),
    /// The store could not be opened.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A store exists but its keys are gone; making new ones would change who the agent is.
    #[error(
        "agent {name} has a store but no key file at {path}; restore it from a backup, or move {dir} away to start over"
    )]
    MissingKeys {
        /// The agent.
        name: AgentName,
        /// Where the key file should be.
        path: PathBuf,
        /// The agent's folder.
        dir: PathBuf,
    },
}

/// An open agent: name, keys and store.
#[derive(Debug)]
pub struct Agent {
    /// Its name.
    pub name: AgentName,
    /// Its keys.
    pub identity: Identity,
    /// Its store.
    pub store: Store,
    /// Its folder.
    pub dir: PathBuf,
    /// The public half of its owner's key, when the owner made one (`mailslot owner init`)
    /// and as the home confirmed it (see `keys::read_owner_public`): registered with the relay
    /// on the agent's first connection.
    pub owner: Option<OwnerKey>,
}

impl Agent {
    /// Opens the agent, creating folder, keys and store on first use. The flag says whether
    /// it was created now.
    pub fn open_or_create(paths: &Paths, name: &AgentName) -> Result<(Self, bool), AgentError> {
        let dir = paths.agent_dir(name);
        let key_path = dir.join(KEY_FILE);
        let store_path = store_path(&dir);
        let mut created = false;
        let owner = match read_owner_public(&paths.owner_key()) {
            Ok(owner) => owner,
            // An existing agent keeps offering the confirmed key (the relay holds it, or should);
            // a new agent is not made while the home's owner key is in doubt.
            Err(e) if key_path.exists() => match e.confirmed() {
                Some(confirmed) => {
                    tracing::warn!(error = %e, "the owner key file is not the confirmed one; offering the confirmed key");
                    Some(confirmed)
                }
                None => return Err(e.into()),
            },
            Err(e) => return Err(e.into()),
        };
        if !key_path.exists() {
            if store_path.exists() {
                return Err(AgentError::MissingKeys {
                    name: name.clone(),
                    path: key_path,
                    dir,
                });
            }
            make_private_dir(&dir)?;
            match Identity::generate().save_new(&key_path) {
                Ok(()) => created = true,
                // Another process created it first: use theirs.
                Err(KeyFileError::Exists { .. }) => {}
                Err(e) => return Err(e.into()),
            }
        }
        let identity = Identity::load(&key_path)?;
        let mut store = Store::open(&store_path)?;
        store.set_owner_check(voice::owner_check(name, paths.owner_key()));
        Ok((
            Self {
                name: name.clone(),
                identity,
                store,
                dir,
                owner,
            },
            created,
        ))
    }

    /// The keys an unfinished rotation moves to: read if a rotation was interrupted, else
    /// made now (keeping the current sealing keys to open mail sealed to them) and written.
    pub fn next_identity(&self) -> Result<Identity, AgentError> {
        let path = self.dir.join(NEXT_KEY_FILE);
        match Identity::load(&path) {
            Ok(next) => Ok(next),
            Err(KeyFileError::Io { source, .. })
                if source.kind() == std::io::ErrorKind::NotFound =>
            {
                let next = self.identity.rotated();
                next.save_new(&path)?;
                Ok(next)
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Finishes a rotation the relay accepted: the next keys become the agent's keys.
    pub fn commit_next_identity(&mut self, next: Identity) -> Result<(), AgentError> {
        next.replace_file(&self.dir.join(KEY_FILE))?;
        let _ = fs::remove_file(self.dir.join(NEXT_KEY_FILE));
        self.identity = next;
        Ok(())
    }

    /// The agent's address. Without a relay, the bare name.
    pub fn address(&self) -> Address {
        Address::local(self.name.clone())
    }
}

/// The store of an existing agent at `path`, alone, for a process that only reads its mail (a
/// hook): owner messages are checked against the home's confirmed owner key, as in every view.
pub fn open_store(paths: &Paths, name: &AgentName, path: &Path) -> Result<Store, AgentError> {
    let mut store = Store::open(path)?;
    store.set_owner_check(voice::owner_check(name, paths.owner_key()));
    Ok(store)
}

/// Where the store of the agent whose folder is `dir` lives.
pub fn store_path(dir: &Path) -> PathBuf {
    dir.join(STORE_FILE)
}

fn make_private_dir(dir: &Path) -> Result<(), AgentError> {
    let io = |source| AgentError::Io {
        path: dir.to_owned(),
        source,
    };
    fs::create_dir_all(dir).map_err(io)?;
    fs::set_permissions(dir, fs::Permissions::from_mode(0o700)).map_err(io)
}
