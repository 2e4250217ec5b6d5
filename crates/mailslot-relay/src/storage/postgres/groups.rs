//! Groups and their rosters on PostgreSQL. A group's name takes the same advisory lock as an
//! agent's registration (`registry::lock_names`), so a group and an agent never take one
//! name on two nodes at once; a roster change takes it too, so the bound holds.

use deadpool_postgres::{Client, GenericClient};

use super::now_ms;
use super::registry::lock_names;
use crate::protocol::{Address, AgentName, GroupView, OwnerKey};
use crate::storage::groups::view_from_columns;
use crate::storage::{GroupCreation, RosterChange, StorageError};

pub(super) async fn create(
    client: &mut Client,
    group: &GroupView,
    max: usize,
) -> Result<GroupCreation, StorageError> {
    let tx = client.transaction().await?;
    // The creator's lock too: two of its creations on two nodes are counted one after the
    // other.
    lock_names(&tx, &[&group.name, &group.creator]).await?;
    let taken = tx
        .query_opt(
            "SELECT 1 FROM agents WHERE name = $1 UNION ALL SELECT 1 FROM groups WHERE name = $1",
            &[&group.name.as_str()],
        )
        .await?
        .is_some();
    if taken {
        return Ok(GroupCreation::NameTaken);
    }
    let made: i64 = tx
        .query_one(
            "SELECT count(*) FROM groups WHERE creator = $1",
            &[&group.creator.as_str()],
        )
        .await?
        .try_get(0)?;
    if made.unsigned_abs() >= max as u64 {
        return Ok(GroupCreation::TooMany);
    }
    tx.execute(
        "INSERT INTO groups (name, creator, owner, policy, created_at) VALUES ($1, $2, $3, $4, $5)",
        &[
            &group.name.as_str(),
            &group.creator.as_str(),
            &group.owner.as_bytes().as_slice(),
            &group.policy.as_str(),
            &now_ms(),
        ],
    )
    .await?;
    for member in &group.members {
        insert_member(&tx, &group.name, member).await?;
    }
    tx.commit().await?;
    Ok(GroupCreation::Created)
}

pub(super) async fn read(
    client: &impl GenericClient,
    name: &AgentName,
) -> Result<Option<GroupView>, StorageError> {
    let Some(row) = client
        .query_opt(
            "SELECT name, creator, owner, policy FROM groups WHERE name = $1",
            &[&name.as_str()],
        )
        .await?
    else {
        return Ok(None);
    };
    let columns = (
        row.try_get(0)?,
        row.try_get(1)?,
        row.try_get(2)?,
        row.try_get(3)?,
    );
    let members = client
        .query(
            "SELECT member FROM group_members WHERE grp = $1 ORDER BY position",
            &[&name.as_str()],
        )
        .await?
        .iter()
        .map(|r| r.try_get(0))
        .collect::<Result<Vec<String>, _>>()?;
    view_from_columns(columns, members).map(Some)
}

pub(super) async fn add_member(
    client: &mut Client,
    group: &AgentName,
    member: &Address,
    max: usize,
) -> Result<RosterChange, StorageError> {
    let tx = client.transaction().await?;
    lock_names(&tx, &[group]).await?;
    let Some(view) = read(&tx, group).await? else {
        return Ok(RosterChange::NoGroup);
    };
    if view.has_member(member) {
        return Ok(RosterChange::Unchanged(view));
    }
    if view.members.len() >= max {
        return Ok(RosterChange::Full);
    }
    insert_member(&tx, group, member).await?;
    let now = read(&tx, group).await?.unwrap_or(view);
    tx.commit().await?;
    Ok(RosterChange::Changed(now))
}

pub(super) async fn remove_member(
    client: &mut Client,
    group: &AgentName,
    member: &Address,
) -> Result<RosterChange, StorageError> {
    let tx = client.transaction().await?;
    lock_names(&tx, &[group]).await?;
    let Some(view) = read(&tx, group).await? else {
        return Ok(RosterChange::NoGroup);
    };
    let n = tx
        .execute(
            "DELETE FROM group_members WHERE grp = $1 AND member = $2",
            &[&group.as_str(), &member.to_string()],
        )
        .await?;
    if n == 0 {
        return Ok(RosterChange::Unchanged(view));
    }
    let now = read(&tx, group).await?.unwrap_or(view);
    tx.commit().await?;
    Ok(RosterChange::Changed(now))
}

pub(super) async fn of(
    client: &Client,
    member: &Address,
    owner: Option<OwnerKey>,
    limit: usize,
) -> Result<Vec<GroupView>, StorageError> {
    let owner = owner.map(|k| k.as_bytes().to_vec());
    let rows = client
        .query(
            "SELECT name FROM groups
             WHERE owner = $2 OR name IN (SELECT grp FROM group_members WHERE member = $1)
             ORDER BY name LIMIT $3",
            &[&member.to_string(), &owner, &(limit as i64)],
        )
        .await?;
    let mut out = Vec::with_capacity(rows.len());
    for row in rows {
        let name: String = row.try_get(0)?;
        let name = AgentName::new(&name).map_err(|_| {
            StorageError::Database(format!("the stored group name {name} is invalid"))
        })?;
        out.extend(read(client, &name).await?);
    }
    Ok(out)
}

async fn insert_member(
    tx: &impl GenericClient,
    group: &AgentName,
    member: &Address,
) -> Result<(), StorageError> {
    tx.execute(
        "INSERT INTO group_members (grp, member, added_at) VALUES ($1, $2, $3)",
        &[&group.as_str(), &member.to_string(), &now_ms()],
    )
    .await?;
    Ok(())
}
