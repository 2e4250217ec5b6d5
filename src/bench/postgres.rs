//! PostgreSQL for `bench relay`: a throwaway cluster for the nodes when no `--db` is given,
//! and the CPU time of the server's processes, whichever server it is, when it runs on this
//! machine.

use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use anyhow::{Context, bail};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use super::proc;

/// How long the new server may take to accept connections.
const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// A PostgreSQL cluster of the benchmark's own: `initdb` in a temp folder, a server on a free
/// loopback port with the durability settings of a real deployment (`fsync` and
/// `synchronous_commit` on, the defaults), stopped and removed on drop.
pub(super) struct Cluster {
    server: Child,
    port: u16,
    /// Removed after the server stopped.
    _dir: tempfile::TempDir,
}

impl Cluster {
    /// Initializes and starts a cluster that takes `connections` connections. It must be
    /// called from a thread that lives as long as the benchmark (the server stops when the
    /// thread that started it ends, so it cannot outlive a benchmark that was killed).
    pub(super) fn start(connections: u32) -> anyhow::Result<Self> {
        let bin = binaries()?;
        let dir = tempfile::Builder::new()
            .prefix("mailslot-bench-pg-")
            .tempdir()?;
        // initdb refuses to run as root.
        let user = unprivileged_user()?;
        if let Some((uid, gid)) = user {
            std::os::unix::fs::chown(dir.path(), Some(uid), Some(gid))
                .context("handing the cluster's folder to its user")?;
        }
        let data = dir.path().join("data");
        let command = |program: &str| {
            let mut command = Command::new(bin.join(program));
            command
                .current_dir(dir.path())
                .env("LC_ALL", "C")
                .stdin(Stdio::null());
            if let Some((uid, gid)) = user {
                command.uid(uid).gid(gid);
            }
            command
        };
        eprintln!(
            "starting a throwaway PostgreSQL cluster in {}…",
            dir.path().display()
        );
        let out = command("initdb")
            .arg("-D")
            .arg(&data)
            .args(["-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-locale"])
            // Only initdb's own final flush of the new files; the server's fsync stays on.
            .args(["--no-sync", "--no-instructions"])
            .output()
            .context("running initdb")?;
        if !out.status.success() {
            bail!(
                "initdb failed: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let mut server = command("postgres");
        server
            .arg("-D")
            .arg(&data)
            .args(["-p", &port.to_string()])
            .args(["-c", "listen_addresses=127.0.0.1"])
            .args(["-c", "unix_socket_directories="])
            .args(["-c", &format!("max_connections={connections}")])
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        // SAFETY: prctl is async-signal-safe and nothing else runs between fork and exec. It
        // runs after the switch of user, which would clear it. SIGQUIT is PostgreSQL's
        // immediate shutdown. Linux only: elsewhere a bench that dies leaves its server running.
        #[cfg(target_os = "linux")]
        unsafe {
            server.pre_exec(|| {
                nix::sys::prctl::set_pdeathsig(Signal::SIGQUIT).map_err(std::io::Error::from)
            });
        }
        let mut server = server.spawn().context("starting postgres")?;
        let stderr = server.stderr.take().context("postgres's stderr")?;
        let (ready, is_ready) = mpsc::channel();
        std::thread::spawn(move || {
            let mut ready = Some(ready);
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { return };
                if line.contains("ready to accept connections") {
                    if let Some(ready) = ready.take() {
                        let _ = ready.send(Ok(()));
                    }
                } else if line.contains("FATAL") || line.contains("PANIC") {
                    match ready.take() {
                        Some(ready) => {
                            let _ = ready.send(Err(line));
                        }
                        None => eprintln!("postgres: {line}"),
                    }
                }
            }
        });
        let cluster = Self {
            server,
            port,
            _dir: dir,
        };
        match is_ready.recv_timeout(READY_TIMEOUT) {
            Ok(Ok(())) => Ok(cluster),
            Ok(Err(line)) => bail!("PostgreSQL did not start: {line}"),
            Err(_) => bail!("PostgreSQL did not start within {READY_TIMEOUT:?}"),
        }
    }

    /// The URL of the cluster's `postgres` database.
    pub(super) fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // Fast shutdown: sessions end, nothing needs to be kept.
        let _ = kill(Pid::from_raw(self.server.id() as i32), Signal::SIGINT);
        let _ = self.server.wait();
    }
}

/// The folder of `initdb` and `postgres`: on PATH (a symlink there, as in `/usr/local/bin`,
/// stands for the folder it points into), else the newest under `/usr/lib/postgresql/*/bin`
/// (where Debian's packages put them). The test harness finds its servers the same way.
pub fn binaries() -> anyhow::Result<PathBuf> {
    let complete = |dir: &Path| ["initdb", "postgres"].iter().all(|b| dir.join(b).is_file());
    let on_path = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .filter_map(|d| {
            let initdb = std::fs::canonicalize(d.join("initdb")).ok()?;
            initdb.parent().map(Path::to_path_buf)
        })
        .find(|d| complete(d));
    if let Some(dir) = on_path {
        return Ok(dir);
    }
    let mut versions: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok().map(|e| e.path().join("bin")))
        .filter(|d| complete(d))
        .collect();
    versions.sort_by_key(|d| {
        d.parent()
            .and_then(|v| v.file_name()?.to_str()?.parse::<u32>().ok())
            .unwrap_or(0)
    });
    versions.pop().context(
        "PostgreSQL's initdb is neither on PATH nor under /usr/lib/postgresql/*/bin: install PostgreSQL, or give the nodes a database with --db postgres://…",
    )
}

/// The user and group a server runs as: ours, unless we are root (which `initdb` refuses),
/// then Debian's `postgres`, else `nobody`.
pub fn unprivileged_user() -> anyhow::Result<Option<(u32, u32)>> {
    if !nix::unistd::geteuid().is_root() {
        return Ok(None);
    }
    let user = ["postgres", "nobody"]
        .iter()
        .find_map(|n| nix::unistd::User::from_name(n).ok().flatten())
        .context("running as root, and there is neither a postgres nor a nobody user to run PostgreSQL as")?;
    Ok(Some((user.uid.as_raw(), user.gid.as_raw())))
}

/// The CPU time of a PostgreSQL server on this machine: its postmaster and every process it
/// started (backends, the WAL writer, checkpointer, …).
pub(super) struct ServerCpu {
    postmaster: u32,
}

impl ServerCpu {
    /// The server behind `url`, found through the process of a connection of ours: its parent
    /// is the postmaster. `None` (with a note) when the server is not a local process.
    pub(super) async fn find(url: &str) -> Option<Self> {
        match Self::postmaster(url).await {
            Ok(postmaster) => Some(Self { postmaster }),
            Err(why) => {
                eprintln!("PostgreSQL CPU is not reported: {why:#}");
                None
            }
        }
    }

    async fn postmaster(url: &str) -> anyhow::Result<u32> {
        let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
            .await
            .context("connecting without TLS")?;
        let task = tokio::spawn(connection);
        let backend: i32 = client
            .query_one("SELECT pg_backend_pid()", &[])
            .await?
            .try_get(0)?;
        let backend = u32::try_from(backend)?;
        let postmaster = proc::parent(backend)
            .with_context(|| format!("its process {backend} is not on this machine"))?;
        drop(client);
        let _ = task.await;
        match proc::command_name(postmaster) {
            Some(name) if name.starts_with("postgres") => Ok(postmaster),
            other => bail!("process {postmaster} here is {other:?}, not PostgreSQL's postmaster"),
        }
    }

    /// CPU seconds (user + system) the server used so far.
    pub(super) fn seconds(&self) -> f64 {
        proc::tree_cpu_seconds(self.postmaster)
    }
}
