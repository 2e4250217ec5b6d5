//! The embedded default: with no relay configured, agents use a relay on loopback, started in
//! the background on first need. One relay per data home: it locks its database's folder.

use std::fs::{File, OpenOptions};
use std::io::ErrorKind;
use std::net::{SocketAddr, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use crate::client::RelayUrl;
use crate::config::Paths;

/// The loopback port used when none is configured.
pub const DEFAULT_PORT: u16 = 7878;
/// How long to wait for a freshly started relay to listen.
const START_TIMEOUT: Duration = Duration::from_secs(10);

/// Files beside a relay database: its lock, its pid, its log.
pub struct RelayFiles {
    /// The database they are beside.
    db: PathBuf,
    /// Held (locked) by the running relay.
    pub lock: PathBuf,
    /// `pid url`, written once the relay listens.
    pub pid: PathBuf,
    /// Where a background relay logs.
    pub log: PathBuf,
}

impl RelayFiles {
    /// The files for the relay using `db`.
    pub fn for_db(db: &Path) -> Self {
        let with = |ext: &str| {
            let mut p = db.as_os_str().to_owned();
            p.push(ext);
            PathBuf::from(p)
        };
        Self {
            db: db.to_owned(),
            lock: with(".lock"),
            pid: with(".pid"),
            log: with(".log"),
        }
    }

    /// Takes the lock for the life of the returned file, or says who holds it.
    pub fn lock(&self) -> anyhow::Result<File> {
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&self.lock)?;
        match file.try_lock() {
            Ok(()) => Ok(file),
            Err(std::fs::TryLockError::WouldBlock) => {
                let who = self
                    .running()
                    .map(|(pid, url)| format!(" (pid {pid}, {url})"))
                    .unwrap_or_default();
                bail!(
                    "another relay already uses this database{who}; stop it with `{}`",
                    stop_command(&self.db)
                )
            }
            Err(std::fs::TryLockError::Error(e)) => Err(e).context("locking the relay database"),
        }
    }

    /// The running relay's pid and URL, if its pid file names a live process.
    pub fn running(&self) -> Option<(i32, String)> {
        let text = std::fs::read_to_string(&self.pid).ok()?;
        let (pid, url) = text.trim().split_once(' ')?;
        let pid: i32 = pid.parse().ok()?;
        alive(pid).then(|| (pid, url.to_owned()))
    }
}

/// Whether `pid` is a live process: one that exited but was not reaped yet (a zombie, whose
/// parent has not waited for it) is not.
fn alive(pid: i32) -> bool {
    if nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_err() {
        return false;
    }
    // Linux: the state follows the command name, which is in parentheses.
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rsplit_once(')')
            .is_none_or(|(_, rest)| !rest.trim_start().starts_with('Z')),
        Err(_) => true,
    }
}

fn listening(addr: SocketAddr) -> bool {
    TcpStream::connect_timeout(&addr, Duration::from_millis(250)).is_ok()
}

/// The loopback relay's URL, starting it in the background if nothing listens there.
pub fn ensure(paths: &Paths, port: u16) -> anyhow::Result<RelayUrl> {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let url: RelayUrl = format!("ws://{addr}").parse().map_err(anyhow::Error::msg)?;
    if listening(addr) {
        return Ok(url);
    }
    let db = paths.relay_db();
    let dir = db.parent().context("the relay database has no folder")?;
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let files = RelayFiles::for_db(&db);
    let log = OpenOptions::new()
        .create(true)
        .append(true)
        .open(&files.log)
        .with_context(|| format!("opening {}", files.log.display()))?;
    let exe = std::env::current_exe().context("finding the mailslot executable")?;
    let mut child = Command::new(exe)
        .arg("relay")
        .arg("--listen")
        .arg(addr.to_string())
        .arg("--db")
        .arg(&db)
        .arg("--home")
        .arg(paths.home())
        // It listens on loopback only, so whoever can name a relay to it can reach what it
        // would reach: other homes' relays on this machine federate with it.
        .arg("--allow-private-relays")
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        // Its own process group: a Ctrl-C meant for this command does not stop the relay.
        .process_group(0)
        .spawn()
        .context("starting the local relay")?;
    let started = Instant::now();
    while started.elapsed() < START_TIMEOUT {
        if listening(addr) {
            eprintln!(
                "mailslot: started the local relay on {addr} (log: {})",
                files.log.display()
            );
            // A long-running parent (`mailslot mcp`) must reap it when it exits, or it stays a
            // zombie in the process table until it exits.
            std::thread::spawn(move || child.wait());
            return Ok(url);
        }
        if let Some(status) = child.try_wait()? {
            // Lost a race with another starter, which now listens; or a real failure.
            if listening(addr) {
                return Ok(url);
            }
            bail!(
                "the local relay exited ({status}); see {}",
                files.log.display()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    bail!(
        "the local relay did not listen on {addr} within {} s; see {}",
        START_TIMEOUT.as_secs(),
        files.log.display()
    )
}

/// `relay status`: what runs on the database `db` (the home's relay's by default).
pub fn status(db: &Path) -> Option<(i32, String)> {
    RelayFiles::for_db(db).running()
}

/// The command that stops the relay on `db`, to paste: it names the database, so it stops
/// that relay wherever it is pasted (without `--db` it would stop the home's relay).
pub fn stop_command(db: &Path) -> String {
    format!(
        "mailslot relay stop --db {}",
        crate::relay::shell_word(&db.to_string_lossy())
    )
}

/// `relay stop`: SIGTERM the relay on the database `db` and wait for it to exit.
pub fn stop(db: &Path) -> anyhow::Result<Option<i32>> {
    let files = RelayFiles::for_db(db);
    let Some((pid, _)) = files.running() else {
        return Ok(None);
    };
    let target = nix::unistd::Pid::from_raw(pid);
    nix::sys::signal::kill(target, nix::sys::signal::Signal::SIGTERM)
        .context("signalling the relay")?;
    let started = Instant::now();
    while started.elapsed() < START_TIMEOUT {
        if !alive(pid) {
            return Ok(Some(pid));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    bail!(
        "the relay (pid {pid}) did not stop within {} s",
        START_TIMEOUT.as_secs()
    )
}

/// Removes a pid file, ignoring one that is already gone.
pub fn remove_pid(files: &RelayFiles) {
    if let Err(e) = std::fs::remove_file(&files.pid)
        && e.kind() != ErrorKind::NotFound
    {
        tracing::warn!(error = %e, "could not remove the relay pid file");
    }
}
