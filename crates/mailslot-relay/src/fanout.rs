//! A group send's fan-out: who may post, and which key wraps get copies. The sender sealed one
//! envelope (the ciphertext once, a wrap per member); the relay stores one copy per member on
//! the roster but the sender, each with only that member's wrap, and drops wraps for anyone
//! else. Each copy then passes its member's consent as the group's, inside the write.

use super::groups::may_post;
use super::state::RelayState;
use super::storage::{Groups, Registry};
use crate::protocol::{Address, AgentName, EnvelopeHead, ErrorCode, KeyWrapHead};

/// Why a group send is refused before anything is written.
pub type Refusal = (ErrorCode, String);

/// The wraps of `envelope`, sent by `agent` to `group`, that get copies: one per member on
/// the roster but the sender, in roster order. Refused when there is no such group, `agent`
/// may not post to it, or a member has no wrap (the roster changed since the sender read it).
pub async fn targets<'e, 'a, S: Registry + Groups>(
    state: &RelayState<S>,
    agent: &AgentName,
    group: &AgentName,
    envelope: &'e EnvelopeHead<'a>,
) -> Result<Vec<&'e KeyWrapHead<'a>>, Refusal> {
    let internal = |e: super::storage::StorageError| (ErrorCode::Internal, e.to_string());
    let Some(view) = state.storage.group(group.clone()).await.map_err(internal)? else {
        return Err((
            ErrorCode::UnknownRecipient,
            format!("no group named {group} on this relay"),
        ));
    };
    let owner = state.storage.owner(agent.clone()).await.map_err(internal)?;
    if !may_post(&view, agent, owner) {
        return Err((
            ErrorCode::NotAllowed,
            format!(
                "{agent} may not post to {group}: its policy is `{}`; ask its owner to add {agent}",
                view.policy
            ),
        ));
    }
    let me = Address::local(agent.clone());
    let mut targets = Vec::with_capacity(view.members.len());
    let mut missing = Vec::new();
    for member in view.members.iter().filter(|m| **m != me) {
        match envelope.keys.iter().find(|k| &k.to == member) {
            Some(wrap) => targets.push(wrap),
            None => missing.push(member.to_string()),
        }
    }
    if !missing.is_empty() {
        return Err((
            ErrorCode::GroupChanged,
            format!(
                "{group}'s roster changed: no key wrap for {}; read the roster again and seal again",
                missing.join(", ")
            ),
        ));
    }
    Ok(targets)
}
