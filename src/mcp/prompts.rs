//! The prompts. Their texts live in `prompts/*.md` (edit them without touching Rust); this
//! file fills in the `{{placeholders}}` from the mailbox.

use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{GetPromptResult, PromptMessage, Role};
use rmcp::{ErrorData, prompt, prompt_router};
use schemars::JsonSchema;
use serde::Deserialize;

use super::server::MailslotServer;
use crate::doorbell::digest::unread_digest;
use crate::mailbox::AgentStatus;
use crate::protocol::MessageId;
use crate::store::InboxQuery;

const STARTUP: &str = include_str!("../../prompts/startup.md");
const TRIAGE: &str = include_str!("../../prompts/triage.md");
const REPLY: &str = include_str!("../../prompts/reply.md");
/// Memories the startup prompt restores.
const STARTUP_MEMORIES: usize = 8;
/// Unread messages listed in a digest.
const DIGEST_ITEMS: usize = 20;

/// Fills `{{key}}` placeholders.
pub(super) fn fill(template: &str, values: &[(&str, &str)]) -> String {
    values
        .iter()
        .fold(template.to_owned(), |text, (key, value)| {
            text.replace(&format!("{{{{{key}}}}}"), value)
        })
}

/// Arguments of the reply prompt.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct ReplyPromptArgs {
    /// The message to answer.
    pub message_id: String,
}

impl MailslotServer {
    /// The framed digest of unread mail.
    pub(super) async fn unread_digest(&self) -> Result<String, ErrorData> {
        let unread = self
            .mailbox
            .inbox(InboxQuery {
                limit: DIGEST_ITEMS,
                ..InboxQuery::default()
            })
            .await
            .map_err(internal)?;
        Ok(unread_digest(
            &unread.messages,
            unread.unread.count,
            "Read a message with the read tool (message_id).",
        ))
    }
}

#[prompt_router(vis = "pub(super)")]
impl MailslotServer {
    /// Restore who this agent is, what it was doing, its most useful memories and its unread
    /// mail, so that it never starts cold after a context reset.
    #[prompt(name = "startup")]
    async fn startup(&self) -> Result<GetPromptResult, ErrorData> {
        let (
            AgentStatus {
                identity,
                current_task: task,
            },
            memories,
        ) = self
            .mailbox
            .startup(STARTUP_MEMORIES)
            .await
            .map_err(internal)?;
        let memories = if memories.is_empty() {
            "No memories yet.".to_owned()
        } else {
            memories
                .iter()
                .map(|r| format!("- {} ({}): {}", r.memory.title, r.memory.id, r.memory.body))
                .collect::<Vec<_>>()
                .join("\n")
        };
        let text = fill(
            STARTUP,
            &[
                ("address", &self.mailbox.address().to_string()),
                ("identity", identity.as_deref().unwrap_or("(not set)")),
                ("current_task", task.as_deref().unwrap_or("(not set)")),
                ("memories", &memories),
                ("unread", &self.unread_digest().await?),
            ],
        );
        Ok(
            GetPromptResult::new(vec![PromptMessage::new_text(Role::User, text)])
                .with_description("Restore identity, current task, memories and unread mail"),
        )
    }

    /// Go through unread mail one message at a time: read, decide, answer.
    #[prompt(name = "triage")]
    async fn triage(&self) -> Result<GetPromptResult, ErrorData> {
        let text = fill(
            TRIAGE,
            &[
                ("address", &self.mailbox.address().to_string()),
                ("unread", &self.unread_digest().await?),
            ],
        );
        Ok(
            GetPromptResult::new(vec![PromptMessage::new_text(Role::User, text)])
                .with_description("Triage unread mail"),
        )
    }

    /// Answer one message with its whole thread in view.
    #[prompt(name = "reply")]
    async fn reply_prompt(
        &self,
        Parameters(args): Parameters<ReplyPromptArgs>,
    ) -> Result<GetPromptResult, ErrorData> {
        let id = MessageId::parse(args.message_id.trim()).map_err(|_| {
            ErrorData::invalid_params(
                format!(
                    "message_id {:?} is not a message id; copy it from the inbox",
                    args.message_id
                ),
                None,
            )
        })?;
        let thread = self
            .mailbox
            .message(id)
            .await
            .map_err(internal)?
            .ok_or_else(|| ErrorData::invalid_params(format!("no message with id {id}"), None))?
            .message
            .thread;
        let view = super::resources::thread_view(&self.mailbox, thread)
            .await
            .map_err(|e| ErrorData::invalid_params(e, None))?;
        let mut parts: Vec<String> = view.messages.into_iter().map(|m| m.framed).collect();
        parts.extend(view.latest_context);
        let text = fill(
            REPLY,
            &[
                ("address", &self.mailbox.address().to_string()),
                ("message_id", &id.to_string()),
                ("thread", &parts.join("\n\n")),
            ],
        );
        Ok(
            GetPromptResult::new(vec![PromptMessage::new_text(Role::User, text)])
                .with_description("Answer one message"),
        )
    }
}

fn internal(e: impl std::fmt::Display) -> ErrorData {
    ErrorData::internal_error(e.to_string(), None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_placeholder_in_the_prompt_files_is_filled() {
        for (text, keys) in [
            (
                STARTUP,
                &["address", "identity", "current_task", "memories", "unread"][..],
            ),
            (TRIAGE, &["address", "unread"][..]),
            (REPLY, &["address", "message_id", "thread"][..]),
        ] {
            let values: Vec<(&str, &str)> = keys.iter().map(|k| (*k, "x")).collect();
            let filled = fill(text, &values);
            assert!(!filled.contains("{{"), "unfilled placeholder in: {filled}");
        }
    }
}
