//! `completion/complete`: values for the arguments of the prompts and resource templates that
//! name a message, a thread, an attachment or an agent, from the agent's own store (mail ids
//! and thread ids that start with what was typed, newest first; attachment indexes of the
//! message named beside it; known agents, ignoring case, sorted). At most 100 values, with
//! `hasMore` when there were more; an argument that takes none of these gets none.

use rmcp::ErrorData;
use rmcp::model::{CompleteRequestParams, CompleteResult, CompletionInfo, Reference};

use super::resources::{AGENT_TEMPLATE, ATTACHMENT_TEMPLATE, MESSAGE_TEMPLATE, THREAD_TEMPLATE};
use crate::mailbox::Mailbox;
use crate::protocol::MessageId;

/// The most values one answer carries (the protocol's own limit).
const MAX_VALUES: usize = CompletionInfo::MAX_VALUES;

/// What an argument names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Completes {
    Message,
    Thread,
    Attachment,
    Agent,
}

/// What `argument` of the prompt or resource template `reference` names, if it is completed.
fn completes(reference: &Reference, argument: &str) -> Option<Completes> {
    match (reference, argument) {
        (Reference::Prompt(p), "message_id") if p.name == "reply" => Some(Completes::Message),
        (Reference::Resource(r), "message_id")
            if r.uri == MESSAGE_TEMPLATE || r.uri == ATTACHMENT_TEMPLATE =>
        {
            Some(Completes::Message)
        }
        (Reference::Resource(r), "index") if r.uri == ATTACHMENT_TEMPLATE => {
            Some(Completes::Attachment)
        }
        (Reference::Resource(r), "thread_id") if r.uri == THREAD_TEMPLATE => {
            Some(Completes::Thread)
        }
        (Reference::Resource(r), "agent") if r.uri == AGENT_TEMPLATE => Some(Completes::Agent),
        _ => None,
    }
}

/// Answers one `completion/complete` request.
pub async fn complete(
    mailbox: &Mailbox,
    request: &CompleteRequestParams,
) -> Result<CompleteResult, ErrorData> {
    let Some(kind) = completes(&request.r#ref, &request.argument.name) else {
        return Ok(CompleteResult::default());
    };
    let typed = request.argument.value.trim().to_owned();
    // One more than shown, to tell whether there are more.
    let asked = MAX_VALUES + 1;
    let mut values: Vec<String> = match kind {
        Completes::Message => strings(mailbox.message_ids_starting(typed, asked).await),
        Completes::Thread => strings(mailbox.thread_ids_starting(typed, asked).await),
        Completes::Agent => strings(mailbox.known_agents_starting(&typed, asked).await),
        Completes::Attachment => {
            let named = request
                .context
                .as_ref()
                .and_then(|c| c.get_argument("message_id"))
                .and_then(|id| MessageId::parse(id.trim()).ok());
            match named {
                Some(id) => attachment_indexes(mailbox, id, &typed).await,
                None => Vec::new(),
            }
        }
    };
    let has_more = values.len() > MAX_VALUES;
    values.truncate(MAX_VALUES);
    let info = CompletionInfo::with_pagination(values, None, has_more)
        .map_err(|e| ErrorData::internal_error(e, None))?;
    Ok(CompleteResult::new(info))
}

/// The values as text; none when the store could not be read (a completion is a hint: the
/// failure is logged, and the person types on).
fn strings<T: ToString, E: std::fmt::Display>(found: Result<Vec<T>, E>) -> Vec<String> {
    match found {
        Ok(found) => found.iter().map(ToString::to_string).collect(),
        Err(e) => {
            tracing::warn!(error = %e, "cannot read the store for a completion");
            Vec::new()
        }
    }
}

/// The indexes of message `id`'s attachments that start with `typed`.
async fn attachment_indexes(mailbox: &Mailbox, id: MessageId, typed: &str) -> Vec<String> {
    let count = match mailbox.message(id).await {
        Ok(found) => found.map_or(0, |m| m.attachments.len()),
        Err(e) => {
            tracing::warn!(error = %e, "cannot read the store for a completion");
            0
        }
    };
    (0..count)
        .map(|i| i.to_string())
        .filter(|i| i.starts_with(typed))
        .take(MAX_VALUES + 1)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use rmcp::model::{PromptReference, ResourceTemplateReference};

    #[test]
    fn only_the_arguments_that_name_something_are_completed() {
        let prompt = |n: &str| Reference::Prompt(PromptReference::new(n));
        let template = |u: &str| Reference::Resource(ResourceTemplateReference::new(u));
        assert_eq!(
            completes(&prompt("reply"), "message_id"),
            Some(Completes::Message)
        );
        assert_eq!(completes(&prompt("triage"), "message_id"), None);
        assert_eq!(
            completes(&template(ATTACHMENT_TEMPLATE), "index"),
            Some(Completes::Attachment)
        );
        assert_eq!(
            completes(&template(THREAD_TEMPLATE), "thread_id"),
            Some(Completes::Thread)
        );
        assert_eq!(
            completes(&template(AGENT_TEMPLATE), "agent"),
            Some(Completes::Agent)
        );
        assert_eq!(completes(&template(MESSAGE_TEMPLATE), "thread_id"), None);
        assert_eq!(completes(&template("mailslot://inbox"), "message_id"), None);
    }
}
