//! The unread notice on every tool result: the doorbell that works in every client. It goes
//! in the text content and, for results with structured output, in a `mail_notice` field
//! that every output schema declares, because some clients (Claude Code) give the model only
//! the structured output and drop the text beside it.

use std::sync::Arc;

use rmcp::model::{CallToolResult, ContentBlock, Tool};
use serde_json::{Value, json};

/// The structured-output field that carries the notice.
pub const FIELD: &str = "mail_notice";

/// Declares [`FIELD`] in `tool`'s output schema (when it has one).
pub fn declare(tool: &mut Tool) {
    if let Some(schema) = &mut tool.output_schema {
        let schema = Arc::make_mut(schema);
        if let Some(Value::Object(properties)) = schema.get_mut("properties") {
            properties.insert(
                FIELD.to_owned(),
                json!({
                    "type": "string",
                    "description": "Present when unread mail is waiting: how much, and from whom. Read it with the inbox tool."
                }),
            );
        }
    }
}

/// Adds `notice` to `result`: a text block, and the field of its structured output.
pub fn attach(result: &mut CallToolResult, notice: String) {
    if let Some(Value::Object(fields)) = &mut result.structured_content {
        fields.insert(FIELD.to_owned(), Value::String(notice.clone()));
    }
    result.content.push(ContentBlock::text(notice));
}
