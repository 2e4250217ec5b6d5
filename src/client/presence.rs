//! Who is online: the relay answers for the agent's contacts and the listed agents only.

use super::ClientError;
use super::ask::Ask;
use crate::protocol::{AgentName, ClientFrame, Online, ServerFrame};

/// Which of `agents` (or, with `None`, of everyone this agent may see) are online now, by
/// name; at most [`crate::protocol::MAX_PRESENCE_AGENTS`] named (the relay refuses more). Agents it may not
/// see are absent, like agents that are offline.
pub async fn online(
    conn: &mut impl Ask,
    agents: Option<Vec<AgentName>>,
) -> Result<Vec<Online>, ClientError> {
    match conn
        .ask(Box::new(|reference| ClientFrame::Presence {
            reference,
            agents,
        }))
        .await?
    {
        ServerFrame::PresenceList { online, .. } => Ok(online),
        other => Err(ClientError::Protocol(format!(
            "unexpected answer {other:?}"
        ))),
    }
}
