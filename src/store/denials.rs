//! Denials: whose owners denied this agent's contact requests, as its relay told it (at once,
//! or at its next login when it was offline). Whichever process held the connection hears
//! the event; the store keeps it, so `mailslot requests` shows it afterwards.

use jiff::{SignedDuration, Timestamp};
use rusqlite::params;

use super::time::{from_ms, to_ms};
use super::{Store, StoreError};
use crate::protocol::Address;

/// How long a denial is shown after it was heard.
pub const DENIALS_SHOWN_FOR: SignedDuration = SignedDuration::from_hours(7 * 24);

/// A denial of one of this agent's contact requests.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Denial {
    /// The agent whose owner denied it.
    pub by: Address,
    /// When this agent heard of it.
    pub heard_at: Timestamp,
}

impl Store {
    /// Records that `by`'s owner denied this agent's request, now; older denials than
    /// [`DENIALS_SHOWN_FOR`] are dropped. `false` when it was heard already: the relay tells a
    /// denial again at the next login until a login took it (at least once), so this is where
    /// it becomes once.
    pub fn record_denial(&mut self, by: &Address) -> Result<bool, StoreError> {
        let now = Timestamp::now();
        let tx = self.write_tx()?;
        tx.execute(
            "DELETE FROM denials WHERE heard_at < ?1",
            [to_ms(now - DENIALS_SHOWN_FOR)],
        )?;
        let new = tx.execute(
            "INSERT INTO denials (agent, heard_at) VALUES (?1, ?2) ON CONFLICT (agent) DO NOTHING",
            params![by.to_string(), to_ms(now)],
        )? == 1;
        tx.commit()?;
        Ok(new)
    }

    /// Forgets the denial by `to`'s owner: this agent asked again, so a denial of the new
    /// request is news.
    pub fn forget_denial(&self, to: &Address) -> Result<(), StoreError> {
        self.conn
            .execute("DELETE FROM denials WHERE agent = ?1", [to.to_string()])?;
        Ok(())
    }

    /// The denials heard within [`DENIALS_SHOWN_FOR`], newest first.
    pub fn denials(&self) -> Result<Vec<Denial>, StoreError> {
        let since = to_ms(Timestamp::now() - DENIALS_SHOWN_FOR);
        let mut query = self.conn.prepare_cached(
            "SELECT agent, heard_at FROM denials WHERE heard_at >= ?1 ORDER BY heard_at DESC, agent",
        )?;
        let rows = query
            .query_map([since], |r| {
                Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?))
            })?
            .collect::<Result<Vec<_>, _>>()?;
        rows.into_iter()
            .map(|(agent, at)| {
                Ok(Denial {
                    by: Address::parse(&agent).map_err(|e| StoreError::Corrupt {
                        what: "denial",
                        detail: e.to_string(),
                    })?,
                    heard_at: from_ms(at)?,
                })
            })
            .collect()
    }
}
