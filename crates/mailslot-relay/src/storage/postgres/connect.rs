//! Reaching the database: the `postgres://` URL (shown only with its password redacted), TLS
//! when the URL asks for it, and the connection pool.

use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use futures_util::StreamExt;
use rustls::{ClientConfig, RootCertStore};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::mpsc;
use tokio_postgres::config::SslMode;
use tokio_postgres::{AsyncMessage, NoTls};
use tokio_postgres_rustls::MakeRustlsConnect;

use crate::protocol::{AgentName, Online, Seq};
use crate::storage::{Committed, StorageError};

/// Connections one node keeps at most: the writer's, and reads and small writes beside it.
const POOL_SIZE: usize = 16;
/// How long a new connection may take when the URL does not say (`connect_timeout`).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Whether `db` names a PostgreSQL database (`postgres://…` or `postgresql://…`) rather than
/// a SQLite file.
pub fn is_postgres_url(db: &str) -> bool {
    db.starts_with("postgres://") || db.starts_with("postgresql://")
}

/// `url` with the password (if any) replaced by `***`, for logs and messages.
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    // The user info ends at the last '@' before the path: a password may itself hold '@'.
    let authority_end = rest.find('/').unwrap_or(rest.len());
    let Some(at) = rest[..authority_end].rfind('@') else {
        return url.to_owned();
    };
    match rest[..at].split_once(':') {
        Some((user, _)) => format!("{scheme}://{user}:***{}", &rest[at..]),
        None => url.to_owned(),
    }
}

/// Where and how to connect: the parsed URL, and TLS when it asks for it.
#[derive(Clone)]
pub struct Target {
    config: tokio_postgres::Config,
    tls: Option<MakeRustlsConnect>,
    shown: String,
}

impl Target {
    /// Parses `url`. Errors name the URL without its password.
    pub(super) fn parse(url: &str) -> Result<Self, StorageError> {
        let shown = redact_url(url);
        // libpq's verify-ca and verify-full are what every TLS connection here does anyway
        // (the certificate is always verified); tokio-postgres only knows `require` for them.
        let normalized = url
            .replace("sslmode=verify-full", "sslmode=require")
            .replace("sslmode=verify-ca", "sslmode=require");
        let mut config: tokio_postgres::Config = normalized.parse().map_err(|e| {
            StorageError::Database(format!(
                "{shown} is not a valid PostgreSQL URL ({e}); write postgres://USER@HOST:PORT/DB, \
                 optionally with ?sslmode=require"
            ))
        })?;
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(CONNECT_TIMEOUT);
        }
        // `prefer` (the default) is taken as plain: a TLS attempt that could not be verified
        // would fail where libpq falls back, so encryption is asked for with `require`.
        let tls = match config.get_ssl_mode() {
            SslMode::Require => Some(MakeRustlsConnect::new(tls_config().map_err(|why| {
                StorageError::Database(format!("cannot set up TLS for {shown}: {why}"))
            })?)),
            _ => None,
        };
        Ok(Self { config, tls, shown })
    }

    /// The URL without its password, for logs and messages.
    pub(super) fn shown(&self) -> &str {
        &self.shown
    }

    /// The pool of connections one node uses for its reads and writes.
    ///
    /// Its connections commit durably (`synchronous_commit = on`, whatever the database's
    /// default: a send is answered only after its commit, and a default of `off` must not make
    /// `sent` a lie; acks turn it off for themselves, see `queue::ack_fenced`). Set here rather
    /// than in each batch, where it was a statement of its own.
    ///
    /// They plan without sequential scans (`enable_seqscan = off`; both after any `options`
    /// the URL gives, so they win). Every query a node runs often is a lookup by key, and
    /// `queue` empties whenever its mail is acknowledged: autovacuum then records it as
    /// (nearly) empty, and a generic plan cached in a pooled connection at that moment
    /// scans the whole, by then bloated, table at every queue read and ack from then on
    /// (measured: 25,900 sequential scans reading 80 million rows in one benchmark run).
    /// The rare whole-table queries (totals, the directory) still run, by an index or a
    /// scan the planner is forced to take.
    ///
    /// They never compile a plan to machine code (`jit = off`). A forced scan costs its plan
    /// 10^10, far past `jit_above_cost`, and PostgreSQL (11 and later, where built with LLVM)
    /// then spent 100–110 ms of CPU compiling each of those statements at every run (the
    /// totals for the metrics, the expiry of duplicate keys: 650 ms in a ten-second run), a
    /// core taken from the relays for that long each time. No statement here runs long enough
    /// for compiled code to pay back.
    pub(super) fn pool(&self) -> Result<Pool, StorageError> {
        let manager_config = ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        };
        let mut config = self.config.clone();
        let options = session_options(config.get_options());
        config.options(options);
        let manager = match &self.tls {
            Some(tls) => Manager::from_config(config, tls.clone(), manager_config),
            None => Manager::from_config(config, NoTls, manager_config),
        };
        Pool::builder(manager)
            .max_size(POOL_SIZE)
            .build()
            .map_err(|e| {
                StorageError::Database(format!("cannot build the pool for {}: {e}", self.shown))
            })
    }

    /// Opens a connection of its own (outside the pool, whose connections drop
    /// notifications), `LISTEN`s on `channels`, and returns what it hears until it drops.
    pub async fn listen(&self, channels: &[&str]) -> Result<Subscription, StorageError> {
        let unavailable = |e: tokio_postgres::Error| {
            StorageError::Unavailable(format!("cannot listen on {}: {e}", self.shown))
        };
        let (client, heard) = match &self.tls {
            Some(tls) => {
                let (client, conn) = self
                    .config
                    .connect(tls.clone())
                    .await
                    .map_err(unavailable)?;
                (client, forward(conn))
            }
            None => {
                let (client, conn) = self.config.connect(NoTls).await.map_err(unavailable)?;
                (client, forward(conn))
            }
        };
        let listen: String = channels.iter().map(|c| format!("LISTEN {c};")).collect();
        client.batch_execute(&listen).await.map_err(unavailable)?;
        Ok(Subscription {
            heard,
            _client: client,
        })
    }
}

/// Notifications heard waiting at most; a listener that falls this far behind is treated as
/// disconnected (its owner then assumes it missed some).
const HEARD_BACKLOG: usize = 65_536;

/// Drives `conn` on a task of its own, passing on its notifications (channel, payload).
fn forward<S, T>(mut conn: tokio_postgres::Connection<S, T>) -> mpsc::Receiver<(String, String)>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (tx, rx) = mpsc::channel(HEARD_BACKLOG);
    tokio::spawn(async move {
        let mut messages = futures_util::stream::poll_fn(move |cx| conn.poll_message(cx));
        while let Some(message) = messages.next().await {
            match message {
                Ok(AsyncMessage::Notification(n)) => {
                    let heard = (n.channel().to_owned(), n.payload().to_owned());
                    if tx.try_send(heard).is_err() {
                        tracing::warn!("the listener fell behind its notifications; reconnecting");
                        break;
                    }
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "the listening database connection failed");
                    break;
                }
            }
        }
    });
    rx
}

/// What a `LISTEN` connection hears, until the connection drops.
pub struct Subscription {
    heard: mpsc::Receiver<(String, String)>,
    /// Keeps the connection open.
    _client: tokio_postgres::Client,
}

impl Subscription {
    /// The next notification (channel, payload); `None` once the connection dropped.
    pub async fn recv(&mut self) -> Option<(String, String)> {
        self.heard.recv().await
    }
}

/// What the presence of several nodes asks of the database, over the node's pool: sending
/// notifications to every node listening, the lease holder, the copies other nodes announced.
#[derive(Clone)]
pub struct Notifier(pub(super) Pool);

impl Notifier {
    /// `NOTIFY channel, payload`, at once, in a transaction of its own that waits for no
    /// flush (see `pipeline::unflushed`).
    pub async fn notify(&self, channel: &str, payload: &str) -> Result<(), StorageError> {
        let client = self.0.get().await?;
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 2] = [&channel, &payload];
        let params = &params;
        super::pipeline::unflushed(&client, |c| c.execute("SELECT pg_notify($1, $2)", params))
            .await??;
        Ok(())
    }

    /// The node whose session holds `agent`'s lease now, if one does.
    pub async fn lease_holder(&self, agent: &str) -> Result<Option<String>, StorageError> {
        super::queue::lease_holder(&self.0.get().await?, agent).await
    }

    /// Which of `agents` hold a lease now (their session claimed it and has not released
    /// it), and since when.
    pub async fn online(&self, agents: &[AgentName]) -> Result<Vec<Online>, StorageError> {
        super::queue::online(&self.0.get().await?, agents).await
    }

    /// The copies of each recipient numbered from `.1` to `.2` (announced by other nodes'
    /// wakes), in one query; in order per recipient.
    pub async fn committed(
        &self,
        ranges: &[(AgentName, Seq, Seq)],
    ) -> Result<Vec<Committed>, StorageError> {
        super::queue::committed(&self.0.get().await?, ranges).await
    }
}

/// Why the database at `shown` could not be reached: the whole chain of causes (a TLS
/// failure's reason is only in its source), with the fix for a refused certificate.
pub(super) fn unreachable(shown: &str, e: &(dyn std::error::Error + 'static)) -> StorageError {
    let mut why = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let said = c.to_string();
        if !why.contains(&said) {
            why.push_str(": ");
            why.push_str(&said);
        }
        cause = c.source();
    }
    let hint = if why.contains("certificate") || why.contains("TLS") {
        "; the database's certificate must be signed by a CA among the system's roots or in \
         SSL_CERT_FILE / SSL_CERT_DIR, and name the URL's host"
    } else {
        ""
    };
    StorageError::Unavailable(format!(
        "cannot connect to the relay database {shown}: {why}{hint}"
    ))
}

/// rustls with `ring`, trusting the platform's roots, or those of `SSL_CERT_FILE` /
/// `SSL_CERT_DIR` when set (as the relay client does for `wss://`).
fn tls_config() -> Result<ClientConfig, String> {
    let found = rustls_native_certs::load_native_certs();
    let mut roots = RootCertStore::empty();
    let (added, _) = roots.add_parsable_certificates(found.certs);
    if added == 0 {
        let why = found
            .errors
            .first()
            .map(|e| format!(" ({e})"))
            .unwrap_or_default();
        return Err(format!(
            "no trusted certificates found{why}; install the ca-certificates package, or set \
             SSL_CERT_FILE to the CA bundle (PEM) that signed the database's certificate"
        ));
    }
    // The provider is chosen here, not taken from the process default, so that no feature
    // combination in the dependency tree can leave rustls without one.
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    Ok(ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth())
}

/// The pooled connections' settings (see [`Target::pool`]) behind the URL's own `options`, so
/// that ours win where both set one.
///
/// `plan_cache_mode = force_generic_plan`: a prepared statement is planned once per connection,
/// not at every run. Left to choose, PostgreSQL planned the batch's statements again at almost
/// every run (their arrays make each generic plan look dearer), a third of its CPU. A generic
/// plan does not know its parameters, so every statement a node prepares has a shape whose
/// plan probes an index per key whatever the statistics said when it was made (no `EXISTS`
/// that could run as a hash of a whole table); docs/decisions.md has the measurements.
fn session_options(given: Option<&str>) -> String {
    let ours = "-c enable_seqscan=off -c synchronous_commit=on -c jit=off -c plan_cache_mode=force_generic_plan";
    match given {
        Some(given) => format!("{given} {ours}"),
        None => ours.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pools_settings_come_after_the_urls_so_they_win() {
        let given =
            Target::parse("postgres://u@h/db?options=-c%20jit%3Don%20-c%20work_mem%3D8MB").unwrap();
        let options = session_options(given.config.get_options());
        let (jit_on, jit_off) = (options.find("jit=on"), options.find("jit=off"));
        assert!(jit_on.is_some() && jit_off > jit_on, "{options}");
        assert!(options.contains("work_mem=8MB"), "{options}");
        let alone = session_options(None);
        for setting in [
            "enable_seqscan=off",
            "synchronous_commit=on",
            "jit=off",
            "plan_cache_mode=force_generic_plan",
        ] {
            assert!(alone.contains(setting), "{alone}");
        }
    }

    #[test]
    fn the_password_never_shows() {
        assert_eq!(
            redact_url("postgres://relay:s3cr@t@db.example:5432/mail?sslmode=require"),
            "postgres://relay:***@db.example:5432/mail?sslmode=require"
        );
        assert_eq!(
            redact_url("postgresql://relay@db:5432/mail"),
            "postgresql://relay@db:5432/mail"
        );
        assert_eq!(redact_url("postgres://db/mail"), "postgres://db/mail");
    }

    #[test]
    fn a_url_selects_postgres_and_a_path_does_not() {
        assert!(is_postgres_url("postgres://u@h:5432/db"));
        assert!(is_postgres_url("postgresql://u@h/db"));
        assert!(!is_postgres_url("/var/lib/mailslot/relay.db"));
        assert!(!is_postgres_url("relay.db"));
    }

    #[test]
    fn a_bad_url_is_refused_without_its_password() {
        let e = Target::parse("postgres://u:hunter2@h:notaport/db")
            .err()
            .unwrap();
        let text = e.to_string();
        assert!(!text.contains("hunter2"), "{text}");
        assert!(text.contains("postgres://USER@HOST:PORT/DB"), "{text}");
    }
}
