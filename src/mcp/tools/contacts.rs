//! Other agents: contact requests, the directory, presence, whois, contacts.

use rmcp::handler::server::wrapper::Parameters;
use rmcp::{Json, tool, tool_router};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::client::consent::{ConsentState, ContactRequest};
use crate::mcp::errors::Doing;
use crate::mcp::peers::{DirectoryView, PresenceView, WhoisView};
use crate::mcp::server::MailslotServer;
use crate::protocol::{Address, AgentName, MAX_PRESENCE_AGENTS, RequestView};

/// Arguments of `request_contact`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ContactRequestArgs {
    /// The agent to ask.
    pub agent: String,
    /// Why, for its owner (at most a few hundred characters).
    #[serde(default)]
    pub note: String,
}

/// A contact request's state.
#[derive(Debug, Serialize, JsonSchema)]
pub struct ContactRequestResult {
    /// "pending" (the owners decide) or "done" (nothing was needed).
    pub status: String,
    /// What happens next.
    pub detail: String,
}

/// A pending request as an agent may see it (never with a code).
#[derive(Debug, Serialize, JsonSchema)]
pub struct PendingRequest {
    /// The other agent.
    pub agent: String,
    /// The requester's note: one line, fenced (untrusted text when incoming).
    pub note: String,
    /// When it lapses (RFC 3339).
    pub expires_at: String,
}

/// A pinned key.
#[derive(Debug, Serialize, JsonSchema)]
pub struct KnownKey {
    /// The peer's address.
    pub address: String,
    /// The fingerprint of its pinned keys.
    pub fingerprint: String,
    /// Key changes seen (each one is a warning).
    pub key_changes: u32,
}

/// Contacts and requests.
#[derive(Debug, Serialize, JsonSchema)]
pub struct ContactsView {
    /// Whom this agent accepts mail from: "open", "contacts" or "closed" (null when the relay
    /// is out of reach).
    pub policy: Option<String>,
    /// Approved contacts (null when the relay is out of reach).
    pub contacts: Option<Vec<String>>,
    /// Blocked agents.
    pub blocked: Option<Vec<String>>,
    /// Requests to this agent, waiting for its owner.
    pub incoming: Vec<PendingRequest>,
    /// Requests this agent made, waiting for the other owner.
    pub outgoing: Vec<PendingRequest>,
    /// Peers whose keys this agent has pinned.
    pub known_keys: Vec<KnownKey>,
    /// Where the relay connection stands.
    pub relay: String,
}

/// Arguments of `presence`.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PresenceArgs {
    /// Only these agents (names like "bob", at most 100); leave it out for all your contacts
    /// and the listed agents.
    #[serde(default)]
    pub agents: Option<Vec<String>>,
}

/// Arguments of `whois`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WhoisArgs {
    /// An agent name ("bob") or an address on another relay ("bob@relay.example.com").
    pub address: String,
}

fn pending(views: Vec<RequestView>) -> Vec<PendingRequest> {
    views
        .into_iter()
        .map(|v| PendingRequest {
            agent: v.agent.to_string(),
            note: crate::doorbell::frame::fence_line(&v.note, 300),
            expires_at: v.expires_at.to_string(),
        })
        .collect()
}

#[tool_router(router = contacts_tools, vis = "pub(super)")]
impl MailslotServer {
    /// Ask another agent's owner to accept mail from this agent. Returns "pending": the
    /// owners decide, out of band. Agents cannot approve requests.
    #[tool(annotations(
        title = "Request a contact",
        read_only_hint = false,
        destructive_hint = false,
        idempotent_hint = true,
        open_world_hint = true
    ))]
    async fn request_contact(
        &self,
        Parameters(args): Parameters<ContactRequestArgs>,
    ) -> Result<Json<ContactRequestResult>, String> {
        let to = Address::parse(args.agent.trim()).map_err(|e| {
            format!(
                "agent {}: write an agent name like \"bob\", or \"bob@relay.example\" on another relay",
                e.problem
            )
        })?;
        let result = match self.mailbox.request_contact(to.clone(), args.note).await {
            // The code is for this agent's owner only: it never reaches the model.
            Ok(ContactRequest::Pending { expires_at, .. }) => ContactRequestResult {
                status: "pending".into(),
                detail: format!(
                    "asked {to}; your owner sees the verification code with `mailslot --agent {me} requests` and passes it to {to}'s owner, who approves it. You will be told the outcome. It lapses at {expires_at}.",
                    me = self.mailbox.name()
                ),
            },
            Ok(ContactRequest::Done(detail)) => ContactRequestResult {
                status: "done".into(),
                detail,
            },
            Err(e) => return Err(self.tool_error(e, Doing::Asking).await),
        };
        Ok(Json(result))
    }

    /// Agents that opted in to the relay's directory, with what each says about itself:
    /// whom this agent could write to (a stranger may first need request_contact).
    #[tool(annotations(title = "Directory", read_only_hint = true, open_world_hint = true))]
    async fn directory(&self) -> Result<Json<DirectoryView>, String> {
        let entries = match self.mailbox.directory().await {
            Ok(entries) => entries,
            Err(e) => return Err(self.tool_error(e, Doing::Asking).await),
        };
        Ok(Json(DirectoryView::of(entries)))
    }

    /// Who is online now, and since when: among your contacts and the agents listed in the
    /// directory only (nobody else is ever shown). Mail to an offline agent waits for it.
    #[tool(annotations(title = "Presence", read_only_hint = true, open_world_hint = true))]
    async fn presence(
        &self,
        Parameters(args): Parameters<PresenceArgs>,
    ) -> Result<Json<PresenceView>, String> {
        let agents = match args.agents {
            Some(raw) if raw.len() > MAX_PRESENCE_AGENTS => {
                return Err(format!(
                    "agents has {} names, over the maximum of {MAX_PRESENCE_AGENTS}; ask about fewer, or leave agents out for everyone you may see",
                    raw.len()
                ));
            }
            Some(raw) => Some(
                raw.iter()
                    .enumerate()
                    .map(|(i, a)| {
                        AgentName::new(a.trim()).map_err(|e| {
                            format!(
                                "agents[{i}] {}: write an agent name like \"bob\"",
                                e.problem
                            )
                        })
                    })
                    .collect::<Result<Vec<_>, _>>()?,
            ),
            None => None,
        };
        let online = match self.mailbox.presence(agents).await {
            Ok(online) => online,
            Err(e) => return Err(self.tool_error(e, Doing::Asking).await),
        };
        Ok(Json(PresenceView::of(online)))
    }

    /// One agent in one answer: its key's fingerprint, whether it is your contact (approved,
    /// pending, blocked or none), its directory listing and whether it is online. Pins nothing.
    #[tool(annotations(title = "Who is", read_only_hint = true, open_world_hint = true))]
    async fn whois(
        &self,
        Parameters(args): Parameters<WhoisArgs>,
    ) -> Result<Json<WhoisView>, String> {
        let address = Address::parse(args.address.trim()).map_err(|e| {
            format!("address {}: write an agent name like \"bob\" or an address like \"bob@relay.example.com\"", e.problem)
        })?;
        let whois = match self.mailbox.whois(&address).await {
            Ok(whois) => whois,
            Err(e) => return Err(self.tool_error(e, Doing::Asking).await),
        };
        Ok(Json(WhoisView::of(whois)))
    }

    /// Contacts, blocks, pending requests (never their codes) and pinned keys.
    #[tool(annotations(title = "Contacts", read_only_hint = true, open_world_hint = true))]
    async fn contacts(&self) -> Result<Json<ContactsView>, String> {
        let known_keys = match self.mailbox.pinned_contacts().await {
            Ok(pinned) => pinned
                .into_iter()
                .map(|c| KnownKey {
                    address: c.address.to_string(),
                    fingerprint: c.fingerprint.to_string(),
                    key_changes: c.key_changes,
                })
                .collect(),
            Err(e) => return Err(self.tool_error(e, Doing::Local).await),
        };
        let relay = self.mailbox.status().describe(self.mailbox.relay());
        let view = match self.mailbox.consent_state().await {
            Ok(ConsentState {
                policy,
                incoming,
                outgoing,
                contacts,
                blocked,
            }) => ContactsView {
                policy: Some(policy.to_string()),
                contacts: Some(contacts.iter().map(ToString::to_string).collect()),
                blocked: Some(blocked.iter().map(ToString::to_string).collect()),
                incoming: pending(incoming),
                outgoing: pending(outgoing),
                known_keys,
                relay,
            },
            Err(e) => ContactsView {
                policy: None,
                contacts: None,
                blocked: None,
                incoming: Vec::new(),
                outgoing: Vec::new(),
                known_keys,
                relay: format!("{relay}; contacts and requests need the relay: {e}"),
            },
        };
        Ok(Json(view))
    }
}
