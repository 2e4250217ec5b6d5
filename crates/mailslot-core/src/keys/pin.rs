//! The owner key this home confirmed: `owner.key.pinned`, a copy of the owner key file as it
//! was when the owner made it (`owner init`), replaced it (`owner change`) or confirmed a new
//! one (`owner confirm`, which takes the passphrases of both). An `owner.key` that is not the
//! confirmed one is refused: no new agent registers it and nothing unlocks it.

use std::path::{Path, PathBuf};

use super::file;
use crate::crypto::{KeyFileError, owner};
use crate::protocol::OwnerKey;

/// Why the home's owner key cannot be used as it is.
#[derive(Debug, thiserror::Error)]
pub enum OwnerPinError {
    /// The key file or its pin could not be read.
    #[error(transparent)]
    File(#[from] KeyFileError),
    /// `owner.key` holds another key than the confirmed one.
    #[error(
        "{path} holds owner key {}, but this home's confirmed owner key is {} (kept in {pin}): refused, so no agent registers it and nothing is signed with it. If you put it there yourself, confirm it at a terminal with `mailslot owner confirm` (it asks the passphrase of the confirmed key, then of the new one). If you did not, something with access to this home replaced it: put the confirmed key back with `cp {pin} {path}`",
        owner::fingerprint(found),
        owner::fingerprint(pinned)
    )]
    Changed {
        /// The owner key file.
        path: PathBuf,
        /// The confirmed copy.
        pin: PathBuf,
        /// The confirmed key.
        pinned: OwnerKey,
        /// The key in the owner key file now.
        found: OwnerKey,
    },
    /// `owner.key` is gone while a confirmed key is kept.
    #[error(
        "{path} is missing, but this home's confirmed owner key {} is kept in {pin}: put it back with `cp {pin} {path}`",
        owner::fingerprint(pinned)
    )]
    Missing {
        /// The owner key file.
        path: PathBuf,
        /// The confirmed copy.
        pin: PathBuf,
        /// The confirmed key.
        pinned: OwnerKey,
    },
}

impl OwnerPinError {
    /// The confirmed key, when the owner key file disagrees with it.
    pub fn confirmed(&self) -> Option<OwnerKey> {
        match self {
            Self::Changed { pinned, .. } | Self::Missing { pinned, .. } => Some(*pinned),
            Self::File(_) => None,
        }
    }
}

/// Where the confirmed copy of the owner key file at `key` is kept.
pub fn pin_path(key: &Path) -> PathBuf {
    let mut path = key.as_os_str().to_owned();
    path.push(".pinned");
    PathBuf::from(path)
}

/// The public key in the owner key file at `path`, read without the passphrase; `None` when
/// there is none.
fn public_in(path: &Path) -> Result<Option<OwnerKey>, KeyFileError> {
    match file::read(path) {
        Ok(text) => owner::public_in_key_file(&text, path).map(Some),
        Err(KeyFileError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

/// This home's owner key as confirmed: the public key in `path` when it is the pinned one;
/// `None` when the home has none. A home whose key was made before keys were pinned pins it
/// at this first read.
pub fn read_owner_public(path: &Path) -> Result<Option<OwnerKey>, OwnerPinError> {
    let pin = pin_path(path);
    let (found, pinned) = (public_in(path)?, public_in(&pin)?);
    let pinned = match (found, pinned) {
        (None, None) => return Ok(None),
        (Some(_), None) => {
            pin_first(path, &pin)?;
            // Another process may have pinned a moment before: its pin is the one that counts.
            public_in(&pin)?
        }
        (_, pinned) => pinned,
    };
    match (found, pinned) {
        (found, None) => Ok(found),
        (Some(found), Some(pinned)) if found == pinned => Ok(Some(found)),
        (Some(found), Some(pinned)) => Err(OwnerPinError::Changed {
            path: path.to_owned(),
            pin,
            pinned,
            found,
        }),
        (None, Some(pinned)) => Err(OwnerPinError::Missing {
            path: path.to_owned(),
            pin,
            pinned,
        }),
    }
}

/// Pins the owner key file at `path` unless a pin was written meanwhile.
fn pin_first(path: &Path, pin: &Path) -> Result<(), KeyFileError> {
    match file::write_new(pin, &file::read(path)?) {
        Err(KeyFileError::Exists { .. }) => Ok(()),
        other => other,
    }
}

/// Confirms the owner key file at `path` as it is now: its copy becomes the pin. For the
/// owner's commands, once the passphrase proved it.
pub fn pin_owner_key(path: &Path) -> Result<(), KeyFileError> {
    let text = file::read(path)?;
    owner::public_in_key_file(&text, path)?;
    file::replace(&pin_path(path), &text)
}
