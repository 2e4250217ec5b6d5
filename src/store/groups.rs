//! Groups this agent is in, as its side knows them: joined (its owner signed the join at its
//! relay, so the group's mail opens here) or wished (its model asked to join; only the owner
//! can, and `mailslot groups` shows the wish until the owner joins or it is withdrawn).

use jiff::Timestamp;
use rusqlite::params;

use super::time::{from_ms, to_ms};
use super::{Store, StoreError};
use crate::protocol::Address;

/// Where this agent stands with a group.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Membership {
    /// Its model asked to join; its owner has not joined it yet.
    Wished,
    /// Its owner joined it.
    Joined,
}

impl Membership {
    fn as_str(self) -> &'static str {
        match self {
            Membership::Wished => "wished",
            Membership::Joined => "joined",
        }
    }
}

/// A group as this agent's store keeps it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct GroupMark {
    /// The group: bare on the agent's relay, `name@host` on another.
    pub group: Address,
    /// Joined or wished.
    pub state: Membership,
    /// Since when.
    pub since: Timestamp,
}

impl Store {
    /// Records where this agent stands with `group`. A wish never undoes a join.
    pub fn mark_group(&self, group: &Address, state: Membership) -> Result<(), StoreError> {
        self.conn.execute(
            "INSERT INTO groups (address, state, since) VALUES (?1, ?2, ?3)
             ON CONFLICT (address) DO UPDATE SET state = excluded.state, since = excluded.since
             WHERE groups.state = 'wished'",
            params![group.to_string(), state.as_str(), to_ms(Timestamp::now())],
        )?;
        Ok(())
    }

    /// Forgets `group`: the agent left it.
    pub fn forget_group(&self, group: &Address) -> Result<(), StoreError> {
        self.conn
            .execute("DELETE FROM groups WHERE address = ?1", [group.to_string()])?;
        Ok(())
    }

    /// The groups this agent joined or wished to, by address.
    pub fn group_marks(&self) -> Result<Vec<GroupMark>, StoreError> {
        let mut query = self
            .conn
            .prepare_cached("SELECT address, state, since FROM groups ORDER BY address")?;
        let rows = query
            .query_map([], |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, i64>(2)?,
                ))
            })?
            .collect::<Result<Vec<_>, _>>()?;
        rows.into_iter()
            .map(|(address, state, since)| {
                let corrupt = |detail: String| StoreError::Corrupt {
                    what: "group",
                    detail,
                };
                Ok(GroupMark {
                    group: Address::parse(&address).map_err(|e| corrupt(e.to_string()))?,
                    state: match state.as_str() {
                        "joined" => Membership::Joined,
                        "wished" => Membership::Wished,
                        other => return Err(corrupt(format!("state {other:?}"))),
                    },
                    since: from_ms(since)?,
                })
            })
            .collect()
    }

    /// The groups this agent joined: the ones whose mail opens here.
    pub fn joined_groups(&self) -> Result<Vec<Address>, StoreError> {
        Ok(self
            .group_marks()?
            .into_iter()
            .filter(|m| m.state == Membership::Joined)
            .map(|m| m.group)
            .collect())
    }
}
