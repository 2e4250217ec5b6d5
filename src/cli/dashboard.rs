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
            let yourself = format!(
                "open the URL above ({}/?token=…) in your browser",
                dashboard.origin()
            );
            // The browser gets a private file that carries the secret, never the secret
            // itself: other users can read its command line.
            match dashboard.launch_page() {
                Ok(page) => open_browser(&page, yourself),
                Err(e) => eprintln!("mailslot: {e}; {yourself}"),
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

/// Hands the launch page's `file://` URL to the desktop's browser (or `MAILSLOT_BROWSER`),
/// and reaps the opener when it exits. Where no browser can be shown (no display, on Linux
/// and the like) or the opener fails, it says so, and `yourself` (how to open it by hand).
fn open_browser(page: &str, yourself: String) {
    let chosen = std::env::var_os(crate::config::ENV_BROWSER).filter(|o| !o.is_empty());
    let opener = match chosen {
        Some(opener) => opener,
        None if cfg!(target_os = "macos") => "open".into(),
        None if !has_display() => {
            eprintln!(
                "mailslot: no display here (DISPLAY and WAYLAND_DISPLAY are unset), so no browser was started; {yourself}"
            );
            return;
        }
        None => "xdg-open".into(),
    };
    let name = opener.to_string_lossy().into_owned();
    let started = tokio::process::Command::new(&opener)
        .arg(page)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn();
    let mut child = match started {
        Ok(child) => child,
        Err(e) => {
            eprintln!("mailslot: no browser could be started ({name}: {e}); {yourself}");
            return;
        }
    };
    // Waited on, so it never lingers as a zombie; `xdg-open` exits once the browser has the
    // page, or fails when it finds none.
    tokio::spawn(async move {
        match child.wait().await {
            Ok(status) if status.success() => {}
            Ok(status) => {
                eprintln!("mailslot: {name} could not open a browser ({status}); {yourself}")
            }
            Err(e) => eprintln!("mailslot: {name} could not open a browser ({e}); {yourself}"),
        }
    });
}

/// Whether a graphical session is there to show a browser in.
fn has_display() -> bool {
    ["DISPLAY", "WAYLAND_DISPLAY"]
        .iter()
        .any(|name| std::env::var_os(name).is_some_and(|v| !v.is_empty()))
}
