//! The groups role on SQLite: groups and their rosters, beside the agents whose namespace
//! they share. Every write runs in the writer's batch.

use rusqlite::{Connection, OptionalExtension, params};

use super::SqliteStorage;
use super::clock::now_ms;
use crate::protocol::{Address, AgentName, GroupView, OwnerKey};
use crate::storage::groups::view_from_columns;
use crate::storage::{GroupCreation, Groups, RosterChange, StorageError};

impl Groups for SqliteStorage {
    async fn create_group(
        &self,
        group: GroupView,
        max: usize,
    ) -> Result<GroupCreation, StorageError> {
        self.writes
            .tables(move |tx| {
                // A held (retired) agent name is taken too, as for registration.
                let taken = tx
                    .prepare_cached(
                        "SELECT 1 FROM agents WHERE name = ?1 UNION ALL SELECT 1 FROM groups WHERE name = ?1",
                    )?
                    .exists([group.name.as_str()])?;
                if taken {
                    return Ok(GroupCreation::NameTaken);
                }
                let made: i64 = tx
                    .prepare_cached("SELECT count(*) FROM groups WHERE creator = ?1")?
                    .query_row([group.creator.as_str()], |r| r.get(0))?;
                if made.unsigned_abs() >= max as u64 {
                    return Ok(GroupCreation::TooMany);
                }
                tx.execute(
                    "INSERT INTO groups (name, creator, owner, policy, created_at) VALUES (?1, ?2, ?3, ?4, ?5)",
                    params![
                        group.name.as_str(),
                        group.creator.as_str(),
                        group.owner.as_bytes().as_slice(),
                        group.policy.as_str(),
                        now_ms()
                    ],
                )?;
                for member in &group.members {
                    insert_member(tx, &group.name, member)?;
                }
                Ok(GroupCreation::Created)
            })
            .await
    }

    async fn group(&self, name: AgentName) -> Result<Option<GroupView>, StorageError> {
        self.readers.read(move |conn| read_group(conn, &name)).await
    }

    async fn add_member(
        &self,
        group: AgentName,
        member: Address,
        max: usize,
    ) -> Result<RosterChange, StorageError> {
        self.writes
            .tables(move |tx| {
                let Some(view) = read_group(tx, &group)? else {
                    return Ok(RosterChange::NoGroup);
                };
                if view.has_member(&member) {
                    return Ok(RosterChange::Unchanged(view));
                }
                if view.members.len() >= max {
                    return Ok(RosterChange::Full);
                }
                insert_member(tx, &group, &member)?;
                Ok(RosterChange::Changed(
                    read_group(tx, &group)?.unwrap_or(view),
                ))
            })
            .await
    }

    async fn remove_member(
        &self,
        group: AgentName,
        member: Address,
    ) -> Result<RosterChange, StorageError> {
        self.writes
            .tables(move |tx| {
                let Some(view) = read_group(tx, &group)? else {
                    return Ok(RosterChange::NoGroup);
                };
                let n = tx.execute(
                    "DELETE FROM group_members WHERE grp = ?1 AND member = ?2",
                    [group.as_str(), member.to_string().as_str()],
                )?;
                if n == 0 {
                    return Ok(RosterChange::Unchanged(view));
                }
                Ok(RosterChange::Changed(
                    read_group(tx, &group)?.unwrap_or(view),
                ))
            })
            .await
    }

    async fn groups_of(
        &self,
        member: Address,
        owner: Option<OwnerKey>,
        limit: usize,
    ) -> Result<Vec<GroupView>, StorageError> {
        self.readers
            .read(move |conn| {
                let owner = owner.map(|k| k.as_bytes().to_vec());
                let names: Vec<String> = conn
                    .prepare_cached(
                        "SELECT name FROM groups
                         WHERE owner = ?2 OR name IN (SELECT grp FROM group_members WHERE member = ?1)
                         ORDER BY name LIMIT ?3",
                    )?
                    .query_map(params![member.to_string(), owner, limit as i64], |r| r.get(0))?
                    .collect::<Result<_, _>>()?;
                let mut out = Vec::with_capacity(names.len());
                for name in names {
                    let name = AgentName::new(&name).map_err(|_| {
                        StorageError::Database(format!("the stored group name {name} is invalid"))
                    })?;
                    out.extend(read_group(conn, &name)?);
                }
                Ok(out)
            })
            .await
    }
}

fn insert_member(tx: &Connection, group: &AgentName, member: &Address) -> Result<(), StorageError> {
    tx.execute(
        "INSERT INTO group_members (grp, member, added_at) VALUES (?1, ?2, ?3)",
        params![group.as_str(), member.to_string(), now_ms()],
    )?;
    Ok(())
}

fn read_group(conn: &Connection, name: &AgentName) -> Result<Option<GroupView>, StorageError> {
    let row: Option<(String, String, Vec<u8>, String)> = conn
        .prepare_cached("SELECT name, creator, owner, policy FROM groups WHERE name = ?1")?
        .query_row([name.as_str()], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
        })
        .optional()?;
    let Some(row) = row else {
        return Ok(None);
    };
    let members: Vec<String> = conn
        .prepare_cached("SELECT member FROM group_members WHERE grp = ?1 ORDER BY rowid")?
        .query_map([name.as_str()], |r| r.get(0))?
        .collect::<Result<_, _>>()?;
    view_from_columns(row, members).map(Some)
}
