//! The private key files on disk: an agent's keys, the owner key (sealed under its
//! passphrase), a relay's key, and secrets other modules make (the MCP HTTP token), written whole with mode 0600 and synced (`file.rs`), never
//! overwritten by accident, refused when other users can read them. `crypto` makes and parses
//! their contents and does no I/O; the file methods of its key types are implemented here, so
//! callers keep writing `Identity::load(path)`.

mod file;
mod pin;

use std::path::Path;

pub use pin::{OwnerPinError, pin_owner_key, pin_path, read_owner_public};

use zeroize::Zeroizing;

use crate::crypto::{Identity, KeyFileError, Owner, OwnerKeyError, Passphrase, RelayIdentity};

impl Identity {
    /// Writes a new key file with mode 0600; refuses to overwrite one.
    pub fn save_new(&self, path: &Path) -> Result<(), KeyFileError> {
        file::write_new(path, &self.to_key_file())
    }

    /// Reads a key file, refusing one that other users can read.
    pub fn load(path: &Path) -> Result<Self, KeyFileError> {
        Self::from_key_file(&file::read(path)?, path)
    }

    /// Replaces the key file in one step (a key rotation finishing).
    pub fn replace_file(&self, path: &Path) -> Result<(), KeyFileError> {
        file::replace(path, &self.to_key_file())
    }
}

impl Owner {
    /// Writes a new owner key file (mode 0600), sealed under `passphrase`; refuses to
    /// overwrite one.
    pub fn save_new(&self, path: &Path, passphrase: &Passphrase) -> Result<(), KeyFileError> {
        file::write_new(path, &self.to_key_file(passphrase))
    }

    /// Replaces the owner key file in one step, sealed under `passphrase`.
    pub fn replace_file(&self, path: &Path, passphrase: &Passphrase) -> Result<(), KeyFileError> {
        file::replace(path, &self.to_key_file(passphrase))
    }

    /// Unlocks the owner key file with `passphrase`.
    pub fn unlock(path: &Path, passphrase: &Passphrase) -> Result<Self, OwnerKeyError> {
        Self::from_key_file(&file::read(path)?, path, passphrase)
    }
}

/// A secret the caller makes (a bearer token), kept in its own file: read from `path`, or
/// written there (mode 0600) from `make` when there is none; when another process wrote it
/// first, theirs.
pub fn read_or_create_secret(
    path: &Path,
    make: impl FnOnce() -> Zeroizing<Vec<u8>>,
) -> Result<Zeroizing<Vec<u8>>, KeyFileError> {
    match file::read(path) {
        Err(KeyFileError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
            match file::write_new(path, &make()) {
                Ok(()) | Err(KeyFileError::Exists { .. }) => file::read(path),
                Err(e) => Err(e),
            }
        }
        read => read,
    }
}

impl RelayIdentity {
    /// Reads the key file at `path`, or makes a new key there when there is none. The flag
    /// says whether it was made now.
    pub fn load_or_create(path: &Path) -> Result<(Self, bool), KeyFileError> {
        match Self::load(path) {
            Ok(identity) => Ok((identity, false)),
            Err(KeyFileError::Io { source, .. })
                if source.kind() == std::io::ErrorKind::NotFound =>
            {
                let identity = Self::generate();
                match identity.save_new(path) {
                    Ok(()) => Ok((identity, true)),
                    // Another process made it first: use theirs.
                    Err(KeyFileError::Exists { .. }) => Ok((Self::load(path)?, false)),
                    Err(e) => Err(e),
                }
            }
            Err(e) => Err(e),
        }
    }

    /// Writes a new key file with mode 0600; refuses to overwrite one.
    pub fn save_new(&self, path: &Path) -> Result<(), KeyFileError> {
        file::write_new(path, &self.to_key_file())
    }

    /// Reads a key file, refusing one that other users can read.
    pub fn load(path: &Path) -> Result<Self, KeyFileError> {
        Self::from_key_file(&file::read(path)?, path)
    }
}

#[cfg(test)]
mod tests {
    use std::fs;
    use std::os::unix::fs::PermissionsExt;

    use super::*;
    use crate::crypto::owner;

    fn mode(path: &Path) -> u32 {
        fs::metadata(path).unwrap().permissions().mode() & 0o777
    }

    fn pass(s: &str) -> Passphrase {
        Passphrase::new(s.to_owned()).unwrap()
    }

    #[test]
    fn agent_key_file_round_trip_with_mode_0600_never_overwritten() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("identity.key");
        let id = Identity::generate();
        id.save_new(&path).unwrap();
        assert_eq!(mode(&path), 0o600);
        let loaded = Identity::load(&path).unwrap();
        assert_eq!(loaded.public(), id.public());
        assert!(matches!(
            Identity::generate().save_new(&path),
            Err(KeyFileError::Exists { .. })
        ));
        assert_eq!(
            Identity::load(&path).unwrap().public(),
            id.public(),
            "overwritten"
        );
    }

    #[test]
    fn refuses_a_world_readable_key_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("identity.key");
        Identity::generate().save_new(&path).unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).unwrap();
        let err = Identity::load(&path).unwrap_err();
        assert!(err.to_string().contains("chmod 600"), "{err}");
    }

    #[test]
    fn owner_key_file_mode_0600_opens_only_with_its_passphrase() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("owner.key");
        assert_eq!(read_owner_public(&path).unwrap(), None);
        let owner = Owner::generate();
        owner
            .save_new(&path, &pass("correct horse battery"))
            .unwrap();
        assert_eq!(mode(&path), 0o600);
        assert_eq!(read_owner_public(&path).unwrap(), Some(owner.public()));
        assert!(matches!(
            Owner::unlock(&path, &pass("wrong horse battery")),
            Err(OwnerKeyError::WrongPassphrase { .. })
        ));
        let unlocked = Owner::unlock(&path, &pass("correct horse battery")).unwrap();
        assert_eq!(unlocked.public(), owner.public());
        assert!(matches!(
            Owner::generate().save_new(&path, &pass("another passphrase")),
            Err(KeyFileError::Exists { .. })
        ));
        let next = Owner::generate();
        next.replace_file(&path, &pass("a new passphrase")).unwrap();
        assert_eq!(mode(&path), 0o600);
        // The first read pinned the first key: the replaced file is refused until confirmed.
        assert_eq!(mode(&pin_path(&path)), 0o600);
        let err = read_owner_public(&path).unwrap_err();
        assert_eq!(err.confirmed(), Some(owner.public()));
        pin_owner_key(&path).unwrap();
        assert_eq!(read_owner_public(&path).unwrap(), Some(next.public()));
    }

    #[test]
    fn an_owner_key_file_that_is_not_the_pinned_one_is_refused_naming_both() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("owner.key");
        let (mine, theirs) = (Owner::generate(), Owner::generate());
        mine.save_new(&path, &pass("correct horse battery"))
            .unwrap();
        pin_owner_key(&path).unwrap();
        let other = dir.path().join("other.key");
        theirs
            .save_new(&other, &pass("the agent's own one"))
            .unwrap();
        fs::rename(&other, &path).unwrap();
        let err = read_owner_public(&path).unwrap_err();
        let said = err.to_string();
        for key in [mine.public(), theirs.public()] {
            assert!(said.contains(owner::fingerprint(&key).as_str()), "{said}");
        }
        assert!(said.contains("mailslot owner confirm"), "{said}");
        assert_eq!(err.confirmed(), Some(mine.public()));
        // Putting the pinned copy back, as the error says, restores it.
        fs::copy(pin_path(&path), &path).unwrap();
        assert_eq!(read_owner_public(&path).unwrap(), Some(mine.public()));
        fs::remove_file(&path).unwrap();
        let err = read_owner_public(&path).unwrap_err();
        assert!(matches!(err, OwnerPinError::Missing { .. }), "{err}");
        assert_eq!(err.confirmed(), Some(mine.public()));
    }

    #[test]
    fn relay_key_made_once_with_mode_0600_then_loaded() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("relay.db.key");
        let (made, created) = RelayIdentity::load_or_create(&path).unwrap();
        assert!(created);
        assert_eq!(mode(&path), 0o600);
        let (again, created) = RelayIdentity::load_or_create(&path).unwrap();
        assert!(!created);
        assert_eq!(again.key(), made.key());
        fs::set_permissions(&path, fs::Permissions::from_mode(0o640)).unwrap();
        let err = RelayIdentity::load_or_create(&path).unwrap_err();
        assert!(err.to_string().contains("chmod 600"), "{err}");
    }
}
