//! The tools. Each is a thin adapter: validate the model's arguments (errors name the field
//! and the fix), call the mailbox, return a JSON view (domain errors become tool errors in
//! `errors.rs`). The sender of every message is this agent: no argument can change it.
//!
//! One file per family, each with its own router; [`router`] joins them.

mod contacts;
mod groups;
mod memory;
mod reading;
mod reservations;
mod writing;

use rmcp::handler::server::router::tool::ToolRouter;
use schemars::JsonSchema;
use serde::Serialize;

use super::server::MailslotServer;
use crate::protocol::{Address, Importance, MessageId};

/// Every tool.
pub(super) fn router() -> ToolRouter<MailslotServer> {
    MailslotServer::writing_tools()
        + MailslotServer::reading_tools()
        + MailslotServer::memory_tools()
        + MailslotServer::contacts_tools()
        + MailslotServer::reservation_tools()
        + MailslotServer::groups_tools()
}

/// The most items a listing returns.
pub(super) const MAX_LIMIT: u32 = 200;

pub(super) fn parse_addresses(field: &str, raw: &[String]) -> Result<Vec<Address>, String> {
    raw.iter()
        .enumerate()
        .map(|(i, a)| {
            Address::parse(a.trim()).map_err(|e| {
                format!("{field}[{i}] {}: write an agent name like \"bob\" or an address like \"bob@relay.example.com\"", e.problem)
            })
        })
        .collect()
}

pub(super) fn parse_message_id(field: &str, raw: &str) -> Result<MessageId, String> {
    MessageId::parse(raw.trim()).map_err(|_| {
        format!("{field} {raw:?} is not a message id; copy message_id from inbox, search or a doorbell event")
    })
}

pub(super) fn parse_importance(
    field: &str,
    raw: Option<&str>,
) -> Result<Option<Importance>, String> {
    raw.map(|r| {
        r.parse()
            .map_err(|e: crate::protocol::ValidationError| format!("{field} {}", e.problem))
    })
    .transpose()
}

pub(super) fn limit(field: &str, value: Option<u32>, default: u32) -> Result<usize, String> {
    match value.unwrap_or(default) {
        0 => Err(format!("{field} is 0; ask for at least 1")),
        n if n > MAX_LIMIT => Err(format!(
            "{field} is {n}, over the maximum of {MAX_LIMIT}; ask for fewer"
        )),
        n => Ok(n as usize),
    }
}

/// A count of changed items.
#[derive(Debug, Serialize, JsonSchema)]
pub struct Changed {
    /// How many changed.
    pub changed: u32,
}
