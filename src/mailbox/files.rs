//! Attachments from and to files. A file is attached by path only inside the folders the
//! agent may use (an MCP client's roots, else the working directory of `mailslot mcp`; the
//! CLI, run by the owner, may name any file), after resolving symlinks, and only a regular
//! file within the size limit; small content may come inline instead. Saving writes a whole
//! file atomically inside the same folders and never replaces one unless asked to.

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use base64::Engine;

use super::Mailbox;
use crate::protocol::{Attachment, Limits};

/// The most bytes of inline content (text or base64-decoded) one attachment may carry: more
/// belongs in a file, attached by path, so it never passes through a model's context.
pub const MAX_INLINE_BYTES: usize = 64 * 1024;

/// Where an attachment's content comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AttachmentSource {
    /// A file, absolute or relative to the first allowed folder.
    Path(PathBuf),
    /// Inline UTF-8 text, sent as `text/plain` (or the type its name suggests).
    Text {
        /// The file name the recipient sees.
        name: String,
        /// The content.
        text: String,
    },
    /// Inline bytes in standard base64.
    Base64 {
        /// The file name the recipient sees.
        name: String,
        /// The content, base64.
        base64: String,
    },
}

/// The folders files may be read from and written to. `Anywhere` is for the owner's CLI.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Folders {
    /// Only inside these folders (canonical paths), described as `source` in errors.
    Within {
        /// The folders, symlinks resolved.
        roots: Vec<PathBuf>,
        /// Where they came from ("the client's roots", "the working directory").
        source: String,
    },
    /// Any path the process can open.
    Anywhere,
}

/// Why a file could not be attached or saved. Each says which file, which rule, and the fix.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    /// The path resolves outside the allowed folders.
    #[error(
        "{field} {path} is outside the folders this agent may use ({origin}: {roots}); copy the file into one of them, or attach small content inline"
    )]
    Outside {
        /// The argument.
        field: String,
        /// The path as given.
        path: String,
        /// Where the folders came from.
        origin: String,
        /// The folders.
        roots: String,
    },
    /// Not a regular file (a folder, a device, a socket).
    #[error("{field} {path} is not a regular file; attach a file, not a folder or device")]
    NotAFile {
        /// The argument.
        field: String,
        /// The path as given.
        path: String,
    },
    /// Over a size limit.
    #[error("{field} {path} is {size} bytes, over the limit of {limit} bytes{what}; {fix}")]
    TooLarge {
        /// The argument.
        field: String,
        /// The path or name.
        path: String,
        /// Its size.
        size: u64,
        /// The limit.
        limit: usize,
        /// Which limit (" for inline content").
        what: &'static str,
        /// What to do instead.
        fix: &'static str,
    },
    /// The file exists and overwriting was not asked for.
    #[error("{field} {path} exists; choose another path, or pass overwrite: true to replace it")]
    Exists {
        /// The argument.
        field: String,
        /// The path as given.
        path: String,
    },
    /// Inline content or a name is unusable.
    #[error("{field} {problem}")]
    Invalid {
        /// The argument.
        field: String,
        /// What is wrong and the fix.
        problem: String,
    },
    /// The OS refused. (Said in the message, not chained as a source, so it is said once.)
    #[error("{field} {path}: {cause}")]
    Io {
        /// The argument.
        field: String,
        /// The path as given.
        path: String,
        /// What the OS said.
        cause: std::io::Error,
    },
}

impl Folders {
    /// The folders given (each must exist), or the working directory when there are none.
    pub fn within(roots: Vec<PathBuf>, source: &str) -> Result<Self, std::io::Error> {
        let (roots, source) = if roots.is_empty() {
            (vec![std::env::current_dir()?], "the working directory")
        } else {
            (roots, source)
        };
        let roots = roots
            .iter()
            .filter_map(|r| fs::canonicalize(r).ok())
            .collect::<Vec<_>>();
        Ok(Self::Within {
            roots,
            source: source.to_owned(),
        })
    }

    /// The first folder (the client's first root, or the working directory): where a
    /// session's repository is looked for.
    pub fn first(&self) -> Option<&Path> {
        match self {
            Self::Within { roots, .. } => roots.first().map(PathBuf::as_path),
            Self::Anywhere => None,
        }
    }

    /// `raw` made absolute: relative paths start at the first folder.
    fn absolute(&self, raw: &Path) -> PathBuf {
        match self {
            Self::Within { roots, .. } if raw.is_relative() => roots
                .first()
                .map_or_else(|| raw.to_owned(), |r| r.join(raw)),
            _ => raw.to_owned(),
        }
    }

    /// Refuses `canonical` (symlinks resolved) unless it is inside a folder.
    fn check(&self, field: &str, raw: &Path, canonical: &Path) -> Result<(), FileError> {
        match self {
            Self::Anywhere => Ok(()),
            Self::Within { roots, source } => {
                if roots.iter().any(|r| canonical.starts_with(r)) {
                    return Ok(());
                }
                Err(FileError::Outside {
                    field: field.to_owned(),
                    path: raw.display().to_string(),
                    origin: source.clone(),
                    roots: if roots.is_empty() {
                        "none".to_owned()
                    } else {
                        roots
                            .iter()
                            .map(|r| r.display().to_string())
                            .collect::<Vec<_>>()
                            .join(", ")
                    },
                })
            }
        }
    }
}

/// The local paths of `file://` URIs (an MCP client's roots); other schemes are skipped.
pub fn paths_of_file_uris<'a>(uris: impl IntoIterator<Item = &'a str>) -> Vec<PathBuf> {
    uris.into_iter()
        .filter_map(|uri| {
            let rest = uri.strip_prefix("file://")?;
            // `file:///p` has an empty host; `file://localhost/p` names this machine.
            let path = rest.strip_prefix("localhost").unwrap_or(rest);
            if !path.starts_with('/') {
                return None;
            }
            percent_decode(path).map(PathBuf::from)
        })
        .collect()
}

fn percent_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = s.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// A media type from a file name's extension; for an unknown one, `text/plain` when the
/// content is UTF-8 text, else `application/octet-stream`.
pub fn media_type(name: &str, bytes: &[u8]) -> &'static str {
    let ext = name
        .rsplit_once('.')
        .map(|(_, e)| e.to_ascii_lowercase())
        .unwrap_or_default();
    let known = match ext.as_str() {
        "txt" | "log" | "rs" | "py" | "go" | "c" | "h" | "sh" | "toml" | "ini" => "text/plain",
        "md" | "markdown" => "text/markdown",
        "csv" => "text/csv",
        "html" | "htm" => "text/html",
        "css" => "text/css",
        "xml" => "application/xml",
        "yaml" | "yml" => "application/yaml",
        "json" => "application/json",
        "js" => "text/javascript",
        "pdf" => "application/pdf",
        "png" => "image/png",
        "jpg" | "jpeg" => "image/jpeg",
        "gif" => "image/gif",
        "webp" => "image/webp",
        "svg" => "image/svg+xml",
        "zip" => "application/zip",
        "gz" => "application/gzip",
        "tar" => "application/x-tar",
        "bin" => "application/octet-stream",
        _ => "",
    };
    if !known.is_empty() {
        known
    } else if std::str::from_utf8(bytes).is_ok_and(|t| !t.contains('\0')) {
        "text/plain"
    } else {
        "application/octet-stream"
    }
}

/// Whether an attachment of `media_type` with `bytes` can be shown as text: text types and
/// the structured ones, when the bytes are UTF-8.
pub fn is_text(media_type: &str, bytes: &[u8]) -> bool {
    let textual = media_type.starts_with("text/")
        || matches!(
            media_type,
            "application/json" | "application/xml" | "application/yaml" | "image/svg+xml"
        )
        || media_type.ends_with("+json")
        || media_type.ends_with("+xml");
    textual && std::str::from_utf8(bytes).is_ok()
}

/// Reads `source` into an attachment (`field` names the argument in errors).
pub fn load(
    field: &str,
    source: AttachmentSource,
    folders: &Folders,
    limits: &Limits,
) -> Result<Attachment, FileError> {
    let invalid = |problem: String| FileError::Invalid {
        field: field.to_owned(),
        problem,
    };
    let inline = |name: String, bytes: Vec<u8>| {
        if bytes.len() > MAX_INLINE_BYTES {
            return Err(FileError::TooLarge {
                field: field.to_owned(),
                path: name,
                size: bytes.len() as u64,
                limit: MAX_INLINE_BYTES,
                what: " for inline content",
                fix: "write it to a file and attach it by path",
            });
        }
        let media_type = media_type(&name, &bytes);
        Ok(Attachment::new(name, media_type, bytes))
    };
    match source {
        AttachmentSource::Text { name, text } => inline(name, text.into_bytes()),
        AttachmentSource::Base64 { name, base64 } => {
            // Four base64 characters per three bytes: refuse before decoding a huge string.
            if base64.len() > MAX_INLINE_BYTES.div_ceil(3) * 4 + 4 {
                return inline(name, vec![0; MAX_INLINE_BYTES + 1]);
            }
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(base64.trim())
                .map_err(|e| invalid(format!("base64 is not valid standard base64 ({e})")))?;
            inline(name, bytes)
        }
        AttachmentSource::Path(raw) => {
            let io = |cause| FileError::Io {
                field: field.to_owned(),
                path: raw.display().to_string(),
                cause,
            };
            let canonical = fs::canonicalize(folders.absolute(&raw)).map_err(io)?;
            folders.check(field, &raw, &canonical)?;
            let meta = fs::metadata(&canonical).map_err(io)?;
            if !meta.is_file() {
                return Err(FileError::NotAFile {
                    field: field.to_owned(),
                    path: raw.display().to_string(),
                });
            }
            let too_large = |size: u64| FileError::TooLarge {
                field: field.to_owned(),
                path: raw.display().to_string(),
                size,
                limit: limits.attachment_bytes,
                what: " for one attachment",
                fix: "send a smaller file, or split it over several messages",
            };
            if meta.len() > limits.attachment_bytes as u64 {
                return Err(too_large(meta.len()));
            }
            let mut bytes = Vec::with_capacity(meta.len() as usize);
            // The file may grow between the look and the read.
            File::open(&canonical)
                .and_then(|f| {
                    f.take(limits.attachment_bytes as u64 + 1)
                        .read_to_end(&mut bytes)
                })
                .map_err(io)?;
            if bytes.len() > limits.attachment_bytes {
                return Err(too_large(bytes.len() as u64));
            }
            let name = canonical
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .ok_or_else(|| invalid("has no file name".into()))?;
            let media_type = media_type(&name, &bytes);
            Ok(Attachment::new(name, media_type, bytes))
        }
    }
}

/// Writes `bytes` to `raw` inside `folders`, whole or not at all: a new file beside it,
/// synced, then moved into place (over an existing file only with `overwrite`). Returns the
/// path written.
pub fn save(
    field: &str,
    raw: &Path,
    bytes: &[u8],
    folders: &Folders,
    overwrite: bool,
) -> Result<PathBuf, FileError> {
    let io = |cause| FileError::Io {
        field: field.to_owned(),
        path: raw.display().to_string(),
        cause,
    };
    let absolute = folders.absolute(raw);
    let (Some(parent), Some(name)) = (absolute.parent(), absolute.file_name()) else {
        return Err(FileError::Invalid {
            field: field.to_owned(),
            problem: format!(
                "{} does not name a file; give a path like out/report.pdf",
                raw.display()
            ),
        });
    };
    let parent = fs::canonicalize(if parent.as_os_str().is_empty() {
        Path::new(".")
    } else {
        parent
    })
    .map_err(io)?;
    let target = parent.join(name);
    folders.check(field, raw, &target)?;
    match fs::symlink_metadata(&target) {
        Ok(_) if !overwrite => {
            return Err(FileError::Exists {
                field: field.to_owned(),
                path: raw.display().to_string(),
            });
        }
        Ok(meta) if meta.is_dir() => {
            return Err(FileError::NotAFile {
                field: field.to_owned(),
                path: raw.display().to_string(),
            });
        }
        _ => {}
    }
    let temp = parent.join(format!(
        ".{}.mailslot-{}.part",
        name.to_string_lossy(),
        std::process::id()
    ));
    let written = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&temp)
        .and_then(|mut f| {
            f.write_all(bytes)?;
            f.sync_all()
        });
    let placed = written.and_then(|()| {
        if overwrite {
            // Replaces a symlink itself, never the file it points to.
            fs::rename(&temp, &target)
        } else {
            // A link fails if the name was taken meanwhile: never a silent replacement.
            fs::hard_link(&temp, &target).and_then(|()| fs::remove_file(&temp))
        }
    });
    if let Err(e) = placed {
        let _ = fs::remove_file(&temp);
        return Err(if e.kind() == std::io::ErrorKind::AlreadyExists {
            FileError::Exists {
                field: field.to_owned(),
                path: raw.display().to_string(),
            }
        } else {
            io(e)
        });
    }
    Ok(target)
}

impl Mailbox {
    /// Attachment `index` (from 0) of message `id`, bytes and all; `None` when there is no
    /// such message or attachment. Reads only that attachment.
    pub async fn attachment(
        &self,
        id: crate::protocol::MessageId,
        index: usize,
    ) -> Result<Option<Attachment>, super::MailboxError> {
        Ok(self.0.store.call(move |s| s.attachment(&id, index)).await?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn folders(dir: &Path) -> Folders {
        Folders::within(vec![dir.to_owned()], "the client's roots").unwrap()
    }

    #[test]
    fn files_outside_the_folders_and_symlinks_out_are_refused() {
        let root = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        fs::write(root.path().join("in.txt"), "hello").unwrap();
        fs::write(outside.path().join("secret.txt"), "no").unwrap();
        std::os::unix::fs::symlink(
            outside.path().join("secret.txt"),
            root.path().join("link.txt"),
        )
        .unwrap();
        let f = folders(root.path());
        let limits = Limits::default();
        let a = load("a", AttachmentSource::Path("in.txt".into()), &f, &limits).unwrap();
        assert_eq!(
            (a.name.as_str(), a.media_type.as_str()),
            ("in.txt", "text/plain")
        );
        let secret = outside.path().join("secret.txt");
        let e = load("a", AttachmentSource::Path(secret.clone()), &f, &limits).unwrap_err();
        assert!(matches!(e, FileError::Outside { .. }), "{e}");
        assert!(e.to_string().contains(&secret.display().to_string()), "{e}");
        let e = load("a", AttachmentSource::Path("link.txt".into()), &f, &limits).unwrap_err();
        assert!(matches!(e, FileError::Outside { .. }), "{e}");
        let e = load("a", AttachmentSource::Path(".".into()), &f, &limits).unwrap_err();
        assert!(matches!(e, FileError::NotAFile { .. }), "{e}");
    }

    #[test]
    fn sizes_are_bounded_and_inline_content_is_small() {
        let root = tempfile::tempdir().unwrap();
        fs::write(root.path().join("big.bin"), vec![0u8; 11]).unwrap();
        let limits = Limits {
            attachment_bytes: 10,
            ..Limits::default()
        };
        let f = folders(root.path());
        let e = load("a", AttachmentSource::Path("big.bin".into()), &f, &limits).unwrap_err();
        assert!(e.to_string().contains("over the limit of 10 bytes"), "{e}");
        let text = AttachmentSource::Text {
            name: "n.md".into(),
            text: "x".repeat(MAX_INLINE_BYTES + 1),
        };
        let e = load("a", text, &f, &limits).unwrap_err();
        assert!(e.to_string().contains(&MAX_INLINE_BYTES.to_string()), "{e}");
        let b64 = AttachmentSource::Base64 {
            name: "x.bin".into(),
            base64: "AAEC".into(),
        };
        let a = load("a", b64, &f, &limits).unwrap();
        assert_eq!(a.bytes, vec![0, 1, 2]);
    }

    #[test]
    fn saving_is_atomic_inside_the_folders_and_never_replaces_unasked() {
        let root = tempfile::tempdir().unwrap();
        let f = folders(root.path());
        let path = save("path", Path::new("out.bin"), b"one", &f, false).unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"one");
        let e = save("path", Path::new("out.bin"), b"two", &f, false).unwrap_err();
        assert!(matches!(e, FileError::Exists { .. }), "{e}");
        save("path", Path::new("out.bin"), b"two", &f, true).unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"two");
        let e = save("path", Path::new("/tmp/elsewhere.bin"), b"x", &f, false).unwrap_err();
        assert!(matches!(e, FileError::Outside { .. }), "{e}");
        let left: Vec<_> = fs::read_dir(root.path()).unwrap().collect();
        assert_eq!(left.len(), 1, "no temporary file is left behind");
    }

    #[test]
    fn file_uris_become_paths() {
        assert_eq!(
            paths_of_file_uris(["file:///a/b%20c", "file://localhost/d", "https://x/y"]),
            vec![PathBuf::from("/a/b c"), PathBuf::from("/d")]
        );
    }
}
