//! Resource links in tool results: every attachment a result lists (a message's
//! `attachments`, each with its `uri`) also comes as a `resource_link` content item, so a
//! client can offer or fetch the content without the model ever holding its bytes.

use rmcp::model::{CallToolResult, ContentBlock, Resource};
use serde_json::Value;

/// The most links one result carries (a thread of many messages lists many attachments).
const MAX_LINKS: usize = 64;

/// Adds a link for each attachment listed in `result`'s structured output.
pub fn attach(result: &mut CallToolResult) {
    let mut links = Vec::new();
    if let Some(value) = &result.structured_content {
        collect(value, &mut links);
    }
    for link in links.into_iter().take(MAX_LINKS) {
        result.content.push(ContentBlock::resource_link(link));
    }
}

fn collect(value: &Value, out: &mut Vec<Resource>) {
    match value {
        Value::Object(fields) => {
            if let Some(Value::Array(items)) = fields.get("attachments") {
                out.extend(items.iter().filter_map(link));
            }
            for (key, v) in fields {
                if key != "attachments" {
                    collect(v, out);
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|v| collect(v, out)),
        _ => {}
    }
}

/// A link to one listed attachment. Its name is mailslot's (the sender's file name is
/// untrusted text, fenced in the structured output only).
fn link(item: &Value) -> Option<Resource> {
    let uri = item.get("uri")?.as_str()?;
    let index = item.get("index")?.as_u64()?;
    let mut resource = Resource::new(uri, format!("attachment {index}"))
        .with_description("An attachment of a received message (untrusted content)");
    if let Some(media_type) = item.get("media_type").and_then(Value::as_str) {
        resource = resource.with_mime_type(media_type);
    }
    if let Some(size) = item.get("size").and_then(Value::as_u64) {
        resource = resource.with_size(size);
    }
    Some(resource)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn each_listed_attachment_gets_a_link() {
        let mut result = CallToolResult::structured(json!({
            "messages": [{"attachments": [
                {"index": 0, "uri": "mailslot://messages/m/attachments/0", "media_type": "text/plain", "size": 3},
                {"index": 1, "uri": "mailslot://messages/m/attachments/1", "media_type": "application/pdf", "size": 9}
            ]}]
        }));
        let before = result.content.len();
        attach(&mut result);
        let links: Vec<_> = result.content[before..]
            .iter()
            .filter_map(|c| c.as_resource_link())
            .collect();
        assert_eq!(links.len(), 2);
        assert_eq!(links[1].uri, "mailslot://messages/m/attachments/1");
        assert_eq!(links[1].mime_type.as_deref(), Some("application/pdf"));
        assert_eq!(links[1].size, Some(9));
    }
}
