//! The agent's memories and its status line.

use rmcp::handler::server::wrapper::Parameters;
use rmcp::{Json, tool, tool_router};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{Changed, limit};
use crate::mailbox::AgentStatus;
use crate::mcp::errors::Doing;
use crate::mcp::server::MailslotServer;
use crate::mcp::views::MemoryView;
use crate::protocol::MemoryId;
use crate::store::MAX_STATUS_BYTES;

/// Arguments of `remember`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RememberArgs {
    /// What to remember.
    pub text: String,
    /// A short title (default: the text's first line).
    #[serde(default)]
    pub title: Option<String>,
    /// Tags to find it by.
    #[serde(default)]
    pub tags: Vec<String>,
}

/// Arguments of `recall`.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RecallArgs {
    /// Words to look for; without it, the most recent memories.
    #[serde(default)]
    pub query: Option<String>,
    /// At most this many (default 10, at most 200).
    #[serde(default)]
    pub limit: Option<u32>,
}

/// Memories.
#[derive(Debug, Serialize, JsonSchema)]
pub struct MemoryList {
    /// Best first.
    pub memories: Vec<MemoryView>,
}

/// Arguments of `forget`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ForgetArgs {
    /// The memory to delete.
    pub memory_id: String,
}

/// Arguments of `set_status`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StatusArgs {
    /// Who this agent is (role, owner, what it is for); "" clears it.
    #[serde(default)]
    pub identity: Option<String>,
    /// What this agent is doing now; "" clears it.
    #[serde(default)]
    pub current_task: Option<String>,
}

/// The agent's identity and task.
#[derive(Debug, Serialize, JsonSchema)]
pub struct Status {
    /// Who this agent is.
    pub identity: Option<String>,
    /// What it is doing.
    pub current_task: Option<String>,
}

#[tool_router(router = memory_tools, vis = "pub(super)")]
impl MailslotServer {
    /// Store a memory that survives context resets.
    #[tool(annotations(
        title = "Remember",
        read_only_hint = false,
        destructive_hint = false,
        idempotent_hint = false,
        open_world_hint = false
    ))]
    async fn remember(
        &self,
        Parameters(args): Parameters<RememberArgs>,
    ) -> Result<Json<MemoryView>, String> {
        let memory = match self
            .mailbox
            .remember(args.text, args.title, args.tags)
            .await
        {
            Ok(memory) => memory,
            Err(e) => return Err(self.tool_error(e, Doing::Local).await),
        };
        Ok(Json(MemoryView::of(&memory)))
    }

    /// Recall memories: by relevance and recency for a query, else the most recent.
    #[tool(annotations(title = "Recall", read_only_hint = true, open_world_hint = false))]
    async fn recall(
        &self,
        Parameters(args): Parameters<RecallArgs>,
    ) -> Result<Json<MemoryList>, String> {
        let limit = limit("limit", args.limit, 10)?;
        let found = match self.mailbox.recall(args.query, limit).await {
            Ok(found) => found,
            Err(e) => return Err(self.tool_error(e, Doing::Local).await),
        };
        Ok(Json(MemoryList {
            memories: found.iter().map(MemoryView::recalled).collect(),
        }))
    }

    /// Delete a memory for good (memory_id from recall or remember).
    #[tool(annotations(
        title = "Forget",
        read_only_hint = false,
        destructive_hint = true,
        idempotent_hint = true,
        open_world_hint = false
    ))]
    async fn forget(
        &self,
        Parameters(args): Parameters<ForgetArgs>,
    ) -> Result<Json<Changed>, String> {
        let id = MemoryId::parse(args.memory_id.trim()).map_err(|_| {
            format!(
                "memory_id {:?} is not a memory id; copy memory_id from recall",
                args.memory_id
            )
        })?;
        let gone = match self.mailbox.forget(id).await {
            Ok(gone) => gone,
            Err(e) => return Err(self.tool_error(e, Doing::Local).await),
        };
        if !gone {
            return Err(format!("no memory with id {id}; list memories with recall"));
        }
        Ok(Json(Changed { changed: 1 }))
    }

    /// Set who this agent is and what it is doing; both come back in the startup prompt
    /// after a context reset. Omitted fields stay as they are.
    #[tool(annotations(
        title = "Set status",
        read_only_hint = false,
        destructive_hint = false,
        idempotent_hint = true,
        open_world_hint = false
    ))]
    async fn set_status(
        &self,
        Parameters(args): Parameters<StatusArgs>,
    ) -> Result<Json<Status>, String> {
        for (field, value) in [
            ("identity", &args.identity),
            ("current_task", &args.current_task),
        ] {
            if let Some(v) = value
                && v.len() > MAX_STATUS_BYTES
            {
                return Err(format!(
                    "{field} is {} bytes, over the limit of {MAX_STATUS_BYTES}; shorten it (keep details in memories)",
                    v.len()
                ));
            }
        }
        let status = match self
            .mailbox
            .set_agent_status(args.identity, args.current_task)
            .await
        {
            Ok(AgentStatus {
                identity,
                current_task,
            }) => Status {
                identity,
                current_task,
            },
            Err(e) => return Err(self.tool_error(e, Doing::Local).await),
        };
        Ok(Json(status))
    }
}
