//! The page that opens the dashboard in the owner's browser without putting the secret on a
//! command line, as Jupyter does: a small HTML file, mode 0600, in `<home>/dashboard/` (mode
//! 0700, the owner's), that posts the secret to the dashboard's `/login` as soon as it loads.
//! The browser is started with the file's `file://` URL, which carries nothing; other users
//! can read that command line but not the file. The POST keeps the secret out of the address
//! bar and the history too. The file is removed once the secret is used, after
//! [`LAUNCH_TTL`], or when the dashboard stops, whichever comes first.

use std::fs;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use maud::{DOCTYPE, html};

/// How long an unused launch page is kept.
pub const LAUNCH_TTL: Duration = Duration::from_secs(120);

/// Why the launch page could not be written.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    /// The folder or the file could not be made.
    #[error("cannot write the dashboard's launch page in {dir}: {source}")]
    Io {
        /// The folder.
        dir: PathBuf,
        /// What the OS said.
        source: std::io::Error,
    },
    /// The folder is not one only this user can enter.
    #[error(
        "{dir} is not a folder of this user's (it is a link, or another user owns it); remove it and start the dashboard again"
    )]
    Foreign {
        /// The folder.
        dir: PathBuf,
    },
}

/// A launch page on disk; removed when dropped.
#[derive(Debug)]
pub struct LaunchPage {
    path: PathBuf,
}

impl LaunchPage {
    /// Writes the page for the dashboard at `origin` (`http://127.0.0.1:PORT`) with this
    /// launch's `secret` into `dir` (made with mode 0700 if missing).
    pub fn write(dir: &Path, origin: &str, secret: &str) -> Result<Self, LaunchError> {
        let io = |source| LaunchError::Io {
            dir: dir.to_owned(),
            source,
        };
        private_dir(dir)?;
        let name = origin.rsplit(':').next().unwrap_or("dashboard");
        let path = dir.join(format!("open-{name}.html"));
        let page = html! {
            (DOCTYPE)
            html {
                head { meta charset="utf-8"; title { "mailslot dashboard" } }
                body {
                    form method="post" action=(format!("{origin}/login")) {
                        input type="hidden" name="token" value=(secret);
                        button type="submit" { "Open the mailslot dashboard" }
                    }
                    script { "document.forms[0].submit();" }
                }
            }
        };
        // A page left by a dashboard that died on the same port is replaced, never reused.
        let _ = fs::remove_file(&path);
        let mut file = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .map_err(io)?;
        // Removed from here on, should the write fail.
        let written = Self { path };
        file.write_all(page.into_string().as_bytes()).map_err(io)?;
        Ok(written)
    }

    /// The page's `file://` URL, for the browser.
    pub fn url(&self) -> String {
        reqwest::Url::from_file_path(&self.path)
            .map(String::from)
            .unwrap_or_else(|()| format!("file://{}", self.path.display()))
    }
}

impl Drop for LaunchPage {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.path);
    }
}

/// Makes `dir` with mode 0700, or checks that it is a folder of this user's and narrows its
/// mode to 0700.
fn private_dir(dir: &Path) -> Result<(), LaunchError> {
    let io = |source| LaunchError::Io {
        dir: dir.to_owned(),
        source,
    };
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(io)?;
    let meta = fs::symlink_metadata(dir).map_err(io)?;
    if !meta.is_dir() || meta.uid() != nix::unistd::geteuid().as_raw() {
        return Err(LaunchError::Foreign {
            dir: dir.to_owned(),
        });
    }
    if meta.mode() & 0o077 != 0 {
        fs::set_permissions(dir, fs::Permissions::from_mode(0o700)).map_err(io)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(path: &Path) -> u32 {
        fs::symlink_metadata(path).unwrap().mode() & 0o777
    }

    #[test]
    fn the_page_is_private_posts_the_secret_and_goes_when_dropped() {
        let home = tempfile::tempdir().unwrap();
        let dir = home.path().join("dashboard");
        fs::DirBuilder::new().mode(0o755).create(&dir).unwrap();
        let page = LaunchPage::write(&dir, "http://127.0.0.1:4242", "s3cret").unwrap();
        let path = page.url().strip_prefix("file://").unwrap().to_owned();
        assert_eq!(Path::new(&path), dir.join("open-4242.html"));
        assert_eq!(mode(&dir), 0o700, "a folder others could enter is narrowed");
        assert_eq!(mode(Path::new(&path)), 0o600);
        let html = fs::read_to_string(&path).unwrap();
        assert!(
            html.contains(r#"action="http://127.0.0.1:4242/login""#)
                && html.contains(r#"name="token" value="s3cret""#),
            "{html}"
        );
        drop(page);
        assert!(!Path::new(&path).exists());
    }

    #[test]
    fn a_link_in_place_of_the_folder_is_refused() {
        let home = tempfile::tempdir().unwrap();
        let elsewhere = tempfile::tempdir().unwrap();
        let dir = home.path().join("dashboard");
        std::os::unix::fs::symlink(elsewhere.path(), &dir).unwrap();
        let refused = LaunchPage::write(&dir, "http://127.0.0.1:1", "s").unwrap_err();
        assert!(matches!(refused, LaunchError::Foreign { .. }), "{refused}");
        assert_eq!(fs::read_dir(elsewhere.path()).unwrap().count(), 0);
    }
}
