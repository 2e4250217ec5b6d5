//! The owner's consent changes from the page: approve (with the requester's code), deny,
//! block, unblock, end a contact. Each needs the owner's passphrase, typed into the page and
//! posted with the form (read by `form.rs` into buffers that are wiped): it unlocks the owner
//! key for this one change and is never stored or logged. The
//! change is signed and sent by [`crate::client::consent`], exactly as the CLI does it, over a
//! control connection of the agent's own.

use super::form::{Action, ConsentForm};
use crate::client::consent::{self as relay_consent, Change, ConsentState, OwnerKeyProblem};
use crate::client::groups as relay_groups;
use crate::client::{ClientError, Connection, RelayUrl};
use crate::crypto::{Owner, OwnerKeyError, PublicIdentity};
use crate::keys::{OwnerPinError, read_owner_public};
use crate::mailbox::Mailbox;
use crate::mailbox::MailboxError;
use crate::protocol::{Address, Fingerprint, GroupView, RequestCode, ValidationError};
use crate::store::GroupMark;

/// Why a consent change from the page did not happen.
#[derive(Debug, thiserror::Error)]
pub enum ActionError {
    /// The form is missing a field or has a bad one.
    #[error(transparent)]
    Form(#[from] super::form::FormError),
    /// The CSRF token is missing or wrong.
    #[error(
        "the form's token is missing or from another launch of the dashboard; reload the page and try again"
    )]
    Csrf,
    /// A field's value is invalid.
    #[error(transparent)]
    Invalid(#[from] ValidationError),
    /// The owner key cannot sign for this agent.
    #[error(transparent)]
    OwnerKey(#[from] OwnerKeyProblem),
    /// The owner key file could not be read or unlocked.
    #[error(transparent)]
    Unlock(#[from] OwnerKeyError),
    /// The owner key file could not be read, or is not the one this home confirmed.
    #[error(transparent)]
    KeyFile(#[from] OwnerPinError),
    /// No open request from that agent.
    #[error("no open contact request from {0}; it may have been answered or expired")]
    NoRequest(Address),
    /// The relay refused or could not be reached.
    #[error(transparent)]
    Relay(#[from] ClientError),
    /// The agent's store could not record the change.
    #[error(transparent)]
    Mailbox(#[from] MailboxError),
}

/// An incoming request, with the requester's fingerprint for the owner to compare.
#[derive(Debug, Clone)]
pub struct Incoming {
    /// The requester.
    pub agent: Address,
    /// Its note (its owner's words, relayed: untrusted text).
    pub note: String,
    /// When it lapses.
    pub expires_at: jiff::Timestamp,
    /// The requester's fingerprint, if the relay gave its keys.
    pub fingerprint: Option<Fingerprint>,
}

/// The agent's consent, for the contacts page.
#[derive(Debug, Clone)]
pub struct Consent {
    /// The relay's state.
    pub state: ConsentState,
    /// Incoming requests with fingerprints.
    pub incoming: Vec<Incoming>,
    /// Groups on the agent's relay it is on the roster of, or whose owner is its owner; the
    /// relay's refusal in words (one from before groups, say), which leaves the rest shown.
    pub groups: Result<Vec<GroupView>, String>,
    /// Where the agent stands with groups by its store: joined, or wished by its model.
    pub marks: Vec<GroupMark>,
}

async fn connect(
    mailbox: &Mailbox,
    relay: &RelayUrl,
    owner_key: &std::path::Path,
) -> Result<Connection, ActionError> {
    let offer = read_owner_public(owner_key)?;
    Ok(Connection::connect_control(relay, mailbox.name(), mailbox.identity(), offer).await?)
}

/// Requesters' keys from other relays looked up at once for the contacts page.
const LOOKUPS_AT_ONCE: usize = 8;
/// How long the contacts page waits for them; the rest show as not known yet.
const LOOKUP_DEADLINE: std::time::Duration = std::time::Duration::from_secs(3);

/// Reads the agent's consent from the relay, with each requester's fingerprint: a local one's
/// from this relay, another relay's agents' from their relays, looked up together (a few at
/// a time, all within [`LOOKUP_DEADLINE`]), so a page with many requests from a slow relay
/// loads in seconds, never one look-up after another.
pub async fn read(
    mailbox: &Mailbox,
    relay: &RelayUrl,
    owner_key: &std::path::Path,
) -> Result<Consent, ActionError> {
    let mut conn = connect(mailbox, relay, owner_key).await?;
    let result = async {
        let state = relay_consent::state(&mut conn).await?;
        let groups = relay_groups::list(&mut conn)
            .await
            .map_err(|e| e.to_string());
        let marks = mailbox.group_marks().await?;
        let deadline = tokio::time::Instant::now() + LOOKUP_DEADLINE;
        let mut fingerprints = std::collections::HashMap::new();
        for q in state.incoming.iter().filter(|q| q.agent.host().is_none()) {
            let Ok(Ok(keys)) = tokio::time::timeout_at(deadline, conn.lookup(q.agent.name())).await
            else {
                continue;
            };
            if let Ok(keys) = PublicIdentity::try_from(keys) {
                fingerprints.insert(q.agent.clone(), keys.fingerprint());
            }
        }
        let remote: Vec<Address> = state
            .incoming
            .iter()
            .filter(|q| q.agent.host().is_some())
            .map(|q| q.agent.clone())
            .collect();
        let mut lookups = futures_util::StreamExt::buffer_unordered(
            futures_util::stream::iter(remote.into_iter().map(|agent| async move {
                let found = crate::client::remote_fingerprint(&[], &agent).await.ok();
                (agent, found)
            })),
            LOOKUPS_AT_ONCE,
        );
        while let Ok(Some((agent, found))) =
            tokio::time::timeout_at(deadline, futures_util::StreamExt::next(&mut lookups)).await
        {
            if let Some(fingerprint) = found {
                fingerprints.insert(agent, fingerprint);
            }
        }
        let incoming = state
            .incoming
            .iter()
            .map(|q| Incoming {
                agent: q.agent.clone(),
                note: q.note.clone(),
                expires_at: q.expires_at,
                fingerprint: fingerprints.get(&q.agent).cloned(),
            })
            .collect();
        Ok(Consent {
            state,
            incoming,
            groups,
            marks,
        })
    }
    .await;
    conn.close().await;
    result
}

/// Carries out `form` for `mailbox`'s agent: the relay's sentence on success.
pub async fn apply(
    mailbox: &Mailbox,
    relay: &RelayUrl,
    owner_key: &std::path::Path,
    form: ConsentForm,
) -> Result<String, ActionError> {
    let ConsentForm {
        action,
        code,
        policy,
        passphrase,
        ..
    } = form;
    let passphrase = passphrase.into_passphrase()?;
    let change = match action {
        Action::Approve(from) => Change::Approve {
            from,
            code: RequestCode::parse(code.trim())?,
        },
        Action::Deny(agent) => Change::Deny(agent),
        Action::Block(agent) => Change::Block(agent.into()),
        Action::Unblock(agent) => Change::Unblock(agent.into()),
        Action::Remove(agent) => Change::Remove(agent),
        Action::Join(group) => Change::Join(group),
        Action::Policy => Change::Policy(policy.as_deref().unwrap_or_default().parse()?),
    };
    let local = read_owner_public(owner_key)?;
    let mut conn = connect(mailbox, relay, owner_key).await?;
    let result = async {
        relay_consent::check_owner(&conn, mailbox.name(), local)?;
        if let Change::Approve { from, code } = &change {
            let state = relay_consent::state(&mut conn).await?;
            if !state.incoming.iter().any(|q| &q.agent == from) {
                return Err(ActionError::NoRequest(from.clone()));
            }
            // The code first, as in the CLI: a typo should not cost an unlock.
            relay_consent::check_code(&mut conn, from, code).await?;
        }
        let path = owner_key.to_owned();
        // Argon2id takes a while: off the async threads.
        let owner = tokio::task::spawn_blocking(move || Owner::unlock(&path, &passphrase))
            .await
            .expect("unlocking never panics")?;
        let joined = match &change {
            Change::Join(group) => Some(group.clone()),
            _ => None,
        };
        let detail = relay_consent::apply(&mut conn, &owner, change).await?;
        // Recorded once the relay holds the consent, as `mailslot groups join` does.
        if let Some(group) = joined {
            mailbox.record_join(group).await?;
        }
        Ok(detail)
    }
    .await;
    conn.close().await;
    result
}
