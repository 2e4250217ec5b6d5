//! The consent ledger on SQLite: contact requests, approvals, blocks and each agent's policy.
//! Every change runs in the writer's batch, so a consent change and a send never race, and
//! clears the consent rules the queue's index remembers for sends.

use rusqlite::{Connection, OptionalExtension, params};

use super::SqliteStorage;
use super::clock::now_ms;
use crate::protocol::{AgentName, RequestCode, RequestView};
use crate::storage::{
    ConsentChange, ConsentLedger, ConsentOutcome, ConsentState, DENIALS_KEPT, StorageError,
    hears_here,
};

impl ConsentLedger for SqliteStorage {
    async fn consent(&self, change: ConsentChange) -> Result<ConsentOutcome, StorageError> {
        self.writes
            .enqueue(move |b| {
                b.index.forget_rules();
                consent(b.tx, &change)
            })
            .await
    }

    async fn has_request(
        &self,
        target: AgentName,
        requester: AgentName,
        code: RequestCode,
        now_ms: i64,
    ) -> Result<bool, StorageError> {
        self.readers.read(move |conn| {
            Ok(conn
                .prepare_cached(
                    "SELECT 1 FROM contact_requests WHERE target = ?1 AND requester = ?2 AND code = ?3 AND expires_at >= ?4",
                )?
                .exists(params![target.as_str(), requester.as_str(), code.as_str(), now_ms])?)
        })
        .await
    }

    async fn take_denials(
        &self,
        requester: AgentName,
        now_ms: i64,
    ) -> Result<Vec<AgentName>, StorageError> {
        self.writes
            .enqueue(move |b| take_denials(b.tx, &requester, now_ms))
            .await
    }

    async fn consent_state(
        &self,
        agent: AgentName,
        now_ms: i64,
    ) -> Result<ConsentState, StorageError> {
        self.readers.read(move |conn| {
            let policy: Option<String> = conn
                .prepare_cached("SELECT policy FROM agents WHERE name = ?1")?
                .query_row([agent.as_str()], |r| r.get(0))
                .optional()?
                .flatten();
            Ok(ConsentState {
                policy: policy.and_then(|p| p.parse().ok()),
                incoming: requests(
                    conn,
                    "SELECT requester, note, code, expires_at FROM contact_requests WHERE target = ?1 AND expires_at >= ?2 ORDER BY expires_at",
                    &agent,
                    now_ms,
                    false,
                )?,
                outgoing: requests(
                    conn,
                    "SELECT target, note, code, expires_at FROM contact_requests WHERE requester = ?1 AND expires_at >= ?2 ORDER BY expires_at",
                    &agent,
                    now_ms,
                    true,
                )?,
                contacts: names(conn, "SELECT peer FROM relations WHERE owner = ?1 AND kind = 'contact' ORDER BY peer", &agent)?,
                blocked: names(conn, "SELECT peer FROM relations WHERE owner = ?1 AND kind = 'blocked' ORDER BY peer", &agent)?,
            })
        })
        .await
    }
}

/// How `owner` relates to `peer`: its own row, else a block of `peer`'s whole relay (which
/// is only ever a block, so "contact" is the peer's own row).
fn relation(
    tx: &rusqlite::Transaction<'_>,
    owner: &AgentName,
    peer: &AgentName,
) -> Result<Option<String>, StorageError> {
    Ok(tx
        .query_row(
            "SELECT kind FROM relations WHERE owner = ?1
                 AND peer IN (?2, '*@' || substr(?2, instr(?2, '@') + 1))
             ORDER BY peer = ?2 DESC LIMIT 1",
            [owner.as_str(), peer.as_str()],
            |r| r.get(0),
        )
        .optional()?)
}

fn consent(
    tx: &rusqlite::Transaction<'_>,
    change: &ConsentChange,
) -> Result<ConsentOutcome, StorageError> {
    let now = now_ms();
    tx.execute("DELETE FROM contact_requests WHERE expires_at < ?1", [now])?;
    tx.execute("DELETE FROM denials WHERE expires_at < ?1", [now])?;
    let add_contacts = |a: &AgentName, b: &AgentName| -> Result<(), StorageError> {
        for (owner, peer) in [(a, b), (b, a)] {
            tx.execute(
                "INSERT INTO relations (owner, peer, kind, since) VALUES (?1, ?2, 'contact', ?3)
                 ON CONFLICT (owner, peer) DO UPDATE SET kind = 'contact', since = excluded.since
                 WHERE relations.kind != 'blocked'",
                params![owner.as_str(), peer.as_str(), now],
            )?;
        }
        Ok(())
    };
    Ok(match change {
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
            let policy: Option<String> = tx
                .query_row(
                    "SELECT policy FROM agents WHERE name = ?1",
                    [to.as_str()],
                    |r| r.get(0),
                )
                .optional()?
                .flatten();
            if relation(tx, to, from)?.as_deref() == Some("blocked")
                || policy.as_deref() == Some("closed")
            {
                return Ok(ConsentOutcome::NotAllowed);
            }
            if relation(tx, from, to)?.as_deref() == Some("contact") {
                return Ok(ConsentOutcome::AlreadyContacts);
            }
            let pending: u32 = tx.query_row(
                "SELECT count(*) FROM contact_requests WHERE requester = ?1 AND target != ?2",
                [from.as_str(), to.as_str()],
                |r| r.get(0),
            )?;
            if pending >= *max_pending {
                return Ok(ConsentOutcome::TooManyPending);
            }
            // Asking again replaces a request, so the one being replaced is not counted.
            let waiting: u32 = tx.query_row(
                "SELECT count(*) FROM contact_requests WHERE target = ?1 AND requester != ?2",
                [to.as_str(), from.as_str()],
                |r| r.get(0),
            )?;
            if waiting >= *max_to_target {
                return Ok(ConsentOutcome::TargetFull);
            }
            if let Some((_, relay)) = from.as_str().split_once('@') {
                let from_relay: u32 = tx.query_row(
                    "SELECT count(*) FROM contact_requests
                     WHERE substr(requester, instr(requester, '@') + 1) = ?1
                       AND instr(requester, '@') > 0
                       AND NOT (requester = ?2 AND target = ?3)",
                    [relay, from.as_str(), to.as_str()],
                    |r| r.get(0),
                )?;
                if from_relay >= *max_from_relay {
                    return Ok(ConsentOutcome::RelayFull);
                }
            }
            let mut open_codes = tx.prepare_cached(
                "SELECT code FROM contact_requests WHERE target = ?1 AND requester != ?2",
            )?;
            let codes =
                open_codes.query_map([to.as_str(), from.as_str()], |r| r.get::<_, String>(0))?;
            for stored in codes {
                if RequestCode::parse(&stored?).is_ok_and(|c| c.appears_in(note)) {
                    return Ok(ConsentOutcome::NoteHasCode);
                }
            }
            // Asking again replaces the earlier request (new code, new expiry).
            tx.execute(
                "INSERT INTO contact_requests (requester, target, note, code, expires_at) VALUES (?1, ?2, ?3, ?4, ?5)
                 ON CONFLICT (requester, target) DO UPDATE SET note = excluded.note, code = excluded.code, expires_at = excluded.expires_at",
                params![from.as_str(), to.as_str(), note, code.as_str(), expires_at_ms],
            )?;
            ConsentOutcome::Applied(None)
        }
        ConsentChange::Approve {
            target,
            requester,
            code,
        } => {
            let n = tx.execute(
                "DELETE FROM contact_requests WHERE target = ?1 AND requester = ?2 AND code = ?3",
                [target.as_str(), requester.as_str(), code.as_str()],
            )?;
            if n == 0 {
                return Ok(ConsentOutcome::NoSuchRequest);
            }
            add_contacts(target, requester)?;
            ConsentOutcome::Applied(Some(requester.clone()))
        }
        ConsentChange::Deny { target, requester } => {
            let lapses: Option<i64> = tx
                .query_row(
                    "DELETE FROM contact_requests WHERE requester = ?1 AND target = ?2 RETURNING expires_at",
                    [requester.as_str(), target.as_str()],
                    |r| r.get(0),
                )
                .optional()?;
            let Some(lapses) = lapses else {
                return Ok(ConsentOutcome::NoSuchRequest);
            };
            if hears_here(requester) {
                keep_denial(tx, requester, target, lapses)?;
            }
            ConsentOutcome::Applied(Some(requester.clone()))
        }
        ConsentChange::Block { owner, peer } => {
            tx.execute(
                "DELETE FROM contact_requests WHERE (requester = ?1 AND target = ?2) OR (requester = ?2 AND target = ?1)",
                [owner.as_str(), peer.as_str()],
            )?;
            tx.execute(
                "DELETE FROM relations WHERE owner = ?1 AND peer = ?2 AND kind = 'contact'",
                [peer.as_str(), owner.as_str()],
            )?;
            tx.execute(
                "INSERT INTO relations (owner, peer, kind, since) VALUES (?1, ?2, 'blocked', ?3)
                 ON CONFLICT (owner, peer) DO UPDATE SET kind = 'blocked', since = excluded.since",
                params![owner.as_str(), peer.as_str(), now],
            )?;
            ConsentOutcome::Applied(None)
        }
        ConsentChange::Unblock { owner, peer } => {
            let n = tx.execute(
                "DELETE FROM relations WHERE owner = ?1 AND peer = ?2 AND kind = 'blocked'",
                [owner.as_str(), peer.as_str()],
            )?;
            changed(n, None)
        }
        ConsentChange::Remove { owner, peer } => {
            let n = tx.execute(
                "DELETE FROM relations WHERE kind = 'contact' AND ((owner = ?1 AND peer = ?2) OR (owner = ?2 AND peer = ?1))",
                [owner.as_str(), peer.as_str()],
            )?;
            changed(n, None)
        }
        ConsentChange::Join { owner, group } => {
            tx.execute(
                "INSERT INTO relations (owner, peer, kind, since) VALUES (?1, ?2, 'contact', ?3)
                 ON CONFLICT (owner, peer) DO UPDATE SET kind = 'contact', since = excluded.since",
                params![owner.as_str(), group.as_str(), now],
            )?;
            ConsentOutcome::Applied(None)
        }
        ConsentChange::SetPolicy { owner, policy } => {
            tx.execute(
                "UPDATE agents SET policy = ?2 WHERE name = ?1",
                [owner.as_str(), policy.as_str()],
            )?;
            ConsentOutcome::Applied(None)
        }
    })
}

/// Keeps `target`'s denial for `requester` until `lapses`, within [`DENIALS_KEPT`].
fn keep_denial(
    tx: &rusqlite::Transaction<'_>,
    requester: &AgentName,
    target: &AgentName,
    lapses: i64,
) -> Result<(), StorageError> {
    tx.execute(
        "INSERT INTO denials (requester, target, expires_at) VALUES (?1, ?2, ?3)
         ON CONFLICT (requester, target) DO UPDATE SET expires_at = excluded.expires_at",
        params![requester.as_str(), target.as_str(), lapses],
    )?;
    tx.execute(
        "DELETE FROM denials WHERE requester = ?1 AND target NOT IN
             (SELECT target FROM denials WHERE requester = ?1
              ORDER BY expires_at DESC, target LIMIT ?2)",
        params![requester.as_str(), DENIALS_KEPT],
    )?;
    Ok(())
}

fn take_denials(
    tx: &rusqlite::Transaction<'_>,
    requester: &AgentName,
    now: i64,
) -> Result<Vec<AgentName>, StorageError> {
    let mut taken = tx
        .prepare_cached("DELETE FROM denials WHERE requester = ?1 RETURNING target, expires_at")?
        .query_map([requester.as_str()], |r| {
            Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?))
        })?
        .collect::<Result<Vec<_>, _>>()?;
    taken.retain(|(_, lapses)| *lapses >= now);
    taken.sort_by(|a, b| (a.1, &a.0).cmp(&(b.1, &b.0)));
    taken
        .into_iter()
        .map(|(target, _)| {
            AgentName::from_stored(&target)
                .map_err(|e| StorageError::Database(format!("a denial's target: {e}")))
        })
        .collect()
}

/// `Applied` when a statement changed rows, `NoSuchRequest` when there was nothing to change.
fn changed(rows: usize, requester: Option<AgentName>) -> ConsentOutcome {
    if rows == 0 {
        ConsentOutcome::NoSuchRequest
    } else {
        ConsentOutcome::Applied(requester)
    }
}

fn names(conn: &Connection, sql: &str, agent: &AgentName) -> Result<Vec<AgentName>, StorageError> {
    let mut stmt = conn.prepare_cached(sql)?;
    let rows = stmt.query_map([agent.as_str()], |r| r.get::<_, String>(0))?;
    rows.map(|r| AgentName::from_stored(&r?).map_err(|e| StorageError::Database(e.to_string())))
        .collect()
}

fn requests(
    conn: &Connection,
    sql: &str,
    agent: &AgentName,
    now: i64,
    with_code: bool,
) -> Result<Vec<RequestView>, StorageError> {
    let mut stmt = conn.prepare_cached(sql)?;
    let rows = stmt.query_map(params![agent.as_str(), now], |r| {
        Ok((
            r.get::<_, String>(0)?,
            r.get::<_, String>(1)?,
            r.get::<_, String>(2)?,
            r.get::<_, i64>(3)?,
        ))
    })?;
    rows.map(|row| {
        let (other, note, code, expires) = row?;
        let bad = |e: String| StorageError::Database(e);
        Ok(RequestView {
            agent: AgentName::from_stored(&other)
                .map_err(|e| bad(e.to_string()))?
                .stored_address(),
            note,
            expires_at: jiff::Timestamp::from_millisecond(expires)
                .map_err(|e| bad(e.to_string()))?,
            code: if with_code {
                Some(RequestCode::parse(&code).map_err(|e| bad(e.to_string()))?)
            } else {
                None
            },
        })
    })
    .collect()
}
