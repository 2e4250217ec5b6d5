//! A private PostgreSQL cluster for tests: `initdb` in a temp dir and a server on a free
//! loopback port, never a shared server. One cluster serves a whole test binary
//! ([`PgCluster::shared`]) with a fresh database per test, so tests run in parallel on it;
//! tests that stop or kill the server start their own ([`PgCluster::start`]).
//!
//! Without the binaries a test is skipped with a note on stderr, unless
//! `MAILSLOT_REQUIRE_POSTGRES=1` (CI), which makes it fail.
//!
//! Leftovers cannot pile up: the server runs with a parent-death signal (SIGQUIT, PostgreSQL's
//! immediate shutdown) tied to a thread that lives as long as the test process, so it stops
//! when the process ends however it ends; and each cluster's folder is named after the
//! process, so the next cluster removes the folders of processes that are gone.

use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, OnceLock, mpsc};
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// How long the server may take to accept connections.
const READY_TIMEOUT: Duration = Duration::from_secs(60);
/// Set to 1 (CI) to fail, not skip, when PostgreSQL is missing.
const REQUIRE: &str = "MAILSLOT_REQUIRE_POSTGRES";
/// The prefix of every cluster's temp folder, followed by the owning process's id.
const DIR_PREFIX: &str = "mailslot-pg-";

/// A PostgreSQL server of this test process's own, stopped on drop.
pub struct PgCluster {
    bin: PathBuf,
    dir: tempfile::TempDir,
    port: u16,
    /// Who the server runs as (initdb refuses root).
    user: Option<(u32, u32)>,
    server: Mutex<Option<Child>>,
    log: Arc<Mutex<Vec<String>>>,
}

impl PgCluster {
    /// The cluster shared by this test binary, started on first use; `None` (the test skips)
    /// when PostgreSQL is not installed.
    pub fn shared() -> Option<&'static PgCluster> {
        static SHARED: OnceLock<Option<PgCluster>> = OnceLock::new();
        SHARED.get_or_init(PgCluster::start).as_ref()
    }

    /// A new private cluster; `None` (the test skips) when PostgreSQL is not installed.
    pub fn start() -> Option<Self> {
        let bin = binaries()?;
        sweep_stale();
        let dir = tempfile::Builder::new()
            .prefix(&format!("{DIR_PREFIX}{}-", std::process::id()))
            .tempdir()
            .expect("a temp dir for PostgreSQL");
        let user = unprivileged_user();
        if let Some((uid, gid)) = user {
            std::os::unix::fs::chown(dir.path(), Some(uid), Some(gid))
                .expect("chown the cluster's folder to the server's user");
        }
        let cluster = Self {
            bin,
            port: free_port(),
            user,
            dir,
            server: Mutex::new(None),
            log: Arc::new(Mutex::new(Vec::new())),
        };
        let mut initdb = cluster.command("initdb");
        initdb
            .arg("-D")
            .arg(cluster.data())
            .args(["-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-locale"])
            .args(["--no-sync", "--no-instructions"]);
        let out = initdb.output().expect("run initdb");
        assert!(
            out.status.success(),
            "initdb failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        cluster.spawn_server();
        Some(cluster)
    }

    /// The URL of database `db` on this cluster.
    pub fn url(&self, db: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{db}", self.port)
    }

    /// Makes a fresh, empty database named after `name` (made unique in this process) and
    /// returns its URL.
    pub async fn create_database(&self, name: &str) -> String {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let clean: String = name
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() {
                    c.to_ascii_lowercase()
                } else {
                    '_'
                }
            })
            .take(40)
            .collect();
        let db = format!("{clean}_{}", NEXT.fetch_add(1, Ordering::Relaxed));
        let (client, connection) =
            tokio_postgres::connect(&self.url("postgres"), tokio_postgres::NoTls)
                .await
                .unwrap_or_else(|e| {
                    panic!("connecting to the test cluster: {e}; log: {:?}", self.log())
                });
        let task = tokio::spawn(connection);
        client
            .batch_execute(&format!("CREATE DATABASE {db}"))
            .await
            .unwrap_or_else(|e| panic!("CREATE DATABASE {db}: {e}"));
        drop(client);
        let _ = task.await;
        self.url(&db)
    }

    /// Turns TLS on with this certificate chain and key (PEM), and from then on accepts only
    /// TLS connections (`hostssl`); restarts the server.
    pub fn require_tls(&self, cert_pem: &str, key_pem: &str) {
        let data = self.data();
        let own = |path: &Path| {
            if let Some((uid, gid)) = self.user {
                std::os::unix::fs::chown(path, Some(uid), Some(gid)).unwrap();
            }
        };
        for (name, pem) in [("server.crt", cert_pem), ("server.key", key_pem)] {
            let path = data.join(name);
            std::fs::write(&path, pem).unwrap();
            std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o600))
                .unwrap();
            own(&path);
        }
        let conf = data.join("postgresql.conf");
        let mut text = std::fs::read_to_string(&conf).unwrap();
        text.push_str("\nssl = on\n");
        std::fs::write(&conf, text).unwrap();
        let hba = data.join("pg_hba.conf");
        std::fs::write(&hba, "hostssl all all 127.0.0.1/32 trust\n").unwrap();
        own(&hba);
        self.restart();
    }

    /// Stops the server cleanly (fast shutdown) and starts it again on the same data and port.
    pub fn restart(&self) {
        self.stop(Signal::SIGINT);
        self.spawn_server();
    }

    /// Kills the server with SIGKILL, as a crash would; [`Self::start_again`] brings it back
    /// (through crash recovery).
    pub fn kill9(&self) {
        self.stop(Signal::SIGKILL);
    }

    /// Starts the server again after [`Self::kill9`].
    pub fn start_again(&self) {
        self.spawn_server();
    }

    /// What the server logged so far.
    pub fn log(&self) -> Vec<String> {
        self.log.lock().unwrap().clone()
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// A command for one of the binaries, run as the unprivileged user when we are root.
    fn command(&self, program: &str) -> Command {
        let mut command = Command::new(self.bin.join(program));
        command
            .current_dir(self.dir.path())
            .env("LC_ALL", "C")
            .stdin(Stdio::null());
        if let Some((uid, gid)) = self.user {
            command.uid(uid).gid(gid);
        }
        command
    }

    fn spawn_server(&self) {
        let mut postgres = self.command("postgres");
        postgres
            .arg("-D")
            .arg(self.data())
            .args(["-p", &self.port.to_string()])
            .args(["-c", "listen_addresses=127.0.0.1"])
            .args(["-c", "unix_socket_directories="])
            // A test cluster need not survive a machine crash; it must survive a server crash,
            // which the page cache does.
            .args(["-c", "fsync=off"])
            .args(["-c", "max_connections=300"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec. It runs
        // after the switch to the unprivileged user, which would otherwise clear it.
        unsafe {
            postgres.pre_exec(|| {
                nix::sys::prctl::set_pdeathsig(Signal::SIGQUIT).map_err(std::io::Error::from)
            });
        }
        let mut child = spawn_from_lasting_thread(postgres).expect("start postgres");
        let stderr = child.stderr.take().expect("postgres's stderr");
        let (ready, is_ready) = mpsc::channel();
        let log = self.log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { return };
                if line.contains("ready to accept connections") {
                    let _ = ready.send(());
                }
                log.lock().unwrap().push(line);
            }
        });
        if is_ready.recv_timeout(READY_TIMEOUT).is_err() {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the test PostgreSQL did not start: {:?}", self.log());
        }
        *self.server.lock().unwrap() = Some(child);
    }

    fn stop(&self, signal: Signal) {
        if let Some(mut child) = self.server.lock().unwrap().take() {
            let postmaster = child.id();
            // Its backends outlive a killed postmaster for a moment, and a new server refuses
            // to start while they hold the old shared memory: a crash takes them too.
            let backends = if signal == Signal::SIGKILL {
                children_of(postmaster)
            } else {
                Vec::new()
            };
            let _ = kill(Pid::from_raw(postmaster as i32), signal);
            let _ = child.wait();
            for pid in &backends {
                let _ = kill(Pid::from_raw(*pid as i32), Signal::SIGKILL);
            }
            let deadline = std::time::Instant::now() + READY_TIMEOUT;
            while backends
                .iter()
                .any(|pid| Path::new(&format!("/proc/{pid}")).exists())
            {
                assert!(
                    std::time::Instant::now() < deadline,
                    "the killed server's backends did not exit"
                );
                std::thread::yield_now();
            }
        }
    }
}

impl Drop for PgCluster {
    fn drop(&mut self) {
        // SIGQUIT is `pg_ctl stop -m immediate`: nothing here needs a clean shutdown.
        self.stop(Signal::SIGQUIT);
        if std::thread::panicking() {
            eprintln!("postgres log:\n{}", self.log().join("\n"));
        }
    }
}

/// The relay key file shared by every node a test starts on the database at `url` (nodes of one
/// relay must use one key; the database refuses another). In a folder of this process's, swept
/// with the clusters' folders once the process is gone.
pub fn node_key(url: &str) -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    let dir = DIR.get_or_init(|| {
        tempfile::Builder::new()
            .prefix(&format!("{DIR_PREFIX}{}-keys-", std::process::id()))
            .tempdir()
            .expect("a temp dir for the relays' keys")
            .keep()
    });
    let db = url.rsplit('/').next().unwrap_or(url);
    let db: String = db
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    dir.join(format!("{db}.key"))
}

/// The processes whose parent is `pid`, from `/proc`.
fn children_of(pid: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|child| {
            std::fs::read_to_string(format!("/proc/{child}/stat"))
                .ok()
                // The field after the command (which is in parentheses) is the state, then
                // the parent's pid.
                .and_then(|stat| {
                    let rest = &stat[stat.rfind(')')? + 1..];
                    rest.split_whitespace().nth(1)?.parse::<u32>().ok()
                })
                == Some(pid)
        })
        .collect()
}

/// The folder of `initdb` and `postgres` (found as `mailslot bench` finds them). Without
/// them: `None` after a note on stderr, or a panic when `MAILSLOT_REQUIRE_POSTGRES=1`.
fn binaries() -> Option<PathBuf> {
    let found = mailslot::bench::postgres::binaries();
    if found.is_err() {
        let required = std::env::var(REQUIRE).is_ok_and(|v| v == "1");
        assert!(
            !required,
            "{REQUIRE}=1 but PostgreSQL's initdb is neither on PATH nor under /usr/lib/postgresql/*/bin: run `bash .ci/postgres-setup` first"
        );
        use std::io::Write;
        // Straight to stderr, past the test harness's capture, so that it is seen.
        let _ = writeln!(
            std::io::stderr(),
            "skipped: PostgreSQL is not installed (initdb not found); run `bash .ci/postgres-setup`"
        );
    }
    found.ok()
}

/// The user the server runs as when we are root.
fn unprivileged_user() -> Option<(u32, u32)> {
    mailslot::bench::postgres::unprivileged_user()
        .expect("a postgres or nobody user to run the test PostgreSQL as")
}

/// A port on 127.0.0.1 that was free a moment ago.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free loopback port")
        .port()
}

/// Removes the cluster folders of test processes that are gone (their servers died with them).
fn sweep_stale() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(rest) = name.to_str().and_then(|n| n.strip_prefix(DIR_PREFIX)) else {
            continue;
        };
        let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<i32>().ok()) else {
            continue;
        };
        if pid != std::process::id() as i32 && kill(Pid::from_raw(pid), None).is_err() {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// Spawns `command` from a thread that lives as long as the process: a parent-death signal
/// fires when the spawning *thread* ends, and test threads end with their test.
fn spawn_from_lasting_thread(command: Command) -> std::io::Result<Child> {
    type Job = (Command, mpsc::Sender<std::io::Result<Child>>);
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<Job>>> = OnceLock::new();
    let spawner = SPAWNER.get_or_init(|| {
        let (jobs, queue) = mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("postgres-spawner".into())
            .spawn(move || {
                for (mut command, reply) in queue {
                    let _ = reply.send(command.spawn());
                }
                // The queue's sender is in a static and never dropped: this thread stays.
            })
            .expect("start the spawner thread");
        Mutex::new(jobs)
    });
    let (reply, answer) = mpsc::channel();
    spawner
        .lock()
        .unwrap()
        .send((command, reply))
        .expect("the spawner thread runs");
    answer.recv().expect("the spawner thread answers")
}
