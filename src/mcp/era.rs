//! Which protocol era a client gets. mailslot serves both (2025-11-25 `initialize` and
//! 2026-07-28 `server/discover`), and a client picks. One exception: Claude Code registers
//! channel notifications — the only push that starts a turn in an idle session — only on a
//! 2025-11-25 connection; on a 2026-07-28 one it logs "Channel notifications skipped" and the
//! mail waits for a hook. So its `server/discover` probe is refused (-32601, as a legacy
//! server answers), and it falls back to `initialize`. Every other client keeps both eras.

use rmcp::model::Implementation;

/// Clients (by the `clientInfo.name` their discover request carries) that are answered as a
/// legacy server would, because they deliver channel events only on a legacy connection.
const LEGACY_CLIENTS: &[&str] = &["claude-code"];

/// Whether a `server/discover` from `client` is refused so that it connects with `initialize`.
pub fn wants_legacy(client: Option<&Implementation>) -> bool {
    client.is_some_and(|c| LEGACY_CLIENTS.contains(&c.name.as_str()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_claude_code_is_sent_to_initialize() {
        assert!(wants_legacy(Some(&Implementation::new(
            "claude-code",
            "2.1.328"
        ))));
        assert!(!wants_legacy(Some(&Implementation::new("mcp", "2.3.0"))));
        assert!(!wants_legacy(Some(&Implementation::new(
            "Claude-Code-fork",
            "1"
        ))));
        assert!(!wants_legacy(None));
    }
}
