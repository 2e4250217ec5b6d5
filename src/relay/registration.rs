//! Who may register a new name: at most `registration_burst` at once and
//! `registrations_per_hour` after that, per client IP, so one address cannot flood the relay
//! with names. Names already registered (a reconnect, the same keys again) take nothing.

use std::net::IpAddr;
use std::time::Duration;

use super::state::RelayState;
use super::storage::Storage;
use crate::protocol::ErrorCode;

/// Why a new name was refused: the code, and a sentence that says when to try again.
pub struct Refused {
    /// The code for the client.
    pub code: ErrorCode,
    /// What happened and what to do.
    pub message: String,
    /// When trying again can help.
    pub retry: Option<Duration>,
}

/// Takes one registration from `ip`'s allowance, or says why not.
pub fn admit<S: Storage>(state: &RelayState<S>, ip: IpAddr) -> Result<(), Refused> {
    state.register_rate.take(&ip).map_err(|wait| {
        state.metrics.reject(ErrorCode::RateLimited);
        state.metrics.refuse_registration("rate");
        Refused {
            code: ErrorCode::RateLimited,
            message: format!(
                "{ip} registered {} names recently (at most {} an hour); try again in {} s",
                state.config.registration_burst,
                state.config.registrations_per_hour,
                wait.as_secs().max(1)
            ),
            retry: Some(wait),
        }
    })
}
