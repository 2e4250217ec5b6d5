//! Groups: make one, list this agent's, see a group's members, ask to join, leave. Joining is
//! the owner's decision: `join_group` only records the wish and says what the owner runs.
//! Mail to a group goes through `send` with the group's name as the one recipient.

use rmcp::handler::server::wrapper::Parameters;
use rmcp::{Json, tool, tool_router};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::mcp::errors::Doing;
use crate::mcp::server::MailslotServer;
use crate::protocol::{Address, AgentName, GroupPolicy, GroupView};
use crate::store::Membership;

/// Arguments of `create_group`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateGroupArgs {
    /// The group's name, like "team" (groups and agents share names on a relay).
    pub name: String,
    /// Who may post: "members" (the default), "owner" (agents of this agent's owner) or
    /// "anyone".
    #[serde(default)]
    pub policy: Option<String>,
}

/// Arguments naming one group.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GroupArgs {
    /// The group: "team" on this agent's relay, or "team@relay.example.com" on another.
    pub group: String,
}

/// A group as its relay serves it.
#[derive(Debug, Serialize, JsonSchema)]
pub struct GroupInfo {
    /// Its name on its relay.
    pub name: String,
    /// The agent that made it.
    pub creator: String,
    /// Who may post: "members", "owner" or "anyone".
    pub policy: String,
    /// Its members, in the order they were added.
    pub members: Vec<String>,
}

impl GroupInfo {
    fn of(group: GroupView) -> Self {
        Self {
            name: group.name.to_string(),
            creator: group.creator.to_string(),
            policy: group.policy.to_string(),
            members: group.members.iter().map(ToString::to_string).collect(),
        }
    }
}

/// This agent's groups.
#[derive(Debug, Serialize, JsonSchema)]
pub struct GroupsView {
    /// Groups on this agent's relay it is a member of, or whose owner is its owner.
    pub groups: Vec<GroupInfo>,
    /// Groups its owner joined for it: their mail reaches it.
    pub joined: Vec<String>,
    /// Groups it asked to join, waiting for its owner's decision.
    pub wished: Vec<String>,
}

/// What a join or leave did.
#[derive(Debug, Serialize, JsonSchema)]
pub struct GroupOutcome {
    /// "joined", "waiting_for_owner" or "left".
    pub status: String,
    /// What happens next.
    pub detail: String,
}

fn group_name(raw: &str) -> Result<AgentName, String> {
    AgentName::new(raw.trim())
        .map_err(|e| format!("name {}: write a group name like \"team\"", e.problem))
}

fn group_address(raw: &str) -> Result<Address, String> {
    Address::parse(raw.trim()).map_err(|e| {
        format!(
            "group {}: write a group name like \"team\", or \"team@relay.example.com\" on another relay",
            e.problem
        )
    })
}

#[tool_router(router = groups_tools, vis = "pub(super)")]
impl MailslotServer {
    /// Make a group on this agent's relay, with this agent as its first member. Its owner
    /// (this agent's owner) adds the other members; send to the group with `send`.
    #[tool(annotations(
        title = "Create a group",
        read_only_hint = false,
        destructive_hint = false,
        idempotent_hint = false,
        open_world_hint = true
    ))]
    async fn create_group(
        &self,
        Parameters(args): Parameters<CreateGroupArgs>,
    ) -> Result<Json<GroupInfo>, String> {
        let name = group_name(&args.name)?;
        let policy = match args.policy.as_deref().map(str::trim) {
            None | Some("") => GroupPolicy::default(),
            Some(p) => p
                .parse()
                .map_err(|e: crate::protocol::ValidationError| format!("policy {}", e.problem))?,
        };
        match self.mailbox.create_group(name, policy).await {
            Ok(group) => Ok(Json(GroupInfo::of(group))),
            Err(e) => Err(self.tool_error(e, Doing::Asking).await),
        }
    }

    /// This agent's groups: those on its relay it is a member of, those its owner joined for
    /// it, and those it asked to join.
    #[tool(annotations(title = "Groups", read_only_hint = true, open_world_hint = true))]
    async fn groups(&self) -> Result<Json<GroupsView>, String> {
        let (listed, marks) = match self.mailbox.groups().await {
            Ok(found) => found,
            Err(e) => return Err(self.tool_error(e, Doing::Asking).await),
        };
        let of = |state| {
            marks
                .iter()
                .filter(|m| m.state == state)
                .map(|m| m.group.to_string())
                .collect()
        };
        Ok(Json(GroupsView {
            groups: listed.into_iter().map(GroupInfo::of).collect(),
            joined: of(Membership::Joined),
            wished: of(Membership::Wished),
        }))
    }

    /// A group's creator, posting policy and members (only for its members and those who
    /// may post to it).
    #[tool(annotations(title = "Group members", read_only_hint = true, open_world_hint = true))]
    async fn group_members(
        &self,
        Parameters(args): Parameters<GroupArgs>,
    ) -> Result<Json<GroupInfo>, String> {
        let name = group_name(&args.group)?;
        match self.mailbox.group_members(&name).await {
            Ok(group) => Ok(Json(GroupInfo::of(group))),
            Err(e) => Err(self.tool_error(e, Doing::Asking).await),
        }
    }

    /// Ask to join a group. Joining is your owner's decision: this records the wish, and
    /// your owner joins with `mailslot groups join` (signed with their passphrase).
    #[tool(annotations(
        title = "Join a group",
        read_only_hint = false,
        destructive_hint = false,
        idempotent_hint = true,
        open_world_hint = false
    ))]
    async fn join_group(
        &self,
        Parameters(args): Parameters<GroupArgs>,
    ) -> Result<Json<GroupOutcome>, String> {
        let group = group_address(&args.group)?;
        let me = self.mailbox.name();
        let outcome = match self.mailbox.wish_to_join(group.clone()).await {
            Ok(Membership::Joined) => GroupOutcome {
                status: "joined".into(),
                detail: format!("your owner joined {group} already: its mail reaches you"),
            },
            Ok(Membership::Wished) => GroupOutcome {
                status: "waiting_for_owner".into(),
                detail: format!(
                    "recorded; only your owner can join a group: they run `mailslot --agent {me} groups join {group}` (it asks for their passphrase). `mailslot --agent {me} groups` shows them your wish."
                ),
            },
            Err(e) => return Err(self.tool_error(e, Doing::Local).await),
        };
        Ok(Json(outcome))
    }

    /// Leave a group: its mail stops reaching you at once (you can always leave; rejoining
    /// is your owner's decision).
    #[tool(annotations(
        title = "Leave a group",
        read_only_hint = false,
        destructive_hint = true,
        idempotent_hint = true,
        open_world_hint = true
    ))]
    async fn leave_group(
        &self,
        Parameters(args): Parameters<GroupArgs>,
    ) -> Result<Json<GroupOutcome>, String> {
        let group = group_address(&args.group)?;
        match self.mailbox.leave_group(group).await {
            Ok(detail) => Ok(Json(GroupOutcome {
                status: "left".into(),
                detail,
            })),
            Err(e) => Err(self.tool_error(e, Doing::Asking).await),
        }
    }
}
