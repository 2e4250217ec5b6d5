//! Where tracing goes and how much of it: always stderr (stdout carries the output, and the
//! MCP protocol). A one-off command says what happened in its own words, so it logs only
//! errors; a service (`relay`, `mcp`, `dashboard`) logs what its operator reads in a log.

use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::format::FmtSpan;

use crate::config;

/// The conventional variable read after [`config::ENV_LOG`].
const ENV_RUST_LOG: &str = "RUST_LOG";

/// What a command is, for how much it logs by default.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    /// Runs once and answers (`send`, `init`, `relay check`): errors only.
    Command,
    /// Serves a client until it ends (`mcp`, `dashboard`): warnings too.
    Service,
    /// The relay in the foreground: what it does (info).
    Relay,
}

/// The levels `-v` steps through, from a kind's default.
const LEVELS: [&str; 5] = ["error", "warn", "info", "debug", "trace"];

/// The default filter of `kind`, one level more per `-v`.
fn default_level(kind: Kind, verbose: u8) -> &'static str {
    let base = match kind {
        Kind::Command => 0,
        Kind::Service => 1,
        Kind::Relay => 2,
    };
    LEVELS[(base + usize::from(verbose)).min(LEVELS.len() - 1)]
}

/// Sends logs to stderr, filtered by `MAILSLOT_LOG`, else `RUST_LOG`, else the kind's level
/// raised by `verbose`; `json` for one JSON object per event.
pub(super) fn init(kind: Kind, verbose: u8, json: bool) {
    let filter = [config::ENV_LOG, ENV_RUST_LOG]
        .into_iter()
        .find_map(|var| EnvFilter::try_from_env(var).ok())
        .unwrap_or_else(|| EnvFilter::new(default_level(kind, verbose)));
    // A span's close is logged with its fields and time: a filter that enables spans (the
    // relay's are at debug) shows each request, delivery and ack once, as it ends.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_span_events(FmtSpan::CLOSE)
        .with_ansi(false);
    let _ = if json {
        builder.json().try_init()
    } else {
        builder.try_init()
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_log_errors_services_warnings_and_each_v_one_level_more() {
        assert_eq!(default_level(Kind::Command, 0), "error");
        assert_eq!(default_level(Kind::Command, 1), "warn");
        assert_eq!(default_level(Kind::Service, 0), "warn");
        assert_eq!(default_level(Kind::Relay, 0), "info");
        assert_eq!(default_level(Kind::Relay, 1), "debug");
        assert_eq!(default_level(Kind::Command, 9), "trace");
    }
}
