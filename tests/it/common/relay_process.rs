//! A relay as a process of its own (the real binary), so that a test can limit its open files
//! and read its memory and open files from `/proc`.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

use mailslot::client::RelayUrl;

use super::EVENT_TIMEOUT;

/// A running `mailslot relay`; killed on drop. Its stderr is kept and shown when a test fails.
pub struct RelayProcess {
    child: Child,
    pub url: RelayUrl,
    pub addr: SocketAddr,
    pub dir: tempfile::TempDir,
    log: Arc<Mutex<Vec<String>>>,
}

impl RelayProcess {
    /// Starts a relay on 127.0.0.1 with `config` (relay.toml text) and, if given, at most
    /// `open_files` open files (soft and hard limit).
    pub fn start(config: &str, open_files: Option<u64>) -> Self {
        super::turns::take();
        let dir = tempfile::tempdir().unwrap();
        let config_path = dir.path().join("relay.toml");
        std::fs::write(&config_path, config).unwrap();
        let mut command = Command::new(env!("CARGO_BIN_EXE_mailslot"));
        command
            .args(["relay", "--listen", "127.0.0.1:0", "--db"])
            .arg(dir.path().join("relay.db"))
            .arg("--relay-config")
            .arg(&config_path)
            .env_clear()
            .env("MAILSLOT_HOME", dir.path())
            .env("MAILSLOT_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        if let Some(n) = open_files {
            // SAFETY: setrlimit is async-signal-safe; nothing else runs between fork and exec.
            unsafe {
                command.pre_exec(move || {
                    nix::sys::resource::setrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE, n, n)
                        .map_err(std::io::Error::from)
                });
            }
        }
        let mut child = command.spawn().unwrap();
        let stderr = child.stderr.take().unwrap();
        let log = Arc::new(Mutex::new(Vec::new()));
        let (found, url) = mpsc::channel();
        std::thread::spawn({
            let log = log.clone();
            move || {
                for line in BufReader::new(stderr).lines() {
                    let Ok(line) = line else { return };
                    if let Some(rest) = line.split(" listening on ").nth(1) {
                        let _ = found.send(rest.split(' ').next().unwrap_or("").to_owned());
                    }
                    log.lock().unwrap().push(line);
                }
            }
        });
        let url: String = url
            .recv_timeout(EVENT_TIMEOUT)
            .unwrap_or_else(|_| panic!("the relay did not start: {:?}", log.lock().unwrap()));
        let addr = url
            .trim_start_matches("ws://")
            .trim_end_matches("/v1/ws")
            .parse()
            .unwrap();
        Self {
            child,
            url: url.parse().unwrap(),
            addr,
            dir,
            log,
        }
    }

    /// The relay's resident memory, in KiB (`VmRSS`).
    pub fn rss_kib(&self) -> u64 {
        self.status_kib("VmRSS:")
    }

    /// The most resident memory the relay had so far, in KiB (`VmHWM`).
    pub fn peak_rss_kib(&self) -> u64 {
        self.status_kib("VmHWM:")
    }

    fn status_kib(&self, field: &str) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        status
            .lines()
            .find_map(|l| l.strip_prefix(field))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or_else(|| panic!("{field} in /proc/PID/status"))
    }

    /// The relay's open files (`/proc/PID/fd`).
    pub fn open_files(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.child.id()))
            .unwrap()
            .count()
    }

    /// A counter or gauge from `/metrics` (the sum of its series that contain `labels`).
    pub async fn metric(&self, name: &str, labels: &str) -> f64 {
        let text = http_get(self.addr, "/metrics").await;
        text.lines()
            .filter(|l| l.starts_with(name) && l.contains(labels))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }

    /// What the relay logged so far.
    pub fn log(&self) -> Vec<String> {
        self.log.lock().unwrap().clone()
    }
}

impl Drop for RelayProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!("relay log:\n{}", self.log().join("\n"));
        }
    }
}

/// `GET path` over a fresh connection; the body.
pub async fn http_get(addr: SocketAddr, path: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::time::timeout(EVENT_TIMEOUT, tokio::net::TcpStream::connect(addr))
        .await
        .expect("connect in time")
        .unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = Vec::new();
    tokio::time::timeout(EVENT_TIMEOUT, stream.read_to_end(&mut response))
        .await
        .expect("an answer in time")
        .unwrap();
    let text = String::from_utf8_lossy(&response).into_owned();
    text.split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default()
}

/// A TCP connection to `addr` from the loopback address `from` (e.g. 127.0.0.2), so that the
/// relay sees another client IP.
pub async fn connect_from(from: &str, addr: SocketAddr) -> std::io::Result<tokio::net::TcpStream> {
    let socket = tokio::net::TcpSocket::new_v4()?;
    socket.bind(format!("{from}:0").parse().unwrap())?;
    tokio::time::timeout(Duration::from_secs(5), socket.connect(addr))
        .await
        .map_err(|_| std::io::Error::other("connect timed out"))?
}
