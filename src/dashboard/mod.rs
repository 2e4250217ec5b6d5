//! `mailslot dashboard`: a local web UI for the owner. It runs every agent of this home as a
//! mailbox (holding its relay connection, hidden from presence, only while no session of the
//! agent runs), and serves pages about them on loopback, to whoever holds the secret printed
//! in the terminal.
//!
//! One job per file: `routes.rs` (the router and the handlers, reading through the mailbox and
//! the store), `agents.rs` (the home's agents, scanned on each page and opened when needed),
//! `auth.rs` (secret, cookie, CSRF, Host and Origin), `pages.rs` (HTML, escaped by `maud`),
//! `live.rs` (new mail as Server-Sent Events), `consent.rs` (approve, deny, block, policy with
//! the owner's passphrase), `form.rs` (the consent form read into wiped buffers), `flash.rs`
//! (what a change said, for the page it redirects to), `relay_status.rs` (the relay's health
//! and metrics), `launch.rs` (the page that hands the secret to the browser through a private
//! file).

mod agents;
mod auth;
mod consent;
mod flash;
mod form;
mod launch;
mod live;
mod pages;
mod relay_status;
mod routes;
mod tell;

use std::net::SocketAddr;
use std::sync::Arc;

use tokio_util::sync::CancellationToken;

pub use form::{ConsentForm, read_form};

use crate::client::RelayUrl;
use crate::config::Paths;
use crate::protocol::RelayName;

/// Why the dashboard could not start.
#[derive(Debug, thiserror::Error)]
pub enum DashboardError {
    /// The address could not be bound.
    #[error("cannot listen on {addr}: {os}; pick another with --listen")]
    Listen {
        /// The address.
        addr: SocketAddr,
        /// What the OS said (in the message, not as a source, so a chain prints it once).
        os: std::io::Error,
    },
    /// The home's agents could not be listed or opened.
    #[error(transparent)]
    Agents(#[from] agents::AgentsError),
    /// The HTTP client for the relay's status could not be made.
    #[error("{0}")]
    Http(String),
    /// The launch page could not be written.
    #[error(transparent)]
    Launch(#[from] launch::LaunchError),
    /// The server failed.
    #[error("the dashboard's server failed: {0}")]
    Serve(std::io::Error),
}

/// What the dashboard serves.
pub struct DashboardConfig {
    /// Where to listen (loopback unless the owner chose otherwise).
    pub listen: SocketAddr,
    /// The home whose agents it shows.
    pub paths: Paths,
    /// The relay those agents use.
    pub relay: RelayUrl,
    /// Other relays reached without TLS (the home's `trusted_hosts`).
    pub trusted_hosts: Vec<RelayName>,
}

/// A running dashboard.
pub struct Dashboard {
    addr: SocketAddr,
    secret: String,
    /// Where the launch page goes (`<home>/dashboard`).
    launch_dir: std::path::PathBuf,
    /// Fires when the secret is used.
    used: CancellationToken,
    /// Removes the launch page when it is used, old or the dashboard stops.
    launch: Option<tokio::task::JoinHandle<()>>,
    stop: CancellationToken,
    server: tokio::task::JoinHandle<Result<(), DashboardError>>,
    agents: Arc<agents::Agents>,
}

impl Dashboard {
    /// Opens every agent of the home and starts serving.
    pub async fn start(config: DashboardConfig) -> Result<Self, DashboardError> {
        let listener = tokio::net::TcpListener::bind(config.listen)
            .await
            .map_err(|os| DashboardError::Listen {
                addr: config.listen,
                os,
            })?;
        let addr = listener.local_addr().map_err(|os| DashboardError::Listen {
            addr: config.listen,
            os,
        })?;
        let agents = Arc::new(agents::Agents::new(
            config.paths.clone(),
            config.relay.clone(),
            config.trusted_hosts,
        ));
        // The agents there now start receiving at once; later ones when a page asks.
        agents.all().await?;
        let stop = CancellationToken::new();
        let app = Arc::new(routes::App {
            auth: Arc::new(auth::Auth::new(addr.port())),
            http: relay_status::client(&config.relay).map_err(DashboardError::Http)?,
            agents: agents.clone(),
            relay: config.relay,
            owner_key: config.paths.owner_key(),
            stop: stop.clone(),
            flashes: flash::Flashes::default(),
        });
        let secret = app.auth.secret().to_owned();
        let used = app.auth.used();
        let router = routes::router(app);
        let server = tokio::spawn({
            let stop = stop.clone();
            async move {
                axum::serve(listener, router)
                    .with_graceful_shutdown(async move { stop.cancelled().await })
                    .await
                    .map_err(DashboardError::Serve)
            }
        });
        Ok(Self {
            addr,
            secret,
            launch_dir: config.paths.home().join("dashboard"),
            used,
            launch: None,
            stop,
            server,
            agents,
        })
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://HOST:PORT`, the dashboard's origin.
    pub fn origin(&self) -> String {
        let host = if self.addr.ip().is_unspecified() {
            "127.0.0.1".to_owned()
        } else {
            match self.addr {
                SocketAddr::V4(a) => a.ip().to_string(),
                SocketAddr::V6(a) => format!("[{}]", a.ip()),
            }
        };
        format!("http://{host}:{}", self.addr.port())
    }

    /// The URL that opens it: it carries this launch's secret, so it is for the owner's eyes
    /// (a terminal), never for a command line.
    pub fn url(&self) -> String {
        format!("{}/?token={}", self.origin(), self.secret)
    }

    /// Writes the launch page, which hands the secret to a browser without a command line
    /// (`launch.rs`); its `file://` URL, for the browser. The page is removed once the secret
    /// is used, after a while, or when the dashboard stops.
    pub fn launch_page(&mut self) -> Result<String, DashboardError> {
        let page = launch::LaunchPage::write(&self.launch_dir, &self.origin(), &self.secret)?;
        let url = page.url();
        let (used, stop) = (self.used.clone(), self.stop.clone());
        self.launch = Some(tokio::spawn(async move {
            tokio::select! {
                () = used.cancelled() => {}
                () = stop.cancelled() => {}
                () = tokio::time::sleep(launch::LAUNCH_TTL) => {}
            }
            drop(page);
        }));
        Ok(url)
    }

    /// Serves until `stop` fires (or the server fails), then closes the mailboxes.
    pub async fn run_until(self, stop: impl Future<Output = ()>) -> Result<(), DashboardError> {
        let Self {
            stop: token,
            mut server,
            agents,
            launch,
            ..
        } = self;
        let result = tokio::select! {
            () = stop => {
                token.cancel();
                (&mut server).await
            }
            done = &mut server => done,
        };
        token.cancel();
        if let Some(launch) = launch {
            let _ = launch.await;
        }
        agents.close().await;
        result.unwrap_or_else(|e| Err(DashboardError::Serve(std::io::Error::other(e))))
    }
}
