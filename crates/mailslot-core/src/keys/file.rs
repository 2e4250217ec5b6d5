//! Private key files on disk: written whole with mode 0600 and synced, never overwritten by
//! accident, and refused when other users can read them.

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;

use zeroize::Zeroizing;

use crate::crypto::KeyFileError;

/// Largest key file read.
const MAX_BYTES: u64 = 4096;

fn io(path: &Path) -> impl Fn(std::io::Error) -> KeyFileError + '_ {
    move |source| KeyFileError::Io {
        path: path.to_owned(),
        source,
    }
}

/// Writes `bytes` to a temporary file beside `path` (mode 0600, synced) and returns its path.
fn write_temp(path: &Path, bytes: &[u8]) -> Result<std::path::PathBuf, KeyFileError> {
    // The whole name and `.tmp`: `owner.key.next` and `owner.key.pinned` get one each.
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = std::path::PathBuf::from(tmp);
    let _ = fs::remove_file(&tmp);
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(io(path))?;
    f.write_all(bytes)
        .and_then(|()| f.sync_all())
        .map_err(io(path))?;
    Ok(tmp)
}

/// Writes a new key file; refuses to overwrite one.
pub(super) fn write_new(path: &Path, bytes: &[u8]) -> Result<(), KeyFileError> {
    let tmp = write_temp(path, bytes)?;
    // hard_link fails if the target exists, so two racing writers cannot both win.
    let linked = fs::hard_link(&tmp, path);
    let _ = fs::remove_file(&tmp);
    match linked {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Err(KeyFileError::Exists {
            path: path.to_owned(),
        }),
        Err(e) => Err(io(path)(e)),
    }
}

/// Replaces a key file in one step (rename), so it is never half-written.
pub(super) fn replace(path: &Path, bytes: &[u8]) -> Result<(), KeyFileError> {
    let tmp = write_temp(path, bytes)?;
    fs::rename(&tmp, path).map_err(io(path))
}

/// Reads a key file, refusing one that other users can read or that is implausibly large.
pub(super) fn read(path: &Path) -> Result<Zeroizing<Vec<u8>>, KeyFileError> {
    let meta = fs::metadata(path).map_err(io(path))?;
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(KeyFileError::Permissions {
            path: path.to_owned(),
            mode,
        });
    }
    if meta.len() > MAX_BYTES {
        return Err(KeyFileError::Malformed {
            path: path.to_owned(),
            problem: format!("larger than {MAX_BYTES} bytes"),
        });
    }
    Ok(Zeroizing::new(fs::read(path).map_err(io(path))?))
}
