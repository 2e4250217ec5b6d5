//! Group requests: create, the owner's roster changes (signed by the group's owner key, not
//! the asking agent's), join (signed by the agent's own owner, checked with every owner-only
//! frame in `consent::signed_by_owner`), leave, the listing, and who may read a roster or post.

use super::state::RelayState;
use super::storage::{
    ConsentChange, ConsentLedger, ConsentOutcome, GroupCreation, Groups, Registry, RosterChange,
};
use super::wire::{error_frame, storage_failed};
use crate::crypto::owner;
use crate::protocol::{
    Address, AgentName, ErrorCode, GroupPolicy, GroupView, MAX_GROUP_MEMBERS, MAX_GROUPS_LISTED,
    MAX_GROUPS_PER_CREATOR, OwnerAct, OwnerKey, ServerFrame,
};

fn error(reference: String, code: ErrorCode, message: impl Into<String>) -> ServerFrame {
    error_frame(Some(reference), code, message, None)
}

fn no_group(reference: String, group: &AgentName) -> ServerFrame {
    error(
        reference,
        ErrorCode::UnknownRecipient,
        format!("no group named {group} on this relay"),
    )
}

/// Whether `agent` (of this relay, whose owner key is `owner`) may post to `group`.
pub fn may_post(group: &GroupView, agent: &AgentName, owner: Option<OwnerKey>) -> bool {
    match group.policy {
        GroupPolicy::Members => group.has_member(&Address::local(agent.clone())),
        GroupPolicy::Owner => owner == Some(group.owner),
        GroupPolicy::Anyone => true,
    }
}

/// Whether `agent` may read `group`'s roster: those who may post, its members and its
/// owner's agents. Anyone else learns nothing of who is on it.
pub fn may_read(group: &GroupView, agent: &AgentName, owner: Option<OwnerKey>) -> bool {
    may_post(group, agent, owner)
        || group.has_member(&Address::local(agent.clone()))
        || owner == Some(group.owner)
}

/// Answers `agent`'s `create_group`.
#[tracing::instrument(level = "debug", name = "request", skip_all, fields(kind = "create_group", %agent, r#ref = %reference, %group))]
pub async fn create<S: Registry + Groups>(
    state: &RelayState<S>,
    agent: &AgentName,
    reference: String,
    group: AgentName,
    policy: GroupPolicy,
) -> ServerFrame {
    // The group is owned by the creator's registered owner key, never by one a frame names.
    let owner = match state.storage.owner(agent.clone()).await {
        Ok(Some(owner)) => owner,
        Ok(None) => {
            return error(
                reference,
                ErrorCode::OwnerRequired,
                format!(
                    "{agent} has no owner key yet, and a group is owned by its creator's owner key: its owner runs `mailslot owner init`"
                ),
            );
        }
        Err(e) => return storage_failed(reference, e),
    };
    let view = GroupView {
        name: group.clone(),
        creator: agent.clone(),
        owner,
        policy,
        members: vec![Address::local(agent.clone())],
    };
    match state
        .storage
        .create_group(view.clone(), MAX_GROUPS_PER_CREATOR)
        .await
    {
        Ok(GroupCreation::Created) => ServerFrame::Group {
            reference,
            group: view,
        },
        Ok(GroupCreation::NameTaken) => error(
            reference,
            ErrorCode::NameTaken,
            format!("{group} is taken on this relay (by an agent or a group); choose another name"),
        ),
        Ok(GroupCreation::TooMany) => error(
            reference,
            ErrorCode::TooManyGroups,
            format!(
                "{agent} made {MAX_GROUPS_PER_CREATOR} groups, the most one agent makes here; use one of them"
            ),
        ),
        Err(e) => storage_failed(reference, e),
    }
}

/// A roster change the group's owner signed: add or remove.
pub struct RosterAct {
    /// The group.
    pub group: AgentName,
    /// The member.
    pub member: Address,
    /// Whether the member is added (else removed).
    pub add: bool,
    /// The group owner key's signature.
    pub signature: Vec<u8>,
}

/// Answers `agent`'s `group_add` or `group_remove` on the connection challenged with `nonce`.
#[tracing::instrument(level = "debug", name = "request", skip_all, fields(kind = "group_roster", %agent, r#ref = %reference, group = %act.group, member = %act.member, add = act.add))]
pub async fn change_roster<S: Registry + Groups>(
    state: &RelayState<S>,
    (agent, nonce): (&AgentName, &[u8]),
    reference: String,
    act: RosterAct,
) -> ServerFrame {
    let group = match state.storage.group(act.group.clone()).await {
        Ok(Some(group)) => group,
        Ok(None) => return no_group(reference, &act.group),
        Err(e) => return storage_failed(reference, e),
    };
    let signed = if act.add {
        OwnerAct::GroupAdd {
            group: &act.group,
            member: &act.member,
        }
    } else {
        OwnerAct::GroupRemove {
            group: &act.group,
            member: &act.member,
        }
    };
    if owner::verify(
        &group.owner,
        &state.relay_id,
        nonce,
        agent,
        &signed,
        &act.signature,
    )
    .is_err()
    {
        tracing::warn!(%agent, group = %act.group, "a roster change not signed by the group's owner key was refused");
        return error(
            reference,
            ErrorCode::NotOwner,
            format!(
                "not signed by the owner key of {} for this connection; only the group's owner changes its roster, with the passphrase (`mailslot groups add|remove`)",
                act.group
            ),
        );
    }
    // A member of this relay is kept bare, however it was written.
    let member = match state.local_name(&act.member) {
        Some(name) => Address::local(name.clone()),
        None => act.member.clone(),
    };
    if act.add
        && let Some(name) = member.host().is_none().then(|| member.name())
    {
        match state.is_registered(name).await {
            Ok(true) => {}
            Ok(false) => {
                return error(
                    reference,
                    ErrorCode::UnknownAgent,
                    format!("no agent named {name} on this relay; a group's members are agents"),
                );
            }
            Err(e) => return storage_failed(reference, e),
        }
    }
    let changed = if act.add {
        state
            .storage
            .add_member(act.group.clone(), member, MAX_GROUP_MEMBERS)
            .await
    } else {
        state.storage.remove_member(act.group.clone(), member).await
    };
    match changed {
        Ok(RosterChange::Changed(group) | RosterChange::Unchanged(group)) => {
            ServerFrame::Group { reference, group }
        }
        Ok(RosterChange::Full) => error(
            reference,
            ErrorCode::GroupFull,
            format!(
                "{} has {MAX_GROUP_MEMBERS} members, the most a group has; remove one first",
                act.group
            ),
        ),
        Ok(RosterChange::NoGroup) => no_group(reference, &act.group),
        Err(e) => storage_failed(reference, e),
    }
}

/// Answers `agent`'s `join` of `group`, whose owner signature was checked already.
#[tracing::instrument(level = "debug", name = "request", skip_all, fields(kind = "join", %agent, r#ref = %reference, %group))]
pub async fn join<S: ConsentLedger + Groups>(
    state: &RelayState<S>,
    agent: &AgentName,
    reference: String,
    group: Address,
) -> ServerFrame {
    if let Some(name) = state.local_name(&group) {
        match state.storage.group(name.clone()).await {
            Ok(Some(_)) => {}
            Ok(None) => return no_group(reference, name),
            Err(e) => return storage_failed(reference, e),
        }
    }
    let Some(kept) = state.stored_peer(&group) else {
        return error(
            reference,
            ErrorCode::BadFrame,
            format!("{group} is too long to keep"),
        );
    };
    let change = ConsentChange::Join {
        owner: agent.clone(),
        group: kept,
    };
    match state.storage.consent(change).await {
        Ok(_) => ServerFrame::Done {
            reference,
            detail: format!(
                "{agent} joined {group}: its mail reaches {agent} while it is on the roster"
            ),
        },
        Err(e) => storage_failed(reference, e),
    }
}

/// Answers `agent`'s `leave` of `group`: no more of its mail, and off its roster here.
#[tracing::instrument(level = "debug", name = "request", skip_all, fields(kind = "leave", %agent, r#ref = %reference, %group))]
pub async fn leave<S: ConsentLedger + Groups>(
    state: &RelayState<S>,
    agent: &AgentName,
    reference: String,
    group: Address,
) -> ServerFrame {
    let Some(kept) = state.stored_peer(&group) else {
        return error(
            reference,
            ErrorCode::BadFrame,
            format!("{group} is too long to keep"),
        );
    };
    let change = ConsentChange::Remove {
        owner: agent.clone(),
        peer: kept,
    };
    let consented = match state.storage.consent(change).await {
        Ok(outcome) => outcome == ConsentOutcome::Applied(None),
        Err(e) => return storage_failed(reference, e),
    };
    let rostered = match state.local_name(&group) {
        Some(name) => match state
            .storage
            .remove_member(name.clone(), Address::local(agent.clone()))
            .await
        {
            Ok(change) => matches!(change, RosterChange::Changed(_)),
            Err(e) => return storage_failed(reference, e),
        },
        None => false,
    };
    let detail = if consented || rostered {
        format!("{agent} left {group}: none of its mail reaches {agent} now")
    } else {
        format!("{agent} was not in {group}; nothing changed")
    };
    ServerFrame::Done { reference, detail }
}

/// Answers `agent`'s `groups`: the groups here it is on the roster of or owns.
#[tracing::instrument(level = "debug", name = "request", skip_all, fields(kind = "groups", %agent, r#ref = %reference))]
pub async fn list<S: Registry + Groups>(
    state: &RelayState<S>,
    agent: &AgentName,
    reference: String,
) -> ServerFrame {
    let owner = match state.storage.owner(agent.clone()).await {
        Ok(owner) => owner,
        Err(e) => return storage_failed(reference, e),
    };
    match state
        .storage
        .groups_of(Address::local(agent.clone()), owner, MAX_GROUPS_LISTED)
        .await
    {
        Ok(groups) => ServerFrame::GroupList { reference, groups },
        Err(e) => storage_failed(reference, e),
    }
}
