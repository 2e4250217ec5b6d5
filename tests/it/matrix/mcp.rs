//! A real `mailslot mcp` for alice: its resources (the list, `mailslot://inbox`,
//! `mailslot://sent`, each message, thread and attachment) and its tools (`inbox`, `sent`,
//! `search`, `read`, `thread`).

use std::path::Path;

use mailslot::client::RelayUrl;
use serde_json::{Value, json};

use super::kinds::{
    Cells, Kind, OWNER_FROM, Side, attachment_read, attachments_ok, entry, has, received_entry,
    searched, sent_entry, want,
};
use crate::common::mcp::{Era, McpClient, spawn_mcp, text_of};

/// What the framed text of a kind (MCP `read`, the message and thread resources) must say,
/// outside the fence: who wrote it or to whom it went, and where each copy stands.
fn framed_ok(text: &str, k: &Kind) -> Result<(), String> {
    if k.side == Side::Owner {
        return want(
            text.contains(&format!("[mailslot message {} from your owner]", k.id))
                && text.contains("From: your owner, verified by the owner key (fingerprint ")
                && text.contains(&k.subject)
                && !text.contains("<<<mailslot-untrusted"),
            || format!("not the owner's words: {text}"),
        );
    }
    want(
        text.contains(&format!("[mailslot message {}]", k.id)),
        || format!("no header for it: {text}"),
    )?;
    let (header, _) = text
        .split_once(&format!("[mailslot message {}]", k.id))
        .map(|(_, rest)| {
            rest.split_once("<<<mailslot-untrusted")
                .unwrap_or((rest, ""))
        })
        .unwrap();
    let line = match (k.side, k.state()) {
        (Side::In, _) => format!("From: {}", k.peer),
        (_, "delivered") => format!("Delivered: {} by", k.peer),
        (_, "bounced") => format!(
            "Bounced (expired on the relay, never delivered): {}",
            k.peer
        ),
        (_, state) => format!("Receipts: {} {state} at", k.peer),
    };
    want(header.contains(&line), || {
        format!("no {line:?} in: {header}")
    })?;
    let fact = match k.side {
        Side::In => format!(
            "Signature: verified (signed with the key pinned for {})",
            k.peer
        ),
        _ => format!("To: {}\n", k.peer),
    };
    want(header.contains(&fact), || {
        format!("no {fact:?} in: {header}")
    })?;
    if let Some(a) = &k.attachment {
        want(
            text.contains(&a.name) && text.contains(&format!("{} bytes", a.size)),
            || format!("no attachment {} in: {text}", a.name),
        )?;
    }
    Ok(())
}

/// What the MCP view of one message (`read`, each message of `thread`) must say.
fn view_ok(v: &Value, k: &Kind) -> Result<(), String> {
    match k.side {
        Side::In => {
            want(
                v["from"] == k.peer.as_str() && v["trust"] == "verified",
                || format!("from and trust: {v}"),
            )?;
            want(v["direction"] == "in", || format!("direction: {v}"))?;
            if k.ack_required {
                want(has(&v["receipts"], "kind", "acknowledged"), || {
                    format!("alice's acknowledgement: {v}")
                })?;
            }
        }
        Side::Out => {
            want(v["direction"] == "out", || format!("direction: {v}"))?;
            let shown = match k.state() {
                "delivered" => has(&v["delivered"], "to", &k.peer),
                "bounced" => v["bounced"] == json!([k.peer]),
                state => v["receipts"].as_array().is_some_and(|r| {
                    r.iter()
                        .any(|r| r["from"] == k.peer.as_str() && r["kind"] == state)
                }),
            };
            want(shown, || format!("{} to {}: {v}", k.state(), k.peer))?;
        }
        Side::Owner => want(
            v["from"] == OWNER_FROM && v["trust"] == "owner" && v["direction"] == "in",
            || format!("from, trust and direction: {v}"),
        )?,
        Side::Refused => return Err(format!("shown: {v}")),
    }
    attachments_ok(&v["attachments"], k)?;
    framed_ok(v["framed"].as_str().unwrap_or_default(), k)
}

/// The resources first (reading them marks nothing read), then the tools.
pub(crate) async fn check(home: &Path, relay: &RelayUrl, kinds: &[Kind], cells: &mut Cells) {
    let mcp = spawn_mcp(home, "alice", relay, Era::Modern).await;
    match mcp.client.list_all_resources().await {
        Ok(listed) => {
            for k in kinds {
                let uri = format!("mailslot://messages/{}", k.id);
                let found = listed.iter().find(|r| r.uri == uri);
                let outcome = match (k.side, found) {
                    (Side::In, Some(r)) => want(
                        r.title.as_deref() == Some(&format!("message from {}", k.peer)),
                        || format!("title: {r:?}"),
                    ),
                    (Side::Owner, Some(r)) => want(
                        r.title.as_deref() == Some(&format!("message from {OWNER_FROM}")),
                        || format!("title: {r:?}"),
                    ),
                    (Side::In | Side::Owner, None) => Err("not listed".into()),
                    (_, Some(r)) => Err(format!("listed among received mail: {r:?}")),
                    (_, None) => Ok(()),
                };
                cells.record("mcp resources/list", &k.name, outcome);
            }
        }
        Err(e) => cells.view_failed("mcp resources/list", kinds, &e.to_string()),
    }
    match read_json(&mcp, "mailslot://inbox").await {
        Ok(digest) => {
            let mut all = digest["unread_messages"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            all.extend(
                digest["recent_read"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default(),
            );
            for k in kinds {
                let outcome = received_entry(&Value::Array(all.clone()), "message_id", k);
                cells.record("mcp mailslot://inbox", &k.name, outcome);
            }
        }
        Err(why) => cells.view_failed("mcp mailslot://inbox", kinds, &why),
    }
    match read_json(&mcp, "mailslot://sent").await {
        Ok(list) => {
            for k in kinds {
                let outcome = sent_entry(&list["messages"], "message_id", k);
                cells.record("mcp mailslot://sent", &k.name, outcome);
            }
        }
        Err(why) => cells.view_failed("mcp mailslot://sent", kinds, &why),
    }
    for k in kinds {
        let message = mcp.read(&format!("mailslot://messages/{}", k.id)).await;
        let thread = mcp.read(&format!("mailslot://threads/{}", k.thread)).await;
        let (message, thread) = if k.side == Side::Refused {
            (
                want(message.is_err(), || format!("{message:?}")),
                want(thread.is_err(), || format!("{thread:?}")),
            )
        } else {
            (
                message
                    .map_err(|e| e.to_string())
                    .and_then(|t| framed_ok(&t, k)),
                thread
                    .map_err(|e| e.to_string())
                    .and_then(|t| framed_ok(&t, k)),
            )
        };
        cells.record("mcp mailslot://messages/ID", &k.name, message);
        cells.record("mcp mailslot://threads/ID", &k.name, thread);
        let attachment = mcp
            .read(&format!("mailslot://messages/{}/attachments/0", k.id))
            .await
            .map(String::into_bytes)
            .map_err(|e| e.to_string());
        cells.record(
            "mcp mailslot://messages/ID/attachments/0",
            &k.name,
            attachment_read(attachment, k),
        );
    }

    match tool(&mcp, "inbox", json!({ "unread_only": false, "limit": 100 })).await {
        Ok(list) => {
            for k in kinds {
                cells.record(
                    "mcp inbox",
                    &k.name,
                    received_entry(&list["messages"], "message_id", k),
                );
            }
        }
        Err(why) => cells.view_failed("mcp inbox", kinds, &why),
    }
    match tool(&mcp, "sent", json!({ "limit": 100 })).await {
        Ok(list) => {
            for k in kinds {
                cells.record(
                    "mcp sent",
                    &k.name,
                    sent_entry(&list["messages"], "message_id", k),
                );
            }
        }
        Err(why) => cells.view_failed("mcp sent", kinds, &why),
    }
    for k in kinds {
        let found = tool(&mcp, "search", json!({ "query": k.word })).await;
        cells.record(
            "mcp search",
            &k.name,
            found.and_then(|f| searched(&f["messages"], "message_id", k)),
        );
        let read = tool(&mcp, "read", json!({ "message_id": k.id })).await;
        let thread = tool(&mcp, "thread", json!({ "thread_id": k.thread })).await;
        if k.side == Side::Refused {
            cells.record(
                "mcp read",
                &k.name,
                want(read.is_err(), || format!("{read:?}")),
            );
            cells.record(
                "mcp thread",
                &k.name,
                want(thread.is_err(), || format!("{thread:?}")),
            );
            continue;
        }
        cells.record("mcp read", &k.name, read.and_then(|v| view_ok(&v, k)));
        let in_thread = thread.and_then(|t| {
            entry(&t["messages"], "message_id", &k.id)
                .cloned()
                .ok_or_else(|| format!("not in its thread: {t}"))
        });
        cells.record(
            "mcp thread",
            &k.name,
            in_thread.and_then(|v| view_ok(&v, k)),
        );
    }
    let _ = mcp.0.close().await;
}

/// A JSON resource.
async fn read_json(mcp: &McpClient, uri: &str) -> Result<Value, String> {
    let text = mcp.read(uri).await.map_err(|e| e.to_string())?;
    serde_json::from_str(&text).map_err(|e| format!("{uri} is not JSON ({e}): {text}"))
}

/// A tool's structured result, or its error.
async fn tool(mcp: &McpClient, name: &str, args: Value) -> Result<Value, String> {
    let result = mcp.call(name, args).await;
    if result.is_error == Some(true) {
        return Err(format!("{name} failed: {}", text_of(&result)));
    }
    result
        .structured_content
        .ok_or_else(|| format!("{name} returned no structured content"))
}
