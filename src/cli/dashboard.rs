//! `mailslot dashboard`: the owner's web UI on loopback, opened with a secret URL printed
//! here, or (unless `--no-open`) by the browser through a private launch page.

use std::net::SocketAddr;

use anyhow::Context;

use super::Ctx;
use super::output::outln;
use crate::dashboard::{Dashboard, DashboardConfig};

pub(super) fn run(ctx: &Ctx, listen: SocketAddr, open: bool) -> anyhow::Result<()> {
    if !listen.ip().is_loopback() {
        eprintln!(
            "mailslot: warning: --listen {listen} is not a loopback address: other machines can reach the dashboard; only the secret in the URL keeps them out, and it travels unencrypted (plain HTTP)"
        );
    }
    // The embedded relay may fail to start: serve from the stores anyway.
    let relay = ctx.relay_url_or_default();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let mut dashboard = Dashboard::start(DashboardConfig {
            listen,
            paths: ctx.paths.clone(),
            relay,
            trusted_hosts: ctx.config.trusted_hosts.clone(),
        })
        .await
        .context("starting the dashboard")?;
        let url = dashboard.url();
        eprintln!(
            "mailslot: the dashboard for {} is at the URL below; it carries this launch's secret, so keep it to yourself. Ctrl-C stops it.",
            ctx.paths.home().display()
        );
        outln!("{url}")?;
        if open {
            // The browser gets a private file that carries the secret, never the secret
            // itself: other users can read its command line.
            match dashboard.launch_page() {
                Ok(page) => open_browser(&page),
                Err(e) => eprintln!("mailslot: {e}; open the URL yourself"),
            }
        }
        dashboard
            .run_until(async {
                if let Err(e) = super::relay::wait_for_signal().await {
                    tracing::warn!(error = %e, "cannot watch for SIGTERM");
                }
            })
            .await?;
        anyhow::Ok(())
    })?;
    runtime.shutdown_timeout(std::time::Duration::from_millis(50));
    Ok(())
}

/// Hands the launch page's `file://` URL to the desktop's browser (or `MAILSLOT_BROWSER`);
/// without one, the printed URL is the way in.
fn open_browser(page: &str) {
    let opener = std::env::var_os(crate::config::ENV_BROWSER)
        .filter(|o| !o.is_empty())
        .unwrap_or_else(|| {
            if cfg!(target_os = "macos") {
                "open".into()
            } else {
                "xdg-open".into()
            }
        });
    let started = std::process::Command::new(&opener)
        .arg(page)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn();
    if started.is_err() {
        eprintln!(
            "mailslot: no browser could be started ({}); open the URL yourself",
            opener.to_string_lossy()
        );
    }
}
