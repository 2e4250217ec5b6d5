//! The group calls: make a group, read its roster, list this agent's groups, leave one (over
//! any [`Ask`]), and the group owner's roster changes, signed with the owner key on a control
//! connection. Joining is a consent change (`consent::Change::Join`), signed by the member's
//! own owner like every other.

use super::ask::Ask;
use super::{ClientError, Connection};
use crate::crypto::Owner;
use crate::protocol::{
    Address, AgentName, ClientFrame, ErrorCode, GroupPolicy, GroupView, OwnerAct, ServerFrame,
};

fn unexpected(other: ServerFrame) -> ClientError {
    ClientError::Protocol(format!("unexpected answer {other:?}"))
}

/// Makes `group` on the agent's relay, owned by the agent's owner key, with the agent as its
/// first member.
pub async fn create(
    conn: &mut impl Ask,
    group: AgentName,
    policy: GroupPolicy,
) -> Result<GroupView, ClientError> {
    match conn
        .ask(Box::new(move |reference| ClientFrame::CreateGroup {
            reference,
            group,
            policy,
        }))
        .await?
    {
        ServerFrame::Group { group, .. } => Ok(group),
        other => Err(unexpected(other)),
    }
}

/// The group `group` on the agent's relay, with its roster; refused when the name is an
/// agent's.
pub async fn roster(conn: &mut impl Ask, group: &AgentName) -> Result<GroupView, ClientError> {
    let wanted = group.clone();
    match conn
        .ask(Box::new(move |reference| ClientFrame::Lookup {
            reference,
            agent: wanted,
        }))
        .await?
    {
        ServerFrame::Group { group, .. } => Ok(group),
        ServerFrame::Keys { .. } => Err(ClientError::Refused {
            code: ErrorCode::UnknownRecipient,
            message: format!("{group} is an agent, not a group"),
            retry_after_ms: None,
        }),
        other => Err(unexpected(other)),
    }
}

/// The groups on the agent's relay it is on the roster of or owns.
pub async fn list(conn: &mut impl Ask) -> Result<Vec<GroupView>, ClientError> {
    match conn
        .ask(Box::new(|reference| ClientFrame::Groups { reference }))
        .await?
    {
        ServerFrame::GroupList { groups, .. } => Ok(groups),
        other => Err(unexpected(other)),
    }
}

/// Leaves `group`: its mail stops, and the agent leaves its roster when it is on the agent's
/// relay. The relay's sentence.
pub async fn leave(conn: &mut impl Ask, group: Address) -> Result<String, ClientError> {
    match conn
        .ask(Box::new(move |reference| ClientFrame::Leave {
            reference,
            group,
        }))
        .await?
    {
        ServerFrame::Done { detail, .. } => Ok(detail),
        other => Err(unexpected(other)),
    }
}

/// A roster change only the group's owner makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Roster {
    /// Put the member on the roster.
    Add,
    /// Take the member off it.
    Remove,
}

/// Adds `member` to or removes it from `group`, signed with the group's owner key (unlocked
/// by the owner's passphrase) for this connection; the group as it is now.
pub async fn change(
    conn: &mut Connection,
    owner: &Owner,
    (group, change, member): (AgentName, Roster, Address),
) -> Result<GroupView, ClientError> {
    let act = match change {
        Roster::Add => OwnerAct::GroupAdd {
            group: &group,
            member: &member,
        },
        Roster::Remove => OwnerAct::GroupRemove {
            group: &group,
            member: &member,
        },
    };
    let owner_signature = conn.owner_signature(owner, &act);
    let answer = conn
        .call(move |reference| match change {
            Roster::Add => ClientFrame::GroupAdd {
                reference,
                group,
                member,
                owner_signature,
            },
            Roster::Remove => ClientFrame::GroupRemove {
                reference,
                group,
                member,
                owner_signature,
            },
        })
        .await?;
    match answer {
        ServerFrame::Group { group, .. } => Ok(group),
        other => Err(unexpected(other)),
    }
}
