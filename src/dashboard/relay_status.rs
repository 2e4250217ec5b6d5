//! The relay's health and key metrics, read from its `/healthz` and `/metrics` over HTTP(S)
//! at the relay URL's host. Answers are bounded in time and size.

use std::time::Duration;

use crate::client::RelayUrl;

/// How long each request may take.
const TIMEOUT: Duration = Duration::from_secs(3);
/// The most bytes read from an answer.
const MAX_BODY: usize = 1024 * 1024;
/// The metrics shown, with what they mean for the owner.
pub const KEY_METRICS: &[(&str, &str)] = &[
    ("mailslot_relay_connections", "open connections"),
    (
        "mailslot_relay_queued",
        "copies waiting for their recipients",
    ),
    ("mailslot_relay_accepted_total", "copies accepted"),
    ("mailslot_relay_delivered_total", "copies delivered"),
    ("mailslot_relay_acked_total", "copies acknowledged"),
    ("mailslot_relay_expired_total", "copies expired undelivered"),
];

/// What the relay said.
#[derive(Debug, Clone)]
pub struct RelayReport {
    /// `/healthz`: `Ok` with its text, or why not.
    pub health: Result<String, String>,
    /// The key metrics that `/metrics` had, in [`KEY_METRICS`] order; or why none.
    pub metrics: Result<Vec<(&'static str, &'static str, f64)>, String>,
}

/// An HTTP client for the relay.
pub fn client(relay: &RelayUrl) -> Result<reqwest::Client, String> {
    let mut builder = reqwest::Client::builder()
        .timeout(TIMEOUT)
        // The relay's own endpoints never redirect; following one could reach anything.
        .redirect(reqwest::redirect::Policy::none())
        .user_agent(concat!("mailslot/", env!("CARGO_PKG_VERSION")))
        .tls_backend_preconfigured(crate::tls::http_tls(relay.is_tls())?);
    if relay.host() == "127.0.0.1" || relay.host() == "localhost" || relay.host() == "[::1]" {
        builder = builder.no_proxy();
    }
    builder
        .build()
        .map_err(|e| format!("cannot make an HTTP client: {e}"))
}

/// Asks the relay at `relay` for its health and metrics.
pub async fn read(http: &reqwest::Client, relay: &RelayUrl) -> RelayReport {
    let base = format!(
        "{}://{}",
        if relay.is_tls() { "https" } else { "http" },
        relay.authority()
    );
    let health = get(http, &format!("{base}/healthz"))
        .await
        .map(|text| text.trim().to_owned());
    let metrics = get(http, &format!("{base}/metrics"))
        .await
        .map(|text| key_metrics(&text));
    RelayReport { health, metrics }
}

async fn get(http: &reqwest::Client, url: &str) -> Result<String, String> {
    let mut response = http
        .get(url)
        .send()
        .await
        .map_err(|e| format!("cannot reach {url}: {e}"))?;
    let status = response.status();
    let mut body = Vec::new();
    while let Some(chunk) = response
        .chunk()
        .await
        .map_err(|e| format!("reading {url}: {e}"))?
    {
        if body.len() + chunk.len() > MAX_BODY {
            return Err(format!("{url} answered more than {MAX_BODY} bytes"));
        }
        body.extend_from_slice(&chunk);
    }
    let text = String::from_utf8_lossy(&body).into_owned();
    if status.is_success() {
        Ok(text)
    } else {
        Err(format!("{url} answered {status}: {}", text.trim()))
    }
}

/// The [`KEY_METRICS`] found in Prometheus text (lines `name value`, labels-free).
fn key_metrics(text: &str) -> Vec<(&'static str, &'static str, f64)> {
    KEY_METRICS
        .iter()
        .filter_map(|(name, meaning)| {
            text.lines()
                .filter_map(|line| line.split_once(' '))
                .find(|(n, _)| n == name)
                .and_then(|(_, v)| v.trim().parse().ok())
                .map(|v| (*name, *meaning, v))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_metrics_are_read_from_prometheus_text() {
        let text = "# HELP mailslot_relay_connections Open\n\
                    mailslot_relay_connections 3\n\
                    mailslot_relay_connections_other 9\n\
                    mailslot_relay_accepted_total 12\n\
                    mailslot_relay_rejections_total{code=\"x\"} 1\n";
        assert_eq!(
            key_metrics(text),
            [
                ("mailslot_relay_connections", "open connections", 3.0),
                ("mailslot_relay_accepted_total", "copies accepted", 12.0),
            ]
        );
    }
}
