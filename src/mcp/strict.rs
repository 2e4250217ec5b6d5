//! Strict tool arguments. A model that passes an argument a tool does not have (`priority`,
//! `attachment`) must learn that it was not used, or it believes it was. So every input
//! schema says `additionalProperties: false`, and a call with an unknown argument fails as a
//! tool error (`isError`, like every other bad argument) that names it and lists the real
//! ones; nothing of the call is done. The argument structs also deny unknown fields, so
//! serde refuses what this check would miss.

use std::sync::Arc;

use rmcp::model::{JsonObject, Tool};
use serde_json::Value;

/// The most unknown names one error repeats (the rest are counted).
const MAX_NAMED: usize = 5;
/// The most characters of one unknown name that an error repeats.
const MAX_NAME_CHARS: usize = 64;

/// Makes `tool`'s input schema refuse unknown properties (tools without arguments too).
pub fn forbid_unknown(tool: &mut Tool) {
    Arc::make_mut(&mut tool.input_schema)
        .insert("additionalProperties".to_owned(), Value::Bool(false));
}

/// The error for a call of `tool` with `arguments` it does not declare, if any.
pub fn unknown_arguments(tool: &Tool, arguments: Option<&JsonObject>) -> Option<String> {
    let declared = tool
        .input_schema
        .get("properties")
        .and_then(Value::as_object);
    let is_declared = |name: &str| declared.is_some_and(|p| p.contains_key(name));
    let mut unknown: Vec<&str> = arguments?
        .keys()
        .map(String::as_str)
        .filter(|name| !is_declared(name))
        .collect();
    if unknown.is_empty() {
        return None;
    }
    unknown.sort_unstable();
    let named = unknown
        .iter()
        .take(MAX_NAMED)
        .map(|name| format!("{:?}", shorten(name)))
        .collect::<Vec<_>>()
        .join(", ");
    let more = match unknown.len().saturating_sub(MAX_NAMED) {
        0 => String::new(),
        n => format!(" and {n} more"),
    };
    let noun = if unknown.len() == 1 {
        "argument"
    } else {
        "arguments"
    };
    let real = match declared.filter(|p| !p.is_empty()) {
        None => "it takes no arguments; call it with {}".to_owned(),
        Some(properties) => {
            let names: Vec<&str> = properties.keys().map(String::as_str).collect();
            let required: Vec<&str> = tool
                .input_schema
                .get("required")
                .and_then(Value::as_array)
                .map(|r| r.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            let required = if required.is_empty() {
                String::new()
            } else {
                format!(" (required: {})", required.join(", "))
            };
            format!("its arguments are: {}{required}", names.join(", "))
        }
    };
    Some(format!(
        "{} has no {noun} {named}{more}; {real}. Nothing was done: call it again without {}.",
        tool.name,
        if unknown.len() == 1 { "it" } else { "them" }
    ))
}

/// At most [`MAX_NAME_CHARS`] characters of `name` (an argument name is the model's text).
fn shorten(name: &str) -> String {
    match name.char_indices().nth(MAX_NAME_CHARS) {
        Some((end, _)) => format!("{}…", &name[..end]),
        None => name.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn tool(schema: Value) -> Tool {
        let Value::Object(schema) = schema else {
            unreachable!()
        };
        let mut tool = Tool::new("send", "Send a message.", Arc::new(schema));
        forbid_unknown(&mut tool);
        tool
    }

    fn args(value: Value) -> JsonObject {
        let Value::Object(object) = value else {
            unreachable!()
        };
        object
    }

    #[test]
    fn an_unknown_argument_is_named_with_the_real_ones() {
        let send = tool(json!({
            "type": "object",
            "properties": {"to": {}, "subject": {}, "body": {}},
            "required": ["subject", "body"]
        }));
        assert_eq!(send.input_schema["additionalProperties"], false);
        let e = unknown_arguments(&send, Some(&args(json!({"to": [], "attachment": "a.pdf"}))))
            .unwrap();
        assert_eq!(
            e,
            "send has no argument \"attachment\"; its arguments are: body, subject, to (required: subject, body). Nothing was done: call it again without it."
        );
        assert_eq!(
            unknown_arguments(&send, Some(&args(json!({"subject": "s"})))),
            None
        );
        assert_eq!(unknown_arguments(&send, None), None);
    }

    #[test]
    fn many_and_long_names_are_bounded() {
        let bare = tool(json!({"type": "object", "properties": {}}));
        let mut many = JsonObject::new();
        for i in 0..9 {
            many.insert(format!("x{i}"), Value::Null);
        }
        many.insert("y".repeat(1000), Value::Null);
        let e = unknown_arguments(&bare, Some(&many)).unwrap();
        assert!(
            e.starts_with("send has no arguments \"x0\", \"x1\", \"x2\", \"x3\", \"x4\" and 5 more; it takes no arguments; call it with {}."),
            "{e}"
        );
        assert!(!e.contains(&"y".repeat(65)), "{e}");
        let long = args(json!({"z".repeat(100): 1}));
        let e = unknown_arguments(&bare, Some(&long)).unwrap();
        assert!(e.contains(&format!("\"{}…\"", "z".repeat(64))), "{e}");
    }
}
