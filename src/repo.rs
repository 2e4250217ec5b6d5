//! The git repository a command or an MCP session works in, as reservations see it: its
//! project name, the paths a commit stages, and where its hooks go. Asks the `git` program,
//! which knows the repository's configuration (`core.hooksPath`, worktrees) better than any
//! reading of `.git` would.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::protocol::{ProjectName, ValidationError};

/// The git configuration key that names a repository's project.
pub const PROJECT_KEY: &str = "mailslot.project";
/// Hex digits of the root commit id a project is named by when none is configured.
const ROOT_ID_DIGITS: usize = 12;
/// The most bytes of `git` output read.
const MAX_OUTPUT_BYTES: usize = 64 * 1024 * 1024;

/// Why the repository could not be read.
#[derive(Debug, thiserror::Error)]
pub enum RepoError {
    /// `git` could not be run.
    #[error("cannot run git ({0}); install git, or pass --project NAME")]
    NoGit(std::io::Error),
    /// The folder is in no git repository.
    #[error(
        "{0} is not inside a git repository; run this in the repository, or pass --project NAME"
    )]
    NotARepository(PathBuf),
    /// The repository has no commit to name its project by, and none is configured.
    #[error(
        "the repository at {0} has no commit yet, so it has no project name; set one with `git config {PROJECT_KEY} NAME`, or pass --project NAME"
    )]
    NoCommit(PathBuf),
    /// The configured project name is not valid.
    #[error(
        "`git config {PROJECT_KEY}` is invalid: {0}; set a valid one with `git config {PROJECT_KEY} NAME`"
    )]
    BadProject(ValidationError),
    /// `git` failed.
    #[error("git {args} failed: {stderr}")]
    Git {
        /// What it was asked.
        args: String,
        /// What it said.
        stderr: String,
    },
}

/// The project of the repository at `dir`: `git config mailslot.project` when set, else the
/// first 12 hex digits of its root commit, which every clone of it shares.
pub fn project(dir: &Path) -> Result<ProjectName, RepoError> {
    toplevel(dir)?;
    if let Some(name) = optional(dir, &["config", "--get", PROJECT_KEY])? {
        return ProjectName::new(name.trim()).map_err(RepoError::BadProject);
    }
    let roots = optional(dir, &["rev-list", "--max-parents=0", "HEAD"])?
        .ok_or_else(|| RepoError::NoCommit(dir.to_owned()))?;
    // A history with several roots (merged repositories): the smallest id, so every clone
    // picks the same one.
    let root = roots
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .min()
        .ok_or_else(|| RepoError::NoCommit(dir.to_owned()))?;
    let short: String = root.chars().take(ROOT_ID_DIGITS).collect();
    ProjectName::new(&short).map_err(RepoError::BadProject)
}

/// The repository's top folder.
pub fn toplevel(dir: &Path) -> Result<PathBuf, RepoError> {
    let out = run(dir, &["rev-parse", "--show-toplevel"])
        .map_err(|_| RepoError::NotARepository(dir.to_owned()))?;
    Ok(PathBuf::from(out.trim_end_matches('\n')))
}

/// The paths the next commit changes, repository-relative: added, changed and deleted files,
/// and both sides of a rename.
pub fn staged_paths(dir: &Path) -> Result<Vec<String>, RepoError> {
    let out = run(
        dir,
        &["diff", "--cached", "--name-only", "--no-renames", "-z"],
    )?;
    Ok(out
        .split('\0')
        .filter(|p| !p.is_empty())
        .map(str::to_owned)
        .collect())
}

/// The folder git runs the repository's hooks from (`core.hooksPath` when set), absolute.
pub fn hooks_dir(dir: &Path) -> Result<PathBuf, RepoError> {
    let top = toplevel(dir)?;
    let out = run(&top, &["rev-parse", "--git-path", "hooks"])?;
    let hooks = PathBuf::from(out.trim_end_matches('\n'));
    Ok(if hooks.is_absolute() {
        hooks
    } else {
        top.join(hooks)
    })
}

/// Runs `git -C dir ARGS`; its standard output, or the failure.
fn run(dir: &Path, args: &[&str]) -> Result<String, RepoError> {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .output()
        .map_err(RepoError::NoGit)?;
    if !out.status.success() {
        return Err(RepoError::Git {
            args: args.join(" "),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        });
    }
    if out.stdout.len() > MAX_OUTPUT_BYTES {
        return Err(RepoError::Git {
            args: args.join(" "),
            stderr: format!("printed over {MAX_OUTPUT_BYTES} bytes"),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Like [`run`], with `None` for a command that answers by failing (an unset key, no HEAD).
fn optional(dir: &Path, args: &[&str]) -> Result<Option<String>, RepoError> {
    match run(dir, args) {
        Ok(out) => Ok(Some(out)),
        Err(RepoError::Git { .. }) => Ok(None),
        Err(e) => Err(e),
    }
}
