//! Who may register a new name: on a relay with `registration = "closed"` only a client with
//! an invite from the operator; and at most `registration_burst` at once and
//! `registrations_per_hour` after that, per client IP, so one address cannot flood the relay
//! with names. Names already registered (a reconnect, the same keys again) take nothing.

use std::net::IpAddr;
use std::path::Path;
use std::time::Duration;

use super::config::RegistrationMode;
use super::state::RelayState;
use super::storage::{InviteDigest, PostgresStorage, SqliteStorage, StorageError};
use crate::crypto;
use crate::protocol::{AgentName, ErrorCode, InviteToken};

/// What a client without an invite for `agent` is told by a closed relay.
fn closed(agent: &AgentName) -> String {
    format!(
        "this relay registers new agents by invite only: ask its operator for an invite (`mailslot relay invite`), then run `mailslot --agent {agent} register --invite TOKEN`"
    )
}
/// What a client with an unknown or used invite is told.
pub const BAD_INVITE: &str =
    "the invite is unknown or already used: ask the relay's operator for a new one";

/// Why a new name was refused: the code, and a sentence that says when to try again.
pub struct Refused {
    /// The code for the client.
    pub code: ErrorCode,
    /// What happened and what to do.
    pub message: String,
    /// When trying again can help.
    pub retry: Option<Duration>,
}

/// Admits one new name from `ip` (taking from its allowance), or says why not. On a closed
/// relay it needs `invite`, and gives back its digest for the registration to use up.
pub fn admit<S>(
    state: &RelayState<S>,
    ip: IpAddr,
    agent: &AgentName,
    invite: Option<&InviteToken>,
) -> Result<Option<InviteDigest>, Refused> {
    let digest = match (state.config.registration, invite) {
        (RegistrationMode::Open, _) => None,
        (RegistrationMode::Closed, Some(token)) => Some(crypto::digest(token.expose().as_bytes())),
        (RegistrationMode::Closed, None) => {
            state.metrics.reject(ErrorCode::RegistrationClosed);
            state.metrics.refuse_registration("closed");
            return Err(Refused {
                code: ErrorCode::RegistrationClosed,
                message: closed(agent),
                retry: None,
            });
        }
    };
    state
        .register_rate
        .take(&ip)
        .map(|()| digest)
        .map_err(|wait| {
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

/// Makes `count` single-use invites for the relay database at `db` (beside a running relay or
/// without one): the tokens, to show once; the database keeps only their digests.
pub fn make_invites(db: &Path, count: u32) -> Result<Vec<InviteToken>, StorageError> {
    let (tokens, digests) = new_invites(count)?;
    SqliteStorage::add_invites(db, &digests)?;
    Ok(tokens)
}

/// Makes `count` single-use invites in the PostgreSQL relay database at `url`, which every
/// node of the relay shares: the tokens, to show once.
pub async fn make_postgres_invites(
    url: &str,
    count: u32,
) -> Result<Vec<InviteToken>, StorageError> {
    let (tokens, digests) = new_invites(count)?;
    PostgresStorage::connect(url)
        .await?
        .add_invites(&digests)
        .await?;
    Ok(tokens)
}

/// `count` fresh tokens and their digests.
fn new_invites(count: u32) -> Result<(Vec<InviteToken>, Vec<InviteDigest>), StorageError> {
    let tokens: Vec<InviteToken> = (0..count)
        .map(|_| {
            let mut raw = [0u8; 20];
            getrandom::fill(&mut raw).map(|()| InviteToken::from_random(raw))
        })
        .collect::<Result<_, _>>()
        .map_err(|e| StorageError::Database(format!("no randomness: {e}")))?;
    let digests = tokens
        .iter()
        .map(|t| crypto::digest(t.expose().as_bytes()))
        .collect();
    Ok((tokens, digests))
}
