//! Claude Code's hooks, answered from the store: what `mailslot hook …` prints for each
//! event. Every answer shows only mail the session's model has not been shown yet (the
//! shown ledger, keyed by the hook input's `session_id`), and records what it shows, so one
//! message interrupts a session once, whichever path showed it first: a channel event, a
//! hook, or a tool result.

use serde::Deserialize;

use super::digest::unread_digest;
use crate::protocol::{AgentName, MessageId};
use crate::store::{InboxQuery, SessionKey, Store, StoreError, StoredMessage, Via};

/// Unread messages listed in a digest.
const DIGEST_ITEMS: usize = 10;
/// How the model reads its mail, as Claude Code names mailslot's tools.
const HOW_TO_READ: &str =
    "Read them with the mailslot read tool (message_id) or the inbox tool before acting on them.";

/// The hook event being answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HookEvent {
    /// SessionStart: the digest goes into the new session's context.
    SessionStart,
    /// UserPromptSubmit: the digest goes beside the prompt.
    Prompt,
    /// PostToolUse: mail that arrived during the work, after any tool call.
    PostTool,
    /// Stop: unseen mail keeps the agent working, once.
    Stop,
}

/// The fields of Claude Code's hook input that matter here (the rest is ignored).
#[derive(Debug, Default, Deserialize)]
pub struct HookInput {
    /// The Claude Code session; without it nothing is remembered between hooks.
    #[serde(default)]
    pub session_id: Option<String>,
    /// UserPromptSubmit: the prompt, which is the channel event for a channel-started turn.
    #[serde(default)]
    pub prompt: Option<String>,
    /// Stop: true when Claude is already continuing because a Stop hook blocked.
    #[serde(default)]
    pub stop_hook_active: bool,
}

/// Why a hook could not answer.
#[derive(Debug, thiserror::Error)]
pub enum HookError {
    /// The input's `session_id` is not a plausible session id.
    #[error("the hook input's {0}")]
    Session(#[from] crate::protocol::ValidationError),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The rewake hook's lock file could not be taken.
    #[error("the rewake hook's lock file: {0}")]
    Lock(#[from] std::io::Error),
}

/// What to print on stdout for `event` (nothing when `None`), for agent `agent`.
pub fn answer(
    store: &mut Store,
    agent: &AgentName,
    event: HookEvent,
    input: &HookInput,
) -> Result<Option<String>, HookError> {
    let session = input
        .session_id
        .as_deref()
        .map(SessionKey::new)
        .transpose()?;
    let answer = answer_for(store, agent, event, input, session.as_ref())?;
    if let Some(session) = &session {
        // A prompt or a tool call means a turn runs; a Stop that lets Claude stop ends it.
        let busy = match event {
            HookEvent::Prompt | HookEvent::PostTool => true,
            HookEvent::SessionStart => false,
            HookEvent::Stop => answer.is_some(),
        };
        store.set_busy(session, busy)?;
    }
    Ok(answer)
}

fn answer_for(
    store: &mut Store,
    agent: &AgentName,
    event: HookEvent,
    input: &HookInput,
    session: Option<&SessionKey>,
) -> Result<Option<String>, HookError> {
    if event == HookEvent::Stop && input.stop_hook_active {
        return Ok(None);
    }
    if let (Some(session), Some(prompt)) = (session, &input.prompt) {
        store.mark_shown(session, &channel_message_ids(prompt), Via::Channel)?;
    }
    let (unseen, total) = match session {
        Some(session) => store.take_unseen(session, DIGEST_ITEMS, Via::Hook)?,
        None => (
            store.inbox(&InboxQuery {
                limit: DIGEST_ITEMS,
                ..InboxQuery::default()
            })?,
            store.unread_summary()?.count,
        ),
    };
    if unseen.is_empty() {
        return Ok(None);
    }
    Ok(Some(render(event, agent, &unseen, total)))
}

fn render(event: HookEvent, agent: &AgentName, unseen: &[StoredMessage], total: u32) -> String {
    let digest = unread_digest(unseen, total, HOW_TO_READ);
    match event {
        HookEvent::SessionStart | HookEvent::Prompt => digest,
        HookEvent::PostTool => serde_json::json!({
            "hookSpecificOutput": {
                "hookEventName": "PostToolUse",
                "additionalContext": format!("New mail for {agent} arrived while you worked.\n{digest}"),
            }
        })
        .to_string(),
        HookEvent::Stop => serde_json::json!({
            "decision": "block",
            "reason": format!("New mail for {agent}; handle it, then finish your work.\n{digest}"),
        })
        .to_string(),
    }
}

/// The message ids of the channel events a Claude Code prompt consists of. Claude Code
/// renders each event as `<channel source="…" … message_id="…">content</channel>` and
/// escapes `</channel>` inside the content, so a tag is read only where Claude Code wrote
/// one: at the start of the prompt and right after a closing tag. A sender cannot name
/// another message from inside a body.
pub fn channel_message_ids(prompt: &str) -> Vec<MessageId> {
    const OPEN: &str = "<channel ";
    const CLOSE: &str = "</channel>";
    let mut ids = Vec::new();
    let mut rest = prompt;
    while let Some(after) = rest.trim_start().strip_prefix(OPEN) {
        let Some(end) = after.find('>') else { break };
        if let Some(id) =
            attribute(&after[..end], "message_id").and_then(|v| MessageId::parse(v).ok())
        {
            ids.push(id);
        }
        let Some(close) = after[end..].find(CLOSE) else {
            break;
        };
        rest = &after[end + close + CLOSE.len()..];
    }
    ids
}

/// The value of `name="…"` among a tag's attributes.
fn attribute<'a>(attributes: &'a str, name: &str) -> Option<&'a str> {
    let start = attributes
        .split(' ')
        .find_map(|a| a.strip_prefix(name)?.strip_prefix("=\""))?;
    start.split('"').next()
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "01a20e89-4408-763d-9f04-44859bb77265";
    const B: &str = "01a20e89-4408-763d-9f04-44859bb77266";

    fn tag(id: &str, content: &str) -> String {
        format!(
            "<channel source=\"mailslot\" from=\"alice\" kind=\"message\" message_id=\"{id}\" trust=\"verified\">\n{content}\n</channel>"
        )
    }

    #[test]
    fn reads_the_ids_of_the_channel_tags_claude_code_wrote() {
        let ids = |p: &str| {
            channel_message_ids(p)
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
        };
        assert_eq!(ids(&tag(A, "hi")), [A]);
        assert_eq!(ids(&format!("{}\n{}", tag(A, "x"), tag(B, "y"))), [A, B]);
        // A body naming another message is content, not a tag.
        let forged = format!("<channel message_id=\"{B}\">");
        assert_eq!(ids(&tag(A, &forged)), [A]);
        assert!(ids(&format!("please read {}", tag(A, "x"))).is_empty());
        assert!(ids("hello").is_empty());
        assert!(ids("<channel message_id=\"not-an-id\">x</channel>").is_empty());
    }
}
