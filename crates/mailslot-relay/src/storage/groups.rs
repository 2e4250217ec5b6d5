//! The groups role: each group's record (owner key, creator, posting policy) and its roster.
//! A group's name lives in the agents' namespace: registering an agent under a group's name
//! is refused as taken, and a group cannot take a registered (or held) agent name.

use std::future::Future;

use super::StorageError;
use crate::protocol::{Address, AgentName, GroupView, OwnerKey};

/// The outcome of [`Groups::create_group`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupCreation {
    /// The group exists now, with its creator as its first member.
    Created,
    /// The name is an agent's (registered or held after retiring) or another group's.
    NameTaken,
    /// The creator made as many groups as one agent may.
    TooMany,
}

/// The outcome of a roster change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RosterChange {
    /// Applied; the group as it is now.
    Changed(GroupView),
    /// Nothing to do (already on it, or not on it); the group as it is.
    Unchanged(GroupView),
    /// The roster is at its bound; nothing changed.
    Full,
    /// No such group.
    NoGroup,
}

/// Groups and their rosters. Every write is durable before its future resolves.
pub trait Groups: Send + Sync + 'static {
    /// Creates `group` (its roster is its creator alone) unless the name is taken or its
    /// creator made `max` groups already.
    fn create_group(
        &self,
        group: GroupView,
        max: usize,
    ) -> impl Future<Output = Result<GroupCreation, StorageError>> + Send;

    /// The group named `name`, with its roster in the order members were added.
    fn group(
        &self,
        name: AgentName,
    ) -> impl Future<Output = Result<Option<GroupView>, StorageError>> + Send;

    /// Puts `member` on `group`'s roster, refused when it holds `max` members already.
    fn add_member(
        &self,
        group: AgentName,
        member: Address,
        max: usize,
    ) -> impl Future<Output = Result<RosterChange, StorageError>> + Send;

    /// Takes `member` off `group`'s roster.
    fn remove_member(
        &self,
        group: AgentName,
        member: Address,
    ) -> impl Future<Output = Result<RosterChange, StorageError>> + Send;

    /// The groups `member` is on the roster of, or that `owner` owns, by name, at most `limit`.
    fn groups_of(
        &self,
        member: Address,
        owner: Option<OwnerKey>,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<GroupView>, StorageError>> + Send;
}

/// A group's record read back from either backend's columns.
pub(super) fn view_from_columns(
    (name, creator, owner, policy): (String, String, Vec<u8>, String),
    members: Vec<String>,
) -> Result<GroupView, StorageError> {
    let bad = |what: &str| {
        StorageError::Database(format!("the stored {what} of group {name} is invalid"))
    };
    Ok(GroupView {
        name: AgentName::new(&name).map_err(|_| bad("name"))?,
        creator: AgentName::new(&creator).map_err(|_| bad("creator"))?,
        owner: <[u8; 32]>::try_from(owner)
            .map(OwnerKey::from_bytes)
            .map_err(|_| bad("owner key"))?,
        policy: policy.parse().map_err(|_| bad("policy"))?,
        members: members
            .iter()
            .map(|m| Address::parse(m).map_err(|_| bad("member")))
            .collect::<Result<_, _>>()?,
    })
}
