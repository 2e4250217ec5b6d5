//! `groups`: make a group, see its members, and the owner's decisions: who is on a group's
//! roster (signed with the group's owner key) and whether this agent joins one (signed with
//! its own owner key). Both ask for the owner's passphrase at a terminal; an agent alone can
//! create a group, leave one and look, nothing more.

use std::io::IsTerminal;

use anyhow::bail;
use serde::Serialize;

use super::consent::with_relay;
use super::output::{self, outln};
use super::{Ctx, owner};
use crate::client::consent::{self as relay_consent, Change};
use crate::client::groups::{self as relay_groups, Roster};
use crate::protocol::{Address, AgentName, GroupPolicy, GroupView};
use crate::store::{GroupMark, Membership};

/// Refuses an owner's decision without a person at a terminal, naming the command to run.
fn needs_terminal(ctx: &Ctx, args: std::fmt::Arguments<'_>) -> anyhow::Result<()> {
    if !std::io::stdin().is_terminal() {
        bail!(
            "this is the owner's decision, signed with the owner key: run `{}` yourself in an interactive shell (agents cannot)",
            output::command(&ctx.agent_name()?, args)
        );
    }
    Ok(())
}

fn show(group: &GroupView) -> String {
    let members: Vec<String> = group.members.iter().map(ToString::to_string).collect();
    format!(
        "{}  policy {}  created by {}\nmembers ({})  {}",
        group.name,
        group.policy,
        group.creator,
        members.len(),
        members.join(", ")
    )
}

pub(super) fn create(ctx: &Ctx, group: AgentName, policy: GroupPolicy) -> anyhow::Result<()> {
    let made = with_relay(ctx, async |conn, _| {
        Ok(relay_groups::create(conn, group, policy).await?)
    })?;
    output::emit(ctx.json, &made, show)
}

pub(super) fn members(ctx: &Ctx, group: AgentName) -> anyhow::Result<()> {
    let found = with_relay(ctx, async |conn, _| {
        Ok(relay_groups::roster(conn, &group).await?)
    })?;
    output::emit(ctx.json, &found, show)
}

pub(super) fn roster(
    ctx: &Ctx,
    (group, change, member): (AgentName, Roster, Address),
) -> anyhow::Result<()> {
    let verb = match change {
        Roster::Add => "add",
        Roster::Remove => "remove",
    };
    needs_terminal(ctx, format_args!("groups {verb} {group} {member}"))?;
    let now = with_relay(ctx, async |conn, _| {
        let owner = owner::unlock(ctx)?;
        Ok(relay_groups::change(conn, &owner, (group, change, member)).await?)
    })?;
    output::emit(ctx.json, &now, show)
}

pub(super) fn join(ctx: &Ctx, group: Address) -> anyhow::Result<()> {
    needs_terminal(ctx, format_args!("groups join {group}"))?;
    let detail = with_relay(ctx, async |conn, agent| {
        owner::check_registered(ctx, conn, agent)?;
        let owner = owner::unlock(ctx)?;
        let detail = relay_consent::apply(conn, &owner, Change::Join(group.clone())).await?;
        // Recorded once the relay holds the consent: the group's mail opens here from now.
        agent.store.mark_group(&group, Membership::Joined)?;
        Ok(detail)
    })?;
    outln!("{detail}")?;
    Ok(())
}

pub(super) fn leave(ctx: &Ctx, group: Address) -> anyhow::Result<()> {
    let detail = with_relay(ctx, async |conn, agent| {
        let detail = relay_groups::leave(conn, group.clone()).await?;
        agent.store.forget_group(&group)?;
        Ok(detail)
    })?;
    outln!("{detail}")?;
    Ok(())
}

#[derive(Serialize)]
struct Listing {
    /// Groups on the agent's relay it is on the roster of or owns.
    groups: Vec<GroupView>,
    /// Where the agent stands with groups by its own store: joined, or wished by its model
    /// and waiting for the owner.
    marks: Vec<GroupMark>,
}

pub(super) fn list(ctx: &Ctx) -> anyhow::Result<()> {
    let listing = with_relay(ctx, async |conn, agent| {
        Ok(Listing {
            groups: relay_groups::list(conn).await?,
            marks: agent.store.group_marks()?,
        })
    })?;
    let me = ctx.agent_name()?;
    output::emit(ctx.json, &listing, |l| {
        let mut lines: Vec<String> = l.groups.iter().map(show).collect();
        if l.groups.is_empty() {
            lines.push("(no groups on this relay with this agent or its owner)".into());
        }
        for mark in &l.marks {
            lines.push(match mark.state {
                Membership::Joined => format!("joined  {}", mark.group),
                Membership::Wished => format!(
                    "wished  {}: the agent asked to join; its owner decides with `{}`",
                    mark.group,
                    output::command(&me, format_args!("groups join {}", mark.group))
                ),
            });
        }
        lines.join("\n")
    })
}
