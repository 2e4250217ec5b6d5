//! Consent: whom an agent accepts mail from. A change takes the advisory locks of both
//! agents, so two nodes changing one pair take turns; a send reads the rules inside its own
//! transaction (see `batch`), so it sees every change committed before it.

use deadpool_postgres::{Client, GenericClient};

use super::now_ms;
use super::registry::lock_names;
use crate::protocol::{AgentName, Policy, RequestCode, RequestView};
use crate::storage::{
    ConsentChange, ConsentOutcome, ConsentState, DENIALS_KEPT, StorageError, hears_here,
};

/// What decides whether a recipient takes mail from a sender: the recipient's own policy (if
/// it set one) and how it relates to the sender, as stored (`relations.kind`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Rule {
    pub(super) policy: Option<Policy>,
    pub(super) relation: Option<String>,
}

impl Rule {
    /// Whether the recipient joined the group this rule was read for and is not closed. As
    /// the SQLite backend decides.
    pub(super) fn joined(&self) -> bool {
        self.relation.as_deref() == Some("contact") && self.policy != Some(Policy::Closed)
    }

    /// Whether the recipient blocks the sender (or its relay).
    pub(super) fn blocked(&self) -> bool {
        self.relation.as_deref() == Some("blocked")
    }

    /// Blocks always refuse; contacts pass unless the recipient is closed; anyone else passes
    /// only an open policy (the recipient's, else `default`). As the SQLite backend decides.
    pub(super) fn allows(&self, default: Policy) -> bool {
        let policy = self.policy.unwrap_or(default);
        match self.relation.as_deref() {
            Some("blocked") => false,
            Some("contact") => policy != Policy::Closed,
            _ => policy == Policy::Open,
        }
    }
}

/// How `owner` relates to `peer`: its own row, else a block of `peer`'s whole relay (which
/// is only ever a block, so "contact" is the peer's own row).
async fn relation(
    tx: &impl GenericClient,
    owner: &AgentName,
    peer: &AgentName,
) -> Result<Option<String>, StorageError> {
    Ok(tx
        .query_opt(
            "SELECT kind FROM relations WHERE owner = $1
                 AND peer IN ($2, '*@' || split_part($2, '@', 2))
             ORDER BY peer = $2 DESC LIMIT 1",
            &[&owner.as_str(), &peer.as_str()],
        )
        .await?
        .map(|row| row.try_get(0))
        .transpose()?)
}

/// The names a change is about, whose locks it takes: for a request from another relay's
/// agent, that relay's too (`@host`), whose open requests here are counted.
fn parties(change: &ConsentChange) -> Vec<AgentName> {
    let [a, b] = match change {
        ConsentChange::Request { from, to, .. } => {
            let relay = from
                .stored_address()
                .host()
                .and_then(AgentName::relay_mailbox);
            return [from.clone(), to.clone()]
                .into_iter()
                .chain(relay)
                .collect();
        }
        ConsentChange::Approve {
            target, requester, ..
        }
        | ConsentChange::Deny { target, requester } => [target, requester],
        ConsentChange::Block { owner, peer }
        | ConsentChange::Unblock { owner, peer }
        | ConsentChange::Remove { owner, peer }
        | ConsentChange::Join { owner, group: peer } => [owner, peer],
        ConsentChange::SetPolicy { owner, .. } => [owner, owner],
    };
    vec![a.clone(), b.clone()]
}

pub(super) async fn consent(
    client: &mut Client,
    change: &ConsentChange,
) -> Result<ConsentOutcome, StorageError> {
    let tx = client.transaction().await?;
    let parties = parties(change);
    lock_names(&tx, &parties.iter().collect::<Vec<_>>()).await?;
    let now = now_ms();
    tx.execute(
        "DELETE FROM contact_requests WHERE expires_at < $1",
        &[&now],
    )
    .await?;
    tx.execute("DELETE FROM denials WHERE expires_at < $1", &[&now])
        .await?;
    let outcome = match change {
        ConsentChange::Request {
            from,
            to,
            note,
            code,
            expires_at_ms,
            max_pending,
            max_to_target,
            max_from_relay,
        } => {
            let policy: Option<String> = match tx
                .query_opt("SELECT policy FROM agents WHERE name = $1", &[&to.as_str()])
                .await?
            {
                Some(row) => row.try_get(0)?,
                None => None,
            };
            if relation(&tx, to, from).await?.as_deref() == Some("blocked")
                || policy.as_deref() == Some("closed")
            {
                return Ok(ConsentOutcome::NotAllowed);
            }
            if relation(&tx, from, to).await?.as_deref() == Some("contact") {
                return Ok(ConsentOutcome::AlreadyContacts);
            }
            let pending: i64 = tx
                .query_one(
                    "SELECT count(*) FROM contact_requests WHERE requester = $1 AND target != $2",
                    &[&from.as_str(), &to.as_str()],
                )
                .await?
                .try_get(0)?;
            if pending >= i64::from(*max_pending) {
                return Ok(ConsentOutcome::TooManyPending);
            }
            // Asking again replaces a request, so the one being replaced is not counted.
            let waiting: i64 = tx
                .query_one(
                    "SELECT count(*) FROM contact_requests WHERE target = $1 AND requester != $2",
                    &[&to.as_str(), &from.as_str()],
                )
                .await?
                .try_get(0)?;
            if waiting >= i64::from(*max_to_target) {
                return Ok(ConsentOutcome::TargetFull);
            }
            if let Some((_, relay)) = from.as_str().split_once('@') {
                let from_relay: i64 = tx
                    .query_one(
                        "SELECT count(*) FROM contact_requests
                         WHERE strpos(requester, '@') > 0
                           AND substr(requester, strpos(requester, '@') + 1) = $1
                           AND NOT (requester = $2 AND target = $3)",
                        &[&relay, &from.as_str(), &to.as_str()],
                    )
                    .await?
                    .try_get(0)?;
                if from_relay >= i64::from(*max_from_relay) {
                    return Ok(ConsentOutcome::RelayFull);
                }
            }
            let codes = tx
                .query(
                    "SELECT code FROM contact_requests WHERE target = $1 AND requester != $2",
                    &[&to.as_str(), &from.as_str()],
                )
                .await?;
            for row in codes {
                let stored: String = row.try_get(0)?;
                if RequestCode::parse(&stored).is_ok_and(|c| c.appears_in(note)) {
                    return Ok(ConsentOutcome::NoteHasCode);
                }
            }
            // Asking again replaces the earlier request (new code, new expiry).
            tx.execute(
                "INSERT INTO contact_requests (requester, target, note, code, expires_at) VALUES ($1, $2, $3, $4, $5)
                 ON CONFLICT (requester, target) DO UPDATE SET note = excluded.note, code = excluded.code, expires_at = excluded.expires_at",
                &[&from.as_str(), &to.as_str(), note, &code.as_str(), expires_at_ms],
            )
            .await?;
            ConsentOutcome::Applied(None)
        }
        ConsentChange::Approve {
            target,
            requester,
            code,
        } => {
            let n = tx
                .execute(
                    "DELETE FROM contact_requests WHERE target = $1 AND requester = $2 AND code = $3",
                    &[&target.as_str(), &requester.as_str(), &code.as_str()],
                )
                .await?;
            if n == 0 {
                return Ok(ConsentOutcome::NoSuchRequest);
            }
            for (owner, peer) in [(target, requester), (requester, target)] {
                tx.execute(
                    "INSERT INTO relations (owner, peer, kind, since) VALUES ($1, $2, 'contact', $3)
                     ON CONFLICT (owner, peer) DO UPDATE SET kind = 'contact', since = excluded.since
                     WHERE relations.kind != 'blocked'",
                    &[&owner.as_str(), &peer.as_str(), &now],
                )
                .await?;
            }
            ConsentOutcome::Applied(Some(requester.clone()))
        }
        ConsentChange::Deny { target, requester } => {
            let Some(row) = tx
                .query_opt(
                    "DELETE FROM contact_requests WHERE requester = $1 AND target = $2 RETURNING expires_at",
                    &[&requester.as_str(), &target.as_str()],
                )
                .await?
            else {
                return Ok(ConsentOutcome::NoSuchRequest);
            };
            if hears_here(requester) {
                keep_denial(&tx, requester, target, row.try_get(0)?).await?;
            }
            ConsentOutcome::Applied(Some(requester.clone()))
        }
        ConsentChange::Block { owner, peer } => {
            tx.execute(
                "DELETE FROM contact_requests WHERE (requester = $1 AND target = $2) OR (requester = $2 AND target = $1)",
                &[&owner.as_str(), &peer.as_str()],
            )
            .await?;
            tx.execute(
                "DELETE FROM relations WHERE owner = $1 AND peer = $2 AND kind = 'contact'",
                &[&peer.as_str(), &owner.as_str()],
            )
            .await?;
            tx.execute(
                "INSERT INTO relations (owner, peer, kind, since) VALUES ($1, $2, 'blocked', $3)
                 ON CONFLICT (owner, peer) DO UPDATE SET kind = 'blocked', since = excluded.since",
                &[&owner.as_str(), &peer.as_str(), &now],
            )
            .await?;
            ConsentOutcome::Applied(None)
        }
        ConsentChange::Unblock { owner, peer } => {
            let n = tx
                .execute(
                    "DELETE FROM relations WHERE owner = $1 AND peer = $2 AND kind = 'blocked'",
                    &[&owner.as_str(), &peer.as_str()],
                )
                .await?;
            changed(n, None)
        }
        ConsentChange::Remove { owner, peer } => {
            let n = tx
                .execute(
                    "DELETE FROM relations WHERE kind = 'contact' AND ((owner = $1 AND peer = $2) OR (owner = $2 AND peer = $1))",
                    &[&owner.as_str(), &peer.as_str()],
                )
                .await?;
            changed(n, None)
        }
        ConsentChange::Join { owner, group } => {
            tx.execute(
                "INSERT INTO relations (owner, peer, kind, since) VALUES ($1, $2, 'contact', $3)
                 ON CONFLICT (owner, peer) DO UPDATE SET kind = 'contact', since = excluded.since",
                &[&owner.as_str(), &group.as_str(), &now],
            )
            .await?;
            ConsentOutcome::Applied(None)
        }
        ConsentChange::SetPolicy { owner, policy } => {
            tx.execute(
                "UPDATE agents SET policy = $2 WHERE name = $1",
                &[&owner.as_str(), &policy.as_str()],
            )
            .await?;
            ConsentOutcome::Applied(None)
        }
    };
    tx.commit().await?;
    Ok(outcome)
}

/// `Applied` when a statement changed rows, `NoSuchRequest` when there was nothing to change.
fn changed(rows: u64, requester: Option<AgentName>) -> ConsentOutcome {
    if rows == 0 {
        ConsentOutcome::NoSuchRequest
    } else {
        ConsentOutcome::Applied(requester)
    }
}

pub(super) async fn has_request(
    client: &Client,
    target: &AgentName,
    requester: &AgentName,
    code: &RequestCode,
    now_ms: i64,
) -> Result<bool, StorageError> {
    Ok(client
        .query_opt(
            "SELECT 1 FROM contact_requests WHERE target = $1 AND requester = $2 AND code = $3 AND expires_at >= $4",
            &[&target.as_str(), &requester.as_str(), &code.as_str(), &now_ms],
        )
        .await?
        .is_some())
}

pub(super) async fn state(
    client: &Client,
    agent: &AgentName,
    now_ms: i64,
) -> Result<ConsentState, StorageError> {
    let policy: Option<String> = match client
        .query_opt(
            "SELECT policy FROM agents WHERE name = $1",
            &[&agent.as_str()],
        )
        .await?
    {
        Some(row) => row.try_get(0)?,
        None => None,
    };
    Ok(ConsentState {
        policy: policy.and_then(|p| p.parse().ok()),
        incoming: requests(
            client,
            "SELECT requester, note, code, expires_at FROM contact_requests WHERE target = $1 AND expires_at >= $2 ORDER BY expires_at",
            agent,
            now_ms,
            false,
        )
        .await?,
        outgoing: requests(
            client,
            "SELECT target, note, code, expires_at FROM contact_requests WHERE requester = $1 AND expires_at >= $2 ORDER BY expires_at",
            agent,
            now_ms,
            true,
        )
        .await?,
        contacts: names(
            client,
            "SELECT peer FROM relations WHERE owner = $1 AND kind = 'contact' ORDER BY peer",
            agent,
        )
        .await?,
        blocked: names(
            client,
            "SELECT peer FROM relations WHERE owner = $1 AND kind = 'blocked' ORDER BY peer",
            agent,
        )
        .await?,
    })
}

fn invalid(what: &str, e: impl std::fmt::Display) -> StorageError {
    StorageError::Database(format!("a stored {what} is invalid: {e}"))
}

async fn names(
    client: &Client,
    sql: &str,
    agent: &AgentName,
) -> Result<Vec<AgentName>, StorageError> {
    client
        .query(sql, &[&agent.as_str()])
        .await?
        .into_iter()
        .map(|row| {
            let name: String = row.try_get(0)?;
            AgentName::from_stored(&name).map_err(|e| invalid("agent name", e))
        })
        .collect()
}

async fn requests(
    client: &Client,
    sql: &str,
    agent: &AgentName,
    now: i64,
    with_code: bool,
) -> Result<Vec<RequestView>, StorageError> {
    client
        .query(sql, &[&agent.as_str(), &now])
        .await?
        .into_iter()
        .map(|row| {
            let other: String = row.try_get(0)?;
            let code: String = row.try_get(2)?;
            let expires: i64 = row.try_get(3)?;
            Ok(RequestView {
                agent: AgentName::from_stored(&other)
                    .map_err(|e| invalid("agent name", e))?
                    .stored_address(),
                note: row.try_get(1)?,
                expires_at: jiff::Timestamp::from_millisecond(expires)
                    .map_err(|e| invalid("request expiry", e))?,
                code: if with_code {
                    Some(RequestCode::parse(&code).map_err(|e| invalid("request code", e))?)
                } else {
                    None
                },
            })
        })
        .collect()
}

/// Keeps `target`'s denial for `requester` until `lapses`, within [`DENIALS_KEPT`].
async fn keep_denial(
    tx: &impl GenericClient,
    requester: &AgentName,
    target: &AgentName,
    lapses: i64,
) -> Result<(), StorageError> {
    tx.execute(
        "INSERT INTO denials (requester, target, expires_at) VALUES ($1, $2, $3)
         ON CONFLICT (requester, target) DO UPDATE SET expires_at = excluded.expires_at",
        &[&requester.as_str(), &target.as_str(), &lapses],
    )
    .await?;
    tx.execute(
        "DELETE FROM denials WHERE requester = $1 AND target NOT IN
             (SELECT target FROM denials WHERE requester = $1
              ORDER BY expires_at DESC, target LIMIT $2)",
        &[&requester.as_str(), &i64::from(DENIALS_KEPT)],
    )
    .await?;
    Ok(())
}

/// The denials kept for `requester`, deleted as they are read.
pub(super) async fn take_denials(
    client: &Client,
    requester: &AgentName,
    now: i64,
) -> Result<Vec<AgentName>, StorageError> {
    let rows = client
        .query(
            "WITH taken AS (DELETE FROM denials WHERE requester = $1 RETURNING target, expires_at)
             SELECT target FROM taken WHERE expires_at >= $2 ORDER BY expires_at, target",
            &[&requester.as_str(), &now],
        )
        .await?;
    rows.iter()
        .map(|row| {
            AgentName::from_stored(row.try_get(0)?)
                .map_err(|e| StorageError::Database(format!("a denial's target: {e}")))
        })
        .collect()
}
