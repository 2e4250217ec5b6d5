//! Why a session ends, in the words its client is told before the close.

use super::super::RelayConfig;
use super::super::presence::Kick;
use super::super::wire::{Ending, Outgoing, close};
use crate::protocol::{AgentName, ErrorCode};

/// The frame that would have gone over the connection's byte bound.
pub(super) fn gone(out: &Outgoing) -> Ending {
    Ending {
        code: ErrorCode::NotReading,
        message: format!(
            "over {} bytes wait for this client to read them; read every frame as it comes",
            out.limit()
        ),
        close: close::NOT_READING,
    }
}

/// The socket took nothing for the write deadline.
pub(super) fn stalled(config: &RelayConfig) -> Ending {
    Ending {
        code: ErrorCode::NotReading,
        message: format!(
            "the client read nothing for {} s while frames waited for it; read every frame as it comes",
            config.write_timeout_secs
        ),
        close: close::NOT_READING,
    }
}

pub(super) fn shutting_down() -> Ending {
    Ending {
        code: ErrorCode::ShuttingDown,
        message: "the relay is shutting down; reconnect shortly".into(),
        close: close::GOING_AWAY,
    }
}

/// The ending of a session the hub ended (`None`: its entry went without a word, which only a
/// newer connection does).
pub(super) fn kicked(agent: &AgentName, why: Option<Kick>) -> Ending {
    match why {
        Some(Kick::Retired) => Ending {
            code: ErrorCode::NameRetired,
            message: format!("{agent} retired its name on this relay"),
            close: close::AUTH,
        },
        Some(Kick::Replaced) | None => Ending {
            code: ErrorCode::Replaced,
            message: format!("another connection for {agent} took over"),
            close: close::REPLACED,
        },
    }
}

/// A storage failure the session cannot go on after.
pub(super) fn internal(message: String) -> Ending {
    Ending {
        code: ErrorCode::Internal,
        message,
        close: close::GOING_AWAY,
    }
}
